"""Every serving number of one layout as its Term: key, value, unit, source and closed form
(``ndplan serve --explain``), the memory Terms over tp and dpa and the step Terms over the layout,
the workload symbols (B, CTX, P, PCTX, OTHER) and the hardware symbols of explain's training Terms."""

from __future__ import annotations

import sympy as sp

from ndplan import symbols as S
from ndplan.serve import memory as SM
from ndplan.serve import time as ST
from ndplan.serve.estimate import ServeEstimate


def explain_rows(spec, hw, est: ServeEstimate, recipe, kv_dtype: str, isl: int, osl: int) -> list[dict]:
    """[{key, value, unit, source, note, formula}] of ``est``'s layout at its steady-state step."""
    lay = est.layout
    b = est.running / lay.dp_attention / lay.pp
    point = {ST.B: b, ST.CTX: isl + osl / 2, ST.P: est.step_point["P"], ST.PCTX: isl / 2,
             ST.OTHER: b + est.step_point["P"]}
    values = {S.BY_NAME[k]: v for k, v in hw.kernel_values(fp8=recipe.dtype == "fp8").items()} | SM.values(lay) | point
    rows = []
    vals = SM.values(lay)
    stage = max(range(lay.pp), key=lambda i: float(sp.sympify(SM.weight_bytes(spec, lay, recipe, i)).subs(vals)))
    terms = list(SM.serve_memory_terms(spec, lay, recipe, kv_dtype, stage))  # the largest stage, as the estimate
    terms += list(ST.step_terms(spec, lay, recipe, kv_dtype))
    for t in terms:
        expr = sp.sympify(t.expr)
        rows.append({"key": t.key, "value": float(expr.subs(values)), "unit": t.unit, "source": t.source,
                     "note": t.note, "formula": sp.sstr(expr)})
    return rows
