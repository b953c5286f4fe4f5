"""Persistent state Terms of one device: weights (ZeRO partitions, ZeRO++ hpZ's secondary
partition, ZeRO-3 parameter offload), gradients, master weights and optimizer states (by
optimizer, ndplan.optimizers), and the host bytes of what is offloaded. memory.stage_memory
and PPB's layer export (ppb/export.py) build them from here.
"""

from __future__ import annotations

import sympy as sp

from ndplan.formulas.minmax import Min

from ndplan import symbols as S
from ndplan.catalog.model import ModelSpec
from ndplan.engines import EngineProfile
from ndplan.formulas import groups as G
from ndplan.formulas.local import stage_params, vocab_params
from ndplan.formulas.placement import pp_expr
from ndplan.structure import Structure, structure
from ndplan.symbols import ModelSymbols
from ndplan.terms import Term
from ndplan.units import DTYPE_BYTES

_SRC_STATES = ("Rajbhandari et al. 2020 (ZeRO) Sec. 3-5: stage 1 shards optimizer states, 2 adds "
               "gradients, 3 adds parameters, over the data-parallel group")


def _sharding(view: Structure, eng: EngineProfile, dense, expert, emb):
    """shard(level): groups.optimizer_shard of these parameters at ZeRO level ``level``."""
    return lambda level: G.optimizer_shard(view, eng, dense, expert, emb, level)


def optimizer_state_bytes(view: Structure, eng: EngineProfile, dense, expert, emb=0, vocab=(0, 0)) -> sp.Expr:
    """Optimizer-state bytes of one device: ``optimizer_bytes`` per parameter it keeps a state
    for (ZeRO level 1 and above shard them), and ``non_matrix_optimizer_bytes`` for the
    ``vocab`` = (vocabulary matrices, of them the input embedding) among them where the
    optimizer treats them apart (ndplan.optimizers: Muon's AdamW part)."""
    out = eng.optimizer_bytes * _sharding(view, eng, dense, expert, emb)(1)
    if eng.non_matrix_optimizer_bytes and vocab[0] != 0:
        out += ((eng.non_matrix_optimizer_bytes - eng.optimizer_bytes)
                * G.optimizer_shard(view, eng, vocab[0], 0, vocab[1], 1))
    return out


def static_terms(spec: ModelSpec, view: Structure, eng: EngineProfile, dense, expert, emb=0,
                 vocab=(0, 0)) -> list[Term]:
    """Weights, gradients, fp32 master and optimizer-state Terms (bytes) of ``dense``
    non-expert and ``expert`` parameters on one device (``emb`` of them the input
    embedding; ``vocab``: local.vocab_params). stage_memory uses it for a stage; PPB's
    layer export for one layer."""
    shard = _sharding(view, eng, dense, expert, emb)
    weight_b, master_b, grad_b = G.weight_bytes(view, eng), G.master_bytes(view, eng), G.grad_bytes(view, eng)
    off = 0 if view.offload_optimizer else 1
    scope = "one device of this stage"
    cache = fp8_weight_cache_terms(view, eng, dense - vocab[0] + expert)
    grads_on = 0 if _grads_offloaded(view, eng) else 1
    return cache + [
        Term(key="mem.weights", expr=device_weights(view, eng, dense, expert, emb, vocab), unit="bytes",
             source=f"{weight_b} bytes/param ({eng.name}: {eng.sources['states']}); {_SRC_STATES}"
                    + _weights_source(view, eng), note=scope + (" (offloaded to host)" if _offloaded(view, eng) else "")),
        Term(key="mem.grads", expr=grads_on * gradient_bytes(spec, view, eng, dense, expert, emb), unit="bytes",
             source=f"{grad_b} bytes/param gradients" + (f" and {eng.lp_grad_bytes} bytes/param 16-bit .grad "
                    "beside them (EngineProfile.lp_grad_bytes)" if eng.lp_grad_bytes else "") + f"; {_SRC_STATES}",
             note=scope + (" (offloaded to host)" if _grads_offloaded(view, eng) else "")),
        Term(key="mem.master", expr=off * master_b * shard(eng.master_sharded_from), unit="bytes",
             source=f"fp32 master weights, {master_b} bytes/param; {_SRC_STATES}",
             note=scope + (" (offloaded to host)" if view.offload_optimizer else "")),
        Term(key="mem.optimizer", expr=off * optimizer_state_bytes(view, eng, dense, expert, emb, vocab), unit="bytes",
             source=f"{_optimizer_source(eng)}; {_SRC_STATES}",
             note=scope + (" (offloaded to host)" if view.offload_optimizer else "")),
    ]


def fp8_weight_cache_terms(view: Structure, eng: EngineProfile, layer_weights) -> list[Term]:
    """Transformer Engine's cached fp8 weight copies (EngineProfile.fp8_weight_cache_bytes) of the
    device's transformer-layer weights (its parameters less the vocabulary matrices; norms and the
    router, under 0.1 %, are counted in)."""
    if not eng.fp8_weight_cache_bytes or view.zero >= 3:
        return []
    per_copy = G.fp8_element_bytes(eng, eng.fp8_weight_block)
    scales = f", each with its block scales ({per_copy} B per element, EngineProfile.fp8_scale_bytes)" \
        if per_copy != 1 else ""
    return [Term(key="mem.fp8_weight_cache", expr=eng.fp8_weight_cache_bytes * per_copy * layer_weights,
                 unit="bytes",
                 source=f"{eng.fp8_weight_cache_bytes} fp8 copies per layer weight: Transformer Engine's fp8 "
                        "workspace (row-wise, and its column-wise copy or transpose where the GEMMs need one) "
                        f"cached across micro-batches{scales} "
                        "(EngineProfile.fp8_weight_cache_bytes; TE@d0067d0d linear.py:1958-1961, 2068-2071)",
                 note="one device of this stage, kept for the run")]


def _offloaded(view: Structure, eng: EngineProfile) -> bool:
    return eng.weights_offloaded and view.zero >= eng.weights_sharded_from


def _grads_offloaded(view: Structure, eng: EngineProfile) -> bool:
    return eng.grads_offloaded and view.zero >= eng.grads_sharded_from


def gradient_bytes(spec: ModelSpec, view: Structure, eng: EngineProfile, dense, expert, emb=0) -> sp.Expr:
    """Bytes of the kept gradients of one device (``mem.grads``, or host bytes when offloaded)."""
    if eng.grads_shard_tp_only:
        # accumulated gradients take the shape of each parameter's model-parallel slice: the
        # layers' TP slice, and the input embedding's (tp*cp) slice when it is not ZeRO-sharded
        grads = dense + expert - (0 if eng.embedding_zero_sharded else emb * (1 - 1 / S.cp))
    else:
        grads = _sharding(view, eng, dense, expert, emb)(eng.grads_sharded_from)
    if not eng.grads_without_accumulation:
        # no persistent gradient buffer without micro-batch accumulation (pp = 1 and m = 1)
        grads = grads * Min(pp_expr(spec, view) + S.m - 2, 1)
    return (G.grad_bytes(view, eng) + eng.lp_grad_bytes) * grads


FP8_VOCAB_BYTES = DTYPE_BYTES["bf16"]
"""fp8 weights are the decoder layers' linear weights: Megatron builds each transformer layer
under Transformer Engine's fp8_model_init (NVIDIA/Megatron-LM@d98e8a64
megatron/core/fp8_utils.py:839-910 get_fp8_context(is_init=True); TE modules only,
extensions/transformer_engine.py:257-300), while the input embedding (VocabParallelEmbedding,
models/common/embeddings/language_model_embedding.py:59) and the output layer
(tensor_parallel.ColumnParallelLinear unless the MXFP8 output projection is on,
models/gpt/gpt_model.py:272-277) keep 16-bit weights; torchao's float8 training converts
only nn.Linear layers of the blocks too. Norms and biases (under 0.01 % of a model) are
counted with the layers."""


def weight_partitions(view: Structure, eng: EngineProfile, dense, expert, emb=0, vocab=(0, 0)) -> sp.Expr:
    """Bytes of the persistent weight partitions (ZeRO-sharded from ``weights_sharded_from``)
    and, with ZeRO++ hpZ (``secondary_weight_shard``), the secondary partition over hpz ranks.
    Under fp8 weights the ``vocab`` matrices (local.vocab_params) stay 16-bit (FP8_VOCAB_BYTES)."""
    weight_b = G.weight_bytes(view, eng)
    out = weight_b * _sharding(view, eng, dense, expert, emb)(eng.weights_sharded_from)
    if view.weight_dtype == "fp8" and vocab[0] != 0:
        out += (FP8_VOCAB_BYTES - weight_b) * G.optimizer_shard(view, eng, vocab[0], 0, vocab[1],
                                                               eng.weights_sharded_from)
    hpz = eng.secondary_weight_shard
    if hpz > 1 and view.zero >= eng.weights_sharded_from:
        out += weight_b * (dense + expert) / hpz
    if eng.megatron_fsdp:  # Megatron-FSDP keeps the embedding and output layer gathered (formulas/megatron_fsdp.py)
        from ndplan.formulas.megatron_fsdp import kept_vocab
        out += kept_vocab(view, eng, vocab)
    return out


def device_weights(view: Structure, eng: EngineProfile, dense, expert, emb=0, vocab=(0, 0)) -> sp.Expr:
    """The weight partitions on the device: none with ZeRO-3 parameter offload (weights_offloaded)."""
    return sp.Integer(0) if _offloaded(view, eng) else weight_partitions(view, eng, dense, expert, emb, vocab)


def _weights_source(view: Structure, eng: EngineProfile) -> str:
    out = ""
    if eng.secondary_weight_shard > 1 and view.zero >= eng.weights_sharded_from:
        out += (f"; ZeRO++ hpZ secondary partition, params / {eng.secondary_weight_shard} in the weight dtype "
                "(DeepSpeed partition_parameters.py:1900-1929)")
    if _offloaded(view, eng):
        out += "; ZeRO-3 offload_param: the partitions are in host memory"
    if eng.megatron_fsdp and view.zero >= 3:
        out += ("; Megatron-FSDP keeps a 16-bit gathered copy of the embedding and output layer, not FSDP units, "
                "beside their shards (formulas/megatron_fsdp.py kept_vocab)")
    return out


def _optimizer_source(eng: EngineProfile) -> str:
    src = f"optimizer states {eng.optimizer_bytes} bytes/param (8: Adam m and v in fp32; ndplan.optimizers)"
    if eng.non_matrix_optimizer_bytes:
        src += f", {eng.non_matrix_optimizer_bytes} for the embedding and output layer"
    return src


def host_memory(spec: ModelSpec, M: ModelSymbols, view: Structure, stage=S.stage) -> sp.Expr:
    """Host bytes per device: master + optimizer states with optimizer offload, the weight
    partitions with ZeRO-3 parameter offload, the gradients with gradient offload."""
    view = structure(spec, view)
    eng = view.engine
    dense, expert, emb = stage_params(spec, M, view, stage)
    vocab = vocab_params(spec, M, view, stage)
    out = weight_partitions(view, eng, dense, expert, emb, vocab) if _offloaded(view, eng) else sp.Integer(0)
    if _grads_offloaded(view, eng):
        out += gradient_bytes(spec, view, eng, dense, expert, emb)
    if not view.offload_optimizer:
        return out
    # the states that left HBM: mem.master and mem.optimizer of static_terms, same sharding
    shard = _sharding(view, eng, dense, expert, emb)
    return (out + G.master_bytes(view, eng) * shard(eng.master_sharded_from)
            + optimizer_state_bytes(view, eng, dense, expert, emb, vocab))
