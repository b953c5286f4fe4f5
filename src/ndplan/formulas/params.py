"""Parameter counts per layer type, and how each piece is sharded.

Counts follow the Hugging Face transformers module structure of each model type
(tests hold them to transformers' own counts, tests/data/hf_param_counts.yaml):

* attention (MHA/GQA/MQA): q h*a*d, k and v h*kv*d each, o a*d*h; q/k/v biases when
  ``attention_bias`` (Qwen2: q/k/v only; Llama/GPT: o too); Qwen3 QK-norm 2*d.
* MLA (DeepSeek-V2/V3): q_a h*ql + norm ql + q_b ql*a*(dn+dr) (or q h*a*(dn+dr) when
  ql=0); kv_a_proj_with_mqa h*(kl+dr), kv_a norm kl, kv_b kl*a*(dn+dv), o a*dv*h.
* dense MLP: gated 3*h*f; GPT 2*h*f + f + h (biases).
* MoE: router E*h (+E correction bias for DeepSeek-V3), routed experts E*3*h*fe,
  shared experts 3*h*fs; experts of a non-gated MLP (Megatron and Megatron-DeepSpeed MoE
  without --swiglu: ParallelMLP / MLP with gated_linear_unit False) 2*h*fe (+ fe + h biases)
  each, shared experts likewise.
* norms: RMSNorm h, LayerNorm 2h (weight + bias); two per layer plus the final one.
* embedding V*h (+ learned positions P*h), head V*h unless tied.
* MTP module (DeepSeek-V3 Sec. 2.2): enorm h, hnorm h, projection 2h*h, one MoE
  decoder layer, a final norm h; embedding and output head shared with the main model.

Sharding (Megatron-LM/Megatron-Core layouts): ``tp`` pieces are split over TP
(column/row-parallel linears, vocab-parallel embedding and head), ``rep`` pieces are
replicated (norms, router, MLA down-projections, row-parallel biases, learned
positions), ``expert`` pieces are split over ep*etp.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from ndplan.catalog.model import ModelSpec
from ndplan.symbols import ModelSymbols
from ndplan.formulas.placement import has_kind, layer_count
from ndplan.readlog import derived


@dataclass(frozen=True)
class Piece:
    name: str
    count: sp.Expr
    shard: str  # "tp" | "rep" | "expert"


def _norm(spec: ModelSpec, width) -> sp.Expr:
    return (2 if spec.layernorm else 1) * width


def attention_pieces(spec: ModelSpec, M: ModelSymbols) -> list[Piece]:
    if spec.is_mla:
        qk = M.dn + M.dr
        if spec.has_q_lora:
            q = [Piece("attn.q_down", M.h * M.ql + M.ql, "rep"), Piece("attn.q_up", M.ql * M.a * qk, "tp")]
        else:
            q = [Piece("attn.q", M.h * M.a * qk, "tp")]
        return q + [
            Piece("attn.kv_down", M.h * (M.kl + M.dr) + M.kl, "rep"),
            Piece("attn.kv_up", M.kl * M.a * (M.dn + M.dv), "tp"),
            Piece("attn.o", M.a * M.dv * M.h, "tp"),
        ]
    qkv = M.h * (M.a + 2 * M.kv) * M.d
    pieces = [Piece("attn.qkv", qkv, "tp"), Piece("attn.o", M.a * M.d * M.h, "tp")]
    if spec.attention_bias:
        pieces.append(Piece("attn.qkv_bias", (M.a + 2 * M.kv) * M.d, "tp"))
        if not spec.implicit_qkv_bias:
            pieces.append(Piece("attn.o_bias", M.h, "rep"))
    if spec.qk_norm:
        pieces.append(Piece("attn.qk_norm", 2 * M.d, "rep"))
    return pieces


def mlp_pieces(spec: ModelSpec, M: ModelSymbols) -> list[Piece]:
    if spec.gated_mlp:
        return [Piece("mlp", 3 * M.h * M.f, "tp")]
    pieces = [Piece("mlp", 2 * M.h * M.f, "tp")]
    if spec.mlp_bias:
        pieces += [Piece("mlp.fc1_bias", M.f, "tp"), Piece("mlp.fc2_bias", M.h, "rep")]
    return pieces


def expert_params(spec: ModelSpec, M: ModelSymbols, width) -> sp.Expr:
    """One expert MLP of ``width``: gated 3*h*width, else 2*h*width (+ width + h biases)."""
    if spec.gated_mlp:
        return 3 * M.h * width
    return 2 * M.h * width + ((width + M.h) if spec.mlp_bias else 0)


def moe_pieces(spec: ModelSpec, M: ModelSymbols) -> list[Piece]:
    pieces = [Piece("moe.router", M.E * M.h + (M.E if spec.router_bias else 0), "rep"),
              Piece("moe.experts", M.E * expert_params(spec, M, M.fe), "expert")]
    if spec.has_shared_experts:
        pieces.append(Piece("moe.shared", expert_params(spec, M, M.fs), "tp"))
    return pieces


def layer_pieces(spec: ModelSpec, M: ModelSymbols, kind: str) -> list[Piece]:
    """One decoder layer of ``kind`` (dense | moe): attention, MLP or MoE, two norms."""
    ffn = moe_pieces(spec, M) if kind == "moe" else mlp_pieces(spec, M)
    return attention_pieces(spec, M) + ffn + [Piece("norms", 2 * _norm(spec, M.h), "rep")]


FLOAT8_DIM_MULTIPLE = 16
"""torchtitan converts only linears whose in and out features are multiples of 16 (float8
tensor-core shapes; components/quantization/utils.py module_filter_fn)."""


def float8_linear_pieces(spec: ModelSpec, M: ModelSymbols, kind: str) -> list[Piece]:
    """The weight elements of one decoder layer that torchtitan's float8 converter swaps for
    torchao ``Float8Linear`` (components/quantization/float8.py ``Float8LinearConverter``;
    torchao float8/float8_linear.py): every ``nn.Linear`` of attention, the dense MLP and the
    shared experts whose in and out features are multiples of ``FLOAT8_DIM_MULTIPLE``. Not
    swapped: biases (plain parameters beside the float8 weight), norms, the MoE router
    (torchtitan's MoE configs filter ``router.gate``), the routed experts (``GroupedExperts``,
    not an ``nn.Linear``), the embedding and the output layer (``filter_fqns = ["output"]``
    in torchtitan's train configs). MLA's down-projections count without their norms."""
    ok = float8_widths(spec)
    fits = lambda *dims: all(d in ok for d in dims)  # noqa: E731
    shape = {  # piece -> (weight elements, dims that must be multiples of 16)
        "attn.qkv": (M.h * (M.a + 2 * M.kv) * M.d, ("h", "ad", "kvd")),
        "attn.o": (M.a * M.d * M.h, ("h", "ad")),
        "attn.q": (M.h * M.a * (M.dn + M.dr), ("h", "aqk")),
        "attn.q_down": (M.h * M.ql, ("h", "ql")),
        "attn.q_up": (M.ql * M.a * (M.dn + M.dr), ("ql", "aqk")),
        "attn.kv_down": (M.h * (M.kl + M.dr), ("h", "kldr")),
        "attn.kv_up": (M.kl * M.a * (M.dn + M.dv), ("kl", "akv")),
        "mlp": (None, ("h", "f")),
        "moe.shared": (3 * M.h * M.fs, ("h", "fs")),
    }
    out = []
    for piece in layer_pieces(spec, M, kind):
        if piece.name not in shape:
            continue
        count, dims = shape[piece.name]
        if piece.name == "attn.o" and spec.is_mla:
            count, dims = M.a * M.dv * M.h, ("h", "adv")
        if fits(*dims):
            out.append(Piece(piece.name, piece.count if count is None else count, piece.shard))
    return out


@derived
def float8_widths(spec: ModelSpec) -> tuple[str, ...]:
    """The linear widths (names of ``_widths``) that are multiples of FLOAT8_DIM_MULTIPLE, on
    the real sizes (M may be symbolic; one recorded read of the model, readlog.derived)."""
    return tuple(k for k, v in _widths(ModelSymbols.of(spec)).items() if v % FLOAT8_DIM_MULTIPLE == 0)


def _widths(M: ModelSymbols) -> dict[str, int]:
    """A model's linear widths as integers (0 where absent), for float8_linear_pieces."""
    v = {k: int(getattr(M, k)) for k in ("h", "f", "fs", "ql", "kl", "a", "d", "kv", "dn", "dr", "dv")}
    return v | {"ad": v["a"] * v["d"], "kvd": v["kv"] * v["d"], "aqk": v["a"] * (v["dn"] + v["dr"]),
                "kldr": v["kl"] + v["dr"], "akv": v["a"] * (v["dn"] + v["dv"]), "adv": v["a"] * v["dv"]}


def embedding_pieces(spec: ModelSpec, M: ModelSymbols) -> list[Piece]:
    pieces = [Piece("embedding", M.V * M.h, "tp")]
    if spec.learned_positions:
        pieces.append(Piece("embedding.positions", M.P * M.h, "rep"))
    return pieces


def head_pieces(spec: ModelSpec, M: ModelSymbols, *, tied_copy: bool) -> list[Piece]:
    """Final norm and output head. With tied embeddings the head is the embedding
    matrix: counted once in the model, but a pipeline's last stage keeps its own
    copy (``tied_copy``), as Megatron does."""
    pieces = [Piece("final_norm", _norm(spec, M.h), "rep")]
    if not spec.tie_word_embeddings or tied_copy:
        pieces.append(Piece("head", M.V * M.h, "tp"))
    return pieces


def mtp_pieces(spec: ModelSpec, M: ModelSymbols) -> list[Piece]:
    """One MTP module without the shared embedding and head (DeepSeek-V3 Sec. 2.2)."""
    return ([Piece("mtp.norms", 3 * _norm(spec, M.h), "rep"), Piece("mtp.proj", 2 * M.h * M.h, "tp")]
            + layer_pieces(spec, M, "moe" if spec.is_moe else "dense"))


def total(pieces: list[Piece]) -> sp.Expr:
    return sp.Add(*[p.count for p in pieces])


def params_total(spec: ModelSpec, M: ModelSymbols, *, mtp: bool = False) -> sp.Expr:
    """Total parameters as transformers counts them (main model; MTP only if asked)."""
    n = total(embedding_pieces(spec, M)) + total(head_pieces(spec, M, tied_copy=False))
    for kind in ("dense", "moe"):
        cnt = layer_count(spec, M, kind)
        if has_kind(spec, kind):
            n += cnt * total(layer_pieces(spec, M, kind))
    if mtp:
        n += spec.mtp_layers * total(mtp_pieces(spec, M))
    return sp.expand(n)


def params_active(spec: ModelSpec, M: ModelSymbols) -> sp.Expr:
    """Parameters a token passes through: routed experts count k of E."""
    n = params_total(spec, M)
    if spec.is_moe:
        n -= layer_count(spec, M, "moe") * (M.E - M.k) * expert_params(spec, M, M.fe)
    return sp.expand(n)
