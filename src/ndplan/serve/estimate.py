"""One serving layout evaluated: memory, KV capacity, concurrency, latency and throughput.

Steady state of continuous batching at a concurrency C per instance (C / dpa sequences decoding
in each attention-DP group): every step decodes one token of each and, with chunked prefill,
runs the prompts of the requests that replace the finished ones, B x ISL / OSL tokens per group
(each request's prompt once per OSL steps). So

* TPOT = one such step (serve/time.py) at CTX = ISL + OSL / 2 (the mean context while decoding)
  and PCTX = ISL / 2; with pp stages the engine keeps pp batches in flight (vLLM's virtual
  engines, TensorRT-LLM's pipeline micro-batches), each of B / pp sequences, so a token's step is
  every stage's time at B / pp;
* the prompt tokens a step takes are capped by the engine's budget (its tokens per step less the B
  decoding ones);
* TTFT = the steps a prompt's chunks take, ceil(ISL / budget), each a step with that chunk beside
  the others decoding (at C = 1 the prompt alone: the prefill time), and never under one TPOT;
* a request stays TTFT + (OSL - 1) x TPOT, so by Little's law the instance returns
  R x OSL / that output tokens per second for R requests running; per device, over its tp x pp.
At most R = min(C, the requests each attention-DP group's pool holds x dpa, the engine's maximum
running sequences per group x dpa) run, a request holding its pages of ISL + OSL (TensorRT-LLM)
or ISL + OSL / 2 on average (vLLM, SGLang: engines.ServeEngine.reserves_output); the other C - R wait for a slot, (C - R) / R request lifetimes on average,
which TTFT then includes (a closed loop of C clients). Without a concurrency (max load, offline)
C = R: one rule for every row (issue 17).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field, replace

import sympy as sp

from ndplan import limits
from ndplan import symbols as S
from ndplan.catalog.hardware import Hardware
from ndplan.catalog.model import ModelSpec
from ndplan.errors import NdplanError
from ndplan.kernels import cached_kernel
from ndplan.serve import memory as SM
from ndplan.serve import time as ST
from ndplan.serve import derived
from ndplan.serve.engines import NON_TORCH_GIB, ServeEngine, engine, kv_capacity, trtllm_bench_limits
from ndplan.serve.engines import mem_fraction as engine_fraction
from ndplan.serve.layout import KV_DTYPES, ServeLayout, WeightRecipe
from ndplan.units import GIB

DRIVER_VISIBLE = 0.99
"""Device memory the CUDA driver reports as total over the nominal capacity: vLLM's logs on H100
80 GB print total_gpu_memory 79.22 GiB (vllm-project/vllm #10511, #12126): 0.990; on an RTX 3090
23.58 of 24 GiB (#10517): 0.983."""


@dataclass(frozen=True)
class ServeEstimate:
    layout: ServeLayout
    fits: bool
    weights_bytes: int
    """Largest stage's weights on one device."""
    kv_bytes_per_token: int
    """Largest stage's KV bytes per token on one device."""
    kv_cache_tokens: int
    """Tokens the instance's KV cache holds (every attention-DP group's pool)."""
    max_concurrency: int
    """Requests of ISL + OSL tokens the KV cache holds at once (whole pages, per attention-DP group)."""
    concurrency: int
    running: int
    """Requests running at once (the rest of ``concurrency`` waits for a slot)."""
    ttft_s: float
    tpot_s: float
    output_tokens_per_s_per_gpu: float
    step_terms: dict = field(default_factory=dict)
    """serve.step.* seconds of the steady-state step."""
    step_point: dict = field(default_factory=dict)
    """The steady-state step's prompt tokens per attention-DP group (``P``)."""
    details: dict = field(default_factory=dict)
    """The values behind the derived numbers (serve/derived.py), for ``--explain``: the limiting
    stage's pool and its parts, one request's KV bytes, the prompt's chunks and their step, the
    requests running and waiting."""

    @property
    def devices(self) -> int:
        return self.layout.devices

    def to_json(self) -> dict:
        lay = self.layout
        return {"tp": lay.tp, "pp": lay.pp, "ep": lay.ep, "dp_attention": lay.dp_attention, "devices": lay.devices,
                "fits": self.fits, "weights_bytes": self.weights_bytes, "kv_bytes_per_token": self.kv_bytes_per_token,
                "kv_cache_tokens": self.kv_cache_tokens, "max_concurrency": self.max_concurrency,
                "concurrency": self.concurrency, "running": self.running, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
                "output_tokens_per_s_per_gpu": self.output_tokens_per_s_per_gpu,
                "step_s": self.step_terms}


def _value(expr, values: dict) -> float:
    return float(sp.sympify(expr).subs(values))


@functools.lru_cache(maxsize=256)
def stage_memory(spec: ModelSpec, layout: ServeLayout, recipe: WeightRecipe, kv_dtype: str, tokens: int,
                 seqs: int) -> tuple[tuple[float, float, float], ...]:
    """(weights, KV bytes per token, forward workspace) of one device of each stage."""
    vals = SM.values(layout)
    act = _value(SM.activation_bytes(spec, tokens, seqs, layout.dense_with_attention), vals)
    return tuple((_value(SM.weight_bytes(spec, layout, recipe, stage), vals),
                  _value(SM.kv_bytes_per_token(spec, layout, kv_dtype, stage), vals), act)
                 for stage in range(layout.pp))


def device_total_bytes(hw: Hardware, total_gib: float | None = None) -> float:
    if total_gib is not None:
        return limits.gib("--gpu-mem-gib", total_gib) * GIB
    return hw.hbm_gib * DRIVER_VISIBLE * GIB


_ARGS = tuple(S.HW_SYMBOLS) + (S.tp, SM.DPA) + ST.WORKLOAD_SYMBOLS
_SPEC_IDENTITY_SKIP = ("name", "source", "traced")


def _architecture(spec: ModelSpec) -> tuple:
    """Every ModelSpec field but the name, the source and traced activations (which the step does not
    read): models that agree on all of them (sizes, flags, context length, windows) share kernels."""
    return tuple((f.name, getattr(spec, f.name)) for f in dataclasses.fields(spec)
                 if f.name not in _SPEC_IDENTITY_SKIP)


@functools.lru_cache(maxsize=64)
def _compiled(spec: ModelSpec, pp: int, ep: int, dense_with_attention: bool, a2a: str, recipe: WeightRecipe,
              kv_dtype: str):
    """The step kernel over the hardware, tp, dpa and workload values: the step's Terms depend on the
    layout only through tp and dpa once pp, ep and the dense split are fixed. Compiled as training
    kernels are (kernels.cached_kernel, whose key holds the sources of serve/ with the formulas'):
    once per architecture and layout class, kept in memory, in the on-disk kernel cache and in the
    store shipped with the package (prebuild.py compiles the --help examples' kernels)."""
    key = ("serve.step", _architecture(spec), pp, ep, dense_with_attention, a2a, repr(recipe), kv_dtype)
    layout = ServeLayout(pp=pp, ep=ep, dense_with_attention=dense_with_attention, a2a=a2a)
    return cached_kernel(key, lambda: ST.step_terms(spec, layout, recipe, kv_dtype), _ARGS,
                         use_disk=spec.traced is None)


class StepKernel:
    """serve.step.* of one (model, layout, recipe, KV dtype), compiled once per architecture
    (``_compiled``) and evaluated at many workload points."""

    def __init__(self, spec, layout, recipe, kv_dtype, hw_values: dict):
        self.kv_dtype, self.dense_with_attention = kv_dtype, layout.dense_with_attention
        self.a2a, self.pp = layout.a2a if layout.ep > 1 else "nccl", layout.pp  # the backend only acts under ep > 1
        self._kernel = _compiled(spec, layout.pp, layout.ep, layout.dense_with_attention, self.a2a, recipe, kv_dtype)
        self.keys = self._kernel.keys
        self._fixed = {s.name: hw_values[s.name] for s in S.HW_SYMBOLS} | {
            S.tp.name: layout.tp, SM.DPA.name: layout.dp_attention}

    def __call__(self, b, ctx, p, pctx, other=None) -> dict:
        """Seconds per Term at ``b`` decoding sequences of ``ctx`` context and ``p`` prefill tokens of
        ``pctx`` mean context per attention-DP group; ``other``: each other group's tokens (default
        b + p, every group alike)."""
        other = b + p if other is None else other
        out = self._kernel(**self._fixed, **{ST.B.name: b, ST.CTX.name: ctx, ST.P.name: p, ST.PCTX.name: pctx,
                                             ST.OTHER.name: other})
        return {k: float(v) for k, v in out.items()}


def serve_estimate(spec: ModelSpec, hw: Hardware, layout: ServeLayout, *, isl: int, osl: int,
                   concurrency: int | None = None, recipe: WeightRecipe = WeightRecipe(), kv_dtype: str = "bf16",
                   engine_name: str = "vllm", mem_fraction: float | None = None, gpu_mem_gib: float | None = None,
                   max_tokens: int | None = None, max_seqs: int | None = None,
                   kernel: StepKernel | None = None) -> ServeEstimate:
    """Serve ``spec`` on ``hw`` in ``layout`` at ``isl`` / ``osl`` tokens per request (module docstring);
    ``max_tokens`` and ``max_seqs`` replace the engine's defaults (vLLM --max-num-batched-tokens and
    --max-num-seqs, TensorRT-LLM max_num_tokens and max_batch_size)."""
    layout.check(spec)
    recipe.check()
    eng: ServeEngine = engine(engine_name)
    layout = engine_layout(eng, layout)
    if max_tokens is not None:
        eng = replace(eng, max_tokens=limits.count("--max-num-batched-tokens", max_tokens, 1, limits.MAX_SEQ))
    if max_seqs is not None:
        eng = replace(eng, max_seqs=limits.count("--max-num-seqs", max_seqs, 1, 10 ** 6))
    if kv_dtype not in KV_DTYPES:
        raise NdplanError("--kv-dtype", kv_dtype, "not a KV-cache dtype ndplan models", f"one of {', '.join(KV_DTYPES)}")
    isl = limits.count("--isl", isl, 1, limits.MAX_SEQ)
    osl = limits.count("--osl", osl, 1, limits.MAX_SEQ)
    if eng.bench_limits and max_tokens is None and max_seqs is None:
        eng = replace(eng, **bench_limits(spec, hw, layout, recipe, kv_dtype, isl, osl, mem_fraction, gpu_mem_gib))
    total = device_total_bytes(hw, gpu_mem_gib)
    fraction = engine_fraction(eng, mem_fraction)
    per_stage = []  # (weights, KV bytes per token, workspace, pool) of one device of each stage
    for w, kv, act in stage_memory(spec, layout, recipe, kv_dtype, eng.max_tokens, eng.max_seqs):
        per_stage.append((w, kv, act, derived.kv_pool(eng.rule, total, fraction, w, act, NON_TORCH_GIB * GIB)))
    capacities = [kv_capacity(pool, kv, eng.block_tokens) for _, kv, _, pool in per_stage]
    fullest = capacities.index(min(capacities))
    tokens = capacities[fullest] * layout.dp_attention  # each attention-DP group's pool (its devices hold the same)

    def held_by(stage: int, length: int, steady: bool = False) -> int:
        """Requests of ``length`` tokens each attention-DP group's pool holds on ``stage`` (``steady``:
        decoding, sliding layers holding only their window, SM.held_tokens)."""
        return requests_held(per_stage[stage][3], request_bytes(spec, layout, kv_dtype, stage, length, eng.max_tokens,
                                                                eng.block_tokens, steady))
    limiting = min(range(layout.pp), key=lambda st: (held_by(st, isl + osl), -per_stage[st][0]))
    max_conc = held_by(limiting, isl + osl) * layout.dp_attention
    fits = max_conc >= 1
    if concurrency is not None:
        limits.count("--concurrency", concurrency, 1, 10 ** 9)
    held = isl + osl if eng.reserves_output else isl + math.ceil(osl / 2)
    batches = layout.pp if eng.seqs_per_stage else 1
    running = min(min(held_by(st, held, steady=True) for st in range(layout.pp)) * layout.dp_attention,
                  eng.max_seqs * batches * layout.dp_attention)
    conc = running if concurrency is None else concurrency
    running = max(1, min(running, conc))
    hw_values = hw.kernel_values(fp8=recipe.dtype == "fp8")
    kernel = kernel or StepKernel(spec, layout, recipe, kv_dtype, hw_values)
    if (kernel.dense_with_attention, kernel.kv_dtype, kernel.pp, kernel.a2a) != (
            layout.dense_with_attention, kv_dtype, layout.pp, layout.a2a if layout.ep > 1 else "nccl"):
        raise ValueError("the step kernel was built for another layout (engine_layout) or KV dtype")
    b = running / layout.dp_attention / layout.pp  # pp batches in flight, one per stage
    budget = max(1.0, eng.max_tokens - b)  # prompt tokens a step takes beside the decoding ones
    steady = min(b * isl / osl, budget)
    step = kernel(b, isl + osl / 2, steady, isl / 2)
    tpot = sum(step.values())
    others = max(0.0, b - 1 / (layout.dp_attention * layout.pp))  # the others decoding while this prompt runs
    chunks = math.ceil(isl / budget)
    chunk_step = sum(kernel(others, isl + osl / 2, min(isl, budget), isl / 2, b + steady if conc > 1 else 0).values())
    waiting = max(0, conc - running)
    w_lim, kv_lim, act_lim, pool_lim = per_stage[limiting]
    details = {"stage": limiting, "capacity_stage": fullest, "capacity_pool_bytes": per_stage[fullest][3],
               "capacity_kv_per_token_bytes": per_stage[fullest][1],
               "total_bytes": total, "fraction": fraction, "weights_bytes": w_lim,
               "workspace_bytes": act_lim, "non_torch_bytes": NON_TORCH_GIB * GIB, "pool_bytes": pool_lim,
               "kv_per_token_bytes": kv_lim, "block_tokens": eng.block_tokens,
               "request_bytes": request_bytes(spec, layout, kv_dtype, limiting, isl + osl, eng.max_tokens,
                                              eng.block_tokens),
               "rule": eng.rule, "chunks": chunks, "chunk_step_s": chunk_step, "waiting": waiting, "running": running,
               "devices": layout.devices, "osl": osl}
    rate = derived.output_per_gpu(running, osl, tpot, chunks, chunk_step, layout.devices) if fits else 0.0
    return ServeEstimate(layout=layout, fits=fits, weights_bytes=int(max(w for w, _, _, _ in per_stage)),
                         kv_bytes_per_token=int(max(kv for _, kv, _, _ in per_stage)), kv_cache_tokens=int(tokens),
                         max_concurrency=int(max_conc), concurrency=int(conc), running=int(running),
                         ttft_s=derived.ttft(tpot, chunks, chunk_step, waiting, running, osl), tpot_s=tpot,
                         output_tokens_per_s_per_gpu=rate, step_terms=step, step_point={"P": steady}, details=details)


BENCH_TUNED_DTYPES = ("bf16", "fp8")
"""Weight dtypes whose runs trtllm-bench sizes with its heuristic (bench/build/build.py TUNED_QUANTS:
NVFP4, FP8, FP8_BLOCK_SCALES, no quantization); int4 runs at TensorRT-LLM's default limits."""


def bench_limits(spec: ModelSpec, hw: Hardware, layout: ServeLayout, recipe: WeightRecipe, kv_dtype: str, isl: int,
                 osl: int, fraction: float | None, gpu_mem_gib: float | None) -> dict:
    """trtllm-bench's max_batch_size and max_num_tokens for this run (engines.trtllm_bench_limits), from
    the checkpoint's parameter count (MTP modules included, as its safetensors are) at the recipe's
    bytes (fp8 1, else 2) and the KV dtype's."""
    from ndplan.formulas.params import params_total
    from ndplan.symbols import model_symbols
    if recipe.dtype not in BENCH_TUNED_DTYPES:  # build.py: other quantizations get the LLM API's defaults
        return {"max_seqs": engine("trtllm").max_seqs, "max_tokens": engine("trtllm").max_tokens}
    params = int(params_total(spec, model_symbols(spec), mtp=True))
    weight = 1.0 if recipe.dtype == "fp8" else 2.0
    batch, tokens = trtllm_bench_limits(params, weight, spec.num_key_value_heads, spec.head_dim,
                                        spec.num_hidden_layers, SM.KV_DTYPE_BYTES[kv_dtype],
                                        device_total_bytes(hw, gpu_mem_gib) / GIB, layout.tp, layout.pp, isl, osl,
                                        0.9 if fraction is None else fraction)
    return {"max_seqs": batch, "max_tokens": tokens}


def engine_layout(eng: ServeEngine, layout: ServeLayout) -> ServeLayout:
    """``layout`` as ``eng`` runs it: under attention DP its dense MLPs and shared experts go with the
    attention where the engine does so (ServeEngine.dense_with_attention_dp)."""
    return replace(layout, dense_with_attention=eng.dense_with_attention_dp and layout.dp_attention > 1)


@functools.lru_cache(maxsize=4096)
def request_bytes(spec: ModelSpec, layout: ServeLayout, kv_dtype: str, stage: int, length: int, chunk: int,
                  block: int, steady: bool = False) -> float:
    """KV bytes one request of ``length`` tokens holds on one device of ``stage`` (SM.kv_request_bytes)."""
    return _value(SM.kv_request_bytes(spec, layout, kv_dtype, stage, length, chunk, block, steady), SM.values(layout))


def requests_held(pool_bytes: float, one_request_bytes: float) -> int:
    """Whole requests a pool holds (0 when it is empty)."""
    return max(0, derived.requests_held(pool_bytes, one_request_bytes))


def batch_latency_s(kernel: StepKernel, batch: int, isl: int, osl: int) -> float:
    """End-to-end seconds of one fixed batch: its prompts in one step, then OSL - 1 decode steps
    (vLLM's benchmark_latency: every request starts together and ends together)."""
    prefill = sum(kernel(0, 0, batch * isl, isl / 2).values())
    return prefill + (osl - 1) * sum(kernel(batch, isl + osl / 2, 0, 0).values())

