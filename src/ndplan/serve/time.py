"""Serving time of one engine step on one device, as a roofline per GEMM and per attention call.

A step of continuous batching runs ``B`` decoding sequences and ``P`` prefill tokens of each
attention-DP group through every layer at once (vLLM's and SGLang's chunked prefill, TensorRT-
LLM's in-flight batching). Symbols: ``B``; ``CTX`` the decoding sequences' mean context (tokens
in their KV cache); ``P``; ``PCTX`` the mean context a prefill token attends to (a whole prompt
of I tokens: I/2, causal).

Per layer and device:
* GEMMs (formulas/flops.py shapes; attention over the attention-TP group on B + P tokens, the
  MLP and experts over the stage's tp devices on the dpa groups' tokens together):
  max(FLOPs / (peak x efficiency), bytes / (HBM bandwidth x eff_hbm)), the weights read at the
  recipe's bytes per element (fp8: at the FP8 peak and eff_gemm8 with 1-byte activations; int4:
  weight-only, at the 16-bit peak), activations and outputs 16-bit. A decode step reads every
  weight it uses once: a small batch is bandwidth-bound (Williams et al. 2009 roofline). Routed
  experts: each device's E/ep experts are read only when some token picks them, an expected
  1 - (1 - k/E)^N of them for N tokens of the whole instance (top-k picks, uniform routing).
* Attention core (a sliding-window layer over at most its window of keys): decode reads the B
  sequences' KV cache (B x CTX x the per-layer KV bytes) and
  computes 2 x (d_qk + d_v) FLOPs per query head and key (MLA: over the latent, the absorbed
  form, 2 x (kv_lora_rank + rope) + 2 x kv_lora_rank); prefill computes the causal core at
  eff_attn times formulas/step.py's length factor; each the larger of compute and bytes.
* Collectives: an all-reduce of the attention output over the attention-TP group and one of
  the MLP output over the stage's tp devices, or, for a MoE layer under expert parallelism,
  dispatch and combine all-to-alls over the ep group (formulas/comm.py alpha-beta, intra-node
  links while the group fits a node).
The output layer runs for the B decoding sequences on the last stage. Norms, activations and
sampling kernels are not timed (a few 16-bit passes over (B + P) x h per layer); with the
scheduler, the sampler and the gaps between launches they are in one fitted constant per step,
``HOST_STEP_S`` (``serve.step.host``).
"""

from __future__ import annotations

import sympy as sp

from ndplan import symbols as S
from ndplan.catalog.model import ModelSpec
from ndplan.formulas import comm as C
from ndplan.formulas import flops as FL
from ndplan.formulas.activations import ActContext
from ndplan.formulas.step import ATTN_HALF_TOKENS
from ndplan.serve.layout import ServeLayout, WeightRecipe
from ndplan.serve.memory import ATTN_TP, DPA, elem_bytes, kv_layer_bytes, quantized, stage_layers
from ndplan.symbols import ModelSymbols
from ndplan.terms import Breakdown, Term

B = sp.Symbol("B", nonnegative=True)
CTX = sp.Symbol("CTX", nonnegative=True)
P = sp.Symbol("P", nonnegative=True)
PCTX = sp.Symbol("PCTX", nonnegative=True)
OTHER = sp.Symbol("OTHER", nonnegative=True)
"""Tokens each other attention-DP group runs in the step (B + P in the steady state, where every
group is alike; 0 for a lone prompt): the MLP and the experts take them all."""
WORKLOAD_SYMBOLS = (B, CTX, P, PCTX, OTHER)
ACT_BYTES = 2


def _gemm_seconds(g: FL.Gemm, recipe: WeightRecipe, layer: int | None, count=None) -> sp.Expr:
    """Roofline seconds of ``g`` (``count``: how many of its ``g.count`` products read their weight)."""
    fp8 = quantized(recipe, g.name, layer) and recipe.dtype == "fp8"
    w = elem_bytes(recipe, g.name, layer)
    a = 1 if fp8 else ACT_BYTES
    read = g.count if count is None else count
    nbytes = g.count * (a * g.rows * g.inner + ACT_BYTES * g.rows * g.cols) + read * w * g.inner * g.cols
    rate = S.peak * S.eff_gemm8 if fp8 else S.peak_bf16 * S.eff_gemm
    return C.vmax(g.flops / rate, nbytes / (S.hbm_bytes_per_s * S.eff_hbm))


def _context(tokens, t, ep, tp) -> ActContext:
    return ActContext(s=sp.Integer(1), b=tokens, t=t, t_sp=tp, etp=tp / ep, capacity=sp.Integer(1), flash=True, ep=ep)


def layer_seconds(spec: ModelSpec, layout: ServeLayout, recipe: WeightRecipe, kv_dtype: str, layer: int) -> dict:
    """Seconds of one layer on one device in a step (module docstring): gemm, attention, comm."""
    M = ModelSymbols.of(spec)
    kind = spec.layer_kinds[layer]
    tokens = B + P
    every = tokens + (DPA - 1) * OTHER  # the instance's tokens of the step at the MLP and the experts
    ep = sp.Integer(layout.ep)
    gemm = sp.Integer(0)
    for g in FL.attention_gemms(spec, M, _context(tokens, ATTN_TP, ep, S.tp)):
        gemm += _gemm_seconds(g, recipe, layer)
    with_attention = {g.name: g for g in FL.ffn_gemms(spec, M, _context(tokens, ATTN_TP, ep, S.tp), kind)}
    for g in FL.ffn_gemms(spec, M, _context(every, S.tp, ep, S.tp), kind):
        count = None
        if g.name.startswith("moe.experts"):
            count = g.count * (1 - (1 - M.k / M.E) ** every)
        elif layout.dense_with_attention and not g.name.startswith(("moe.router", "moe.experts")):
            g = with_attention[g.name]  # a dense MLP or shared expert on its group's tokens, over the attention tp
        gemm += _gemm_seconds(g, recipe, layer, count)
    dense_alone = layout.dense_with_attention and kind != "moe"  # a MoE layer's experts still span the tp devices
    comm = (_comm_seconds(M, tokens, tokens if dense_alone else every, dense_alone) if kind != "moe" or layout.ep == 1
            else _ep_comm_seconds(M, tokens, ep, layout.a2a == "deepep", recipe.dtype == "fp8"))
    return {"gemm": gemm, "attention": _attention_seconds(spec, M, kv_dtype, spec.window(layer)), "comm": comm}


HOST_STEP_S = 2.5e-3
"""Seconds each engine step spends beyond the roofline's GEMMs, attention cores and collectives:
scheduling, sampling, the untimed elementwise kernels and the gaps between launches. FITTED on
the three vLLM CI fixed-batch rows of ../shared/validation/inference (vLLM benchmark_latency on
H200, batch 8, ISL 32, OSL 128: 128 steps each): (measured - roofline) / 128 = 2.55 ms
(Llama-3.1-8B-Instruct tp 1), 2.20 ms (Llama-3-70B tp 4), 3.34 ms (Mixtral-8x7B tp 2); the median, 2.5 ms.
Held out: every other row (TensorRT-LLM's tables, NIM's latencies and throughputs, whose
concurrency-1 TPOTs sit 3.3 and 4.0 ms above the roofline: benchmarks/README.md). One value for
every engine and device, per step, independent of the batch."""

FLASH_QUERY_TILE = 128
"""Queries per tile of a fused prefill attention kernel: it reads each key and value once per tile
(FlashAttention-2 Sec. 3.1, block size 128 on A100/H100)."""


def _attention_seconds(spec: ModelSpec, M: ModelSymbols, kv_dtype: str, window: int = 0) -> sp.Expr:
    """Decode and prefill attention cores of one layer (module docstring); the prefill's FLOPs are
    stretched by formulas/step.py's length factor (L + ATTN_HALF_TOKENS) / L at L = 2 PCTX, the
    prompt a whole-prompt prefill runs. A sliding-window layer (``window`` > 0) attends to at most
    ``window`` keys: decode reads min(CTX, window) of them, a prefill token min(PCTX, window) (the
    mean over a prompt longer than the window is a little less: an upper bound)."""
    heads = M.a / ATTN_TP
    kv_layer = kv_layer_bytes(spec, kv_dtype)  # this device's, one layer
    ctx, pctx = (sp.Min(CTX, window), sp.Min(PCTX, window)) if window else (CTX, PCTX)
    if spec.is_mla:
        decode_dims, prefill_dims = (M.kl + M.dr) + M.kl, M.dn + M.dr + M.dv
    else:
        decode_dims = prefill_dims = 2 * M.d
    hbm = S.hbm_bytes_per_s * S.eff_hbm
    decode = C.vmax(2 * B * ctx * heads * decode_dims / (S.peak_bf16 * S.eff_attn), B * ctx * kv_layer / hbm)
    prefill_flops = 2 * P * heads * prefill_dims * (pctx + sp.Rational(ATTN_HALF_TOKENS, 2))
    prefill = C.vmax(prefill_flops / (S.peak_bf16 * S.eff_attn), P / FLASH_QUERY_TILE * pctx * kv_layer / hbm)
    return decode + prefill


def _comm_seconds(M: ModelSymbols, tokens, mlp_tokens, with_attention: bool) -> sp.Expr:
    """All-reduce of the attention output (attention-TP group) and of the MLP output over the devices
    that split it (all tp devices on the instance's tokens, or the attention-TP group on its own)."""
    group = ATTN_TP if with_attention else S.tp
    return (C.all_reduce(ATTN_TP, ACT_BYTES * tokens * M.h, ATTN_TP)
            + C.all_reduce(group, ACT_BYTES * mlp_tokens * M.h, group))


def _ep_comm_seconds(M: ModelSymbols, tokens, ep, deepep: bool = False, fp8: bool = False) -> sp.Expr:
    """A MoE layer under expert parallelism: the attention output's all-reduce, then each device
    dispatches its share of its group's tokens (tokens / attention tp) once to each distinct ep rank
    holding one of its k experts, ep (1 - (1 - 1/ep)^k) of them on average under uniform routing
    (DeepEP and the engines' all-to-all send a token once per rank), and combines their outputs back:
    two all-to-alls over the ep group (16-bit hidden states; the expert groups sit tp / ep ranks
    apart). Under ``layout.a2a == "deepep"``: ``_deepep_seconds``. Not modelled: overlap with compute
    (SGLang's two-batch overlap, DeepEP's hooks), node-limited routing (DeepSeek-V3's at most 4
    nodes per token: uniform routing over the nodes is used), the all-gather that re-replicates the
    tokens when the attention tp exceeds 1, the shared experts' reduction."""
    x = ACT_BYTES * tokens * M.h
    if deepep:
        return C.all_reduce(ATTN_TP, x, ATTN_TP) + _deepep_seconds(M, tokens / ATTN_TP, ep, fp8)
    ranks = ep * (1 - (1 - sp.Integer(1) / ep) ** M.k)
    sent = ACT_BYTES * tokens / ATTN_TP * ranks * M.h
    return C.all_reduce(ATTN_TP, x, ATTN_TP) + 2 * C.all_to_all(ep, sent, S.tp / ep)


FP8_DISPATCH_BYTES = 1 + sp.Rational(4, 128)
"""Bytes per hidden element of DeepEP's fp8 dispatch: the e4m3 value and an fp32 scale per 128
(the block-fp8 activations DeepGEMM takes; DeepEP README: "FP8 dispatching, BF16 combining")."""


def _deepep_seconds(M: ModelSymbols, tokens, ep: sp.Integer, fp8: bool) -> sp.Expr:
    """DeepEP's normal (high-throughput) dispatch and combine of ``tokens`` per rank over an ep group
    spanning N = tp / node nodes (deepseek-ai/DeepEP README and docs/legacy.md): a token crosses the RDMA
    network once per destination node holding one of its k experts, (N - 1)(1 - (1 - 1/N)^k) remote
    nodes of N on average under uniform routing, and is forwarded over NVLink to the ranks there,
    ep (1 - (1 - 1/ep)^k) of them; the two legs run at once, so each pass takes the slower (NVLink
    alone within a node). Dispatch sends fp8 under fp8 weights (FP8_DISPATCH_BYTES), combine 16-bit.
    DeepEP V1's measured logical RDMA bandwidth on H800 with CX7 400 Gb/s, 43-58 GB/s at EP 16-64
    (local traffic counted), is close to what the device presets carry, 50 GB/s x eff_inter 0.85 =
    42.5 GB/s (bw_inter x eff_inter)."""
    nodes = C.vmax(1, S.tp / S.node)  # the ep group's ranks sit tp / ep apart over the stage's tp devices
    remote = (nodes - 1) * (1 - (1 - 1 / nodes) ** M.k)
    ranks = ep * (1 - (1 - sp.Integer(1) / ep) ** M.k)
    total = 0
    for nbytes in ((FP8_DISPATCH_BYTES if fp8 else ACT_BYTES), ACT_BYTES):  # dispatch, combine
        rdma = tokens * remote * M.h * nbytes / (S.bw_inter * S.eff_inter)
        nvlink = tokens * ranks * M.h * nbytes / (S.bw_intra * S.eff_intra)
        total += C.vmax(rdma, nvlink) + C.latency(S.tp)
    return total


def head_seconds(spec: ModelSpec) -> sp.Expr:
    M = ModelSymbols.of(spec)
    return sum((_gemm_seconds(g, WeightRecipe(), None) for g in FL.head_gemms(spec, M, _context(B, ATTN_TP, 1, S.tp))),
               sp.Integer(0))


def step_terms(spec: ModelSpec, layout: ServeLayout, recipe: WeightRecipe, kv_dtype: str) -> Breakdown:
    """serve.step.{gemm, attention, comm, head, pp, pipeline_wait, host}: seconds between two tokens of a
    sequence. A token crosses every stage (gemm, attention, comm summed over the stages' layers, the
    head on the last, the activations sent between stages); with pp batches in flight each stage
    runs them in turn, so the period is pp x the slowest stage, and ``pipeline_wait`` holds what that
    adds to the sum (0 at pp 1 and for equal stages). Layers of one kind and recipe are built once."""
    M = ModelSymbols.of(spec)
    parts = {"gemm": sp.Integer(0), "attention": sp.Integer(0), "comm": sp.Integer(0)}
    stage_totals = []
    send = C.p2p(ACT_BYTES * (B + P) * M.h, S.tp * 2)  # to the next stage: over NVLink or the NICs
    for s_idx, layers in enumerate(stage_layers(spec, layout.pp)):
        groups: dict = {}
        for layer in layers:
            key = (spec.layer_kinds[layer], layer in recipe.keep_layers, spec.window(layer))
            groups.setdefault(key, [layer, 0])[1] += 1
        stage = {"gemm": sp.Integer(0), "attention": sp.Integer(0), "comm": sp.Integer(0)}
        for layer, count in groups.values():
            for k, v in layer_seconds(spec, layout, recipe, kv_dtype, layer).items():
                stage[k] += count * v
        for k in parts:
            parts[k] += stage[k]
        last = s_idx == layout.pp - 1
        stage_totals.append(sum(stage.values()) + (head_seconds(spec) if last else 0) + (0 if last else send))
    pp_send = (layout.pp - 1) * send
    wait = layout.pp * C.vmax(*stage_totals) - sum(stage_totals) if layout.pp > 1 else sp.Integer(0)
    terms = [Term(key=f"serve.step.{k}", expr=v, unit="s", source="serve/time.py roofline",
                  note="every layer of every stage, one device of each") for k, v in parts.items()]
    terms += [Term(key="serve.step.head", expr=head_seconds(spec), unit="s", source="serve/time.py",
                   note="output layer for the B decoding sequences"),
              Term(key="serve.step.pp", expr=pp_send, unit="s", source="formulas/comm.py p2p",
                   note="activations sent between stages"),
              Term(key="serve.step.pipeline_wait", expr=wait, unit="s", source="serve/time.py step_terms",
                   note="pp x the slowest stage less the sum of the stages"),
              Term(key="serve.step.host", expr=sp.Float(HOST_STEP_S), unit="s",
                   source="HOST_STEP_S, fitted on vLLM CI's fixed-batch latency rows (serve/time.py)",
                   note="scheduler, sampler, untimed kernels and launch gaps, once per step")]
    return Breakdown(tuple(terms))
