"""Sweep: its vectorized peak/step equal estimate() stage by stage, its ranking is
deterministic, its Pareto front equals a brute-force oracle, find-min-gpus equals a
linear scan, and time kernels equal their SymPy expressions."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import sympy as sp
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ndplan import symbols as S
from ndplan.catalog import load_hardware, load_model
from ndplan.cli import main
from ndplan.estimate import estimate
from ndplan.formulas.step import step_time
from ndplan.kernels import compile_breakdown
from ndplan.sweep import find_min_gpus, pareto_front, row_strategy, sweep
from ndplan.symbols import model_symbols

H100 = load_hardware("h100-sxm")
SMALL_SPACE = {"mbs": [1, 2], "zero": [1, 3], "recompute": ["none", "full"]}


@pytest.fixture(scope="module")
def llama8b_64():
    return sweep(load_model("llama3-8b"), H100, 64, 8192, 256, SMALL_SPACE, top=3)


ROW_CASES = {  # model, gpus, a small space with pipelines (per-stage peaks), every schedule family and MoE
    "dense-pp-schedules": ("llama3-8b", 16, {"tp": [2], "pp": [2, 4], "cp": [1], "mbs": [1], "zero": [1],
                                             "recompute": ["none", "full"], "vpp": [1, 2],
                                             "schedule": ["1f1b", "interleaved", "zbv"]}),
    "moe-ep": ("mixtral-8x7b", 16, {"tp": [2], "pp": [2], "cp": [1], "mbs": [1], "zero": [1, 3],
                                    "recompute": ["selective"], "vpp": [1], "schedule": ["1f1b"]}),
}


@pytest.mark.parametrize("name", list(ROW_CASES))
def test_sweep_rows_equal_estimate(name):
    """Peak over PEAK_STAGES == max over every stage of estimate(); step time equal. A few
    rows (first, middle, last of the ranking) of a small sweep: the vectorised table against
    the per-strategy path (kernel caching is tests/test_kernel_cache.py's business)."""
    model_name, gpus, space = ROW_CASES[name]
    model = load_model(model_name)
    r = sweep(model, H100, gpus, 4096, 64, space, top=0)
    n = len(r.table)
    assert n >= 3
    for i in sorted({0, n // 2, n - 1}):
        strat = r.strategy(i)
        e = estimate(model, H100, strat, gpus)
        assert r.table.peak_bytes[i] == pytest.approx(e.peak_bytes, rel=1e-9, abs=2), strat
        assert r.table.step_s[i] == pytest.approx(e.step_s, rel=1e-9), strat


def test_json_is_deterministic():
    """Same input, byte-identical JSON (ranking ties broken by the degrees)."""
    args = ["sweep", "-m", "llama3-8b", "-H", "a100-80gb", "--gpus", "16", "--gbs", "64", "--seq", "4096",
            "--mbs", "1,2", "--vpp", "1,2", "--schedule", "1f1b,interleaved,zbv", "--json", "--top", "3"]
    a = CliRunner().invoke(main, args)
    b = CliRunner().invoke(main, args)
    assert a.exit_code == 0, a.output
    assert a.stdout == b.stdout  # stderr may hold the first run's compile progress
    data = json.loads(a.stdout)
    assert set(data["candidates"]) >= {"generated", "rejected", "infeasible", "feasible"}
    c = data["candidates"]
    assert c["generated"] == c["rejected"] + c["infeasible"] + c["feasible"]
    top = data["top"][0]
    assert set(top) >= {"strategy", "memory", "time", "fits"}
    assert top["time"]["step_s"] > 0 and 0 < top["time"]["mfu"] < 1
    assert data["pareto"] and all(p["peak_bytes"] > 0 for p in data["pareto"])


def test_ranking_sorted_and_feasible_first(llama8b_64):
    r = llama8b_64
    f = r.feasible
    assert f > 0
    assert np.all(r.table.peak_bytes[:f] <= r.mem_limit_bytes)
    assert np.all(r.table.peak_bytes[f:] > r.mem_limit_bytes)
    assert np.all(np.diff(r.table.step_s[:f]) >= -1e-9)  # ties (to 1e-12 s) ordered by memory, then degrees
    assert r.top[0].step_s == pytest.approx(r.table.step_s[0])


def test_pareto_equals_brute_force(llama8b_64):
    r = llama8b_64
    peak, step = r.table.peak_bytes[:r.feasible], r.table.step_s[:r.feasible]
    oracle = set()
    for i in range(len(peak)):
        dominated = np.any(((peak <= peak[i]) & (step < step[i])) | ((peak < peak[i]) & (step <= step[i])))
        if not dominated:
            oracle.add((peak[i], step[i]))
    got = {(peak[i], step[i]) for i in r.pareto}
    assert got == oracle
    assert len(pareto_front(peak, step)) == len(r.pareto)


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=40))
def test_pareto_front_keeps_each_undominated_point_once(points):
    """On small integer grids (many ties): the front is exactly the points no other point beats
    on one axis without losing on the other, each pair once."""
    peak = np.array([p for p, _ in points], dtype=float)
    step = np.array([t for _, t in points], dtype=float)
    oracle = {(p, t) for p, t in zip(peak, step)
              if not np.any(((peak <= p) & (step < t)) | ((peak < p) & (step <= t)))}
    front = pareto_front(peak, step)
    assert [(peak[i], step[i]) for i in front] == sorted(oracle)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(levels=st.integers(1, 6), seed=st.integers(0, 2 ** 16), sort=st.sampled_from(["time", "memory"]))
def test_rank_equals_the_full_lexsort(llama8b_64, levels, seed, sort):
    """rank() sorts on feasibility, the sort key and the other key, then breaks ties with the
    degree columns gathered for tied rows only; the definition is one lexsort over every key of
    every row (the columns all gathered). Step and peak are quantized to ``levels`` values so
    that most rows tie, and NaN appears."""
    from ndplan.table import _REC_ORDER, _SCHED_ORDER, _codes, rank
    t = llama8b_64.table
    rng = np.random.default_rng(seed)
    t = t.take(rng.permutation(len(t)))
    t.step_s = rng.integers(0, levels, len(t)).astype(float)
    t.peak_bytes = rng.integers(0, levels, len(t)).astype(float)
    t.step_s[rng.random(len(t)) < 0.01] = np.nan
    fits = rng.random(len(t)) < 0.5
    g = t.grid
    ties = [g["dp"], g["tp"], g["pp"], g["cp"], g["ep"], g["etp"], g["vpp"], g["mbs"], g["zero"],
            _codes(g["recompute"], _REC_ORDER), _codes(g["schedule"], _SCHED_ORDER),
            ~g["sp"].astype(bool), g["uneven"], g["first_layers"], g["last_layers"]]
    primary, secondary = (t.peak_bytes, t.step_s) if sort == "memory" else (t.step_s, t.peak_bytes)
    want = np.lexsort(ties[::-1] + [np.round(secondary, 12), np.round(primary, 12), ~fits])
    assert np.array_equal(rank(t, fits, sort), want)


@settings(max_examples=200, deadline=None)
@given(fit=st.sets(st.integers(1, 64)), step=st.sampled_from([1, 2, 4, 8]), floor=st.sampled_from([0, 8, 16]))
def test_smallest_count_is_the_stated_walk(fit, step, floor):
    """smallest_count: the first doubling of ``first`` (up to ``top``) that fits bounds the walk,
    and the answer is the smallest fitting multiple of ``step`` above ``floor`` below it, or that
    doubling; brute force over the counts as the docstring states it, with ``fits`` any set."""
    from ndplan.sweep import smallest_count
    first, top = 2 * max(floor, step), 64 * step
    fits = {n * step for n in fit}
    got, tried = smallest_count(first, step, top, lambda n: n in fits, floor=floor)
    doublings = [first * 2 ** i for i in range(8) if first * 2 ** i <= top]
    bound = next((d for d in doublings if d in fits), None)
    if bound is None:
        assert got is None
        return
    below = [m for m in range(step, bound, step) if m > floor and m in fits]
    assert got == min(below + [bound])
    assert len(tried) == len(set(tried))


def test_find_min_gpus_equals_linear_scan():
    model = load_model("llama3-70b")
    # one schedule and no vpp/cp: fewer kernels to compile; the scan below is the oracle either way
    space = {"recompute": ["none", "full"], "zero": [1, 3], "mbs": [1], "cp": [1], "vpp": [1], "schedule": ["1f1b"]}
    r = find_min_gpus(model, H100, 4096, 64, space, top=1)
    first = None
    for nodes in range(1, 17):
        try:
            s = sweep(model, H100, nodes * 8, 4096, 64, space, top=0)
        except Exception:
            continue
        if s.feasible:
            first = nodes * 8
            break
    assert r.gpus == first


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["llama3-8b", "mixtral-8x7b", "deepseek-v2-lite", "megatron-gpt-22b"]),
       schedule=st.sampled_from(["1f1b", "interleaved", "zb-h1", "zbv"]),
       recompute=st.sampled_from(["none", "selective", "full"]), zero=st.sampled_from([0, 1, 3]),
       dp=st.sampled_from([1, 2, 8]), tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]),
       mbs=st.sampled_from([1, 2]), seed=st.integers(0, 1000))
def test_time_kernel_equals_subs(name, schedule, recompute, zero, dp, tp, cp, mbs, seed):
    """The compiled time kernel equals expr.subs at the point, term by term."""
    model = load_model(name)
    vpp = {"interleaved": 2, "zbv": 2}.get(schedule, 1)
    pp = 3 if model.num_hidden_layers % 6 == 0 and model.num_hidden_layers % 4 else 2
    if model.num_hidden_layers % (pp * vpp):
        pp = 1 if schedule in ("1f1b", "zb-h1") else pp
    if model.num_hidden_layers % (pp * vpp):
        return
    ep = 2 if model.is_moe and (dp * cp * tp) % 2 == 0 else 1
    try:
        strat = row_strategy({"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "etp": 1, "vpp": vpp, "mbs": mbs,
                              "zero": zero, "sp": True, "recompute": recompute, "schedule": schedule},
                             4096, dp * mbs * max(pp, 2) * 2, {})
        strat.check(model)
    except Exception:
        return
    bd = step_time(model, model_symbols(model), strat)
    hw = load_hardware(random.Random(seed).choice(["h100-sxm", "a100-80gb", "ascend-910b"])).kernel_values()
    point = {S.dp: dp, S.tp: tp, S.pp: pp, S.vpp: vpp, S.cp: cp, S.ep: ep, S.etp: 1, S.mbs: mbs, S.m: strat.m,
             S.seq: 4096, S.nrec: 0, S.stage: 0, S.first_layers: 0, S.last_layers: 0}  # even: not read
    point |= {S.BY_NAME[k]: v for k, v in hw.items()}
    point = {k: sp.Float(v, 30) if isinstance(v, float) else sp.Integer(v) for k, v in point.items()}
    out = compile_breakdown(bd, S.STRATEGY_SYMBOLS + S.HW_SYMBOLS)(**{k.name: float(v) for k, v in point.items()})
    for t in bd:
        ref = float(sp.sympify(t.expr).xreplace(point).evalf(30))  # xreplace: exact substitution, no rewriting
        assert float(out[t.key]) == pytest.approx(ref, rel=1e-9, abs=1e-12), t.key


def test_cli_sweep_errors_exit_2(tmp_path):
    bad = tmp_path / "space.yaml"
    bad.write_text("tp: [1, 2\n")
    cases = [
        ["--space", str(bad)],
        ["--tpp", "2"],
        ["--tp", "3"],
        ["--schedule", "foo"],
        ["--mem-limit-gib", "-1"],
        ["--mem-fraction", "1.5"],
    ]
    for extra in cases:
        res = CliRunner().invoke(main, ["sweep", "-m", "llama3-8b", "--gpus", "64", "--gbs", "64", *extra])
        assert res.exit_code == 2, (extra, res.output)
        assert "Traceback" not in res.output
    res = CliRunner().invoke(main, ["sweep", "-m", "llama3-8b", "--gpus", "64", "--gbs", "64", "--space", str(bad)])
    assert "space" in res.output


def test_nothing_fits_names_the_smallest_need():
    res = CliRunner().invoke(main, ["sweep", "-m", "llama3-70b", "-H", "a100-80gb", "--gpus", "8", "--gbs", "8",
                                    "--zero", "0", "--recompute", "none", "--cp", "1", "--vpp", "1",
                                    "--schedule", "1f1b"])
    assert res.exit_code == 1
    assert "nothing fits" in res.output and "smallest peak" in res.output and "mem." in res.output


def test_why_names_rule_or_rank():
    # a small space: why checks the rules before the space, so tp=3 is still a world-rule reject
    base = ["sweep", "-m", "llama3-70b", "-H", "a100-80gb", "--gpus", "64", "--gbs", "128", "--mbs", "1,2",
            "--tp", "1,8", "--pp", "1,2", "--cp", "1", "--vpp", "1", "--schedule", "1f1b", "--zero", "0,1",
            "--recompute", "none,full"]
    res = CliRunner().invoke(main, base + ["--why", "tp=3"])
    assert res.exit_code == 0 and "rule world" in res.output
    res = CliRunner().invoke(main, base + ["--why", "dp=8,tp=8,pp=1"])
    assert "ranks #" in res.output or "infeasible by memory" in res.output
    res = CliRunner().invoke(main, base + ["--why", "dp=64,tp=1,pp=1,zero=0"])
    assert "infeasible by memory" in res.output


def test_compare_marks_differing_terms():
    res = CliRunner().invoke(main, ["compare", "-m", "llama2-70b", "-H", "a100-80gb", "--gpus", "64", "--gbs", "128",
                                    "dp=4,tp=8,pp=2", "dp=8,tp=8,pp=1,recompute=full", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    diff = set(data["differing_terms"])
    assert "time.recompute" in diff and "time.pp_bubble" in diff and "mem.activations (max)" in diff
    assert "mem.reserve (max)" not in diff
