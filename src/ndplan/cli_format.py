"""Text the commands print: tables and summaries of estimates, sweeps and comparisons.

Functions here return strings (or lines) and print nothing; the commands echo them.
Strategies are written by ``labels.label`` only.
"""

from __future__ import annotations

from ndplan.labels import label
from ndplan.units import GIB, fmt_bytes, fmt_count, fmt_seconds
from ndplan.throughput import tokens_per_s_per_device

MFU_NOTE = "MFU: 3 x forward GEMM + causal attention FLOPs, no recompute, over bf16 dense peak"


def _short(key: str) -> str:
    """``mem.activations`` -> ``activations``."""
    return key.split(".", 1)[1]


def columns(rows: list[list[str]]) -> str:
    """Rows of cells, right-aligned in columns two spaces apart (the first row a header)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)


def stage_table(est) -> str:
    """Per-stage peak, static, dynamic and every memory term, GiB, one row per stage."""
    keys = list(est.per_stage[0]["terms"])
    head = ["stage", "peak GiB", "static", "dynamic"] + [_short(k) for k in keys]
    rows = [[str(r["stage"]), f"{r['peak_bytes'] / GIB:.2f}", f"{r['static_bytes'] / GIB:.2f}",
             f"{r['dynamic_bytes'] / GIB:.2f}"] + [f"{r['terms'][k] / GIB:.2f}" for k in keys]
            for r in est.per_stage]
    return columns([head] + rows)


def time_summary(est) -> str:
    """Step time with its 95 % band (ndplan.bands), MFU/HFU, tokens/s and the non-zero time
    terms, three lines."""
    from ndplan.bands import band
    parts = ", ".join(f"{_short(k)} {fmt_seconds(v)}" for k, v in est.time_terms.items() if v > 5e-7)
    return (f"step {fmt_seconds(est.step_s)} (95% band {_band(band(est))} from the time constants)  "
            f"MFU {est.mfu:.1%}  HFU {est.hfu:.1%}  "
            f"{est.tokens_per_s:,.0f} tokens/s/device\n  time: {parts}\n{overlap_line(est)}  ({MFU_NOTE})")


def overlap_line(est) -> str:
    """The collectives per axis as exposed (in the step) + hidden (under compute) seconds, one
    line, or nothing when the step runs no collective."""
    axes = []
    for axis in ("tp", "cp", "ep", "dp", "pp"):
        shown, hidden = est.time_terms.get(f"time.{axis}_comm", 0.0), est.hidden_terms.get(f"hidden.{axis}_comm", 0.0)
        if shown + hidden > 5e-7:
            axes.append(f"{axis} {fmt_seconds(shown)} + {fmt_seconds(hidden)}")
    again = ("; a full recompute's exposed collectives are inside recompute"
             if est.strategy.recompute == "full" and axes else "")
    return f"  communication, exposed + hidden under compute: {', '.join(axes)}{again}\n" if axes else ""


def estimate_text(est, model, hw, strat) -> str:
    """``ndplan estimate``'s report: the plan, the stage table, the verdict, the time."""
    active = f", {fmt_count(est.params_active)} active" if est.params_active else ""
    verdict = "fits" if est.fits else "DOES NOT FIT"
    host = f"; host {fmt_bytes(est.host_bytes)} per device" if est.host_bytes else ""
    return "\n".join([
        f"{model.name} ({model.architecture}; {fmt_count(est.params_total)} params{active}) on {hw.name} "
        f"x {strat.world}: {label(strat, full=True)}",
        stage_table(est),
        f"peak {fmt_bytes(est.peak_bytes)} on stage {est.peak_stage} of {hw.hbm_gib:g} GiB HBM: {verdict}{host}",
        memory_lines(est),
        time_summary(est)])


def memory_lines(est) -> str:
    """The peak stage's allocated and reserved memory and what the verdict compares."""
    st = max(est.per_stage, key=lambda s: s["peak_bytes"])
    alloc, res = st["allocated_bytes"], st["reserved_bytes"]
    reserve = fmt_bytes(st["terms"].get("mem.reserve", 0))
    if res <= alloc:
        return (f"  allocated {fmt_bytes(alloc)} (live tensors; no allocator slack: the engine's measured peaks are "
                f"its own memory pool's); the verdict compares HBM with it + {reserve} engine reserve = the peak")
    return (f"  allocated {fmt_bytes(alloc)} (live tensors, torch max_memory_allocated); reserved ~{fmt_bytes(res)} "
            f"(+{(res - alloc) / alloc:.1%} caching-allocator slack, max_memory_reserved);\n  the verdict compares "
            f"HBM with reserved + {reserve} engine reserve (CUDA context, NCCL) = the peak")


def explained_text(it, latex: bool) -> str:
    """One ``ndplan explain`` item: value, unit and note, formula, source, a blank line."""
    if it.unit == "bytes":
        val = fmt_bytes(it.value)
    elif it.unit == "count":
        val = fmt_count(it.value) + f" ({int(it.value):,})"
    elif it.unit == "s":
        val = fmt_seconds(it.value)
    else:
        val = f"{it.value:g} {it.unit}"
    note = f"; {it.note}" if it.note else ""
    return (f"{it.key} = {val}   [{it.unit}{note}]\n  = {it.latex if latex else it.formula}\n"
            f"  source: {it.source}\n")


def models_lines(rows: list[dict]) -> list[str]:
    return [f"{r['name']:<18} {fmt_count(r['params_total']):>9}  {r['layers']:>3} layers  h={r['hidden_size']:<6} "
            f"{r['architecture']}" for r in rows]


def hardware_lines(rows: list[dict]) -> list[str]:
    name_w = max((len(x["name"]) for x in rows), default=0)
    out = []
    for r in rows:
        flag = f"  unverified: {', '.join(r['unverified'])}" if r["unverified"] else ""
        link = f"{r['intra_node_gb_per_s']:g}/{r['inter_node_gb_per_s']:g}"
        out.append(f"{r['name']:<{name_w}} {r['bf16_tflops']:>7g} TFLOPS bf16 (GEMMs at {r['gemm_efficiency']:.0%})  "
                   f"{r['hbm_gib']:>5g} GiB  {link:>8} GB/s intra/inter  {r['devices_per_node']:>2}/node  "
                   f"{r['display_name']}{flag}")
    return out


# --------------------------------------------------------------------------- sweep

PARETO_SHOWN = 12
SWEEP_MFU_NOTE = ("MFU: 3 x forward GEMM + causal attention FLOPs per step (no recompute) / "
                  "(step x devices x bf16 peak)")
CSV_COLUMNS = ["dp", "tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "m", "zero", "sp", "recompute", "schedule"]


def _mem_terms(e) -> str:
    st = max(e.per_stage, key=lambda s: s["peak_bytes"])
    parts = [f"{_short(k)} {v / GIB:.1f}" for k, v in st["terms"].items() if v >= 0.05 * GIB]
    return f"stage {st['stage']}: " + ", ".join(parts) + " GiB"


def _time_terms(e) -> str:
    return ", ".join(f"{_short(k)} {fmt_seconds(v)}" for k, v in e.time_terms.items() if v >= 0.005 * e.step_s)


def sweep_head(r) -> list[str]:
    """What was swept and how the candidates split (generated, rejected, infeasible, feasible)."""
    c = r.candidates
    rej = ", ".join(f"{k} {v:,}" for k, v in sorted(c.rejected.items(), key=lambda kv: -kv[1]) if v)
    return [f"{r.model.name} on {r.gpus} x {r.hardware.name}, seq {r.seq}, gbs {r.gbs}, "
            f"memory limit {fmt_bytes(r.mem_limit_bytes)}, sorted by {r.sort}",
            f"candidates: {c.generated:,} generated, {sum(c.rejected.values()):,} rejected by rule ({rej}), "
            f"{r.infeasible:,} infeasible by memory, {r.feasible:,} feasible  [{r.elapsed_s:.2f} s]"]


TIE_NOTE = ("= : tied with #1: their difference lies inside its 95 % band from the time constants' uncertainty "
            "(ndplan.bands), so the choice among them does not matter at that uncertainty; the order stays the "
            "point estimates'. Bands leave out the model's structural error.")


def _band(b) -> str:
    return f"{fmt_seconds(b.low_s)}-{fmt_seconds(b.high_s)}" if b else ""


def top_lines(r) -> list[str]:
    """The top candidates: label, peak, step and its 95 % band, MFU, tokens/s, then their memory and
    time terms; ``=`` marks the candidates tied with the first (TIE_NOTE)."""
    labels = [label(r.table.point(i)) for i in range(len(r.top))]
    w = max([len("strategy"), *map(len, labels)])
    bands = r.bands or [None] * len(r.top)
    tied = r.tied or [False] * len(r.top)
    bw = max([len("95% band"), *(len(_band(b)) for b in bands)])
    out = [f"{'#':>4}  {'strategy':<{w}} {'peak GiB':>8} {'step':>10} {'95% band':>{bw}} {'MFU':>6} {'tok/s/dev':>9}"]
    for i, (e, text, b, t) in enumerate(zip(r.top, labels, bands, tied)):
        mark = "=" if t and i else " "
        out += [f"{mark}{i + 1:>3}  {text:<{w}} {e.peak_bytes / GIB:>8.2f} {fmt_seconds(e.step_s):>10} "
                f"{_band(b):>{bw}} {e.mfu:>6.1%} {e.tokens_per_s:>9,.0f}",
                f"        memory  {_mem_terms(e)}", f"        time    {_time_terms(e)}"]
    if any(tied[1:]):
        out.append(TIE_NOTE)
    return out


def pareto_lines(r) -> list[str]:
    """The memory / step-time front, at most PARETO_SHOWN points spread evenly along it."""
    t = r.table
    front = sorted(r.pareto, key=lambda j: t.peak_bytes[j])
    n = PARETO_SHOWN
    shown = front if len(front) <= n else [front[round(k * (len(front) - 1) / (n - 1))] for k in range(n)]
    more = "" if len(shown) == len(front) else f", {len(shown)} shown evenly; --json or --csv for all"
    return [f"Pareto front, peak memory vs step time ({len(front)} points{more}; rank = row of --csv, "
            f"of {r.feasible:,} feasible):"] + [
        f"  {t.peak_bytes[i] / GIB:>7.2f} GiB  {fmt_seconds(t.step_s[i]):>10}  {label(t.point(i))}  (rank {i + 1:,})"
        for i in shown]


def sweep_text(r, smallest=None) -> str:
    """``ndplan sweep``'s report; ``smallest`` is the estimate of the smallest peak when
    nothing fits (None: every candidate was rejected by a rule)."""
    lines = sweep_head(r)
    if not r.feasible:
        return "\n".join(lines + [nothing_fits(r, smallest)])
    return "\n".join(lines + [""] + top_lines(r) + [""] + pareto_lines(r) + [SWEEP_MFU_NOTE])


def nothing_fits(r, smallest) -> str:
    """Why nothing fits: the rule that rejected most, or the smallest peak and its largest term."""
    from ndplan.space import RULES
    c = r.candidates
    if smallest is None:
        worst = max(c.rejected.items(), key=lambda kv: kv[1])
        return (f"nothing fits: every candidate was rejected by a rule; most by '{worst[0]}' ({worst[1]:,}). "
                "Rules: " + "; ".join(f"{n}: {d}" for n, d in RULES))
    st = max(smallest.per_stage, key=lambda s: s["peak_bytes"])
    big = max(st["terms"].items(), key=lambda kv: kv[1])
    return (f"nothing fits in {fmt_bytes(r.mem_limit_bytes)}: the smallest peak is {fmt_bytes(smallest.peak_bytes)} "
            f"({label(smallest.strategy)}), largest term {big[0]} {fmt_bytes(big[1])} on stage {st['stage']}. "
            "Try more devices (--find-min-gpus), a smaller --gbs/--seq, or allow recompute/zero/cp.")


def sweep_csv(r) -> str:
    """Every evaluated candidate, ranked: strategy columns, fits, peak, step, MFU, tokens/s, time terms."""
    import csv
    import io
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    t = r.table
    terms = list(t.time_terms)
    w.writerow(["rank", *CSV_COLUMNS, "fits", "peak_bytes", "step_s", "mfu", "tokens_per_s_per_device", *terms])
    mfu = r.mfu(t.step_s)
    for i in range(len(t)):
        p = t.point(i)
        w.writerow([i + 1, *[p[c] for c in CSV_COLUMNS], i < r.feasible, int(t.peak_bytes[i]), f"{t.step_s[i]:.6g}",
                    f"{mfu[i]:.4f}", f"{tokens_per_s_per_device(r.gbs, r.seq, t.step_s[i], r.gpus):.6g}",
                    *[f"{t.time_terms[k][i]:.6g}" for k in terms]])
    return out.getvalue()


OWN_SPLIT_NOTE = 0.01
"""``sweep --balance`` says why a balanced step and the estimate differ when PPB's replay of the
estimate's own split is this share away from the estimate (the two model the bubble differently)."""


def balanced_lines(reranked) -> list[str]:
    """``sweep --balance``: the re-ranked candidates, balanced or why not."""
    out = ["balanced (ndplan balance on each top candidate with pp > 1), re-ranked:"]
    for i, b in enumerate(reranked, 1):
        s = b.estimate.strategy
        tag = (f"not balanced (pp={s.pp}, {s.schedule})" if b.solution is None
               else f"{b.solution.status}, was {fmt_seconds(b.estimate.step_s)}")
        if b.own_split_s is not None and abs(b.own_split_s - b.estimate.step_s) > OWN_SPLIT_NOTE * b.estimate.step_s:
            tag += (f"; its own split replays at {fmt_seconds(b.own_split_s)}: the estimate's bubble is "
                    f"formulas/step.py's closed form, the replay {s.schedule}'s op order on these F, B, W")
        out.append(f"{i:>3}. {fmt_seconds(b.step_s):<10} {label(s)}  [{tag}]")
    return out


# --------------------------------------------------------------------------- compare

def compare_rows(ests: list) -> list[tuple[str, list[str], bool]]:
    """(name, cells, differs) of every compared quantity: verdict, peak, step, MFU, terms."""
    def row(name, vals, fmt):
        differs = len({round(v, 9) if isinstance(v, float) else v for v in vals}) > 1
        return (name, [fmt(v) for v in vals], differs)

    gib = lambda v: f"{v:.2f} GiB"  # noqa: E731
    rows = [row("fits", [e.fits for e in ests], str),
            row("peak memory", [e.peak_bytes / GIB for e in ests], gib),
            row("peak stage", [e.peak_stage for e in ests], str),
            row("step time", [e.step_s for e in ests], fmt_seconds),
            row("MFU", [e.mfu for e in ests], lambda v: f"{v:.1%}"),
            row("tokens/s/device", [e.tokens_per_s for e in ests], lambda v: f"{v:,.0f}")]
    for key in dict.fromkeys(k for e in ests for k in e.per_stage[0]["terms"]):
        vals = [max(s["terms"].get(key, 0) for s in e.per_stage) / GIB for e in ests]
        rows.append(row(key + " (max)", vals, gib))
    for key in ests[0].time_terms:
        rows.append(row(key, [e.time_terms[key] for e in ests], fmt_seconds))
    return rows


def compare_text(names: list[str], rows) -> str:
    """The compared strategies side by side, ``*`` on the rows that differ."""
    width = max(22, *(len(s) for s in names))
    lines = [f"{'':<24}" + "".join(f"{s:>{width + 2}}" for s in names)]
    for name, cells, differs in rows:
        lines.append(f"{'*' if differs else ' '} {name:<22}" + "".join(f"{c:>{width + 2}}" for c in cells))
    return "\n".join(lines + ["* = differs between the strategies"])
