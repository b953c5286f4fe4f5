"""Process-group sizes, bytes per element and placements that several formulas use:
each written once here (torchtitan's ``parallel_dims.py`` plays this role there).

Group sizes (Megatron-Core ``parallel_state.initialize_model_parallel``; torchtitan
``ParallelDims``, whose ``dp_shard_cp`` mesh shards the non-expert states over the
data and context ranks):

* non-expert weights, gradients and optimizer states shard over dp*cp ranks;
* routed experts shard over the expert-data-parallel group edp = dp*cp*tp/(ep*etp)
  (Megatron ``expert_data_parallel_size``: the dp*cp*tp ranks of a pipeline stage
  divided by the expert-model-parallel ranks ep*etp).

Every function takes symbols or numbers alike (plain arithmetic).
"""

from __future__ import annotations

import sympy as sp

from ndplan.formulas.minmax import Min

from ndplan import symbols as S
from ndplan.engines import EngineProfile
from ndplan.layouts import head_stage  # noqa: F401  (plain Python: layouts.py)
from ndplan.strategy import micro_batches  # noqa: F401  (plain Python: strategy.py)


def dense_shard_ranks(dp=S.dp, cp=S.cp):
    """Ranks the non-expert states shard over (ZeRO / FSDP): dp*cp."""
    return dp * cp


def expert_shard_ranks(dp=S.dp, cp=S.cp, tp=S.tp, ep=S.ep, etp=S.etp):
    """Expert-data-parallel ranks edp = dp*cp*tp/(ep*etp) (the routed experts' ZeRO group)."""
    return dp * cp * tp / (ep * etp)


def weight_bytes(view, eng: EngineProfile) -> int | sp.Rational:
    """Bytes per persistent weight element: the engine's choice under ``auto``; fp8 weights carry
    their block scales (fp8_element_bytes)."""
    if view.weight_dtype == "fp8":
        return fp8_element_bytes(eng, eng.fp8_weight_block)
    return {"auto": eng.weight_bytes, "fp32": 4, "bf16": 2}[view.weight_dtype]


def fp8_element_bytes(eng: EngineProfile, block: int) -> int | sp.Rational:
    """Bytes per element of one fp8 copy of a tensor: the byte and, under a block-scaled recipe,
    its share of the block's scale (EngineProfile.fp8_scale_bytes per ``block`` elements:
    MXFP8 1/32, blockwise 4/128 for inputs and 4/16384 for weights); 1 under per-tensor scaling."""
    if not (eng.fp8_scale_bytes and block):
        return 1
    return 1 + sp.Rational(eng.fp8_scale_bytes, block)


def grad_bytes(view, eng: EngineProfile) -> int:
    """Bytes per accumulated gradient element: 2 for bf16 gradients; with fp32 gradients
    the weights' own dtype where the engine accumulates in it (``grads_in_weight_dtype``:
    MindSpore's gradients take the parameter dtype), else ``grad_bytes_fp32``. Memory, the
    DP gradient traffic and the optimizer step all read this one value."""
    if view.grad_dtype != "fp32":
        return 2
    return weight_bytes(view, eng) if eng.grads_in_weight_dtype else eng.grad_bytes_fp32


def master_bytes(view, eng: EngineProfile) -> int:
    """Bytes per fp32 master element (0 if the weights are the master); FP8 weights always
    keep a higher-precision master (Transformer Engine keeps fp32 master weights beside
    the FP8 copies), at least 4 bytes."""
    return max(eng.master_bytes, 4) if view.weight_dtype == "fp8" else eng.master_bytes


def optimizer_shard(view, eng: EngineProfile, dense, expert, emb=0, level: int = 1):
    """Parameters one device keeps a state for when ZeRO level >= ``level`` shards it:
    non-expert over dp*cp, experts over edp; the input embedding (``emb`` of ``dense``)
    over cp only when the engine does not ZeRO-shard it (``embedding_zero_sharded``).
    Below ``level``: every local parameter."""
    if view.zero < level:
        return dense + expert
    n_dense, n_exp = state_shard_ranks(eng)
    if eng.embedding_zero_sharded:
        return dense / n_dense + expert / n_exp
    return (dense - emb) / n_dense + emb / S.cp + expert / n_exp


def state_shard_ranks(eng: EngineProfile):
    """(non-expert, expert) ranks the ZeRO / optimizer-parallel states shard over: dp*cp and
    edp, each capped at the engine's ``optimizer_shard_size`` when it sets one (MindSpore
    ``optimizer_weight_shard_size``)."""
    k = eng.optimizer_shard_size
    if not k:
        return dense_shard_ranks(), expert_shard_ranks()
    return Min(dense_shard_ranks(), k), Min(expert_shard_ranks(), k)


def tied_head_copy(spec, first, last):
    """1 when a stage keeps its own copy of a tied embedding for the head: the head's
    stage, unless it is stage 0 too (Megatron ``share_embeddings_and_output_weights``
    keeps the copy on the last stage and all-reduces its gradient with stage 0's)."""
    if not spec.tie_word_embeddings:
        return sp.Integer(0)
    return last * (1 - first)
