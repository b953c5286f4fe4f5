"""``ndplan sweep`` and ``ndplan compare``: thin commands over ndplan.sweep.

A sweep runs in three steps: ``_prepare`` checks every option and loads what the run
needs (bad input fails there, before any candidate is evaluated), ``_run`` calls the
library (``sweep`` or ``find_min_gpus``), ``_output`` prints or writes what was asked.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import click
import numpy as np

from ndplan import cli_format
from ndplan.catalog import load_model
from ndplan.cli_emit import check_emit_out, emit_cli, emit_options, one_stdout
from ndplan.cli_options import MODEL, SEQ_OPTION, apply, apply_overrides, run_fields, run_options, with_activations
from ndplan.cli_types import BATCH, DEVICES, TOP, mem_limit_options
from ndplan.errors import NdplanError
from ndplan.estimate import estimate
from ndplan.labels import label
from ndplan.report import cli as report_cli
from ndplan.layouts import RANGE_TEXT
from ndplan.space import DIMS, load_space, normalize_space, why
from ndplan.sweep import SORT_KEYS, SweepResult, find_min_gpus, mem_limit, sweep
from ndplan.units import GIB, fmt_bytes, fmt_seconds


_DIM_HELP = {
    "uneven": "Uneven pipeline layouts: true, false or auto (both; even only for models whose dense and MoE "
              f"layers interleave). The family, per (pp, vpp): {RANGE_TEXT}. Megatron writes it as "
              "--decoder-first/last-pipeline-num-layers (or a --pipeline-model-parallel-layout under vpp), "
              "MindFormers as offsets, torchtitan as module names per stage.",
    "first_layers": "Decoder layers of pipeline stage 0 (even rows: L/pp): one value, a comma list, or auto (any).",
    "last_layers": "Decoder layers of the last pipeline stage (even rows: L/pp): one value, a comma list, or auto.",
}


def _dim_options(fn):
    for dim in reversed(DIMS):
        fn = click.option(f"--{dim.replace('_', '-')}", dim, default=None, metavar="V|V1,V2|auto",
                          help=_DIM_HELP.get(dim, f"Constrain {dim}: one value fixes it, a comma list enumerates it, "
                                                  "auto explores it."))(fn)
    return fn


def _space(space_file, kw: dict) -> dict:
    space = dict(load_space(space_file)) if space_file else {}
    for dim in DIMS:
        if kw.get(dim) is not None:
            space[dim] = kw[dim]
    normalize_space(space)
    return space


def _parse_point(text: str, field: str = "--why") -> dict:
    """``dim=value`` pairs (``"dp=8,tp=4,pp=2"``), one value per dimension."""
    point = {}
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise NdplanError(field, text, f"{item!r} is not a dim=value pair", "write e.g. \"dp=8,tp=4,pp=2\"")
        if name in point:
            raise NdplanError(field, text, f"{name} given twice", "give each dimension once")
        point[name] = value
    if not point:
        raise NdplanError(field, text, "no dim=value pairs", "write e.g. \"dp=8,tp=4,pp=2\"")
    try:
        normalize_space(point)
    except NdplanError as e:
        raise NdplanError(field, text, f"{e.field}={e.value!r}: {e.problem}", e.fix) from None
    return point


def _progress(n_groups: int, n_rows: int):
    """Tell the command's compile progress (cli_types.PROGRESS) how many candidate
    groups are evaluated; it prints only while kernels compile."""
    from ndplan import cli_types
    state = {"done": 0}

    def tick(k: int) -> None:
        state["done"] += k
        if cli_types.PROGRESS is not None:
            cli_types.PROGRESS.group_done(state["done"], n_groups)
    return tick


def _completions(r: SweepResult, point: dict) -> np.ndarray:
    """Rows of the ranked table that agree with every dimension the point gives."""
    given = {k: v for k, v in normalize_space(point).items() if v is not None}
    t = r.table
    match = np.ones(len(t), dtype=bool)
    for k, vals in given.items():
        col = t.grid[k]
        match &= np.isin(col.astype(str) if col.dtype == object else col, [str(v) if col.dtype == object else v
                                                                          for v in vals])
    return np.nonzero(match)[0]


def _why_report(r: SweepResult, model, space, text: str) -> str:
    """``--why``: the rule that rejects the point, or where its best completion ranks."""
    point = _parse_point(text)
    reason = why(model, r.gpus, r.seq, r.gbs, space, point, r.base.get("engine", "megatron"))
    if reason:
        return f"{text}: rejected by rule {reason}"
    t, idx = r.table, _completions(r, point)
    if not len(idx):
        return f"{text}: valid, but outside the swept space"
    best = int(idx[0])
    if best < r.feasible:
        return (f"{text}: feasible; best completion ranks #{best + 1} of {r.feasible} "
                f"({label(t.point(best))}: {t.peak_bytes[best] / GIB:.2f} GiB, {fmt_seconds(t.step_s[best])}); "
                f"{int((idx < r.feasible).sum())} of its {len(idx)} completions fit")
    low = int(idx[np.argmin(t.peak_bytes[idx])])
    return (f"{text}: infeasible by memory: all {len(idx)} completions exceed {fmt_bytes(r.mem_limit_bytes)}; "
            f"the smallest needs {fmt_bytes(t.peak_bytes[low])} ({label(t.point(low))})")


EMIT_TRIES = 1000
"""Ranked feasible candidates tried for --emit before giving up (each try renders the form)."""


def expressible(r: SweepResult, form: str, k: int) -> tuple[list[tuple[int, str]], NdplanError | None]:
    """The first ``k`` feasible candidates in rank order that ``form`` can express, as
    (0-based rank, rendered text), and the exporter's refusal of rank 1 when it refused it
    (the exporter's own checks decide: export/<format>.py)."""
    from ndplan.export import emit
    found, first_refusal = [], None
    for i in range(min(r.feasible, EMIT_TRIES)):
        try:
            found.append((i, emit(form, r.model, r.strategy(i))))
        except NdplanError as e:
            if i == 0:
                first_refusal = e
            continue
        if len(found) == k:
            break
    return found, first_refusal


def _emit(r: SweepResult, form: str, out: str | None, every: bool) -> bool:
    """--emit the best feasible candidate the format can express (or with --emit-all the top-k
    of them as DIR/rank<i><suffix>, i its rank in the sweep), saying on stderr when a better
    ranked one could not be written; True when the form went to stdout instead of the report."""
    from pathlib import Path

    from ndplan.export import SUFFIX
    found, refusal = expressible(r, form, len(r.top) if every else 1)
    if not found:
        raise NdplanError("--emit", form, f"none of the {min(r.feasible, EMIT_TRIES):,} best feasible candidates "
                          f"can be written as {form} (rank 1: {refusal.problem if refusal else 'refused'})",
                          "constrain the sweep to what the format runs (e.g. --schedule 1f1b --vpp 1)")
    if refusal is not None:
        click.echo(f"note: rank 1 cannot be written as {form} ({refusal.field}={refusal.value!r}: {refusal.problem}); "
                   f"{'the best that can is' if not every else 'written from'} rank {found[0][0] + 1:,}", err=True)
    if not every:
        i, text = found[0]
        return emit_cli(form, out, r.model, r.strategy(i), text=text)
    for i, text in found:
        emit_cli(form, str(Path(out) / f"rank{i + 1}{SUFFIX[form]}"), r.model, r.strategy(i), text=text)
    return False


def _check_options(gpus, min_gpus, as_json, as_csv, emit_fmt, emit_out, emit_all) -> None:
    """Before any work: the sweep's options fit together."""
    if emit_all and (emit_fmt is None or emit_out is None):
        raise NdplanError("--emit-all", True, "needs --emit FORMAT and --emit-out DIRECTORY", "give both")
    check_emit_out(emit_fmt, emit_out, directory=emit_all)
    one_stdout(json=as_json, csv=as_csv, emit=emit_fmt and not emit_out)
    if min_gpus and gpus is not None:
        raise NdplanError("--gpus", gpus, "given with --find-min-gpus, which chooses the device count",
                          "drop one of them")
    if gpus is None and not min_gpus:
        raise NdplanError("--gpus", None, "required", "give --gpus N (or --find-min-gpus)")


def _find_min_gpus(m, hw, seq, gbs, space, limit, base, sort, top, to_stderr: bool) -> SweepResult:
    """--find-min-gpus: each device count tried and the answer on stderr (stdout when text)."""
    r = find_min_gpus(m, hw, seq, gbs, space, **limit, base=base, sort=sort, top=top,
                      progress=lambda n: click.echo(f"trying {n:,} devices ...", err=True))
    nodes = r.gpus // hw.devices_per_node
    click.echo(f"smallest device count that fits: {r.gpus} ({nodes} node{'' if nodes == 1 else 's'} "
               f"of {hw.devices_per_node})", err=to_stderr)
    return r




@dataclass
class _Sweep:
    """A checked sweep request: everything ``_run`` and ``_output`` need."""
    model: object
    hardware: object
    space: dict
    base: dict
    limit: dict
    opts: dict
    """The command's options as click parsed them."""

    @property
    def to_stderr(self) -> bool:
        """Messages go to stderr when stdout carries --json or --csv."""
        return bool(self.opts["as_json"] or self.opts["as_csv"])


def _prepare(o: dict) -> _Sweep:
    """Step 1, before any work: every option checked, model, hardware and space loaded."""
    _check_options(o["gpus"], o["min_gpus"], o["as_json"], o["as_csv"], o["emit_fmt"], o["emit_out"], o["emit_all"])
    m = load_model(o["model"])
    hw, o["engine"] = apply_overrides(o["hardware"], o["engine"], o.pop("overrides"), o.pop("profile_path", None),
                                      m, o["seq"])
    limit = {"mem_limit_gib": o["mem_limit_gib"], "mem_fraction": o["mem_fraction"]}
    mem_limit(hw, o["mem_limit_gib"], o["mem_fraction"])
    space = _space(o["space_file"], o)
    if o["why_point"]:
        _parse_point(o["why_point"])
    m = with_activations(m, o["model"], o["activations"], o["flash"])  # the long part, after every check
    return _Sweep(m, hw, space, run_fields(o), limit, o)


def _run(job: _Sweep) -> SweepResult:
    """Step 2: the library's sweep (at the fewest devices that fit, with --find-min-gpus)."""
    o = job.opts
    if o["min_gpus"]:
        return _find_min_gpus(job.model, job.hardware, o["seq"], o["gbs"], job.space, job.limit, job.base, o["sort"],
                              o["top"], job.to_stderr)
    return sweep(job.model, job.hardware, o["gpus"], o["seq"], o["gbs"], job.space, top=o["top"], sort=o["sort"],
                 **job.limit, base=job.base, progress=_progress)


def _smallest(r: SweepResult):
    """The estimate of the smallest peak when nothing fits (None: no valid candidate)."""
    if not len(r.table):
        return None
    return estimate(r.model, r.hardware, r.strategy(int(np.argmin(r.table.peak_bytes))), r.gpus)


def _output(job: _Sweep, r: SweepResult) -> None:
    """Step 3: --why, --balance, --report, then one of --emit, --json, --csv or the text."""
    o, err = job.opts, job.to_stderr
    if o["why_point"]:
        click.echo(_why_report(r, job.model, job.space, o["why_point"]), err=err)
    if o["balance"]:
        from ndplan.ppb.rerank import rerank
        click.echo("\n".join(cli_format.balanced_lines(rerank(r.top, r.mem_limit_bytes))), err=err)
    report_cli.sweep(r, job.space, o)
    if o["emit_fmt"] and r.feasible and _emit(r, o["emit_fmt"], o["emit_out"], o["emit_all"]):
        pass
    elif o["as_json"]:
        click.echo(json.dumps(r.to_json(), indent=2))
    elif o["as_csv"]:
        click.echo(cli_format.sweep_csv(r), nl=False)
    elif not o["why_point"]:
        click.echo(cli_format.sweep_text(r, None if r.feasible else _smallest(r)))


SWEEP_OPTIONS = MODEL + [
    click.option("--gpus", "-n", type=DEVICES, default=None, help="Device count (required unless --find-min-gpus)."),
    SEQ_OPTION,
    click.option("--gbs", type=BATCH, required=True, help="Global batch, sequences."),
    click.option("--space", "space_file", type=click.Path(dir_okay=False), default=None,
                 help="Space YAML: dim: value | [values] | auto. Flags override it."),
    _dim_options, run_options, mem_limit_options,
    click.option("--top", type=TOP, default=5, show_default=True, help="How many ranked candidates to detail."),
    click.option("--sort", type=click.Choice(SORT_KEYS), default="time", show_default=True),
    click.option("--why", "why_point", default=None, metavar="\"dp=8,tp=4,pp=2\"",
                 help="Say why this point was rejected, or where its best completion ranked."),
    click.option("--find-min-gpus", "min_gpus", is_flag=True,
                 help="Find the fewest whole nodes on which something fits (instead of --gpus)."),
    click.option("--json", "as_json", is_flag=True,
                 help="JSON: candidates, top (estimate schema without time.hidden: estimate a row for it), pareto."),
    click.option("--csv", "as_csv", is_flag=True, help="CSV of every evaluated candidate, ranked."),
    click.option("--balance", is_flag=True, help="Balance the top candidates with pp > 1 (ndplan balance) and re-rank."),
    emit_options,
    click.option("--emit-all", is_flag=True, help="--emit the top candidates the format can express into the --emit-out "
                 "directory, as rank<i> files (i: the rank in the sweep)."),
    report_cli.report_option,
]


def register(main: click.Group) -> None:
    main.command("sweep")(apply(SWEEP_OPTIONS, sweep_cmd))
    main.command("compare")(apply(COMPARE_OPTIONS, compare_cmd))


def sweep_cmd(**opts):
    """Evaluate every valid strategy, drop what does not fit, rank the rest.

    Exit code 0 with results, 1 when nothing fits (the report says why), 2 for bad input.

    \b
    Examples:
      ndplan sweep -m llama3-70b -H h100-sxm --gpus 1024 --seq 8192 --gbs 1024
      ndplan sweep -m llama3-8b --gpus 64 --gbs 512 --tp 1,2 --recompute none --json
      ndplan sweep -m llama3-70b -H a100-80gb --gpus 64 --gbs 64 --why "dp=8,tp=8,pp=1"
      ndplan sweep -m llama3-70b -H a100-80gb --gpus 64 --gbs 64 --mem-fraction 0.9 --top 3
      ndplan sweep -m llama3-8b -H a100-80gb --gbs 256 --seq 4096 --find-min-gpus
      ndplan sweep -m llama3-8b --gpus 64 --gbs 512 --emit torchtitan --emit-all --emit-out configs
      ndplan sweep -m llama3.1-405b -H h100-sxm --gpus 2048 --seq 8192 --gbs 2048 --tp 8 --pp 16 --cp 1 \\
          --vpp 1 --zero 1 --schedule 1f1b --uneven true --top 3
    """
    job = _prepare(opts)
    r = _run(job)
    _output(job, r)
    if not r.feasible:
        sys.exit(1)


# --------------------------------------------------------------------------- compare

COMPARE_OPTIONS = MODEL + [
    click.option("--gpus", "-n", type=DEVICES, required=True, help="Device count."),
    SEQ_OPTION,
    click.option("--gbs", type=BATCH, required=True, help="Global batch, sequences."),
    run_options,
    click.option("--json", "as_json", is_flag=True),
    click.argument("strategies", nargs=-1, required=True),
]


def _compare_strategy(text: str, m, gpus: int, seq: int, gbs: int, base: dict):
    """One STRATEGY argument as a checked Strategy (points.strategy_from_point defaults)."""
    from ndplan.points import complete_point
    from ndplan.strategy import Strategy
    point = {k: v[0] for k, v in normalize_space(_parse_point(text, "STRATEGY")).items() if v is not None}
    p = complete_point({**point, "seq": seq, "gbs": gbs, **base}, gpus, context=f' of "{text}"')
    try:
        strat = Strategy(**p)
        strat.check(m, gpus)
    except NdplanError as e:
        raise NdplanError("STRATEGY", text, f"{e.field}={e.value!r}: {e.problem}", e.fix) from None
    return strat


def compare_cmd(model, hardware, gpus, seq, gbs, strategies, as_json, **kw):
    """Put named strategies side by side, with the terms that differ.

    Each STRATEGY is dim=value pairs; unspecified dims take estimate's defaults
    (dp = gpus/(tp*pp*cp), mbs 1, zero 1, recompute none, 1f1b; interleaved when vpp > 1).

    \b
    Example (LLaMA-70B on 64 A100):
      ndplan compare -m llama2-70b -H a100-80gb --gpus 64 --gbs 128 \\
          "dp=4,tp=8,pp=2" "dp=8,tp=8,pp=1,recompute=full"
    """
    m = load_model(model)
    hw, kw["engine"] = apply_overrides(hardware, kw["engine"], kw.pop("overrides"), kw.pop("profile_path", None),
                                       m, seq)
    base = run_fields(kw)
    # every strategy is checked before the first estimate compiles kernels
    strats = [_compare_strategy(text, m, gpus, seq, gbs, base) for text in strategies]
    m = with_activations(m, model, kw["activations"], kw["flash"])
    ests = [estimate(m, hw, s, gpus) for s in strats]
    rows = cli_format.compare_rows(ests)
    if as_json:
        click.echo(json.dumps({"strategies": list(strategies), "estimates": [e.to_json() for e in ests],
                               "differing_terms": [r[0] for r in rows if r[2]]}, indent=2))
        return
    click.echo(cli_format.compare_text(list(strategies), rows))
