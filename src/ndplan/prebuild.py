"""Build the kernels shipped with the package (prebuilt.py): ``python -m ndplan.prebuild``.

Runs, with the shipped store off and an empty kernel cache, every case below in-process
(the CLI's own code path, output discarded) and stores the generated sources and read lists
the cases compiled into prebuilt.STORE, with a manifest naming the formula sources they came from,
and every catalog model's @derived read values into prebuilt.DERIVED:

- each catalog model's default sweep (engine megatron, every dimension auto, the top 10
  estimated) on 64, 1,024 and 16,384 H100s at sequence 4,096 and the README's (1,024 at
  8,192): the kernels of every catalog architecture class (a model of a class that is
  already built compiles nothing, kernels.model_kernel);
- every ``ndplan`` command of README.md and of every ``--help`` (the commands a new user
  runs first), from a scratch copy of ``examples/``.

Run it after changing any expression module (kernels._EXPR_MODULES): tests/test_prebuilt.py
fails while the store is stale. About 10 minutes on 2 cores (``--jobs 2``); the store is
deterministic (sorted members, a fixed xz preset), so an unchanged build leaves git clean.
``--check`` then reruns every case against the new store with another empty cache and
reports any case that still compiles.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ndplan import prebuilt

ROOT = Path(__file__).resolve().parents[2]
"""The checkout (README.md, examples/): the prebuild runs from a clone, not an installed wheel."""
SWEEPS = ((64, 4096), (1024, 4096), (16384, 4096), (1024, 8192))
"""(devices, sequence length) of each catalog model's sweeps; 1,024 at 8,192 is the README's."""
SWEEP_ARGS = ("-H", "h100-sxm", "--gbs", "1024")
"""The default --top (10): each of the top rows is estimated, and a row of a concrete layout
has kernels of its own (structure.peaks_over_held_vectors)."""
SIGNATURE = ("layer_pattern", "gated_mlp", "is_mla", "attention_bias", "qk_norm", "layernorm", "router_bias",
             "has_shared_experts", "learned_positions", "tie_word_embeddings", "mtp_layers", "hidden_dropout",
             "is_moe", "implicit_qkv_bias", "has_q_lora")
"""Model properties that split kernel classes (what builders read besides the sizes): used
only to order the work so that two workers rarely build the same class at once."""


Case = tuple[list[str], tuple[int, ...]]
"""(argv after ``ndplan``, the exit codes it may end with)."""


def catalog_cases() -> tuple[list[Case], list[Case]]:
    """(one sweep per apparent class, every other catalog sweep); a sweep exits 0, or 1 when
    nothing fits."""
    from ndplan.catalog.files import builtin_dir
    from ndplan.catalog.model import load_model
    first, rest, seen = [], [], set()
    for name in sorted(p.stem for p in builtin_dir("models").glob("*.yaml")):
        spec = load_model(name)
        sig = tuple(repr(getattr(spec, a, None)) for a in SIGNATURE)
        for gpus, seq in SWEEPS:
            case = (["sweep", "-m", name, "--gpus", str(gpus), "--seq", str(seq), *SWEEP_ARGS], (0, 1))
            (first if sig not in seen and (gpus, seq) == SWEEPS[1] else rest).append(case)
        seen.add(sig)
    return first, rest


def example_cases() -> list[list[Case]]:
    """README's commands as one sequence (a file one writes, the next reads), then each
    command's --help examples as one sequence, with the exit code each shows (``# exits N``;
    ``trace`` may also exit 2 where the trace extra is not installed)."""
    from ndplan import doc_examples

    def cases(cmds):
        return [(argv, (code, 2) if argv[0] == "trace" else (code,)) for argv, code in cmds]
    seqs = [cases(doc_examples.readme_commands(ROOT / "README.md"))]
    seqs += [cases(doc_examples.help_commands(n)) for n in doc_examples.command_names()]
    return [s for s in seqs if s]


def _run_sequence(seq: list[Case]) -> tuple[int, float, list[str]]:
    """Run commands in one scratch copy of examples/; (kernels compiled, seconds, commands that
    ended with another exit code)."""
    from click.testing import CliRunner

    from ndplan import kernels
    from ndplan.cli import main
    built, wrong = [0], []
    t0 = time.perf_counter()
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as scratch, kernels.compile_listener(lambda: built.__setitem__(0, built[0] + 1)):
        if (ROOT / "examples").is_dir():
            shutil.copytree(ROOT / "examples", Path(scratch) / "examples")
        os.chdir(scratch)
        try:
            for argv, codes in seq:
                r = CliRunner().invoke(main, argv)
                if r.exit_code not in codes:
                    wrong.append(f"ndplan {' '.join(argv)}: exit {r.exit_code}, expected {codes}")
        finally:
            os.chdir(here)
            kernels.flush()
    return built[0], time.perf_counter() - t0, wrong


def _init(cache: str, use_store: bool) -> None:
    os.environ["NDPLAN_CACHE_DIR"] = cache
    os.environ["NDPLAN_PREBUILT"] = "1" if use_store else "0"
    prebuilt.reset()


def run_all(seqs: list[list[Case]], cache: str, jobs: int, use_store: bool) -> list[tuple[int, float, list[str]]]:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(jobs, initializer=_init, initargs=(cache, use_store)) as pool:
        out = []
        for i, r in enumerate(pool.imap(_run_sequence, seqs)):
            out.append(r)
            print(f"  {i + 1}/{len(seqs)}: {r[0]} kernels in {r[1]:.1f} s: ndplan {' '.join(seqs[i][0][0])}"
                  + (f" (+{len(seqs[i]) - 1} more)" if len(seqs[i]) > 1 else ""), file=sys.stderr, flush=True)
            for line in r[2]:
                print(f"    unexpected exit: {line}", file=sys.stderr, flush=True)
        return out


def write_store(cache: Path, path: Path, cases: int) -> int:
    """Store the cache's kernel sources and read lists (not the marshalled code, not traces, not the
    model memos), and the catalog models' @derived values beside the store (write_derived)."""
    from importlib.metadata import version

    from ndplan.kernels import _sources_digest
    members = {p.name: p.read_text() for p in sorted(cache.glob("*.json")) if not p.name.startswith("model-")}
    for name in members:  # read lists in a fixed order, whichever worker added one first
        if name.startswith("reads-"):
            members[name] = json.dumps(sorted(json.loads(members[name])))
    manifest = {"sources": _sources_digest(), "sympy": version("sympy"), "kernels": sum(
        not n.startswith("reads-") for n in members), "cases": cases, "built_by": "python -m ndplan.prebuild"}
    prebuilt.write(path, manifest, members)
    write_derived(members, path.with_name(prebuilt.DERIVED.name))
    return manifest["kernels"]


def derived_document(members: dict[str, str]) -> dict:
    """Every catalog model's value of every @derived read the stored read lists name, by the
    model's key (prebuilt.derived_values)."""
    from ndplan.catalog.files import builtin_dir
    from ndplan.catalog.model import load_model
    from ndplan.kernels import _digest, _sources_digest
    from ndplan.readlog import _value
    names = sorted({n for m, text in members.items() if m.startswith("reads-")
                    for names in json.loads(text) for n in names if ":" in n})
    models = {}
    for name in sorted(p.stem for p in builtin_dir("models").glob("*.yaml")):
        spec = load_model(name)
        models[_digest(repr(spec))] = {n: repr(_value(spec, n)) for n in names}
    return {"sources": _sources_digest(), "names": names, "models": models}


def write_derived(members: dict[str, str], path: Path) -> None:
    path.write_text(json.dumps(derived_document(members), indent=1, sort_keys=True) + "\n")


def _jobs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 64:
        raise argparse.ArgumentTypeError(f"--jobs={text}: not a worker count; give 1 to 64")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ndplan.prebuild", description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=_jobs, default=os.cpu_count() or 1, help="worker processes, 1-64 (default: the cores)")
    ap.add_argument("--out", type=Path, default=prebuilt.STORE, help="the store to write (default: the package's)")
    ap.add_argument("--check", action="store_true", help="then rerun every case on the new store and count compiles")
    args = ap.parse_args(argv)
    if args.check and args.out != prebuilt.STORE:  # before the ten minutes of work
        ap.error("--check reads the package's store: drop --out or --check")
    first, rest = catalog_cases()
    phases = [[[c] for c in first], [[c] for c in rest], example_cases()]
    n_cases = sum(len(s) for p in phases for s in p)
    t0 = time.perf_counter()
    wrong = 0
    with tempfile.TemporaryDirectory() as cache:
        for i, seqs in enumerate(phases, 1):
            print(f"phase {i}/{len(phases)}: {len(seqs)} sequences", file=sys.stderr, flush=True)
            wrong += sum(len(r[2]) for r in run_all(seqs, cache, args.jobs, use_store=False))
        if wrong:
            print(f"{wrong} commands ended with an unexpected exit code: the store would miss their kernels; "
                  "fix them first", file=sys.stderr)
            return 1
        n = write_store(Path(cache), args.out, n_cases)
    print(f"wrote {args.out}: {n} kernels, {args.out.stat().st_size / 2**20:.2f} MiB, "
          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if args.check:
        with tempfile.TemporaryDirectory() as cache:
            results = run_all([s for p in phases for s in p], cache, args.jobs, use_store=True)
        missed = sum(r[0] for r in results)
        print(f"check: {missed} kernels compiled over {n_cases} cases with the new store", file=sys.stderr)
        return 1 if missed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
