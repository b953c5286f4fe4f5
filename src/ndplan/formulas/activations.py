"""Activation bytes stored for backward, per layer and per micro-batch, on one device.

Start: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", Sec. 4 and Table 2: per layer ``s*b*h*(34 + 5*a*s/h)`` bytes with
16-bit activations, 1-byte dropout masks and a 4h GeLU MLP; ``/t`` for everything
under TP+SP; 10*s*b*h stays unsharded under TP without SP; selective recompute of the
attention core removes the 5*a*s^2*b term; full recompute keeps the 2*s*b*h layer input.

Each component names the tensor(s) it stands for. Deviations from Table 2, all derived
from what the tensors are (no fitted constants); engine-specific choices are named
settings of ``engines.EngineProfile`` (defaults = Megatron-LM):

1. q, k, v are ``2*s*b*(a + 2*kv)*d`` instead of 6*s*b*h, so GQA/MQA and head_dim != h/a
   are exact; MHA with d = h/a gives Table 2's 6*s*b*h.
2. Gated MLP (SwiGLU): gate and up outputs (4*s*b*f) and the down-projection input
   (2*s*b*f); an unfused graph also keeps the SiLU output (2*s*b*f). A GeLU MLP stores
   2*s*b*f (GeLU input) + 2*s*b*f (fc2 input), Table 2's 16*s*b*h at f = 4h.
3. Dropout masks (1 byte per element) only when the model has dropout: attention
   dropout (a*s^2*b mask + 2*a*s^2*b output), hidden dropout (s*b*h after attention and
   after the MLP). Modern LLMs train without dropout.
4. FlashAttention (Dao 2022) stores no s x s matrix: it keeps its output (the o_proj
   input, counted once) and the fp32 log-sum-exp, 4*a*s*b bytes.
5. MLA (DeepSeek-V2 Sec. 2.1): the down-projection outputs (q: ql, kv: kl + dr) and
   their norm outputs are replicated over TP; q and k have dn+dr per head, v has dv.
6. MoE: router logits in fp32 (4*s*b*E); each routed token-expert pair keeps the engine's
   ``moe_rows_saved`` rows of 2*h bytes (the transformers modules: its permuted input and its
   output; Megatron-LM: fc1's input only) and the expert MLP's intermediate;
   T_e = s*b*k*cap*etp/t_sp token-expert pairs per device. Shared experts are a dense
   MLP of width fs. The dispatch's all-to-all buffers are a transient (memory.py).
7. CP divides s (each rank keeps its sequence shard; ring/all-to-all peers' K, V are
   transient). SP divides the residual-stream tensors (norm inputs, linear inputs,
   dropout masks) by tp.
8. Full recompute stores the layer input ``2*s*b*h / t`` under SP, else unsliced
   (Megatron stores the SP-sharded input; an SP-like layout that an engine derives from
   CP does not reach the layer boundary); the layer's activations are rebuilt one layer at a time in
   backward (a transient term in memory.py, ``transient_term``).
9. QK-norm (Qwen3) saves what every norm saves, per head of q and k: its input and, where the
   engine counts it, the per-token statistic (traced: transformers Qwen3 modules).
10. Op-level selective checkpointing (torchtitan's ``selective`` AC in ``op`` mode, engine
   setting ``selective_op_sac``): a layer stores its input, the outputs of every other mm
   in call order and the attention kernel's outputs; everything else is recomputed
   (``op_sac_layer``; traced: ``ndplan trace --policy op``).
11. Engine settings (engines.EngineProfile, each documented and cited there) change what
   is saved: ``rope_inputs_kept`` (q and k before rotation beside the rotated copies),
   ``norm_input_bytes``, ``swiglu_bytes_per_f``, ``gathered_inputs_kept``,
   ``selective_drops`` and ``comm_recompute_keeps_shard`` (what selective recompute
   frees), ``score_bytes`` / ``selective_score_bytes`` / ``selective_score_global``
   (scores without flash attention), ``cp_implies_sp``.
12. fp8 GEMMs (``fp8_linear_inputs``, Transformer Engine): the saved inputs of the q/k/v, fc1
   and fc2 linears take one fp8 byte per element and the recipe's block scales
   (groups.fp8_element_bytes); the o_proj saves an fp8 copy beside the output the flash
   kernel keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy as sp

from ndplan.formulas.minmax import Min

from ndplan.catalog.model import ModelSpec
from ndplan.engines import MEGATRON, EngineProfile
from ndplan.errors import NdplanError
from ndplan.formulas import groups as G
from ndplan.formulas import traced as T
from ndplan.symbols import ModelSymbols
from ndplan.formulas.placement import has_kind

ACT_BYTES = 2  # bf16/fp16 activations (Korthikanti Table 2 assumes 16-bit)
MASK_BYTES = 1  # dropout masks are bytes (Korthikanti Sec. 4.1)
FP32_BYTES = 4  # router logits, flash-attention log-sum-exp


@dataclass(frozen=True)
class ActContext:
    """Local sizes one device sees: ``s`` tokens of its sequence shard, ``b`` micro-batch,
    ``t`` the TP degree for head/column-sharded tensors, ``t_sp`` the divisor of
    residual-stream tensors (t with SP, 1 without), expert TP ``etp`` and the MoE
    capacity factor; ``eng`` the engine profile."""

    s: sp.Expr
    b: sp.Expr
    t: sp.Expr
    t_sp: sp.Expr
    etp: sp.Expr
    capacity: sp.Expr
    flash: bool
    sp: bool = True
    eng: EngineProfile = MEGATRON
    sp_flag: bool = True
    """The user's SP switch (``sp`` may also be on because the engine implies it with CP)."""
    selective_configured: bool = False
    """Selective recompute is set for some layers (see EngineProfile.selective_score_global)."""
    ep: object = 1
    """Expert-parallel degree (routed experts per device = E/ep)."""
    traced: object = None
    """formulas.traced.TracedActivations replacing the closed form (``--activations traced``)."""
    traced_mode: str = "none"
    """The strategy's recompute mode: what the traced embedding and head sites depend on (under
    full and op recompute the first layer's checkpointed input is the embedding's output)."""


def _gathered(c: ActContext) -> sp.Expr:
    """Divisor of a linear layer's saved input: SP-sharded, unless the engine keeps the
    all-gathered copy."""
    return sp.Integer(1) if (c.eng.gathered_inputs_kept and c.sp) else c.t_sp


def attention_parts(spec: ModelSpec, M: ModelSymbols, c: ActContext) -> dict[str, sp.Expr]:
    """Attention block activations by component (bytes per micro-batch)."""
    s, b, t, tsp = c.s, c.b, c.t, c.t_sp
    sbh = s * b * M.h
    parts = {"norm_input": _norm(M, c), "qkv_input": _linear_bytes(c) * sbh / _gathered(c)}
    if spec.is_mla:
        # each latent (q: ql, kv: kl) is a norm input (engine bytes, plus its statistic) and its
        # output feeds the up-projection (2 B); the shared rotary key part k_pe (dr) is kept too
        latents = (M.ql if spec.has_q_lora else 0) + M.kl
        norms = 2 if spec.has_q_lora else 1
        parts["mla_latents"] = ((c.eng.norm_input_bytes + ACT_BYTES) * latents + c.eng.norm_stat_bytes * norms
                                + ACT_BYTES * M.dr) * s * b
        v_width = M.dv + (M.dn if c.eng.mla_value_keeps_kv_up else 0)
        parts["qkv"] = ACT_BYTES * s * b * M.a * (2 * (M.dn + M.dr) + v_width) / t
    else:
        expanded = c.eng.repeat_kv_always or (c.eng.attention_kv_expanded and not c.flash)  # repeat_kv
        kv_heads = M.a if expanded else M.kv
        parts["qkv"] = ACT_BYTES * s * b * (M.a + 2 * kv_heads) * M.d / t
        if c.eng.rope_inputs_kept and not spec.learned_positions:
            parts["rope_input"] = ACT_BYTES * s * b * (M.a + M.kv) * M.d / t  # q and k before rotation
        if spec.qk_norm:  # per-head RMSNorm of q and k (Qwen3): its input and per-head statistic, like any norm
            heads = M.a + M.kv
            parts["qk_norm"] = (c.eng.norm_input_bytes * M.d + c.eng.norm_stat_bytes) * heads * s * b / t
    parts["core"] = core_attention(spec, M, c)
    parts["o_input"] = _o_input_bytes(c) * s * b * _o_width(spec, M) / t
    if spec.hidden_dropout > 0:
        parts["dropout_mask"] = MASK_BYTES * sbh / tsp
    return parts


def _linear_bytes(c: ActContext) -> int:
    """Bytes per element of a saved linear-layer input: one fp8 copy under fp8 GEMMs
    (EngineProfile.fp8_linear_inputs), else 16-bit."""
    return _fp8_input_bytes(c) if c.eng.fp8_linear_inputs else ACT_BYTES


def _fp8_input_bytes(c: ActContext):
    """One saved fp8 copy of a linear input with its block scales (groups.fp8_element_bytes)."""
    return G.fp8_element_bytes(c.eng, c.eng.fp8_act_block)


def _o_input_bytes(c: ActContext) -> int:
    """The attention output, once (the flash kernel's saved output is the o_proj input); under fp8
    GEMMs the o_proj saves its own fp8 copy beside the output flash attention keeps (without flash,
    the core keeps its scores, not its output)."""
    if not c.eng.fp8_linear_inputs:
        return ACT_BYTES
    return _fp8_input_bytes(c) + (ACT_BYTES if c.flash else 0)


def _o_width(spec: ModelSpec, M: ModelSymbols) -> sp.Expr:
    """Width of the attention output (the o_proj input): a heads of d, or of dv under MLA."""
    return M.a * (M.dv if spec.is_mla else M.d)


def _norm(M: ModelSymbols, c: ActContext) -> sp.Expr:
    """What one norm saves: its input (engine bytes per element) and its per-token statistic."""
    return (c.eng.norm_input_bytes * M.h + c.eng.norm_stat_bytes) * c.s * c.b / c.t_sp


def core_attention(spec: ModelSpec, M: ModelSymbols, c: ActContext, selective: bool = False) -> sp.Expr:
    """The attention core: the s x s softmax (and its dropout) without flash attention,
    the fp32 log-sum-exp with it."""
    s, b, t = c.s, c.b, c.t
    if c.flash:
        return FP32_BYTES * M.a * s * b / t
    if c.eng.score_bytes:
        sel = selective or (c.selective_configured and c.eng.selective_score_global)
        per = c.eng.selective_score_bytes if sel else c.eng.score_bytes
    else:
        per = ACT_BYTES + ((MASK_BYTES + ACT_BYTES) if spec.attention_dropout > 0 else 0)
    return per * M.a * s * s * b / t


def _ffn_parts(spec: ModelSpec, c: ActContext, width, tokens, t_width) -> dict[str, sp.Expr]:
    """Saved tensors of an MLP of ``width`` over ``tokens`` tokens, width split by t_width."""
    if spec.gated_mlp:
        parts = {"gate_up": 2 * ACT_BYTES * tokens * width / t_width,
                 "down_input": _linear_bytes(c) * tokens * width / t_width}
        extra = c.eng.swiglu_bytes_per_f - 3 * ACT_BYTES  # unfused graphs keep the SiLU output
        if extra:
            parts["act_out"] = extra * tokens * width / t_width
        return parts
    return {"act_input": ACT_BYTES * tokens * width / t_width, "down_input": _linear_bytes(c) * tokens * width / t_width}


def mlp_parts(spec: ModelSpec, M: ModelSymbols, c: ActContext) -> dict[str, sp.Expr]:
    sbh = c.s * c.b * M.h
    parts = {"norm_input": _norm(M, c), "fc1_input": _linear_bytes(c) * sbh / _gathered(c)}
    parts |= _ffn_parts(spec, c, M.f, c.s * c.b, c.t)
    if spec.hidden_dropout > 0:
        parts["dropout_mask"] = MASK_BYTES * sbh / c.t_sp
    return parts


def moe_parts(spec: ModelSpec, M: ModelSymbols, c: ActContext) -> dict[str, sp.Expr]:
    s, b, tsp = c.s, c.b, c.t_sp
    sbh = s * b * M.h
    tokens_e = s * b * M.k * c.capacity * c.etp / tsp  # token-expert pairs on this device
    parts = {"norm_input": _norm(M, c), "fc1_input": ACT_BYTES * sbh / _gathered(c),
             "router_logits": FP32_BYTES * s * b * M.E / tsp,
             "expert_io": c.eng.moe_rows_saved * ACT_BYTES * tokens_e * M.h}
    parts |= {f"expert_{k}": v for k, v in _ffn_parts(spec, c, M.fe, tokens_e, c.etp).items()}
    if spec.has_shared_experts:
        parts |= {f"shared_{k}": v for k, v in _ffn_parts(spec, c, M.fs, s * b, c.t).items()}
    if spec.hidden_dropout > 0:
        parts["dropout_mask"] = MASK_BYTES * sbh / tsp
    return parts


def _dropped(c: ActContext, name: str) -> bool:
    """Does the engine's selective recompute drop component ``name``?"""
    base = name.split("_", 1)[1] if name.startswith(("expert_", "shared_")) else name
    if base == "core":
        return "core" in c.eng.selective_drops and not c.eng.keep_core_attn
    return base in c.eng.selective_drops


_CHECKPOINT_INPUTS = ("ffn.norm_input", "ffn.fc1_input", "ffn.dropout_mask")
"""What stays of a checkpointed MoE layer: the pre-MLP norm's input and output (the
checkpoint's input, hidden_states) and the hidden dropout that follows the layer."""


def module_drops(spec: ModelSpec, eng: EngineProfile, kind: str, parts: dict) -> set[str]:
    """Components (keys of ``parts``, one layer of ``kind``) that Megatron's per-module
    recompute frees (EngineProfile.recompute_layernorm ... recompute_shared_experts, each
    citing the Megatron-LM lines that wrap the module)."""
    ffn = [k for k in parts if k.startswith("ffn.")]
    out: set[str] = set()
    if eng.recompute_layernorm:
        out |= {"ffn.fc1_input"} if kind == "moe" else set()
        out |= {"qkv_input"} if spec.is_mla else set()
    if eng.recompute_mla_up_proj and spec.is_mla:
        out.add("qkv")
    if eng.recompute_mlp and kind == "dense":
        out |= {k for k in ffn if k not in ("ffn.norm_input", "ffn.dropout_mask")}
    if eng.recompute_moe and kind == "moe":
        out |= {k for k in ffn if k not in _CHECKPOINT_INPUTS}
    if eng.recompute_moe_act and kind == "moe":
        out |= {k for k in ffn if k in ("ffn.expert_down_input", "ffn.expert_act_out")}
    if eng.recompute_shared_experts and kind == "moe":
        out |= {k for k in ffn if k.startswith("ffn.shared_")}
    return out


def mm_outputs(spec: ModelSpec, M: ModelSymbols, c: ActContext, kind: str) -> list[sp.Expr]:
    """Bytes of the output of each ``aten.mm`` a layer of ``kind`` runs in forward, in call
    order (transformers and torchtitan module order: q, k, v, o, or one fused qkv
    (``fused_qkv``), o; MLA q_a, q_b, kv_a, kv_b, o;
    then gate, up, down; a MoE layer's router and its shared expert's gate, up, down). A
    linear with a bias runs ``aten.addmm``, not an mm (Qwen2's q, k, v; GPT's every linear);
    routed experts run ``aten._grouped_mm``. Column-parallel outputs are split by tp; a
    row-parallel output (o, down) is the full-width partial sum before its reduction; MLA's
    down-projections (q_a, kv_a) are replicated."""
    per_token = ACT_BYTES * c.s * c.b
    t = c.t
    widths: list[sp.Expr] = []
    if spec.is_mla:
        widths += [M.ql, M.a * (M.dn + M.dr) / t] if spec.has_q_lora else [M.a * (M.dn + M.dr) / t]
        widths += [M.kl + M.dr, M.a * (M.dn + M.dv) / t]
    elif not spec.attention_bias and c.eng.fused_qkv:
        widths.append((M.a + 2 * M.kv) * M.d / t)
    elif not spec.attention_bias:
        widths += [M.a * M.d / t, M.kv * M.d / t, M.kv * M.d / t]
    if not (spec.attention_bias and spec.learned_positions):  # GPT-style: o_proj has a bias too
        widths.append(M.h)
    mlp_width = M.f
    if kind == "moe":
        widths.append(M.E)  # router logits (torchtitan's and transformers' bf16 nn.Linear gates)
        mlp_width = M.fs if spec.has_shared_experts else None
    if mlp_width is not None and not spec.mlp_bias:
        widths += [mlp_width / t, mlp_width / t] if spec.gated_mlp else [mlp_width / t]
        widths.append(M.h)
    return [per_token * w for w in widths]


def op_sac_layer(spec: ModelSpec, M: ModelSymbols, c: ActContext, kind: str) -> sp.Expr:
    """What a layer stores under torchtitan's op-level SAC (torchtitan
    torchtitan/distributed/activation_checkpoint.py ``_save_list`` and ``_get_custom_policy``
    at 55e42c0d): its checkpointed input, the outputs of the 1st, 3rd, 5th, ... ``aten.mm``
    (a counter per layer call saves an mm unless the count is even) and the attention
    kernel's outputs (its output and fp32 log-sum-exp). Norms, activations, products and
    the other mm outputs are recomputed. With SP (tp > 1) the reduce-scatter outputs of
    o and down are saved as well (``_c10d_functional.reduce_scatter_tensor`` is listed)."""
    mms = mm_outputs(spec, M, c, kind)
    saved = sp.Add(*mms[0::2])
    layer_input = ACT_BYTES * c.s * c.b * M.h / c.t_sp
    attention = ACT_BYTES * c.s * c.b * _o_width(spec, M) / c.t + core_attention(spec, M, c)
    row_parallel = 1 + int(kind != "moe" or spec.has_shared_experts)  # o, and a dense down
    scatter = row_parallel * ACT_BYTES * c.s * c.b * M.h / c.t * Min(c.t - 1, 1) if c.sp else 0
    return layer_input + saved + attention + scatter


def mlp_backward_workspace(spec: ModelSpec, M: ModelSymbols, c: ActContext, kind: str) -> sp.Expr:
    """Activation gradients alive above a layer's saved tensors at the height of its MLP backward,
    by autograd's order on ``down(act(gate(x)) * up(x))``: the down projection's backward makes
    the gradient of its input m (+f) and frees the saved m (-f); the product's backward makes the
    gradients of both factors (+2f) while that gradient is alive: h + 2f 16-bit values per token
    beside the layer output's gradient (h); without a gate, fc2's then the activation's backward:
    h + f. In an MoE layer f is the routed experts' width x top-k plus the shared experts': the
    device's experts take k x capacity rows per token of its s b / t_sp, times etp after the
    expert-TP gather, each fe / etp wide, so fe k capacity / t_sp per token of s b (until
    2026-12-06 fe k / etp, which counted t_sp / etp times the rows at tp > etp and left out the
    capacity). Checked on the gloo runtime's full-recompute peaks (tests/test_runtime.py).
    Under fp8 GEMMs (``fp8_linear_inputs``) the up projection's backward quantises that output
    gradient into a row-wise and a column-wise fp8 copy beside it (Transformer Engine linear.py:
    903-905, base.py:1688-1780), each with its block scales: 2 x (2f or f) fp8 elements more."""
    tokens = c.s * c.b
    if kind == "moe":
        width = M.fe * M.k * c.capacity / c.t_sp + M.fs / c.t
    else:
        width = M.f / c.t
    up_grad = (2 if spec.gated_mlp else 1) * width
    fp8_copies = 2 * _fp8_input_bytes(c) * up_grad if c.eng.fp8_linear_inputs else 0
    return tokens * (ACT_BYTES * (M.h / c.t_sp + up_grad) + fp8_copies)


def layer_activation(spec: ModelSpec, M: ModelSymbols, c: ActContext, kind: str, mode: str) -> sp.Expr:
    """Bytes one layer of ``kind`` stores per micro-batch under recompute ``mode``
    (``op``: torchtitan's op-level SAC, which ``selective`` means for engines with
    ``selective_op_sac``)."""
    if c.traced is not None:
        return _traced(spec, M, c, kind, T.trace_policy(mode, c.eng.selective_op_sac))
    if mode == "op" or (mode == "selective" and c.eng.selective_op_sac):
        return op_sac_layer(spec, M, c, kind)
    if c.eng.compiled_blocks and mode in ("none", "selective"):
        c = replace(c, eng=compiled_view(c.eng))
    if mode == "full":
        sliced = c.eng.full_recompute_input_sliced and c.sp_flag  # the user's SP, not CP's SP-like layout
        return ACT_BYTES * c.s * c.b * M.h / (c.t if sliced else 1)
    parts = attention_parts(spec, M, c)
    parts |= {f"ffn.{k}": v for k, v in (moe_parts(spec, M, c) if kind == "moe" else mlp_parts(spec, M, c)).items()}
    if mode == "selective":
        modules = module_drops(spec, c.eng, kind, parts)
        keep = {k: v for k, v in parts.items() if not _dropped(c, k.removeprefix("ffn.")) and k not in modules}
        if c.eng.comm_recompute_keeps_shard and c.eng.gathered_inputs_kept and c.sp:
            # the all-gather re-run in backward needs its SP-sharded input (the norm output)
            for k in ("qkv_input", "ffn.fc1_input"):
                if k in parts and k not in keep:
                    keep[k] = ACT_BYTES * c.s * c.b * M.h / c.t_sp
        if "core" not in keep and not c.flash and c.eng.selective_score_bytes:
            keep["core"] = core_attention(spec, M, c, selective=True)
        elif "core" in keep and not c.flash and c.eng.score_bytes:
            keep["core"] = core_attention(spec, M, c, selective=True)
        if c.eng.selective_needs_tp:
            # selective acts only when SP splits over tp > 1 devices (EngineProfile.selective_needs_tp);
            # gate = 0 at tp = 1, where the SP layout is the non-SP one
            stored = sp.Add(*parts.values())
            gate = Min(c.t - 1, 1) if c.sp_flag else 0
            return stored - gate * (stored - sp.Add(*keep.values()))
        parts = keep
    return sp.Add(*parts.values())


def compiled_view(eng: EngineProfile) -> EngineProfile:
    """What a compiled layer saves (EngineProfile.compiled_blocks): 16-bit norm inputs, no SiLU output."""
    return replace(eng, norm_input_bytes=ACT_BYTES, swiglu_bytes_per_f=3 * ACT_BYTES, compiled_blocks=False)


def embedding_activation(spec: ModelSpec, M: ModelSymbols, c: ActContext) -> sp.Expr:
    """Embedding output dropout mask (Korthikanti Sec. 4.3), first stage only."""
    if c.traced is not None:
        return _traced(spec, M, c, "embedding", T.trace_policy(c.traced_mode, c.eng.selective_op_sac))
    return MASK_BYTES * c.s * c.b * M.h / c.t_sp if spec.hidden_dropout > 0 else sp.Integer(0)


def head_activation(spec: ModelSpec, M: ModelSymbols, c: ActContext) -> sp.Expr:
    """Final-norm input and output-layer input kept for backward, last stage only."""
    if c.traced is not None:
        return _traced(spec, M, c, "head", T.trace_policy(c.traced_mode, c.eng.selective_op_sac))
    return _norm(M, c) + ACT_BYTES * c.s * c.b * M.h / _gathered(c)


def _traced(spec: ModelSpec, M: ModelSymbols, c: ActContext, site: str, policy: str) -> sp.Expr:
    """The traced bytes of ``site`` (formulas.traced.local_bytes); a layer kind the model does
    not have is 0."""
    out = T.local_bytes(c.traced, site, policy, M, c)
    if out is not None:
        return out
    if site in ("dense", "moe") and not has_kind(spec, site):
        return sp.Integer(0)
    raise NdplanError("--activations", "traced", f"the trace has no {site} site under recompute policy {policy}",
                      f"trace it with ndplan trace (policies traced: {', '.join(c.traced.policies())}) or use "
                      "--activations closed-form")
