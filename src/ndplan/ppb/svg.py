"""A hand-written SVG timeline of a replay: one row per stage, one box per op
(F forward, B backward incl. recompute, W weight gradient), and a memory line per stage."""

from __future__ import annotations

from html import escape

from ndplan.ppb.simulate import SimResult
from ndplan.units import GIB

COLORS = {"F": "#4e79a7", "B": "#f28e2b", "W": "#59a14f"}
ROW_PX, WIDTH_PX, LEFT_PX, TOP_PX = 28, 1200, 70, 30


def timeline_svg(r: SimResult, title: str = "") -> str:
    pp = len(r.busy_s)
    scale = (WIDTH_PX - LEFT_PX - 10) / r.step_s if r.step_s else 1.0
    h = TOP_PX + pp * ROW_PX * 2 + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{h}" font-family="sans-serif" '
           f'font-size="11">', f'<text x="{LEFT_PX}" y="18">{escape(title)} step {r.step_s * 1e3:.3f} ms</text>']
    for s in range(pp):
        y = TOP_PX + s * ROW_PX
        out.append(f'<text x="4" y="{y + ROW_PX * 0.65:.1f}">stage {s}</text>')
    for op in r.ops:
        x = LEFT_PX + op.start_s * scale
        w = max((op.end_s - op.start_s) * scale, 0.5)
        y = TOP_PX + op.stage * ROW_PX + 2
        out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW_PX - 4}" fill="{COLORS[op.kind]}" '
                   f'stroke="white" stroke-width="0.5"><title>{op.kind} v{op.v} mb{op.mb} '
                   f'{op.start_s * 1e3:.3f}-{op.end_s * 1e3:.3f} ms</title></rect>')
        if w > 14:
            out.append(f'<text x="{x + 2:.2f}" y="{y + ROW_PX * 0.6:.1f}" fill="white" font-size="9">{op.mb}</text>')
    peak = max(r.peak_bytes) or 1.0
    base = TOP_PX + pp * ROW_PX + 20
    out.append(f'<text x="4" y="{base - 6}">memory (peak {peak / GIB:.2f} GiB)</text>')
    for s, series in enumerate(r.memory):
        pts = []
        last = series[0][1]
        for t, b in series:
            pts += [(t, last), (t, b)]
            last = b
        pts.append((r.step_s, last))
        y0 = base + s * ROW_PX
        path = " ".join(f"{LEFT_PX + t * scale:.2f},{y0 + ROW_PX - 4 - (b / peak) * (ROW_PX - 6):.2f}" for t, b in pts)
        out.append(f'<text x="4" y="{y0 + ROW_PX * 0.65:.1f}">mem {s}</text>')
        out.append(f'<polyline points="{path}" fill="none" stroke="#e15759" stroke-width="1"/>')
    for i, (k, c) in enumerate(COLORS.items()):
        out.append(f'<rect x="{LEFT_PX + 260 + i * 60}" y="8" width="10" height="10" fill="{c}"/>'
                   f'<text x="{LEFT_PX + 274 + i * 60}" y="17">{k}</text>')
    out.append("</svg>")
    return "\n".join(out)
