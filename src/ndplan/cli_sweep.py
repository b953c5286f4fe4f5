"""``ndplan sweep`` and ``ndplan compare``: thin commands over ndplan.sweep."""

from __future__ import annotations

import csv
import io
import json
import sys

import click
import numpy as np

from ndplan.catalog import load_model
from ndplan.cli_emit import check_emit_out, emit_cli, emit_options, one_stdout
from ndplan.cli_types import BATCH, DEVICES, SEQ, TOP, mem_limit_options
from ndplan.errors import NdplanError
from ndplan.estimate import Estimate, estimate
from ndplan.space import DIMS, RULES, load_space, normalize_space, row_label, why
from ndplan.strategy import ENGINES
from ndplan.report import cli as report_cli
from ndplan.sweep import SORT_KEYS, SweepResult, find_min_gpus, mem_limit, sweep
from ndplan.units import GIB, fmt_bytes, fmt_seconds


PARETO_SHOWN = 12


def _dim_options(fn):
    for dim in reversed(DIMS):
        fn = click.option(f"--{dim}", dim, default=None, metavar="V|V1,V2|auto",
                          help=f"Constrain {dim}: one value fixes it, a comma list enumerates it, auto explores it.")(fn)
    return fn


def _base_options(fn):
    opts = [
        click.option("--engine", type=click.Choice(ENGINES), default="megatron", show_default=True),
        click.option("--flash/--no-flash", default=True, show_default=True, help="FlashAttention (no s^2 scores)."),
        click.option("--order", default="tp-cp-ep-dp-pp", show_default=True, help="Rank placement, innermost first."),
        click.option("--grad-dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True),
        click.option("--weight-dtype", type=click.Choice(["auto", "fp32", "bf16", "fp8"]), default="auto",
                     show_default=True),
        click.option("--set", "overrides", multiple=True, metavar="NAME=VALUE",
                     help="Override a hardware parameter or engine setting (e.g. gemm_efficiency=0.7, overlap_tp_comm=1)."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _base(kw: dict) -> dict:
    return {"engine": kw["engine"], "flash_attention": kw["flash"], "order": kw["order"],
            "grad_dtype": kw["grad_dtype"], "weight_dtype": kw["weight_dtype"]}


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


def _mem_terms(e: Estimate) -> str:
    st = max(e.per_stage, key=lambda s: s["peak_bytes"])
    parts = [f"{k.split('.', 1)[1]} {v / GIB:.1f}" for k, v in st["terms"].items() if v >= 0.05 * GIB]
    return f"stage {st['stage']}: " + ", ".join(parts) + " GiB"


def _time_terms(e: Estimate) -> str:
    return ", ".join(f"{k.split('.', 1)[1]} {fmt_seconds(v)}" for k, v in e.time_terms.items()
                     if v >= 0.005 * e.step_s)


def _print_text(r: SweepResult, top: int) -> None:
    c = r.candidates
    click.echo(f"{r.model.name} on {r.gpus} x {r.hardware.name}, seq {r.seq}, gbs {r.gbs}, "
               f"memory limit {fmt_bytes(r.mem_limit_bytes)}, sorted by {r.sort}")
    rej = ", ".join(f"{k} {v:,}" for k, v in sorted(c.rejected.items(), key=lambda kv: -kv[1]) if v)
    click.echo(f"candidates: {c.generated:,} generated, {sum(c.rejected.values()):,} rejected by rule ({rej}), "
               f"{r.infeasible:,} infeasible by memory, {r.feasible:,} feasible  [{r.elapsed_s:.2f} s]")
    if not r.feasible:
        _print_nothing_fits(r)
        return
    click.echo("")
    head = f"{'#':>3}  {'strategy':<72} {'peak GiB':>8} {'step':>10} {'MFU':>6} {'tok/s/dev':>9}"
    click.echo(head)
    for i, e in enumerate(r.top):
        p = r.table.point(i)
        click.echo(f"{i + 1:>3}  {row_label(p):<72} {e.peak_bytes / GIB:>8.2f} {fmt_seconds(e.step_s):>10} "
                   f"{e.mfu:>6.1%} {e.tokens_per_s:>9,.0f}")
        click.echo(f"       memory  {_mem_terms(e)}")
        click.echo(f"       time    {_time_terms(e)}")
    click.echo("")
    front = sorted(r.pareto, key=lambda j: r.table.peak_bytes[j])
    shown = front if len(front) <= PARETO_SHOWN else [front[round(k * (len(front) - 1) / (PARETO_SHOWN - 1))]
                                                      for k in range(PARETO_SHOWN)]
    more = "" if len(shown) == len(front) else f", {len(shown)} shown evenly; --json or --csv for all"
    click.echo(f"Pareto front, peak memory vs step time ({len(front)} points{more}; rank = row of --csv, "
               f"of {r.feasible:,} feasible):")
    for i in shown:
        click.echo(f"  {r.table.peak_bytes[i] / GIB:>7.2f} GiB  {fmt_seconds(r.table.step_s[i]):>10}  "
                   f"{row_label(r.table.point(i))}  (rank {i + 1:,})")
    click.echo("MFU: 3 x forward GEMM + causal attention FLOPs per step (no recompute) / (step x devices x bf16 peak)")


def _print_nothing_fits(r: SweepResult) -> None:
    c = r.candidates
    if not len(r.table):
        worst = max(c.rejected.items(), key=lambda kv: kv[1])
        click.echo(f"nothing fits: every candidate was rejected by a rule; most by '{worst[0]}' ({worst[1]:,}). "
                   f"Rules: " + "; ".join(f"{n}: {d}" for n, d in RULES))
        return
    i = int(np.argmin(r.table.peak_bytes))
    e = estimate(r.model, r.hardware, r.strategy(i), r.gpus)
    st = max(e.per_stage, key=lambda s: s["peak_bytes"])
    big = max(st["terms"].items(), key=lambda kv: kv[1])
    click.echo(f"nothing fits in {fmt_bytes(r.mem_limit_bytes)}: the smallest peak is {fmt_bytes(e.peak_bytes)} "
               f"({row_label(r.table.point(i))}), largest term {big[0]} {fmt_bytes(big[1])} on stage {st['stage']}. "
               "Try more devices (--find-min-gpus), a smaller --gbs/--seq, or allow recompute/zero/cp.")


def _csv(r: SweepResult) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    cols = ["dp", "tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "m", "zero", "sp", "recompute", "schedule"]
    terms = list(r.table.time_terms)
    w.writerow(["rank", *cols, "fits", "peak_bytes", "step_s", "mfu", "tokens_per_s_per_device", *terms])
    t = r.table
    mfu = r.mfu(t.step_s)
    for i in range(len(t)):
        p = t.point(i)
        w.writerow([i + 1, *[p[c] for c in cols], i < r.feasible, int(t.peak_bytes[i]), f"{t.step_s[i]:.6g}",
                    f"{mfu[i]:.4f}", f"{r.gbs * r.seq / t.step_s[i] / r.gpus:.6g}",
                    *[f"{t.time_terms[k][i]:.6g}" for k in terms]])
    return out.getvalue()


def _why_report(r: SweepResult, model, space, text: str) -> str:
    point = _parse_point(text)
    reason = why(model, r.gpus, r.seq, r.gbs, space, point)
    if reason:
        return f"{text}: rejected by rule {reason}"
    given = {k: v for k, v in normalize_space(point).items() if v is not None}
    t = r.table
    match = np.ones(len(t), dtype=bool)
    for k, vals in given.items():
        col = t.grid[k]
        match &= np.isin(col.astype(str) if col.dtype == object else col, [str(v) if col.dtype == object else v
                                                                          for v in vals])
    idx = np.nonzero(match)[0]
    if not len(idx):
        return f"{text}: valid, but outside the swept space"
    best = int(idx[0])
    if best < r.feasible:
        return (f"{text}: feasible; best completion ranks #{best + 1} of {r.feasible} "
                f"({row_label(t.point(best))}: {t.peak_bytes[best] / GIB:.2f} GiB, {fmt_seconds(t.step_s[best])}); "
                f"{int((idx < r.feasible).sum())} of its {len(idx)} completions fit")
    low = int(idx[np.argmin(t.peak_bytes[idx])])
    return (f"{text}: infeasible by memory: all {len(idx)} completions exceed {fmt_bytes(r.mem_limit_bytes)}; "
            f"the smallest needs {fmt_bytes(t.peak_bytes[low])} ({row_label(t.point(low))})")


def _print_balanced(r: SweepResult, to_stderr: bool) -> None:
    from ndplan.ppb.rerank import rerank
    click.echo("balanced (ndplan balance on each top candidate with pp > 1), re-ranked:", err=to_stderr)
    for i, b in enumerate(rerank(r.top, r.mem_limit_bytes), 1):
        tag = f"not balanced (pp={b.estimate.strategy.pp}, {b.estimate.strategy.schedule})" if b.solution is None else f"{b.solution.status}, was {fmt_seconds(b.estimate.step_s)}"
        click.echo(f"{i:>3}. {fmt_seconds(b.step_s):<10} {row_label(b.estimate.strategy.as_dict())}  [{tag}]",
                   err=to_stderr)


def _emit(r: SweepResult, fmt: str, out: str | None, every: bool) -> bool:
    """--emit the top-1 (or with --emit-all every top candidate as DIR/rank<i><suffix>);
    True when the form went to stdout instead of the report."""
    from pathlib import Path

    from ndplan.export import SUFFIX
    if not every:
        return emit_cli(fmt, out, r.model, r.top[0].strategy)
    for i, e in enumerate(r.top, 1):
        emit_cli(fmt, str(Path(out) / f"rank{i}{SUFFIX[fmt]}"), r.model, e.strategy)
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


def register(main: click.Group, apply_overrides) -> None:
    _register_sweep(main, apply_overrides)
    _register_compare(main, apply_overrides)


def _register_sweep(main: click.Group, apply_overrides) -> None:
    @main.command("sweep")
    @click.option("--model", "-m", required=True, help="Catalog name, model YAML, or HF model dir/config.json.")
    @click.option("--hardware", "-H", default="h100-sxm", show_default=True, help="Catalog name or hardware YAML.")
    @click.option("--gpus", "-n", type=DEVICES, default=None, help="Device count (required unless --find-min-gpus).")
    @click.option("--seq", type=SEQ, default=4096, show_default=True, help="Sequence length, tokens.")
    @click.option("--gbs", type=BATCH, required=True, help="Global batch, sequences.")
    @click.option("--space", "space_file", type=click.Path(dir_okay=False), default=None,
                  help="Space YAML: dim: value | [values] | auto. Flags override it.")
    @_dim_options
    @_base_options
    @mem_limit_options
    @click.option("--top", type=TOP, default=5, show_default=True, help="How many ranked candidates to detail.")
    @click.option("--sort", type=click.Choice(SORT_KEYS), default="time", show_default=True)
    @click.option("--why", "why_point", default=None, metavar="\"dp=8,tp=4,pp=2\"",
                  help="Say why this point was rejected, or where its best completion ranked.")
    @click.option("--find-min-gpus", "min_gpus", is_flag=True,
                  help="Find the fewest whole nodes on which something fits (instead of --gpus).")
    @click.option("--json", "as_json", is_flag=True, help="JSON: candidates, top (estimate schema), pareto.")
    @click.option("--csv", "as_csv", is_flag=True, help="CSV of every evaluated candidate, ranked.")
    @click.option("--balance", is_flag=True, help="Balance the top candidates with pp > 1 (ndplan balance) and re-rank.")
    @emit_options
    @click.option("--emit-all", is_flag=True, help="--emit every top candidate into the --emit-out directory.")
    @report_cli.report_option
    def sweep_cmd(model, hardware, gpus, seq, gbs, space_file, mem_limit_gib, mem_fraction, top, sort, why_point,
                  min_gpus, as_json, as_csv, balance, emit_fmt, emit_out, emit_all, **kw):
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
        """
        _check_options(gpus, min_gpus, as_json, as_csv, emit_fmt, emit_out, emit_all)
        m = load_model(model)
        hw, kw["engine"] = apply_overrides(hardware, kw["engine"], kw.pop("overrides"))
        mem_limit(hw, mem_limit_gib, mem_fraction)
        space = _space(space_file, kw)
        base = _base(kw)
        if why_point:
            _parse_point(why_point)
        limit = {"mem_limit_gib": mem_limit_gib, "mem_fraction": mem_fraction}
        if min_gpus:
            r = _find_min_gpus(m, hw, seq, gbs, space, limit, base, sort, top, to_stderr=as_json or as_csv)
        else:
            r = sweep(m, hw, gpus, seq, gbs, space, top=top, sort=sort, **limit, base=base, progress=_progress)
        if why_point:
            click.echo(_why_report(r, m, space, why_point), err=as_json or as_csv)
        if balance:
            _print_balanced(r, as_json or as_csv)
        report_cli.sweep(r, space, kw)
        if emit_fmt and r.feasible and _emit(r, emit_fmt, emit_out, emit_all):
            pass
        elif as_json:
            click.echo(json.dumps(r.to_json(), indent=2))
        elif as_csv:
            click.echo(_csv(r), nl=False)
        elif not why_point:
            _print_text(r, top)
        if not r.feasible:
            sys.exit(1)


def _register_compare(main: click.Group, apply_overrides) -> None:
    @main.command("compare")
    @click.option("--model", "-m", required=True, help="Catalog name, model YAML, or HF model dir/config.json.")
    @click.option("--hardware", "-H", default="h100-sxm", show_default=True, help="Catalog name or hardware YAML.")
    @click.option("--gpus", "-n", type=DEVICES, required=True, help="Device count.")
    @click.option("--seq", type=SEQ, default=4096, show_default=True, help="Sequence length, tokens.")
    @click.option("--gbs", type=BATCH, required=True, help="Global batch, sequences.")
    @_base_options
    @click.option("--json", "as_json", is_flag=True)
    @click.argument("strategies", nargs=-1, required=True)
    def compare_cmd(model, hardware, gpus, seq, gbs, strategies, as_json, **kw):
        """Put named strategies side by side, with the terms that differ.

        Each STRATEGY is dim=value pairs; unspecified dims take estimate's defaults
        (dp = gpus/(tp*pp*cp), mbs 1, zero 1, recompute none, 1f1b).

        \b
        Example (LLaMA-70B on 64 A100):
          ndplan compare -m llama2-70b -H a100-80gb --gpus 64 --gbs 128 \\
              "dp=4,tp=8,pp=2" "dp=8,tp=8,pp=1,recompute=full"
        """
        from ndplan.sweep import row_strategy
        m = load_model(model)
        hw, kw["engine"] = apply_overrides(hardware, kw["engine"], kw.pop("overrides"))
        base = _base(kw)
        ests = []
        for text in strategies:
            point = _parse_point(text, "STRATEGY")
            p = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "etp": 1, "vpp": 1, "mbs": 1, "zero": 1, "sp": True,
                 "recompute": "none", "schedule": None}
            for k, v in normalize_space(point).items():
                if v is not None:
                    p[k] = v[0]
            if "dp" not in p or p.get("dp") is None:
                rest = p["tp"] * p["pp"] * p["cp"]
                if gpus % rest:
                    raise NdplanError("--gpus", gpus, f"not divisible by tp*pp*cp={rest} of \"{text}\"",
                                      "change the strategy's degrees or --gpus")
                p["dp"] = gpus // rest
            p["schedule"] = p["schedule"] or ("interleaved" if p["vpp"] > 1 else "1f1b")
            try:
                strat = row_strategy(p, seq, gbs, base)
                strat.check(m, gpus)
            except NdplanError as e:
                raise NdplanError("STRATEGY", text, f"{e.field}={e.value!r}: {e.problem}", e.fix) from None
            ests.append(strat)  # every strategy is checked before the first estimate compiles kernels
        ests = [estimate(m, hw, s, gpus) for s in ests]
        rows = _compare_rows(ests)
        if as_json:
            click.echo(json.dumps({"strategies": list(strategies), "estimates": [e.to_json() for e in ests],
                                   "differing_terms": [r[0] for r in rows if r[2]]}, indent=2))
            return
        width = max(22, *(len(s) for s in strategies))
        click.echo(f"{'':<24}" + "".join(f"{s:>{width + 2}}" for s in strategies))
        for name, cells, differs in rows:
            mark = "*" if differs else " "
            click.echo(f"{mark} {name:<22}" + "".join(f"{c:>{width + 2}}" for c in cells))
        click.echo("* = differs between the strategies")


def _compare_rows(ests: list[Estimate]) -> list[tuple[str, list[str], bool]]:
    def row(name, vals, fmt):
        differs = len({round(v, 9) if isinstance(v, float) else v for v in vals}) > 1
        return (name, [fmt(v) for v in vals], differs)

    rows = [row("fits", [e.fits for e in ests], str),
            row("peak memory", [e.peak_bytes / GIB for e in ests], lambda v: f"{v:.2f} GiB"),
            row("peak stage", [e.peak_stage for e in ests], str),
            row("step time", [e.step_s for e in ests], fmt_seconds),
            row("MFU", [e.mfu for e in ests], lambda v: f"{v:.1%}"),
            row("tokens/s/device", [e.tokens_per_s for e in ests], lambda v: f"{v:,.0f}")]
    for key in dict.fromkeys(k for e in ests for k in e.per_stage[0]["terms"]):
        vals = [max(s["terms"].get(key, 0) for s in e.per_stage) / GIB for e in ests]
        rows.append(row(key + " (max)", vals, lambda v: f"{v:.2f} GiB"))
    for key in ests[0].time_terms:
        rows.append(row(key, [e.time_terms[key] for e in ests], fmt_seconds))
    return rows
