"""Figures with matplotlib (optional: ``pip install 'ndplan[plot]'``).

Each function returns a ``matplotlib.figure.Figure`` built without pyplot (no global
state, no backend switch), so notebooks can show it and reports can save it;
``to_png`` gives the bytes. Nothing here computes a quantity: bars, points and boxes
are the Estimate's terms, the sweep's table and the PPB replay's ops."""

from __future__ import annotations

import io

import numpy as np

from ndplan.vocab import STATIC_KEYS
from ndplan.ppb.simulate import SimResult
from ndplan.ppb.svg import COLORS
from ndplan.labels import label
from ndplan.units import GIB

from ndplan.report.notes import PLOT_MISSING  # noqa: F401  (re-exported)


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(w: float, h: float, rows: int = 1, cols: int = 1, **kw):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(w, h), layout="constrained")
    return fig, fig.subplots(rows, cols, squeeze=False, **kw)


def to_png(fig, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _short(key: str) -> str:
    return key.split(".", 1)[1]


def memory_bars(ests: list, labels: list[str] | None = None, limit_bytes: float | None = None):
    """Stacked bars in GiB: left, every stage of ``ests[0]``; right (when there are more
    estimates), the peak stage of each. Static terms hatched, dynamic terms solid."""
    from matplotlib import colormaps
    keys = list(dict.fromkeys(k for e in ests for r in e.per_stage for k, v in r["terms"].items() if v > 0))
    cmap = colormaps["tab20"]
    color = {k: cmap(i % 20) for i, k in enumerate(keys)}
    panels = [("stages of the chosen plan", [f"stage {r['stage']}" for r in ests[0].per_stage], ests[0].per_stage)]
    if len(ests) > 1:
        peak_rows = [max(e.per_stage, key=lambda r: r["peak_bytes"]) for e in ests]
        names = labels or [f"#{i + 1}" for i in range(len(ests))]
        panels.append(("peak stage of each candidate", names, peak_rows))
    fig, axes = _figure(5.0 * len(panels) + 1.5, 4.2, 1, len(panels))
    for ax, (title, names, rows) in zip(axes[0], panels):
        bottom = np.zeros(len(rows))
        for k in keys:
            vals = np.array([r["terms"].get(k, 0) for r in rows], dtype=float) / GIB
            if not vals.any():
                continue
            static = k in STATIC_KEYS
            ax.bar(names, vals, bottom=bottom, color=color[k], hatch="//" if static else None,
                   edgecolor="white", label=f"{_short(k)} ({'static' if static else 'dynamic'})")
            bottom += vals
        if limit_bytes:
            ax.axhline(limit_bytes / GIB, color="black", linestyle="--", linewidth=1, label="memory limit")
        ax.set_title(title)
        ax.set_ylabel("GiB per device")
        ax.tick_params(axis="x", labelrotation=30 if len(names) > 4 else 0)
    handles, names = axes[0][0].get_legend_handles_labels()
    seen = dict(zip(names, handles))
    for ax in axes[0][1:]:
        h, n = ax.get_legend_handles_labels()
        seen |= dict(zip(n, h))
    fig.legend(seen.values(), seen.keys(), loc="outside right upper", fontsize=8)
    return fig


PARETO_Y_CAP = 1.5
"""The Pareto figure's memory axis ends at this many memory limits when candidates go higher."""
PARETO_Y_MIN = 1.35
"""... and at least this many: room above the limit line for the chosen plan's label."""


def pareto_ylim(peak_bytes, feasible: int, limit_bytes: float) -> float:
    """Top of the Pareto figure's memory axis, in bytes: ``PARETO_Y_CAP`` x the limit
    when some candidate lies above that, else the highest candidate plus 5 %, but at
    least ``PARETO_Y_MIN`` x the limit. Never below the highest feasible point plus 5 %
    (the front and the chosen plan are feasible)."""
    peak = np.asarray(peak_bytes, dtype=float)
    high = float(peak.max()) if len(peak) else 0.0
    top = PARETO_Y_CAP * limit_bytes if high > PARETO_Y_CAP * limit_bytes else max(PARETO_Y_MIN * limit_bytes,
                                                                                    1.05 * high)
    if feasible:
        top = max(top, 1.05 * float(peak[:feasible].max()))
    return top


def pareto_plot(res, chosen: int = 0):
    """Peak memory vs step time of every evaluated candidate of a SweepResult: feasible
    (grey), over the limit (light red), the Pareto front (line), ``chosen`` (star, its
    strategy written beside it, above the limit line where only infeasible points lie).

    The memory axis is linear from 0 to at most 1.5 x the memory limit
    (``pareto_ylim``): the choice is made below the limit, and a sweep's infeasible
    candidates reach tens of limits up (1,500 GiB against 80 GiB for llama3-70b on 64
    H100), which on a full-range axis flattens the feasible band into a line. Candidates
    above the axis are drawn as triangles on its top edge, at their step time, and a
    note above the axis says how many there are and how high they go. A log axis was
    the alternative; it still spends most of the height on candidates that cannot be
    chosen and squeezes the headroom just under the limit, where the front ends, so
    linear-and-clipped reads better."""
    t = res.table
    fig, axes = _figure(8.5, 5.2)
    ax = axes[0][0]
    lim = res.mem_limit_bytes / GIB
    top = pareto_ylim(t.peak_bytes, res.feasible, res.mem_limit_bytes) / GIB
    n_off = _pareto_points(ax, res, top)
    ax.axhline(lim, color="black", linestyle="--", linewidth=1, label=f"memory limit ({lim:,.0f} GiB)")
    ax.set_ylim(0, top)
    ax.set_xscale("log")
    if res.feasible and 0 <= chosen < len(t):
        _mark_chosen(ax, res, chosen, lim, top)
    _pareto_title(ax, res, top, n_off)
    ax.set_xlabel("step time (s, log)")
    ax.set_ylabel("peak memory (GiB per device)")
    fig.legend(loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    return fig


def _pareto_points(ax, res, top: float) -> int:
    """Over the limit (light red), feasible (grey), off the axis (triangles on the top
    edge), the front (line); returns how many are off the axis."""
    t, f = res.table, res.feasible
    mem = t.peak_bytes / GIB
    off = mem > top
    inside = (np.arange(len(t)) >= f) & ~off
    if inside.any():
        ax.scatter(t.step_s[inside], mem[inside], s=4, color="#f4a6a6", label="over the memory limit",
                   rasterized=True)
    ax.scatter(t.step_s[:f], mem[:f], s=4, color="#9a9a9a", label="feasible", rasterized=True)
    n_off = int(off.sum())
    if n_off:
        ax.scatter(t.step_s[off], np.full(n_off, top), s=14, marker="^", color="#d9534f", clip_on=False,
                   zorder=4, rasterized=True, label=f"above {top:,.0f} GiB (drawn at the top edge)")
    front = sorted(res.pareto, key=lambda i: t.peak_bytes[i])
    if front:
        ax.plot(t.step_s[front], mem[front], "o-", color="#4e79a7", markersize=4, label="Pareto front")
    return n_off


def _mark_chosen(ax, res, chosen: int, lim: float, top: float) -> None:
    """The chosen candidate: a star, and its strategy (labels.label, on two lines) beside it."""
    t = res.table
    x, y = float(t.step_s[chosen]), float(t.peak_bytes[chosen] / GIB)
    ax.scatter([x], [y], marker="*", s=220, color="#e15759", edgecolor="black", zorder=5,
               label=f"chosen (#{chosen + 1})")
    words = label(t.point(chosen)).split(" ")
    half = (len(words) + 1) // 2
    text = (f"chosen #{chosen + 1}: {' '.join(words[:half])}\n{' '.join(words[half:])}\n"
            f"{y:.1f} GiB, step {x:.3g} s")
    lo, hi = np.log10(ax.get_xlim())  # autoscaled to every point drawn so far
    fx = (np.log10(x) - lo) / (hi - lo)
    left = fx < 0.5  # the label goes to the side with more room, its corner just above the limit line
    ann = ax.annotate(text, (x, y), xytext=(fx + (0.03 if left else -0.03), lim / top + 0.03),
                      textcoords="axes fraction", ha="left" if left else "right", va="bottom", fontsize=8,
                      zorder=6, bbox=dict(boxstyle="round", facecolor="white", edgecolor="#e15759", alpha=0.95),
                      arrowprops=dict(arrowstyle="->", color="#e15759", shrinkB=9))
    ann.set_gid("chosen")


def _pareto_title(ax, res, top: float, n_off: int) -> None:
    """The title, and above the axis a note on the candidates drawn off scale."""
    t = res.table
    title = f"{res.model.name} on {res.gpus} x {res.hardware.name}: {len(t):,} candidates"
    if not n_off:
        ax.set_title(title)
        return
    ax.set_title(title, pad=16)
    note = ax.annotate(f"{n_off:,} candidates above {top:,.0f} GiB (up to {t.peak_bytes.max() / GIB:,.0f} GiB) "
                       "not to scale: triangles at the top edge", (0.5, 1.0), xycoords="axes fraction",
                       xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8,
                       color="#b52b27")
    note.set_gid("off-scale")


def timeline_plot(sim: SimResult, title: str = ""):
    """One row of boxes per stage (F forward, B backward incl. recompute, W weight
    gradient) and, below, each stage's memory over the step. The title is the figure's
    suptitle and both legends sit in the right margin, outside the axes, so neither
    covers the title or the data, whatever the title's length or the stage count."""
    pp = len(sim.busy_s)
    fig, axes = _figure(10.0, 1.4 + 0.9 * pp, 2, 1, sharex=True, height_ratios=[pp, max(2, pp * 0.8)])
    ax, mem = axes[0][0], axes[1][0]
    for op in sim.ops:
        ax.broken_barh([(op.start_s * 1e3, (op.end_s - op.start_s) * 1e3)], (op.stage - 0.4, 0.8),
                       facecolors=COLORS[op.kind], edgecolors="white", linewidth=0.3)
    ax.set_yticks(range(pp), [f"stage {s}" for s in range(pp)])
    ax.invert_yaxis()
    from matplotlib.patches import Patch
    names = {"F": "F forward", "B": "B backward", "W": "W weight grad"}
    ax.legend([Patch(color=c) for c in COLORS.values()], [names.get(k, k) for k in COLORS], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title="ops", title_fontsize=8)
    fig.suptitle(f"{title}  step {sim.step_s * 1e3:.3f} ms".strip(), wrap=True)
    for s, series in enumerate(sim.memory):
        times = [t * 1e3 for t, _ in series] + [sim.step_s * 1e3]
        vals = [b / GIB for _, b in series]
        mem.step(times, vals + vals[-1:], where="post", label=f"stage {s}")
    mem.set_xlabel("time (ms)")
    mem.set_ylabel("GiB")
    mem.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
               ncols=1 if pp <= 12 else 2)
    return fig


def serve_plot(rows, front):
    """``ndplan serve``'s layouts: TPOT (ms) against output tokens/s per GPU, the Pareto front joined,
    layouts missing a limit hollow."""
    fig, ax = _figure(6.5, 4.0)
    ax = ax[0][0]
    for meets, style in ((True, dict(color="tab:blue")), (False, dict(facecolors="none", edgecolors="tab:gray"))):
        pts = [(r.per_budget_gpu, r.estimate.tpot_s * 1e3) for r in rows if r.meets == meets and r.estimate.fits]
        if pts:
            ax.scatter(*zip(*pts), s=18, label="meets the limits" if meets else "misses a limit", **style)
    line = sorted((r.per_budget_gpu, r.estimate.tpot_s * 1e3) for r in front)
    if line:
        ax.plot(*zip(*line), color="tab:red", lw=1, label="Pareto front")
    ax.set_xlabel("output tokens/s per GPU")
    ax.set_ylabel("TPOT (ms)")
    ax.legend(fontsize=8)
    return fig
