"""Step time of one training iteration as a Breakdown of Terms (seconds).

Per micro-batch and pipeline stage i, the device runs forward F_i, input-gradient
backward B_i, weight-gradient backward W_i, the recompute forward R_i and the exposed
per-layer communication C_i (TP/SP collectives, CP ring exchange beyond the attention
core it hides behind, EP all-to-all): t_i = F_i + B_i + W_i + R_i + C_i.

Compute time of a GEMM is a roofline (Williams et al. 2009): max(FLOPs / (peak *
eff_gemm), bytes / (hbm_bytes_per_s * eff_hbm)), with ``eff_gemm8`` for fp8 GEMMs; both come
per device and dtype from its maximum achievable matmul FLOP/s (catalog/mamf.py). The efficiency therefore falls for small per-device
matrices: once 2*M*K*N / (2*(MK + KN + MN)) drops below peak*eff_gemm / (hbm_bytes_per_s*eff_hbm)
FLOP/byte (about 230 on H100 at the defaults) the GEMM is bandwidth-bound, e.g. the
expert GEMMs of a fine-grained MoE with few tokens per expert, or a TP-split head with
tiny micro-batches. Attention-core FLOPs run at the 16-bit peak ``peak_bf16`` (under fp8
GEMMs too: Megatron-LM enables Transformer Engine's fp8 attention only from
TransformerConfig.fp8_dot_product_attention, default False and no command-line flag at
d98e8a64, transformer_config.py:640, fp8_utils.py:779-787; torchtitan's float8 converts
nn.Linear modules only) times ``eff_attn`` times the kernel's length factor
L / (L + ATTN_HALF_TOKENS), L the tokens each attention call sees (the CP shard); norms,
activation functions, residual adds, RoPE, softmax without flash attention and MoE permutes
move bytes at ``hbm_bytes_per_s * eff_hbm`` (the tensors are listed in ``elementwise_bytes``;
backward moves ``ELEMENTWISE_BACKWARD_FACTOR`` times the forward bytes), and so does the loss,
over the logits, at each engine's passes (``loss_pass_bytes``). Under fp8 GEMMs
(``fp8_gemm`` = 1) each transformer-layer GEMM quantises its operands every micro-batch
(``quantise_bytes``); the weights' fp8 copies are made once per step (Transformer Engine
caches them from the first micro-batch, linear.py:479) and not timed.

Pipeline (schedules.py has the memory side). With m micro-batches the step is
m * t_max plus the bubble; for 1F1B (and GPipe) with per-stage times t_i the last
micro-batch's work crosses every stage once: step = sum_i t_i + (m-1) * max_i t_i
(Narayanan et al. 2021 Sec. 2.2: bubble (p-1)*t for equal stages; the unequal form
is the SAPP-PPB objective), so the bubble term is sum_i t_i - max_i t_i.

* interleaved (Narayanan et al. 2021 Sec. 2.2.2): each device's work is split in vpp
  chunks and fill/drain cross chunk boundaries, bubble (sum_i t_i - t_max) / vpp.
* zb-h1 (Qi et al. 2024, Table 2): (p-1)(T_F + T_B - T_W) instead of 1F1B's
  (p-1)(T_F + T_B + T_W), with T_B the input-gradient part: the 1F1B bubble times
  (t - 2W)/t at the bottleneck stage.
* zbv (Qi et al. 2024 Sec. 6): (p-1)(T_F + T_B - 2T_W) per chunk of half a stage, but
  never below the start-up: device i cannot start before i chunk forwards have run, so
  the bubble is at least (p-1) T_F per chunk (a hand-written pp=2, m=2 timeline with
  F = B = W reaches exactly that, tests/test_steptime_published.py). Bubble
  (p-1) max(T_F, T_F + T_B - 2T_W) per chunk = the 1F1B bubble times max(F, t - 3W) / (2t).
* zb-h1 and zbv with m < p: too few W's to fill; the step is at least one micro-batch's
  path, sum_i (F_i + B_i + R_i + C_i) plus the first chunk's W.
* dualpipev (deepseek-ai/DualPipe README table: (PP/2-1)(F&B + B - 3W) over PP chunk-stages,
  F&B the overlapped pair, B a full backward): with the pair run in turn (F&B = F + B + W, the
  runtimes ndplan models, ppb/dag.py) and B the input gradient, (p-1)(F + 2B - W) per chunk. The
  replay of the op order (ppb/simulate.py) meets that only when F = B = W; its longest paths
  grow per stage by the largest of F + 2B - W, 2F + B - W, F + B and 2F (fitted to the replay
  over B/F in 0.5..2, W/F in 0.5..1.5, pp 2..16, m = 2pp and 4pp: step within 3.2 %, 1.8 %
  at pp >= 8, median 0.2 %, one op high at most; tests/test_dualpipe.py), so the bubble is
  (p-1) max(those) per chunk = the 1F1B
  bubble times max(...) / (2t) with device-level F, B, W.
* dualpipe: the same per pair of mirrored stages over pp/2 - 1 of them, each chunk a whole
  stage: (p/2 - 1) max(...) with a stage's F, B, W (the README's (PP/2-1) factor), the 1F1B
  bubble times (p/2 - 1)/(p - 1) max(...)/t. Each micro-batch runs one of the stage's two
  chunks (the other model copy serves the other direction): the stage time per micro-batch is
  half the two chunks' work (``stage_parts``).

Data parallelism (ZeRO 0-2) reduces gradients once per step: an all-reduce (ZeRO 0) or
a reduce-scatter plus the all-gather of the updated 16-bit weights (ZeRO 1-2, the
distributed optimizer). With the engine's overlap settings the reduce-scatter hides
behind one micro-batch's backward and the all-gather behind one forward; the excess is
exposed, and never less than the last gradient bucket and the first gather bucket
(Megatron-LM's buckets); engines without overlap (DeepSpeed below ZeRO-3), pipelines that
reduce after the last backward (DeepSpeed's PipelineEngine) and the later stages' whole
gather at their first forward (Megatron-LM, non-interleaved) expose more
(``_zero012_exposed``, the EngineProfile time fields cite each). ZeRO-3/FSDP gathers 16-bit
weights before forward and again before backward and reduce-scatters gradients every
micro-batch, prefetched layer by layer: exposed per micro-batch the first unit's gather
and the last unit's reduce-scatter, + max(0, gather - first - F) + max(0, gather + reduce
- last - B - W) (``_zero3_exposed``). Those windows are shortened by the hidden TP and CP
collectives on the same links (NVLink or the NICs, dp_comm.shared_window): a link's busy time,
not each collective alone, must fit under the compute.
Pipeline send/recv of the 2*s*b*h/t_sp boundary tensor lies on the critical path
twice (activation forward, gradient backward) for each of the m*vpp + pp - 1 steps
of the fill-steady-drain timeline. The optimizer step streams every local parameter's
state through HBM once (``optimizer_bytes_per_param``).
"""

from __future__ import annotations

import sympy as sp

from ndplan.formulas.minmax import Min

from ndplan import hooks
from ndplan import symbols as S
from ndplan.catalog.model import ModelSpec
from ndplan.engines import EngineProfile
from ndplan.formulas import comm as C
from ndplan.formulas import flops as FL
from ndplan.formulas.activations import ACT_BYTES, ActContext
from ndplan.formulas import groups as G
from ndplan.formulas import params as P
from ndplan.formulas.dp_comm import dp_comm_time
from ndplan.formulas.local import act_context, stage_params
from ndplan.formulas.placement import chunk_layers, has_kind, head_device_flag, layer_count, pp_expr, symbolic_layout
from ndplan.structure import Structure, structure
from ndplan.symbols import ModelSymbols
from ndplan.terms import Breakdown, Term
from ndplan.vocab import BIDIRECTIONAL_SCHEDULES, OVERLAPPED_PAIR_SCHEDULES, SPLIT_W_SCHEDULES

ELEMENTWISE_BACKWARD_FACTOR = 2
"""Backward of an elementwise op reads the output gradient and the saved input and writes
the input gradient: about twice the forward's bytes."""
FP8_OPERAND_BYTES = 1
"""Bytes per input element of an fp8 GEMM: both operands are fp8 copies (quantise_bytes makes
them), the output is 16-bit (Transformer Engine and torchao write bf16). The bandwidth side of
the roofline then matches DeepGEMM's published H800 FP8 table (tests/test_attention_speed.py)."""
COMPILED_LOSS_PASS_BYTES = (4, 4)
"""(forward, backward) HBM bytes per logit element of a loss under torch.compile
(EngineProfile.compiled_loss): inductor fuses the fp32 upcast into its reductions, which read
the 16-bit logits twice (the max, then the exp-sum) in forward; backward reads them once and
writes the 16-bit gradient in one pointwise kernel (the log-sum-exp per token is saved)."""
ATTN_HALF_TOKENS = 400
"""Tokens per attention call at which a fused attention kernel runs at half its long-sequence
throughput, T(L) = T_max L / (L + ATTN_HALF_TOKENS). Least-squares fits to the FlashAttention-3
paper's H100 SXM5 head-dim-128 bars (Shah et al. 2024, arXiv 2407.08608, Figs. 5-6; 512 to 16k
tokens; every bar within 3.3 % of its fit): causal forward 404 (FlashAttention-2), 387 (cuDNN),
604 (FlashAttention-3); non-causal backward 274, 377, 427. 400 is the causal forward of the
FlashAttention-2 and cuDNN kernels the training engines run (tests/test_attention_speed.py
refits the bars). ``eff_attn`` is T_max / peak: cuDNN's fits give 561 / 989 = 0.57 forward
and 542 / 989 = 0.55 backward."""
QUANTISE_FORWARD_BYTES = 3
"""HBM bytes per element of an fp8 GEMM's input in forward: read the 16-bit tensor, write its
row-wise fp8 copy (Transformer Engine linear.py:380-398; per-tensor quantizers make no
column-wise copy in forward, :389-392)."""
QUANTISE_BACKWARD_BYTES = 4
"""HBM bytes per element of an fp8 GEMM's output gradient in backward: read it, write its
row-wise and column-wise fp8 copies in one cast-transpose (linear.py:903-905 sets both usages;
base.py:1688-1780 ``grad_output_preprocess``, "fused bgrad + cast + transpose")."""
TRANSPOSE_BACKWARD_BYTES = 2
"""HBM bytes per element of an fp8 GEMM's saved input in backward: its column-wise copy for the
weight gradient, read 1 B and written 1 B (linear.py:1176-1180)."""


SIXTEEN_BIT_GEMMS = ("moe.router", "head")
"""GEMMs that stay 16-bit under fp8 GEMMs: the MoE router and the output layer (Megatron-LM
builds output_layer as a plain ColumnParallelLinear unless MXFP8's fp8_output_proj is on,
gpt_model.py:272-277 at d98e8a64; torchtitan's llama3 float8 configs filter the output
projection, config_registry.py:314 ``filter_fqns=["lm_head"]``)."""


def fp8_capable(spec: ModelSpec, M: ModelSymbols, kind: str, eng: EngineProfile, weight_dtype: str,
                gemms: list) -> list:
    """The GEMMs of one layer that fp8 GEMMs (``fp8_gemm``) run in fp8: every one but the
    SIXTEEN_BIT_GEMMS under Transformer Engine; with ``fp8_linears_only`` and fp8 weights or
    ``fp8_gemm_compute`` (torchtitan's float8 converter) those of the linears
    params.float8_linear_pieces swaps (``mlp`` covers mlp.up and mlp.down; not the routed
    experts' GroupedExperts). Without fp8 the peaks are equal and the choice changes nothing."""
    gemms = [g for g in gemms if g.name not in SIXTEEN_BIT_GEMMS]
    if not (eng.fp8_linears_only and (weight_dtype == "fp8" or eng.fp8_gemm_compute)):
        return gemms
    swapped = [p.name for p in P.float8_linear_pieces(spec, M, kind)]
    return [g for g in gemms if any(g.name == p or g.name.startswith(p + ".") for p in swapped)]


def gemm_time(g: FL.Gemm, fp8: bool = False, step: str = "F") -> sp.Expr:
    """Roofline seconds of ``g``'s forward (``step`` "F"), input-gradient ("B") or weight-gradient
    ("W") product: at the GEMMs' peak and efficiency (``peak`` and ``eff_gemm8``, the FP8 ones,
    under fp8 GEMMs: ``fp8_gemm`` = 1) with FP8_OPERAND_BYTES per input element when ``fp8`` says
    it can run in fp8, else at the 16-bit peak and ``eff_gemm`` (catalog/mamf.py derives both per
    device). Each product writes a 16-bit result: the activation (F), its gradient (B) or the
    weight gradient (W); the same bytes for all three at 16-bit operands."""
    if fp8:
        rate = S.peak * (S.eff_gemm + S.fp8_gemm * (S.eff_gemm8 - S.eff_gemm))
        nbytes = g.bytes_with(ACT_BYTES - S.fp8_gemm * (ACT_BYTES - FP8_OPERAND_BYTES), step)
    else:
        rate, nbytes = S.peak_bf16 * S.eff_gemm, g.bytes
    return C.vmax(g.flops / rate, nbytes / (S.hbm_bytes_per_s * S.eff_hbm))


def attention_core_time(spec: ModelSpec, M: ModelSymbols, c: ActContext) -> sp.Expr:
    """Seconds of one layer's forward attention core: flash attention at ``eff_attn`` times the
    length factor (ATTN_HALF_TOKENS) of the c.s tokens each call sees; without flash, batched
    GEMMs at ``eff_gemm``; both at the 16-bit peak (module docstring)."""
    if not c.flash:
        return FL.core_flops(spec, M, c, S.seq) / (S.peak_bf16 * S.eff_gemm)
    return FL.core_flops(spec, M, c, S.seq) * (c.s + ATTN_HALF_TOKENS) / (c.s * S.peak_bf16 * S.eff_attn)


def quantise_bytes(fp8: list) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) HBM bytes of quantising the fp8 GEMMs' operands per micro-batch
    (QUANTISE_FORWARD_BYTES, QUANTISE_BACKWARD_BYTES, TRANSPOSE_BACKWARD_BYTES per element of
    each GEMM's input and output) of ``fp8``, the layer's fp8-capable GEMMs."""
    inputs = sum((g.count * g.rows * g.inner for g in fp8), sp.Integer(0))
    outputs = sum((g.count * g.rows * g.cols for g in fp8), sp.Integer(0))
    return (QUANTISE_FORWARD_BYTES * inputs,
            QUANTISE_BACKWARD_BYTES * outputs + TRANSPOSE_BACKWARD_BYTES * inputs)


def elementwise_bytes(spec: ModelSpec, M: ModelSymbols, c: ActContext, kind: str) -> sp.Expr:
    """HBM bytes of one layer's memory-bound forward ops (16-bit tensors)."""
    tok = c.s * c.b
    res = tok * M.h / c.t_sp
    total = 2 * 2 * ACT_BYTES * res            # two norms: read + write
    total += 2 * 3 * ACT_BYTES * res           # two residual adds: 2 reads + 1 write
    heads = (M.a + 1) * M.dr if spec.is_mla else (M.a + M.kv) * M.d
    total += 2 * ACT_BYTES * tok * heads / c.t  # RoPE on q and k: read + write
    if not c.flash:
        total += 2 * ACT_BYTES * M.a / c.t * tok * S.seq  # softmax over materialised scores
    if spec.hidden_dropout > 0:
        total += 2 * (2 * ACT_BYTES + 1) * res  # two dropouts: read, write, 1-byte mask
    act_io = 3 if spec.gated_mlp else 2        # SwiGLU reads gate and up, writes one; GeLU reads, writes
    if kind == "moe":
        pairs = tok * M.k * c.capacity * c.etp / c.t_sp
        total += 2 * 2 * ACT_BYTES * pairs * M.h  # permute and unpermute: read + write
        total += act_io * ACT_BYTES * pairs * M.fe / c.etp
        if spec.has_shared_experts:
            total += act_io * ACT_BYTES * tok * M.fs / c.t
    else:
        total += act_io * ACT_BYTES * tok * M.f / c.t
    return total


def layer_parts(spec: ModelSpec, M: ModelSymbols, view: Structure, c: ActContext, kind: str, eng: EngineProfile) -> dict:
    """Per micro-batch seconds of one layer of ``kind``: F, B, W, R, the exposed comm (tp, cp, ep)
    and the hidden comm per pass (HIDDEN_PARTS)."""
    gemms = FL.layer_gemms(spec, M, c, kind)
    fp8 = fp8_capable(spec, M, kind, eng, view.weight_dtype, gemms)
    gemm = {step: sum((gemm_time(g, any(g is f for f in fp8), step) for g in gemms), sp.Integer(0))
            for step in ("F", "B", "W")}
    core = attention_core_time(spec, M, c)
    hbm = S.hbm_bytes_per_s * S.eff_hbm
    elem = elementwise_bytes(spec, M, c, kind) / hbm
    quant_f, quant_b = (S.fp8_gemm * q / hbm for q in quantise_bytes(fp8))
    F = gemm["F"] + core + elem + quant_f
    B = gemm["B"] + FL.CORE_BACKWARD_FACTOR * core + ELEMENTWISE_BACKWARD_FACTOR * elem + quant_b
    W = gemm["W"]
    order = view.order
    # TP/SP: two all-reduce equivalents forward, two backward (Korthikanti 2022 Sec. 4.2.2:
    # SP's all-gather + reduce-scatter pair costs one all-reduce)
    x = ACT_BYTES * c.s * c.b * M.h
    tp_one = C.all_reduce(S.tp, x, C.span(order, ("tp",)))
    tp_f = 0 if eng.overlap_tp_comm else 2 * tp_one
    # CP ring: cp-1 exchanges of the local K and V forward, K, V, dK, dV backward, under the core
    kv_width = (M.a * (M.dn + M.dr + M.dv) / c.t) if spec.is_mla else 2 * M.kv * M.d / c.t
    kv_bytes = ACT_BYTES * c.s * c.b * kv_width
    cp_link = C.span(order, ("cp",))
    cp_f_raw = (S.cp - 1) * C.p2p(kv_bytes, cp_link)
    cp_f = C.vmax(0, cp_f_raw - core)
    cp_b = C.vmax(0, 2 * cp_f_raw - FL.CORE_BACKWARD_FACTOR * core)
    ep_f = sp.Integer(0)
    if kind == "moe":
        sent = ACT_BYTES * c.s * c.b / c.t_sp * M.k * c.capacity * M.h
        ep_one = C.all_to_all(S.ep, sent, C.stride(order, "ep", "expert"))
        ep_f = 2 * ep_one  # dispatch + combine
    comm_f = tp_f + cp_f + ep_f
    R = {"none": sp.Integer(0), "selective": core, "full": F + comm_f}[view.recompute]
    again = 1 if view.recompute == "full" else 0  # a full recompute reruns the forward's collectives in backward
    hidden = {"tp_hidden_f": 2 * tp_one - tp_f, "tp_hidden_b": 2 * tp_one - tp_f,
              "tp_hidden_r": again * (2 * tp_one - tp_f),
              "cp_hidden_f": cp_f_raw - cp_f, "cp_hidden_b": 2 * cp_f_raw - cp_b, "cp_hidden_r": again * (cp_f_raw - cp_f)}
    return {"F": F, "B": B, "W": W, "R": R, "tp": 2 * tp_f, "cp": cp_f + cp_b, "ep": 2 * ep_f, **hidden}


def loss_pass_bytes(eng: EngineProfile) -> tuple[int, int]:
    """(forward, backward) HBM bytes per logit element of ``eng``'s loss: COMPILED_LOSS_PASS_BYTES
    under a compiled loss, else the engine's loss_bytes_forward / loss_bytes_backward
    (engine_time.py cites each framework's passes)."""
    if eng.compiled_loss:
        return COMPILED_LOSS_PASS_BYTES
    return eng.loss_bytes_forward, eng.loss_bytes_backward


def head_parts(spec, M, c, eng: EngineProfile) -> dict:
    """Per micro-batch seconds of the output layer's GEMM and the loss's memory-bound passes
    (loss_pass_bytes per token and vocab/tp element)."""
    gemm = sum((gemm_time(g) for g in FL.head_gemms(spec, M, c)), sp.Integer(0))
    logits = c.s * c.b * M.V / c.t / (S.hbm_bytes_per_s * S.eff_hbm)
    fwd, bwd = loss_pass_bytes(eng)
    return _zero() | {"F": gemm + fwd * logits, "B": gemm + bwd * logits, "W": gemm}


PARTS = ("F", "B", "W", "R", "tp", "cp", "ep")
"""The parts that take time on the device's critical path (they sum to a micro-batch's time)."""
HIDDEN_PARTS = ("tp_hidden_f", "tp_hidden_b", "tp_hidden_r", "cp_hidden_f", "cp_hidden_b", "cp_hidden_r")
"""Collective seconds that overlap compute (not on the critical path), in the forward, the
backward and a full recompute's forward (in the backward window; trimmed with R under
recompute_layers): TP/SP under overlap_tp_comm, the CP ring under the attention core. They hold
their links while the data-parallel collectives hide in the same windows (dp_comm.shared_window);
``hidden_comm`` reports them."""


def _add(a: dict, b: dict, k=1) -> dict:
    return {p: a[p] + k * b[p] for p in PARTS + HIDDEN_PARTS}


def _zero() -> dict:
    return {p: sp.Integer(0) for p in PARTS + HIDDEN_PARTS}


def stage_parts(spec: ModelSpec, M: ModelSymbols, view: Structure, stage, eng: EngineProfile,
                layer: dict, head: dict) -> dict:
    """Per micro-batch seconds of every part on one device of ``stage``."""
    view = structure(spec, view)
    pp = pp_expr(spec, view)
    out = _zero()
    for ch in range(view.vpp):
        nd, nm = chunk_layers(spec, view, stage, ch, pp, M.L)
        out = _add(_add(out, layer["dense"], nd), layer["moe"], nm)
        if view.partial_recompute:
            # only the first nrec layers of the chunk recompute (dense layers come first)
            rd = C.vmin(S.nrec, nd)
            rm = C.vmin(S.nrec - rd, nm)
            for part in ("R", "tp_hidden_r", "cp_hidden_r"):
                out[part] += (rd - nd) * layer["dense"][part] + (rm - nm) * layer["moe"][part]
    last = head_device_flag(view.schedule, stage, pp)
    out = _add(out, head, last)
    if spec.mtp_layers:
        out = _add(out, _add(layer["moe" if spec.is_moe else "dense"], head), last * spec.mtp_layers)
    if view.schedule in BIDIRECTIONAL_SCHEDULES:  # a micro-batch runs one of the two model copies' chunks
        out = {k: v / 2 for k, v in out.items()}
    return out


def bubble_factor(schedule: str, vpp: int, t, W, F, pp=None) -> sp.Expr:
    """The bubble over (sum of stage times - max) for stage time t per micro-batch, of which W
    weight gradients and F forward (module docstring); ``pp`` for dualpipe."""
    if schedule in ("gpipe", "1f1b"):
        return sp.Integer(1)
    if schedule == "interleaved":
        return sp.Rational(1, vpp)
    if schedule == "zb-h1":
        return C.vmax(t - 2 * W, 0) / t
    if schedule == "zbv":
        return C.vmax(F, t - 3 * W) / (2 * t)
    if schedule in OVERLAPPED_PAIR_SCHEDULES:
        B = t - F - W
        paths = C.vmax(F + 2 * B - W, 2 * F + B - W, F + B, 2 * F)
        if schedule == "dualpipev":
            return paths / (2 * t)
        return (sp.Rational(1, 2) * pp - 1) / (pp - 1) * paths / t
    raise ValueError(schedule)


def _pipeline_bubble(view: Structure, ref: dict, t_ref, t_max, t_sum, w_sum) -> sp.Expr:
    """The schedule's bubble (module docstring): the factor times (sum of stage times -
    max); for zb-h1/zbv with m < pp too few weight gradients fill it, so it is floored at
    one micro-batch's critical path (F and B through every chunk, then the first chunk's
    W) plus (m-1) x the reference stage's F+B+R+C; tests/test_ppb_simulate.py holds it to
    the replay of the hand orders. Never negative (t_sum - t_max rounds to -1e-16 at pp 1)."""
    bubble = bubble_factor(view.schedule, view.vpp, t_ref, ref["W"], ref["F"], S.pp) * (t_sum - t_max)
    if view.schedule in SPLIT_W_SCHEDULES and view.schedule not in OVERLAPPED_PAIR_SCHEDULES:
        path = t_sum - w_sum + ref["W"] / view.vpp
        bubble = C.vmax(bubble, path + (S.m - 1) * (t_ref - ref["W"]) - S.m * t_max)
    return C.vmax(bubble, 0)


def mirror_sync_time(view: Structure, eng: EngineProfile, dense, expert, emb) -> sp.Expr:
    """DualPipe's two model copies: stage i holds slices i and pp-1-i, stage pp-1-i the same two of
    the other copy, so once a step each sends its local gradients (the engine's gradient shard) to
    the mirror and adds what it receives (deepseek-ai/DualPipe examples/example_dualpipe.py:167-174
    sums p.grad with the mirror rank's), one exchange each way at the same time over the pipeline
    link, after the last backward: exposed."""
    grads = G.grad_bytes(view, eng) * G.optimizer_shard(view, eng, dense, expert, emb, level=eng.grads_sharded_from)
    return C.p2p(grads, C.span(view.order, ("pp",)))


def optimizer_bytes_per_param(eng: EngineProfile, view: Structure) -> int:
    """HBM bytes the Adam step streams per local parameter: read the gradient, read and
    write the fp32 master (or the weights when they are the master), both moments, and
    write the 16-bit copy when a separate master exists."""
    master = G.master_bytes(view, eng)
    weights = G.weight_bytes(view, eng)
    return G.grad_bytes(view, eng) + 2 * (master or weights) + 2 * eng.optimizer_bytes + (weights if master else 0)


def _stages(spec: ModelSpec, M: ModelSymbols, view: Structure, eng: EngineProfile, c: ActContext):
    """(per-layer parts, head parts, the stages evaluated, their parts, index of the head's
    stage): the first and last stage of a symbolic layout (and a middle one of an ends
    layout), else every stage."""
    layer = {k: (layer_parts(spec, M, view, c, k, eng) if has_kind(spec, k) else _zero()) for k in ("dense", "moe")}
    head = head_parts(spec, M, c, eng)
    if symbolic_layout(spec, view):
        stages = [sp.Integer(0), pp_expr(spec, view) - 1]
        if view.ends:  # the middle stages hold M layers each: stage 1 stands for them
            stages.insert(1, Min(1, S.pp - 1))
    else:
        stages = [sp.Integer(i) for i in range(view.pp)]
    per_stage = [stage_parts(spec, M, view, s, eng, layer, head) for s in stages]
    return layer, head, stages, per_stage, G.head_stage(view, len(stages))


def _all_layers(spec: ModelSpec, M: ModelSymbols, view: Structure, layer: dict, head: dict, ref: dict) -> dict:
    """One micro-batch's work summed over stages: every layer once, the head (and MTP) once."""
    out = _zero()
    for kind in ("dense", "moe"):
        n = layer_count(spec, M, kind)
        if has_kind(spec, kind):
            out = _add(out, layer[kind], n)
    out = _add(out, head)
    if spec.mtp_layers:
        out = _add(out, _add(layer["moe" if spec.is_moe else "dense"], head), spec.mtp_layers)
    if view.partial_recompute:
        # recompute of the first nrec layers per chunk: every stage as the reference stage
        out["R"] = S.pp * ref["R"]
    return out


def step_time(spec: ModelSpec, M: ModelSymbols, view: Structure, engine: EngineProfile | None = None) -> Breakdown:
    """Time Terms of one step (seconds); they sum to the step time (``view``: a Structure,
    or a Strategy turned into one; ``engine`` replaces its profile)."""
    view = structure(spec, view, engine)
    eng = view.engine
    c = act_context(spec, view)
    layer, head, stages, per_stage, ref_i = _stages(spec, M, view, eng, c)
    tot = [sum(p[k] for k in PARTS) for p in per_stage]
    ref, t_ref = per_stage[ref_i], tot[ref_i]
    t_max = C.vmax(*tot) if len(tot) > 1 else t_ref
    all_layers = _all_layers(spec, M, view, layer, head, ref)
    t_sum = sum(all_layers[k] for k in PARTS)
    bubble = _pipeline_bubble(view, ref, t_ref, t_max, t_sum, all_layers["W"])
    dense, expert, emb = stage_params(spec, M, view, stages[ref_i])
    dp_time, dp_src, _ = dp_comm_time(spec, M, view, eng, ref, (dense, expert, emb), stages[ref_i])
    order = view.order

    p2p_bytes = ACT_BYTES * c.s * c.b * M.h / c.t_sp
    visits = 1 if view.schedule in BIDIRECTIONAL_SCHEDULES else view.vpp  # chunks a micro-batch runs per stage
    pp_time = C.vmin(S.pp - 1, 1) * 2 * (S.m * visits + S.pp - 1) * C.p2p(p2p_bytes, C.span(order, ("pp",)))
    pp_src = "pipeline send/recv of the boundary activation, 2 per critical-path step"
    if view.schedule in BIDIRECTIONAL_SCHEDULES:
        pp_time += mirror_sync_time(view, eng, dense, expert, emb)
        pp_src += ("; dualpipe: the two model copies' gradients exchanged with the mirror stage pp-1-i once a "
                   "step (mirror_sync_time)")

    shard = G.optimizer_shard(view, eng, dense, expert, emb)
    opt = 0 if view.offload_optimizer else optimizer_bytes_per_param(eng, view) * shard / (S.hbm_bytes_per_s * S.eff_hbm)

    m = S.m
    scope = "one device of the stage holding the head (the slowest stage of an even split)"
    T = lambda key, expr, src, note=scope: Term(key=key, expr=expr, unit="s", source=src, note=note)  # noqa: E731
    terms = [
        T("time.compute", m * (ref["F"] + ref["B"] + ref["W"]),
          "m x (forward + backward) per micro-batch: GEMM roofline, attention core at the 16-bit peak x "
          f"eff_attn x L/(L+{ATTN_HALF_TOKENS}), elementwise bytes and fp8 quantisation at HBM bandwidth "
          "(formulas/flops.py, formulas/step.py)"),
        T("time.recompute", m * ref["R"], f"m x extra forward of recompute={view.recompute} "
          "(selective: attention core; full: the whole layer forward incl. its collectives)"),
        T("time.tp_comm", m * ref["tp"], "TP/SP: 4 all-reduce equivalents of 2*s*b*h bytes per layer per "
          "micro-batch (Korthikanti et al. 2022 Sec. 4.2.2), exposed"),
        T("time.cp_comm", m * ref["cp"], "CP ring: (cp-1) K/V exchanges beyond the attention core they hide behind"),
        T("time.ep_comm", m * ref["ep"], "EP: dispatch + combine all-to-all of s*b*k*h tokens forward and backward"),
        T("time.imbalance", m * (t_max - t_ref), "m x (slowest stage - head stage) when another stage is slower",
          "zero for even splits of uniform models"),
        T("time.pp_bubble", bubble, f"pipeline bubble of {view.schedule}: (sum of stage times - max) x "
          "schedule factor (formulas/step.py docstring)"),
        T("time.pp_comm", pp_time, pp_src),
        T("time.dp_comm", dp_time, dp_src),
        T("time.optimizer", opt, "Adam step streaming "
          f"{optimizer_bytes_per_param(eng, view)} bytes per local parameter at HBM bandwidth"),
    ]
    return hooks.apply(Breakdown(tuple(terms)), spec, view)


def hidden_comm(spec: ModelSpec, M: ModelSymbols, view: Structure, engine: EngineProfile | None = None) -> Breakdown:
    """Collective seconds per step that run under compute, per axis (not in the step time, whose
    ``time.*_comm`` Terms are the exposed parts): TP/SP under overlap_tp_comm, the CP ring under the
    attention core, the data-parallel collectives the stage hides (dp_comm_time). The EP all-to-all
    and pipeline send/recv are never hidden in this model; hooks on time.* Terms do not reach them."""
    view = structure(spec, view, engine)
    eng = view.engine
    _, _, stages, per_stage, ref_i = _stages(spec, M, view, eng, act_context(spec, view))
    ref = per_stage[ref_i]
    params = stage_params(spec, M, view, stages[ref_i])
    _, _, dp_hidden = dp_comm_time(spec, M, view, eng, ref, params, stages[ref_i])
    scope = "one device of the stage holding the head; seconds that overlap compute, not in the step time"
    T = lambda key, expr, src: Term(key=key, expr=expr, unit="s", source=src, note=scope)  # noqa: E731
    return Breakdown((
        T("hidden.tp_comm", S.m * sum(ref[f"tp_hidden_{p}"] for p in "fbr"), "TP/SP collectives under the GEMMs "
          "(overlap_tp_comm): the 4 all-reduce equivalents per layer and micro-batch that time.tp_comm leaves out "
          "(6 in each layer a full recompute reruns)"),
        T("hidden.cp_comm", S.m * sum(ref[f"cp_hidden_{p}"] for p in "fbr"), "CP ring K/V exchanges under the "
          "attention core: forward (cp-1) x K,V and backward (cp-1) x K,V,dK,dV (and a full recompute's forward), "
          "less what time.cp_comm exposes"),
        T("hidden.dp_comm", dp_hidden, "the data-parallel gathers and reductions of the step (formulas/dp_comm.py) "
          "less the stage's own exposed ones (time.dp_comm also holds the later stages' gathers on the fill)"),
    ))
