"""Figures with matplotlib (optional: ``pip install 'ndplan[plot]'``).

Each function returns a ``matplotlib.figure.Figure`` built without pyplot (no global
state, no backend switch), so notebooks can show it and reports can save it;
``to_png`` gives the bytes. Nothing here computes a quantity: bars, points and boxes
are the Estimate's terms, the sweep's table and the PPB replay's ops."""

from __future__ import annotations

import io

import numpy as np

from ndplan.formulas.memory import STATIC_KEYS
from ndplan.ppb.simulate import SimResult
from ndplan.ppb.svg import COLORS
from ndplan.units import GIB

PLOT_MISSING = "matplotlib is not installed: figures skipped, tables only; install them with: pip install 'ndplan[plot]'"


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


def pareto_plot(res, chosen: int = 0):
    """Peak memory vs step time of every evaluated candidate of a SweepResult: feasible
    (grey), over the limit (light red), the Pareto front (line), ``chosen`` (star)."""
    t = res.table
    fig, axes = _figure(7.5, 4.5)
    ax = axes[0][0]
    f = res.feasible
    ax.scatter(t.step_s[f:], t.peak_bytes[f:] / GIB, s=4, color="#f4a6a6", label="over the memory limit",
               rasterized=True)
    ax.scatter(t.step_s[:f], t.peak_bytes[:f] / GIB, s=4, color="#9a9a9a", label="feasible", rasterized=True)
    front = sorted(res.pareto, key=lambda i: t.peak_bytes[i])
    if front:
        ax.plot(t.step_s[front], t.peak_bytes[front] / GIB, "o-", color="#4e79a7", markersize=4, label="Pareto front")
    if f:
        ax.scatter([t.step_s[chosen]], [t.peak_bytes[chosen] / GIB], marker="*", s=220, color="#e15759",
                   edgecolor="black", zorder=5, label=f"chosen (#{chosen + 1})")
    ax.axhline(res.mem_limit_bytes / GIB, color="black", linestyle="--", linewidth=1, label="memory limit")
    ax.set_xscale("log")
    ax.set_xlabel("step time (s, log)")
    ax.set_ylabel("peak memory (GiB per device)")
    ax.set_title(f"{res.model.name} on {res.gpus} x {res.hardware.name}: {len(t):,} candidates")
    ax.legend(fontsize=8)
    return fig


def timeline_plot(sim: SimResult, title: str = ""):
    """One row of boxes per stage (F forward, B backward incl. recompute, W weight
    gradient) and, below, each stage's memory over the step."""
    pp = len(sim.busy_s)
    fig, axes = _figure(10.0, 1.2 + 0.9 * pp, 2, 1, sharex=True, height_ratios=[pp, max(2, pp * 0.8)])
    ax, mem = axes[0][0], axes[1][0]
    for op in sim.ops:
        ax.broken_barh([(op.start_s * 1e3, (op.end_s - op.start_s) * 1e3)], (op.stage - 0.4, 0.8),
                       facecolors=COLORS[op.kind], edgecolors="white", linewidth=0.3)
    ax.set_yticks(range(pp), [f"stage {s}" for s in range(pp)])
    ax.invert_yaxis()
    from matplotlib.patches import Patch
    ax.legend([Patch(color=c) for c in COLORS.values()], list(COLORS), ncols=3, fontsize=8, loc="lower right",
              bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title(f"{title}  step {sim.step_s * 1e3:.3f} ms")
    for s, series in enumerate(sim.memory):
        times = [t * 1e3 for t, _ in series] + [sim.step_s * 1e3]
        vals = [b / GIB for _, b in series]
        mem.step(times, vals + vals[-1:], where="post", label=f"stage {s}")
    mem.set_xlabel("time (ms)")
    mem.set_ylabel("GiB")
    mem.legend(fontsize=7, ncols=min(pp, 4))
    return fig
