"""Strategies as text: the one formatter behind every label ndplan prints (estimate's
and check's headers, sweep rows, the Pareto front, reports, figures, export headers).

Every item is ``field=value`` with the Strategy field's own name (as ``--why`` and
``compare`` read them, with commas): ``recompute=selective``, ``schedule=1f1b``;
``sp=on|off``; recompute limited to the first N layers reads ``selective[first N]``
(``selective[first 4,2,0,0]`` with one count per stage, as --recompute-layers takes it).
The short form (``label``) has the swept fields and ``sp=off`` only when it is off (the
canonical default); the full form adds gbs, m, seq, sp and engine. An uneven layout ends
either form: ``first_layers=7 last_layers=7`` (layouts.py), else ``layers_per_stage=...``.
"""

from __future__ import annotations

from typing import Mapping

SHORT = ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "zero", "recompute", "schedule")
FULL = ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "gbs", "m", "seq", "zero", "sp", "recompute",
        "schedule", "engine")


def recompute_text(mode: str, layers=None) -> str:
    """``full``, or ``selective[first 4]`` when only the first layers recompute."""
    if layers is None:
        return str(mode)
    counts = ",".join(map(str, layers)) if isinstance(layers, (list, tuple)) else layers
    return f"{mode}[first {counts}]"


def _mapping(s) -> Mapping:
    return s if isinstance(s, Mapping) else s.as_dict()


def _value(p: Mapping, key: str) -> str:
    if key == "sp":
        return "on" if p["sp"] else "off"
    if key == "recompute":
        return recompute_text(p["recompute"], p.get("recompute_layers"))
    v = p[key]
    return str(v.item() if hasattr(v, "item") else v)


def label(s, full: bool = False, sep: str = " ") -> str:
    """One strategy (a ``Strategy``, or a mapping such as a sweep ``Table.point`` or
    ``Strategy.as_dict()``) in one line; ``full`` adds gbs, m, seq, sp and engine."""
    p = _mapping(s)
    keys = FULL if full else SHORT + (() if p["sp"] else ("sp",))
    return sep.join([f"{k}={_value(p, k)}" for k in keys] + _layout_items(p))


def _layout_items(p: Mapping) -> list[str]:
    """``first_layers=F last_layers=Lst`` for an uneven sweep row or an ends layout
    (layouts.py), ``layers_per_stage=a,b,...`` for any other given split, else nothing."""
    if "uneven" in p:
        return [f"first_layers={_value(p, 'first_layers')}", f"last_layers={_value(p, 'last_layers')}"] \
            if p["uneven"] else []
    lps = p.get("layers_per_stage")
    if not lps:
        return []
    from ndplan.layouts import ends_of
    ends = ends_of(p["pp"], p["vpp"], p["schedule"], tuple(lps))
    if ends is None:
        return [f"layers_per_stage={','.join(map(str, lps))}"]
    return [f"first_layers={ends[0]}", f"last_layers={ends[1]}"]
