"""Sweep speed: candidate evaluations per second, end-to-end sweep time from the shell,
and candidates / wall time per device count. Prints figures and ratios; asserts nothing.

1. Evaluation rate (one core): the memory kernel (the candidate stages) and the time kernel
   of one Llama-3-70B group, on 1,000,000 rows, vs a plain Python loop calling the same
   generated formulas one candidate at a time (same run, same process).
2. `ndplan sweep -m llama3-70b -H h100-sxm --gpus 1024 --seq 8192 --gbs 1024` from the
   shell, whole process (Python start-up included), wall time and peak RSS: with an empty
   kernel cache (the kernels shipped with the package, prebuilt.py), then another model of
   the same class and one of another class on that cache, then warm (5 runs: median and
   spread), and warm with no bytecode cache (every module compiled from source); and, unless --skip-cold, with an empty cache and the shipped kernels off
   (NDPLAN_PREBUILT=0: every kernel built by SymPy, about a minute), with the ratio.
   AutoParallel's whole-process time is printed beside it when an ``autoparallel`` command is
   on the machine (it is not on PyPI: the PyPI name is an unrelated joblib decorator).
3. Candidates and wall time for 8 ... 16384 devices (warm kernels).
4. 131,072 devices, every dimension auto, llama3-70b and deepseek-v3, whole process: wall
   time and peak RSS (warm kernels).

The measured processes run with Python's bytecode cache on (python_env), as an installed
ndplan does.

Run: python benchmarks/sweep_speed.py [--skip-cold]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: numpy elementwise ops are single-threaded anyway

import argparse  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from ndplan import load_hardware, load_model  # noqa: E402
from ndplan.estimate import memory_kernel, time_kernel  # noqa: E402
from ndplan.space import Group, generate  # noqa: E402
from ndplan.sweep import evaluate_group, row_strategy, sweep, sweep_view  # noqa: E402
from ndplan.structure import structure  # noqa: E402

N_ROWS = 1_000_000
N_LOOP = 3_000
REPEATS = 3


def evaluation_rate() -> None:
    model, hw = load_model("llama3-70b"), load_hardware("h100-sxm")
    cands = generate(model, 1024, 8192, 1024, {"schedule": "1f1b", "recompute": "selective", "zero": 1})
    g = cands.groups[0]
    reps = -(-N_ROWS // len(g))
    big = Group(schedule=g.schedule, vpp=g.vpp, recompute=g.recompute, zero=g.zero, sp=g.sp,
                grid={k: np.tile(v, reps)[:N_ROWS] for k, v in g.grid.items()})
    hwv = hw.kernel_values()
    evaluate_group(model, hw, g, 8192, 1024, {}, hwv)  # compile (or load) the group's kernels
    vec_s = math.inf
    for _ in range(REPEATS):  # best of REPEATS: the machine's other load only slows a run down
        t0 = time.perf_counter()
        peak, step, _ = evaluate_group(model, hw, big, 8192, 1024, {}, hwv)  # the sweep's own code path
        vec_s = min(vec_s, time.perf_counter() - t0)

    # baseline: the same generated formulas, called one candidate at a time from Python
    strat = row_strategy({**{k: g.grid[k][0] for k in g.grid}, "vpp": g.vpp, "zero": g.zero, "sp": g.sp,
                          "recompute": g.recompute, "schedule": g.schedule}, 8192, 1024, {},
                         model.num_hidden_layers)
    view = sweep_view(model, structure(model, strat))  # the sweep's own view: even and uneven rows
    fm, ft = memory_kernel(model, view), time_kernel(model, view)
    t0 = time.perf_counter()
    for i in range(N_LOOP):
        row = {k: float(v[i]) for k, v in big.grid.items()} | {"vpp": 1.0, "seq": 8192.0, "nrec": 0.0}
        pp = int(row["pp"])
        best = max(sum(fm.kernel._fn(*[row[a] if a in row else
                                       (float(st) if a == "stage" else fm.model_values[a])
                                       for a in fm.kernel.args]))
                   for st in {0, min(1, pp - 1), pp - 1})
        s = sum(ft.kernel._fn(*[row[a] if a in row else (0.0 if a == "stage" else
                                hwv.get(a, ft.model_values.get(a))) for a in ft.kernel.args]))
        assert abs(s - step[i]) <= 1e-9 * s and abs(np.ceil(best) - peak[i]) <= 1e-6 * best + 2
    loop_s = time.perf_counter() - t0
    vec_rate, loop_rate = N_ROWS / vec_s, N_LOOP / loop_s
    print("1. evaluation rate: peak memory (max over stages) + step time, one Llama-3-70B group, one core")
    print(f"   sweep kernels      : {N_ROWS:,} candidates in {vec_s:.3f} s (best of {REPEATS}) = "
          f"{vec_rate:,.0f} candidates/s")
    print(f"   plain Python loop  : {N_LOOP:,} candidates in {loop_s:.3f} s = {loop_rate:,.0f} candidates/s")
    print(f"   ratio              : {vec_rate / loop_rate:,.0f}x   (target >= 2,000,000 candidates/s)")


README = "sweep -m {model} -H h100-sxm --gpus {gpus} --seq 8192 --gbs {gbs} --json"
MEASURE = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
           "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
           "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)")


def _exe() -> list[str]:
    found = shutil.which("ndplan")
    return [found] if found else [sys.executable, "-m", "ndplan.cli"]


def timed(args: str, env: dict) -> tuple[float, float]:
    """(wall s, peak RSS MiB) of one ``ndplan ARGS`` process."""
    out = subprocess.run([sys.executable, "-c", MEASURE, *_exe(), *args.split()], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    if out[2] not in ("0", "1"):
        raise SystemExit(f"ndplan {args} exited {out[2]}")
    return float(out[0]), float(out[1]) / 1024


def python_env(**extra: str) -> dict:
    """The environment of the measured processes: Python's default bytecode cache on (a
    ``PYTHONDONTWRITEBYTECODE`` of the calling shell is dropped: pip writes an installed
    package's .pyc at install time, and an editable one's on its first run)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return env | extra


def shell_sweep(skip_cold: bool) -> None:
    cmd = README.format(model="llama3-70b", gpus=1024, gbs=1024)
    print(f"\n2. from the shell, whole process: ndplan {cmd}")
    with tempfile.TemporaryDirectory() as cache:
        env = python_env(NDPLAN_CACHE_DIR=cache)
        first, rss = timed(cmd, env)
        print(f"   empty cache, shipped kernels     {first:6.2f} s  {rss:5.0f} MiB   (target <= 5 s)")
        for model, what in (("llama3-8b", "same class"), ("qwen2.5-72b", "another class")):
            wall, rss = timed(README.format(model=model, gpus=1024, gbs=1024), env)
            print(f"   then {model:<12} ({what:<13}) {wall:6.2f} s  {rss:5.0f} MiB   (target <= 1 s)")
        warm = sorted(timed(cmd, env)[0] for _ in range(5))
        print(f"   warm (5 runs)                    {warm[2]:6.2f} s  median, {warm[0]:.2f}-{warm[4]:.2f} s   "
              "(target <= 0.5 s)")
        with tempfile.TemporaryDirectory() as pyc:  # every module compiled from source, every run
            cold_pyc = sorted(timed(cmd, env | {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": pyc})[0]
                              for _ in range(3))
        print(f"   warm, no bytecode cache (3 runs) {cold_pyc[1]:6.2f} s  median, {cold_pyc[0]:.2f}-{cold_pyc[2]:.2f} s"
              "   (PYTHONDONTWRITEBYTECODE=1: every module compiled each run)")
    if not skip_cold:
        with tempfile.TemporaryDirectory() as cache:
            wall, rss = timed(cmd, python_env(NDPLAN_CACHE_DIR=cache, NDPLAN_PREBUILT="0"))
            print(f"   empty cache, no shipped kernels  {wall:6.2f} s  {rss:5.0f} MiB   "
                  f"(SymPy builds every kernel: {wall / first:.0f}x the shipped run)")
    other = shutil.which("autoparallel")
    if other:
        t0 = time.perf_counter()
        subprocess.run([other, "--help"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"   AutoParallel (autoparallel --help, start-up only): {time.perf_counter() - t0:.2f} s")
    else:
        print("   AutoParallel: not on this machine (it scores 20-100 candidates; this sweep scores every valid one)")


def largest(cluster: int = 131072) -> None:
    print(f"\n4. {cluster:,} devices, every dimension auto, whole process (warm kernels)")
    for model in ("llama3-70b", "deepseek-v3"):
        cmd = README.format(model=model, gpus=cluster, gbs=16384)
        timed(cmd, python_env())  # kernels (shipped or built) into the cache
        runs = sorted(timed(cmd, python_env()) for _ in range(3))
        print(f"   {model:<12} {runs[1][0]:6.2f} s median ({runs[0][0]:.2f}-{runs[2][0]:.2f}), peak RSS "
              f"{max(r[1] for r in runs):.0f} MiB   (target <= 2 s, <= 200 MB = 191 MiB)")


def per_device_count() -> None:
    model, hw = load_model("llama3-70b"), load_hardware("h100-sxm")
    print("\n3. Llama-3-70B on H100, seq 8192, gbs 1024, all dimensions auto (kernels warm)")
    print(f"   {'devices':>7} {'generated':>11} {'valid':>8} {'feasible':>9} {'groups':>7} {'wall s':>7}")
    for gpus in (8, 64, 512, 4096, 16384):
        gbs = max(1024, gpus // 8)
        sweep(model, hw, gpus, 8192, gbs, top=1)  # compile anything new
        t0 = time.perf_counter()
        r = sweep(model, hw, gpus, 8192, gbs, top=1)
        wall = time.perf_counter() - t0
        print(f"   {gpus:>7} {r.candidates.generated:>11,} {r.candidates.valid:>8,} {r.feasible:>9,} "
              f"{len(r.candidates.groups):>7} {wall:>7.2f}" + ("" if gbs == 1024 else f"   (gbs {gbs})"))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-cold", action="store_true", help="skip the cold-cache shell run (about a minute)")
    a = ap.parse_args()
    evaluation_rate()
    shell_sweep(a.skip_cold)
    per_device_count()
    largest()
