"""FLOPs and bytes of one decoder layer (and of the embedding/head), per device and per
micro-batch, as a list of GEMMs plus the attention core.

A GEMM of an (M x K) by (K x N) product costs 2*M*K*N FLOPs (one multiply and one add
per term) and moves at least 2*(M*K + K*N + M*N) bytes with 16-bit operands; both are
kept so step.py can apply a roofline (compute- or bandwidth-bound). Dimensions are what
one device computes (``ActContext``): TP splits the column-parallel output width and the
row-parallel input width by ``t``; SP gathers the sequence before column-parallel GEMMs,
so every TP rank multiplies all ``s*b`` local tokens.

* attention, MHA/GQA (Megatron ``SelfAttention``): qkv K=h, N=(a+2kv)*d/t; o K=a*d/t, N=h.
* MLA (DeepSeek-V2 Sec. 2.1): q_down h->ql and kv_down h->(kl+dr) are replicated (every
  TP rank computes them whole); q_up ql->a*(dn+dr)/t (or q h->a*(dn+dr)/t), kv_up
  kl->a*(dn+dv)/t, o a*dv/t->h.
* attention core: QK^T and PV, 2*b*s_q*s_k*(a/t)*(d_qk + d_v) FLOPs for s_q local queries
  against s_k = seq keys (CP splits the queries, each rank attends to the whole
  sequence), times the causal factor 1/2 (Dao 2023, FlashAttention-2 Sec. 3.1: causal
  masking skips about half the blocks). Backward is 2.5x the forward: 5 matmuls instead
  of 2 (FlashAttention-2 Sec. 3.2 recomputes P).
* gated MLP (SwiGLU): gate+up K=h, N=2f/t; down K=f/t, N=h. GeLU MLP: fc1 K=h, N=f/t;
  fc2 K=f/t, N=h (Narayanan et al. 2021 Eq. 3 counts these 16*b*s*h^2 at f=4h).
* MoE: router K=h, N=E on the s*b/t_sp local tokens (replicated weights); routed
  experts: T_e = s*b*k*capacity*etp/t_sp token-expert pairs per device (the same count
  as activations.moe_parts), spread over E/ep local experts, each a gated MLP of width
  fe/etp; shared experts a gated MLP of width fs over s*b tokens, split by t.
* head: K=h, N=V/t over s*b tokens (vocab-parallel output layer).
* backward: every GEMM has an input-gradient GEMM and a weight-gradient GEMM of the same
  FLOPs (2x forward; Narayanan et al. 2021 Sec. 3.5); zero-bubble schedules place the
  weight-gradient part separately (Qi et al. 2024).

Model FLOPs (for MFU) are the same GEMMs at t = cp = 1 for one sequence, times
forward + backward (3x): no recompute, causal attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from ndplan.catalog.model import ModelSpec
from ndplan.formulas.activations import ACT_BYTES, ActContext
from ndplan.symbols import ModelSymbols
from ndplan.formulas.placement import has_kind, layer_count

CAUSAL_FACTOR = sp.Rational(1, 2)
"""Fraction of the s x s score blocks a causal mask leaves (FlashAttention-2 Sec. 3.1)."""
CORE_BACKWARD_FACTOR = sp.Rational(5, 2)
"""Attention-core backward / forward FLOPs: 5 matmuls vs 2 (FlashAttention-2 Sec. 3.2)."""
GEMM_BACKWARD_FACTOR = 2
"""Input-gradient + weight-gradient GEMMs, each the forward's FLOPs."""


@dataclass(frozen=True)
class Gemm:
    """``count`` independent (rows x inner) @ (inner x cols) products on one device (the
    GEMM's M, K, N; named apart from the model symbols ``M``)."""

    name: str
    rows: sp.Expr
    inner: sp.Expr
    cols: sp.Expr
    count: sp.Expr = sp.Integer(1)

    @property
    def flops(self) -> sp.Expr:
        return 2 * self.rows * self.inner * self.cols * self.count

    @property
    def bytes(self) -> sp.Expr:
        return self.bytes_with(ACT_BYTES)

    def bytes_with(self, operand_bytes, step: str = "F") -> sp.Expr:
        """HBM bytes of the forward product (``step`` "F": input rows x inner and weight inner x
        cols in, rows x cols out), the input gradient ("B": output gradient and weight in, rows x
        inner out) or the weight gradient ("W": input and output gradient in, inner x cols out),
        with ``operand_bytes`` per input element (1 for fp8 operands) and a 16-bit result."""
        act, weight, out = self.rows * self.inner, self.inner * self.cols, self.rows * self.cols
        operands, result = {"F": (act + weight, out), "B": (out + weight, act), "W": (act + out, weight)}[step]
        return (operand_bytes * operands + ACT_BYTES * result) * self.count


def attention_gemms(spec: ModelSpec, M: ModelSymbols, c: ActContext) -> list[Gemm]:
    tok, t = c.s * c.b, c.t
    if spec.is_mla:
        qk = M.dn + M.dr
        out = [Gemm("attn.q_down", tok, M.h, M.ql), Gemm("attn.q_up", tok, M.ql, M.a * qk / t)] \
            if spec.has_q_lora else [Gemm("attn.q", tok, M.h, M.a * qk / t)]
        return out + [Gemm("attn.kv_down", tok, M.h, M.kl + M.dr),
                      Gemm("attn.kv_up", tok, M.kl, M.a * (M.dn + M.dv) / t),
                      Gemm("attn.o", tok, M.a * M.dv / t, M.h)]
    return [Gemm("attn.qkv", tok, M.h, (M.a + 2 * M.kv) * M.d / t),
            Gemm("attn.o", tok, M.a * M.d / t, M.h)]


def core_flops(spec: ModelSpec, M: ModelSymbols, c: ActContext, seq_keys) -> sp.Expr:
    """Forward FLOPs of QK^T and PV on one device, causal."""
    dims = (M.dn + M.dr + M.dv) if spec.is_mla else 2 * M.d
    return CAUSAL_FACTOR * 2 * c.b * c.s * seq_keys * (M.a / c.t) * dims


def _mlp(spec: ModelSpec, name: str, tok, h, width, t_width, count=sp.Integer(1)) -> list[Gemm]:
    n_in = 2 if spec.gated_mlp else 1
    return [Gemm(f"{name}.up", tok, h, n_in * width / t_width, count),
            Gemm(f"{name}.down", tok, width / t_width, h, count)]


def ffn_gemms(spec: ModelSpec, M: ModelSymbols, c: ActContext, kind: str) -> list[Gemm]:
    tok = c.s * c.b
    if kind != "moe":
        return _mlp(spec, "mlp", tok, M.h, M.f, c.t)
    local_experts = M.E / c.ep
    pairs = c.s * c.b * M.k * c.capacity * c.etp / c.t_sp
    out = [Gemm("moe.router", c.s * c.b / c.t_sp, M.h, M.E)]
    out += _mlp(spec, "moe.experts", pairs / local_experts, M.h, M.fe, c.etp, local_experts)
    if spec.has_shared_experts:
        out += _mlp(spec, "moe.shared", tok, M.h, M.fs, c.t)
    return out


def layer_gemms(spec: ModelSpec, M: ModelSymbols, c: ActContext, kind: str) -> list[Gemm]:
    return attention_gemms(spec, M, c) + ffn_gemms(spec, M, c, kind)


def head_gemms(spec: ModelSpec, M: ModelSymbols, c: ActContext) -> list[Gemm]:
    return [Gemm("head", c.s * c.b, M.h, M.V / c.t)]


def mtp_gemms(spec: ModelSpec, M: ModelSymbols, c: ActContext) -> list[Gemm]:
    """One MTP module's own projection (2h -> h) plus its decoder layer and the shared head."""
    kind = "moe" if spec.is_moe else "dense"
    return ([Gemm("mtp.proj", c.s * c.b, 2 * M.h, M.h / c.t)] + layer_gemms(spec, M, c, kind)
            + head_gemms(spec, M, c))


def _unsharded(seq) -> ActContext:
    """One sequence on one device: no TP, CP, EP; capacity 1."""
    one = sp.Integer(1)
    return ActContext(s=seq, b=one, t=one, t_sp=one, etp=one, capacity=one, flash=True, ep=one)


def model_flops_per_sequence(spec: ModelSpec, M: ModelSymbols, seq) -> sp.Expr:
    """Forward + backward FLOPs of one sequence through the whole model, no parallelism,
    no recompute, causal attention: the MFU numerator per sequence (MTP excluded)."""
    c = _unsharded(seq)
    fwd = sp.Integer(0)
    for kind in ("dense", "moe"):
        n = layer_count(spec, M, kind)
        if has_kind(spec, kind):
            fwd += n * (sum(g.flops for g in layer_gemms(spec, M, c, kind)) + core_flops(spec, M, c, seq))
    fwd += sum(g.flops for g in head_gemms(spec, M, c))
    return (1 + GEMM_BACKWARD_FACTOR) * fwd


def recompute_flops_per_sequence(spec: ModelSpec, M: ModelSymbols, seq, mode: str) -> sp.Expr:
    """Extra forward FLOPs recompute adds per sequence (for HFU): full recomputes every
    layer's forward, selective the attention core."""
    if mode == "none":
        return sp.Integer(0)
    c = _unsharded(seq)
    out = sp.Integer(0)
    for kind in ("dense", "moe"):
        n = layer_count(spec, M, kind)
        if has_kind(spec, kind):
            core = core_flops(spec, M, c, seq)
            out += n * (core if mode == "selective" else sum(g.flops for g in layer_gemms(spec, M, c, kind)) + core)
    return out
