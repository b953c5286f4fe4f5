"""Serving memory per device: weights, KV cache per token and the forward workspace, as Terms.

Weights (``weight_bytes``): the pieces of formulas/params.py (the Hugging Face module
structure) on the device of a pipeline stage, each divided by the devices that split it
(layout.py): attention pieces over the attention-TP group (tp / dpa; MLA's down-projections
replicated), MLPs, shared and routed experts over the stage's tp devices (MLPs and shared experts
with the attention under ``ServeLayout.dense_with_attention``), the vocab-parallel
embedding and head over the attention-TP group (vLLM VocabParallelEmbedding / ParallelLMHead),
norms and routers whole; past the KV head count the k and v projections are replicated like the
cache (``_count``). Stages hold floor(L / pp) layers, the remainder one each on the stages
before the last (``stage_layers``), the embedding on the first, the final norm and head on the last.
Bytes per element: 2 for 16-bit pieces; the decoder layers' linear weights (not norms, not the
router) at 1 under fp8 (a per-tensor scale, or FP8_ROW_SCALE_BYTES per output row) and at
INT4_BYTES under int4 (weight-only, GPTQ/AWQ layout); the embedding and head stay 16-bit
(vLLM quantizes neither; ModelOpt FP8 and FP4 checkpoints keep lm_head in 16-bit). Beside them
every device holds the RoPE cos/sin table, max_position_embeddings x rotary dim (head_dim; MLA's
qk_rope_head_dim) in the model's 16-bit dtype, built once per model (vLLM
``RotaryEmbedding._compute_cos_sin_cache``; ``get_rope`` caches the module for every layer):
what vLLM's "Loading model weights took" adds to the parameters (Llama-3.1-8B, 131,072
positions: 32 MiB; its log 14.9888 GiB against 14.958 of parameters, vllm-project/vllm#10517).

KV cache per token (``kv_bytes_per_token``), for the stage's layers:
* MHA/GQA: K and V, 2 x kv_local x d elements per layer, kv_local = max(1, kv / attention tp):
  with fewer KV heads than the attention-TP group each device keeps one whole head
  (vLLM ``num_kv_heads = max(1, total_num_kv_heads // tp_size)``, replicated).
* MLA (DeepSeek-V2 Sec. 2.1.2): the compressed latent and the decoupled RoPE key,
  kv_lora_rank + qk_rope_head_dim elements per layer, the same on every device of the
  attention-TP group (vLLM's MLA backends cache ``kv_c_and_k_pe``).
Elements at 2 bytes (bf16/fp16) or 1 (fp8 KV cache). A sliding-window layer (ModelSpec.attention_windows:
Mistral, Gemma 2/3, gpt-oss) keeps its window's last tokens and, while a prompt chunk runs, the chunk
(``held_tokens``): a request's bytes (``kv_request_bytes``) are what the concurrency counts, the
per-token figure counts every layer.

Workspace (``activation_bytes``): a forward over ``tokens`` tokens at once (the engine's
largest batch of scheduled tokens) keeps, per token, the residual stream and the normed input
(2h) beside the wider of attention's projections (q, k, v and the attention output over the
attention-TP group) and the MLP's (gate and up outputs and the activation, 3f / tp for a gated
MLP, 2f / tp otherwise; per routed token k (3 fe + h) / tp for MoE), 16-bit; and the sampler's
fp32 logits for ``seqs`` sequences over the whole vocabulary (gathered from the TP ranks).
"""

from __future__ import annotations

import sympy as sp

from ndplan import symbols as S
from ndplan.catalog.model import ModelSpec
from ndplan.formulas import params as P
from ndplan.serve.layout import ServeLayout, WeightRecipe
from ndplan.symbols import ModelSymbols
from ndplan.terms import Breakdown, Term

DPA = sp.Symbol("dpa", positive=True, integer=True)
"""Attention data-parallel degree (``ServeLayout.dp_attention``)."""
ATTN_TP = S.tp / DPA
GROUP = sp.Symbol("group", positive=True, integer=True)
INT4_BYTES = sp.Rational(1, 2) + sp.Rational(5, 2) / GROUP
"""Bytes per int4 weight element: the packed nibble and, per group of ``group`` elements, a 16-bit
scale and a 4-bit zero point (GPTQ ``scales``/``qzeros``, AWQ likewise)."""
KV_DTYPE_BYTES = {"bf16": 2, "fp8": 1}
SIXTEEN_BIT = 2
FP8_ROW_SCALE_BYTES = 4
"""fp32 scale per output row of a channel-wise fp8 linear (fbgemm_fp8 and compressed-tensors
channel strategy): Llama-3.1-405B-FP8 at tp 8 holds 14 MiB of them."""
LOGITS_BYTES = 4
"""The sampler's logits are fp32 (vLLM's sampler upcasts them before softmax)."""
_UNQUANTIZED = ("norms", "moe.router")


def stage_layers(spec: ModelSpec, pp: int) -> list[list[int]]:
    """Layer indices per pipeline stage: floor(L / pp) each, one more on each of the L mod pp stages
    counting back from the second-to-last (vLLM ``get_pp_indices``, which SGLang copies: the last
    stage also holds the head)."""
    L = spec.num_hidden_layers
    counts = [L // pp] * pp
    for i in range(L % pp):
        counts[(pp - 2 - i) % pp] += 1
    starts = [sum(counts[:s]) for s in range(pp)]
    return [list(range(starts[s], starts[s] + counts[s])) for s in range(pp)]


DENSE_PIECES = ("mlp", "mlp.fc1_bias", "moe.shared")
"""The pieces ``ServeLayout.dense_with_attention`` splits like the attention."""


def _divisor(piece: P.Piece, layout: ServeLayout):
    if piece.shard == "rep":
        return 1
    with_attention = piece.name.startswith("attn.") or (layout.dense_with_attention and piece.name in DENSE_PIECES)
    return ATTN_TP if with_attention else S.tp


def quantized(recipe: WeightRecipe, name: str, layer: int | None) -> bool:
    """Is the linear ``name`` of decoder layer ``layer`` (None: embedding, head, final norm) stored
    at the recipe's dtype (module docstring)?"""
    return not (layer is None or recipe.dtype == "bf16" or name in _UNQUANTIZED or layer in recipe.keep_layers
                or any(name.startswith(k) for k in recipe.keep_pieces))


def elem_bytes(recipe: WeightRecipe, name: str, layer: int | None):
    """Bytes per weight element of the linear ``name`` of decoder layer ``layer``."""
    if not quantized(recipe, name, layer):
        return SIXTEEN_BIT
    return 1 if recipe.dtype == "fp8" else INT4_BYTES.subs(GROUP, recipe.group)


def _count(spec: ModelSpec, M: ModelSymbols, piece: P.Piece) -> sp.Expr:
    """The piece's elements, with vLLM's replicated KV heads: past the KV head count every attention-TP
    rank keeps a whole head of the k and v projections (QKVParallelLinear
    ``num_kv_head_replicas``), so the group holds max(kv, attention tp) of them."""
    if spec.is_mla or piece.name not in ("attn.qkv", "attn.qkv_bias"):
        return piece.count
    width = (M.a + 2 * sp.Max(M.kv, ATTN_TP)) * M.d
    return M.h * width if piece.name == "attn.qkv" else width


def weight_bytes(spec: ModelSpec, layout: ServeLayout, recipe: WeightRecipe, stage: int) -> sp.Expr:
    """Weight bytes on one device of ``stage`` (module docstring), over the symbols tp and dpa."""
    M = ModelSymbols.of(spec)
    total = sp.Integer(0)
    for layer in stage_layers(spec, layout.pp)[stage]:
        for piece in P.layer_pieces(spec, M, spec.layer_kinds[layer]):
            nbytes = elem_bytes(recipe, piece.name, layer)
            total += _count(spec, M, piece) / _divisor(piece, layout) * nbytes
            if nbytes == 1 and recipe.channel_scales:
                total += output_rows(spec, M, piece.name) / _divisor(piece, layout) * FP8_ROW_SCALE_BYTES
    ends = []
    if stage == 0:
        ends += P.embedding_pieces(spec, M)
    if stage == layout.pp - 1:
        ends += P.head_pieces(spec, M, tied_copy=layout.pp > 1)
    for piece in ends:
        div = ATTN_TP if piece.shard == "tp" else 1
        total += piece.count / div * SIXTEEN_BIT
    return total + rope_table_bytes(spec)


def output_rows(spec: ModelSpec, M: ModelSymbols, name: str) -> sp.Expr:
    """Output rows (the weights' out_features, summed over the piece's linears) of a layer piece
    (formulas/params.py names)."""
    up = 2 if spec.gated_mlp else 1
    rows = {"attn.qkv": (M.a + 2 * M.kv) * M.d, "attn.o": M.h, "attn.q": M.a * (M.dn + M.dr),
            "attn.q_down": M.ql, "attn.q_up": M.a * (M.dn + M.dr), "attn.kv_down": M.kl + M.dr,
            "attn.kv_up": M.a * (M.dn + M.dv), "mlp": up * M.f + M.h,
            "moe.experts": M.E * (up * M.fe + M.h), "moe.shared": up * M.fs + M.h}
    return rows.get(name, sp.Integer(0))


def rope_table_bytes(spec: ModelSpec) -> int:
    """The RoPE cos/sin table one device holds (module docstring); none with learned positions."""
    if spec.learned_positions:
        return 0
    rotary = spec.qk_rope_head_dim if spec.is_mla else spec.head_dim
    return spec.max_position_embeddings * rotary * SIXTEEN_BIT


def kv_layer_bytes(spec: ModelSpec, kv_dtype: str) -> sp.Expr:
    """KV-cache bytes per token of one layer on one device (module docstring), over tp and dpa."""
    M = ModelSymbols.of(spec)
    per_layer = M.kl + M.dr if spec.is_mla else 2 * sp.Max(1, M.kv / ATTN_TP) * M.d
    return per_layer * KV_DTYPE_BYTES[kv_dtype]


def kv_bytes_per_token(spec: ModelSpec, layout: ServeLayout, kv_dtype: str, stage: int) -> sp.Expr:
    """KV-cache bytes per token on one device of ``stage``, every layer of it counted (module docstring)."""
    return len(stage_layers(spec, layout.pp)[stage]) * kv_layer_bytes(spec, kv_dtype)


def pages(tokens: int, block: int) -> int:
    """Tokens in whole pages of ``block``."""
    return -(-tokens // block) * block


def held_tokens(window: int, tokens: int, chunk: int, block: int, steady: bool = False) -> int:
    """Tokens a layer's cache holds for a request of ``tokens``: all of them in whole pages for full
    attention (``window`` 0). A sliding-window layer, at its peak while a prompt chunk of up to
    ``chunk`` tokens is scheduled, holds the last window - 1 tokens and the chunk, in whole pages and
    one more (the window need not start on a page): vLLM's admission and pool-sizing rule
    (``SlidingWindowSpec.max_memory_usage_bytes``), which the concurrency a pool admits uses. While
    decoding (``steady``) it holds the window in whole pages and one more, its
    ``SlidingWindowManager`` freeing the pages that fall out of it. Never more than the full layer's;
    the same rule for every engine."""
    full = pages(tokens, block)
    if not window:
        return full
    span = window if steady else window - 1 + chunk
    return min(full, pages(min(span, tokens), block) + block)


def kv_request_bytes(spec: ModelSpec, layout: ServeLayout, kv_dtype: str, stage: int, tokens: int, chunk: int,
                     block: int, steady: bool = False) -> sp.Expr:
    """KV-cache bytes one request of ``tokens`` holds on one device of ``stage``: each layer's
    ``held_tokens`` (sliding-window and hybrid models hold less than ``tokens`` on their sliding layers)."""
    held = sum(held_tokens(spec.window(i), tokens, chunk, block, steady) for i in stage_layers(spec, layout.pp)[stage])
    return held * kv_layer_bytes(spec, kv_dtype)


def activation_bytes(spec: ModelSpec, tokens, seqs, dense_with_attention: bool = False) -> sp.Expr:
    """Forward workspace bytes on one device for ``tokens`` scheduled tokens and ``seqs`` sampled
    sequences (module docstring); dense MLPs over the attention-TP group when they go with it."""
    M = ModelSymbols.of(spec)
    if spec.is_mla:
        attn = (M.a * (M.dn + M.dr) + M.a * (M.dn + M.dv) + M.a * M.dv) / ATTN_TP
    else:
        attn = ((M.a + 2 * M.kv) * M.d + M.a * M.d) / ATTN_TP
    widths = [attn]
    if spec.is_moe:
        widths.append(M.k * (3 * M.fe + M.h) / S.tp + (3 * M.fs / S.tp if spec.has_shared_experts else 0))
    if "dense" in spec.layer_kinds:
        widths.append((3 if spec.gated_mlp else 2) * M.f / (ATTN_TP if dense_with_attention else S.tp))
    per_token = (2 * M.h + sp.Max(*widths)) * SIXTEEN_BIT
    return tokens * per_token + seqs * M.V * LOGITS_BYTES  # the sampler gathers the whole vocabulary


def serve_memory_terms(spec: ModelSpec, layout: ServeLayout, recipe: WeightRecipe, kv_dtype: str,
                       stage: int) -> Breakdown:
    """serve.weights and serve.kv_per_token of one device of ``stage``, over tp and dpa."""
    return Breakdown((
        Term(key="serve.weights", expr=weight_bytes(spec, layout, recipe, stage), unit="bytes",
             source="formulas/params.py pieces split per serve/layout.py; 16-bit, fp8 1 B, int4 INT4_BYTES",
             note=f"one device of pipeline stage {stage}"),
        Term(key="serve.kv_per_token", expr=kv_bytes_per_token(spec, layout, kv_dtype, stage), unit="bytes",
             source="K and V per KV head per layer (MLA: latent + RoPE key), serve/memory.py",
             note=f"one device of pipeline stage {stage}, {kv_dtype} KV cache"),
    ))


def values(layout: ServeLayout) -> dict:
    """The layout's symbol values."""
    return {S.tp: layout.tp, DPA: layout.dp_attention}
