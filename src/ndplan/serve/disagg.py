"""Prefill-decode disaggregation: a prefill pool and a decode pool sized apart for a request rate
(``ndplan serve --disaggregate``; the DeepSeek and SGLang large-scale EP deployments).

* Prefill instance: full steps of the engine's token budget of prompts, no decoding (serve/time.py
  at B = 0, P = the budget per attention-DP group, PCTX = ISL / 2), pp of them in flight:
  ISL-token requests per second = budget x dpa x pp / step / ISL. A sized pool runs full, so a
  prompt's TTFT is half a step's wait for the current one, ceil(ISL / budget) full steps, then its
  KV cache sent to the decode pool: ISL x the model's KV bytes per token over the NICs of the
  attention-tp x pp devices that hold it (every device drives its own, formulas/comm.py's
  multi-rail link; the receiving side is not modelled).
* Decode instance: steps of B sequences and no prompts (P = 0), at CTX = ISL + OSL / 2, B the
  largest batch the instance runs at once (serve/estimate.py's running count: the KV cache and the
  engine's sequence limit) that meets the TPOT limit; requests per second = B x dpa x pp /
  ((OSL - 1) x TPOT), the prefill having made the first token.
* Each pool takes ceil(rate / an instance's requests per second) instances of the layout that needs
  the fewest GPUs per request per second (meeting its limit); the total is the two pools' GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ndplan import limits
from ndplan.errors import NdplanError
from ndplan.serve.engines import engine
from ndplan.serve.estimate import StepKernel, engine_layout, request_bytes, serve_estimate
from ndplan.serve.layout import ServeLayout, WeightRecipe
from ndplan.serve.search import candidate_layouts, largest_true


@dataclass(frozen=True)
class Pool:
    layout: ServeLayout
    instances: int
    requests_per_s: float
    """One instance's."""
    latency_s: float
    """TTFT (prefill pool) or TPOT (decode pool)."""
    batch: float
    """Prompt tokens (prefill) or sequences (decode) per attention-DP group and step."""

    @property
    def gpus(self) -> int:
        return self.instances * self.layout.devices

    def to_json(self) -> dict:
        lay = self.layout
        return {"tp": lay.tp, "pp": lay.pp, "ep": lay.ep, "dp_attention": lay.dp_attention, "instances": self.instances,
                "gpus": self.gpus, "requests_per_s_per_instance": self.requests_per_s, "latency_s": self.latency_s,
                "batch": self.batch}


def _prefill(spec, hw, lay, kernel, eng, isl, ttft_s) -> tuple[float, float, float] | None:
    """(requests/s, TTFT, tokens per step) of one prefill instance, None when TTFT misses."""
    budget = eng.max_tokens
    step = sum(kernel(0, 0, budget, isl / 2).values())
    prompt_kv = request_bytes(spec, ServeLayout(), kernel.kv_dtype, 0, isl, budget, 1)  # the whole model's, unsplit
    holders = lay.attention_tp * lay.pp  # one attention-DP group holds a request's cache
    send = prompt_kv / (holders * hw.inter_node_gb_per_s * 1e9 * hw.inter_node_efficiency)
    # a full pool: wait half a step for the current one, then the prompt's share of full steps
    ttft = step / 2 + math.ceil(isl / budget) * step + send
    if ttft_s is not None and ttft > ttft_s:
        return None
    return budget * lay.dp_attention * lay.pp / step / isl, ttft, budget


def _decode(spec, hw, lay, kernel, isl, osl, tpot_s, run) -> tuple[float, float, float] | None:
    """(requests/s, TPOT, sequences per group) of one decode instance at the largest batch meeting TPOT."""
    top = run(lay)
    if not top.fits or top.running < lay.dp_attention * lay.pp:
        return None
    cap = top.running // (lay.dp_attention * lay.pp)  # the KV cache's and the engine's limit per batch

    def tpot(b):
        return sum(kernel(b, isl + osl / 2, 0, 0).values())
    if tpot_s is not None and tpot(1) > tpot_s:
        return None
    lo = largest_true(1, cap, lambda b: tpot_s is None or tpot(b) <= tpot_s)
    return lo * lay.dp_attention * lay.pp / (max(1, osl - 1) * tpot(lo)), tpot(lo), lo  # the prefill made token 1


def disaggregated(spec, hw, *, isl: int, osl: int, rate: float, ttft_s: float | None = None,
                  tpot_s: float | None = None, recipe: WeightRecipe = WeightRecipe(), kv_dtype: str = "bf16",
                  engine_name: str = "vllm", mem_fraction: float | None = None, max_devices: int = 64) -> dict:
    """{"prefill": Pool, "decode": Pool} sized for ``rate`` requests per second (module docstring)."""
    limits.real("--rate", rate, 0.0, 1e9, what="requests per second")
    eng = engine(engine_name)
    hw_values = hw.kernel_values(fp8=recipe.dtype == "fp8")
    best: dict = {}
    fits_any = False
    for lay in candidate_layouts(spec, max_devices, hw.devices_per_node, {}):
        run_lay = engine_layout(eng, lay)
        kernel = StepKernel(spec, run_lay, recipe, kv_dtype, hw_values)

        def run(layout, _l=lay):
            return serve_estimate(spec, hw, _l, isl=isl, osl=osl, recipe=recipe, kv_dtype=kv_dtype,
                                  engine_name=engine_name, mem_fraction=mem_fraction, kernel=kernel)
        if not run(lay).fits:
            continue
        fits_any = True
        for role, found in (("prefill", _prefill(spec, hw, lay, kernel, eng, isl, ttft_s)),
                            ("decode", _decode(spec, hw, lay, kernel, isl, osl, tpot_s, run))):
            if found is None:
                continue
            per_s, latency, batch = found
            pool = Pool(run_lay, max(1, math.ceil(rate / per_s)), per_s, latency, batch)
            if role not in best or (pool.gpus, pool.latency_s) < (best[role].gpus, best[role].latency_s):
                best[role] = pool
    if not fits_any:
        raise NdplanError("--model", spec.name, f"fits no layout up to {max_devices} x {hw.name} with one request's "
                          "KV cache", "use --weight-dtype fp8 or int4, or a larger device")
    for role, limit, name in (("prefill", ttft_s, "--ttft-ms"), ("decode", tpot_s, "--tpot-ms")):
        if role not in best:
            raise NdplanError(name, limit * 1e3, f"no {role} layout up to {max_devices} devices meets it",
                              "relax the limit")
    return best
