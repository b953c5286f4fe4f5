"""Every serving number of one layout as its Term: key, value, unit, source and closed form
(``ndplan serve --explain``, ``--report``): the memory Terms over tp and dpa and the step Terms over
the layout, the workload symbols (B, CTX, P, PCTX, OTHER) and the hardware symbols of explain's
training Terms; then the quantities derived from them (serve/derived.py: the KV pool, its capacity,
the concurrency, TPOT, TTFT, output tokens/s per GPU), each the same function the estimate
computes with, printed over named symbols and evaluated at the estimate's values."""

from __future__ import annotations

import sympy as sp

from ndplan import symbols as S
from ndplan.serve import derived as D
from ndplan.serve import memory as SM
from ndplan.serve import time as ST
from ndplan.serve.estimate import ServeEstimate
from ndplan.terms import Term

_SYMBOLS = {name: sp.Symbol(name, positive=True) for name in (
    "total_bytes", "fraction", "weights_bytes", "workspace_bytes", "non_torch_bytes", "pool_bytes",
    "kv_per_token_bytes", "capacity_pool_bytes", "capacity_kv_per_token_bytes", "block_tokens", "request_bytes", "dpa", "tpot_s", "chunks", "chunk_step_s", "waiting",
    "running", "osl", "devices")}


def _derived_terms(est: ServeEstimate) -> list[Term]:
    """The derived Terms over the named symbols of ``_SYMBOLS`` (values: est.details)."""
    v = _SYMBOLS
    step_keys = " + ".join(est.step_terms)
    return [
        Term(key="serve.kv_pool", expr=D.kv_pool(est.details["rule"], v["total_bytes"], v["fraction"],
                                                 v["weights_bytes"], v["workspace_bytes"], v["non_torch_bytes"]),
             unit="bytes", source="serve/engines.py: the engine's rule", note=f"one device of stage {est.details['stage']}"),
        Term(key="serve.kv_cache_tokens", expr=D.capacity_tokens(v["capacity_pool_bytes"],
                                                                 v["capacity_kv_per_token_bytes"],
                                                                 v["block_tokens"]) * v["dpa"],
             unit="tokens", source="whole pages of the pool, per attention-DP group",
             note=f"the instance: stage {est.details['capacity_stage']}'s pool holds the fewest tokens"),
        Term(key="serve.max_concurrency", expr=D.requests_held(v["pool_bytes"], v["request_bytes"]) * v["dpa"],
             unit="requests", source="serve/memory.py kv_request_bytes at ISL + OSL",
             note="requests of ISL + OSL whose KV cache the instance holds at once"),
        Term(key="serve.tpot", expr=v["tpot_s"], unit="s", source=step_keys, note="one steady-state step"),
        Term(key="serve.ttft", expr=D.ttft(v["tpot_s"], v["chunks"], v["chunk_step_s"], v["waiting"], v["running"],
                                           v["osl"]),
             unit="s", source="serve/derived.py ttft", note="the prompt's chunks, then the wait for a slot"),
        Term(key="serve.output_tokens_per_s_per_gpu",
             expr=D.output_per_gpu(v["running"], v["osl"], v["tpot_s"], v["chunks"], v["chunk_step_s"], v["devices"]),
             unit="tokens/s", source="serve/derived.py output_per_gpu (Little's law)", note="per device of the instance"),
    ]


def explain_rows(spec, hw, est: ServeEstimate, recipe, kv_dtype: str, isl: int, osl: int) -> list[dict]:
    """[{key, value, unit, source, note, formula, latex}] of ``est``'s layout at its steady-state step."""
    lay = est.layout
    b = est.running / lay.dp_attention / lay.pp
    point = {ST.B: b, ST.CTX: isl + osl / 2, ST.P: est.step_point["P"], ST.PCTX: isl / 2,
             ST.OTHER: b + est.step_point["P"]}
    values = {S.BY_NAME[k]: v for k, v in hw.kernel_values(fp8=recipe.dtype == "fp8").items()} | SM.values(lay) | point
    stage = est.details["stage"]
    terms = list(SM.serve_memory_terms(spec, lay, recipe, kv_dtype, stage))  # the stage whose pool limits
    terms += list(ST.step_terms(spec, lay, recipe, kv_dtype))
    given = {**est.details, "dpa": lay.dp_attention, "tpot_s": est.tpot_s}
    values |= {sym: given[name] for name, sym in _SYMBOLS.items()}
    rows = []
    for t in terms + _derived_terms(est):
        expr = sp.sympify(t.expr)
        rows.append({"key": t.key, "value": float(expr.subs(values)), "unit": t.unit, "source": t.source,
                     "note": t.note, "formula": sp.sstr(expr), "latex": sp.latex(expr)})
    return rows
