"""The step-time choices of an engine profile (formulas/step.py, formulas/dp_comm.py): which
collectives overlap compute, how gradients are bucketed and reduced, and which GEMMs run in fp8.
EngineProfile (engine_fields.py) derives from TimeChoices; every field is documented with the
framework lines it follows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class TimeChoices:
    overlap_grad_reduce: bool = True
    """ZeRO 0-2: the data-parallel gradient reduction runs under the last micro-batch's backward
    (Megatron ``--overlap-grad-reduce``; PyTorch DDP/FSDP bucketing; DeepSpeed ``overlap_comm``)."""
    overlap_param_gather: bool = True
    """ZeRO 1-2: the parameter all-gather after the optimizer step runs under the next forward
    (Megatron ``--overlap-param-gather``)."""
    overlap_tp_comm: bool = False
    """TP/SP collectives overlap the GEMMs (Megatron ``--tp-comm-overlap`` with TE userbuffers); off by
    default in Megatron-LM, so TP communication is exposed."""
    grad_bucket_min_elements: int = 0
    """ZeRO 0-2 under overlap_grad_reduce: gradients are reduced in buckets of max(this,
    grad_bucket_elements_per_rank x dp x cp) parameters laid out in backward order, so the last
    bucket (the first layers and the embedding) is launched only when backward ends and its
    reduction is exposed; under overlap_param_gather the first bucket's all-gather is waited for
    at the first forward. Megatron-LM@d98e8a64: max(40M, 1M x dp_cp) (training.py:2179-2194
    ``resolve_ddp_bucket_size``; reverse layout param_and_grad_buffer.py:959, 980; waited in
    ``finish_grad_sync`` :787-832 and ``finish_param_sync`` :538-573). 0: no bucket exposed."""
    grad_bucket_elements_per_rank: int = 0
    """The bucket's growth with the data-parallel size (Megatron-LM: 1M parameters per dp*cp rank)."""
    grad_comm_bytes: int = 0
    """Bytes per gradient element on the wire of the data-parallel reduction; 0: the accumulated
    gradients' (groups.grad_bytes). DeepSpeed reduces in ``communication_data_type``, by default
    the training dtype, bf16 or fp16 (2; runtime/engine.py:1719-1730 at 0.19.8), fp32 otherwise."""
    fp8_linears_only: bool = False
    """fp8 GEMMs (weight_dtype fp8) only in the linears torchtitan's float8 converter swaps for
    torchao Float8Linear (params.float8_linear_pieces): not the routed experts (GroupedExperts),
    not widths off a multiple of 16; Transformer Engine's fp8 covers every layer GEMM but the
    router."""
    stage_gather_at_first_forward: bool = False
    """Under overlap_param_gather with a non-interleaved pipeline, every stage after the first
    keeps one bucket (bucketing is off at pp_rank > 0, distributed_data_parallel.py:160-171),
    whose all-gather its first forward's pre-hook dispatches and waits for (:517-551,
    param_and_grad_buffer.py:538-573; ``align_param_gather`` is off without interleaving,
    arguments.py:1010-1013, while the interleaved schedule dispatches chunks 0 and 1 when it
    starts, schedules.py:1218-1221): each of the pp - 1 later stages delays the fill by its
    all-gather. Megatron-LM."""
    grad_reduce_after_last_backward: bool = False
    """ZeRO 0-2 at pp > 1: the gradient reduction runs after the stage's last backward, behind
    nothing: DeepSpeed's PipelineEngine issues ReduceTiedGrads, ReduceGrads, OptimizerStep at the
    schedule's last step (pipe/schedule.py:238-241) as synchronous all-reduces (pipe/engine.py:
    287-298). (Under ZeRO-3, torch.distributed.pipelining's once-per-step gather and reduce
    follow pp_unsharded_stage_bytes.)"""
    grads_all_reduced: bool = False
    """ZeRO 1-2 reduce the gradient buckets by all-reduce (twice a reduce-scatter's bytes):
    DeepSpeed's ``use_multi_rank_bucket_allreduce`` (default true, zero/config.py:119;
    stage_1_and_2.py ``allreduce_and_scatter``)."""
    attention_fa2: bool = False
    """The attention core runs FlashAttention-2, timed at the device's ``fa2_attention_efficiency``
    (catalog/hardware.py; below the fused kernels on Hopper, where FlashAttention-2 uses no
    wgmma/TMA). Megatron-DeepSpeed calls the flash-attn package (megatron/model/transformer.py:53,
    409 at f4157bea: ``flash_attn_varlen_func`` under --use-flash-attn-v2), so the deepspeed
    profile sets it. Off: Transformer Engine picks cuDNN's FusedAttention on sm90 from v1.2, also
    under context parallelism from v1.3 (attention.py:2383-2388 at v1.2; dot_product_attention/
    utils.py:1647-1653 at main); torchtitan puts SDPA's cuDNN backend first since Oct 2025
    (models/attention.py:88-93 at v0.2.0; before, flash first except on sm100, v0.1.0 :200-207);
    PyTorch's own SDPA order put flash first on sm90 in torch 2.4 and 2.5.1-2.8 (cuDNN first only
    in 2.5.0 and, with cuDNN above 9.15, from 2.9): set ``attention_fa2=1`` for such a run."""
    zero2_reduce_per_microbatch: bool = False
    """ZeRO-2 reduces every micro-batch's gradients as its backward fills the buckets (DeepSpeed
    stage_1_and_2.py:1414-1427 from the gradient hooks, engine.py:3084-3086), so the reduction
    runs m times, on the compute stream without overlap_comm (:1590-1616)."""
    loss_bytes_forward: int = 38
    """HBM bytes per logit element (token x vocab/tp, on the head's stage) the loss moves in
    forward. Megatron-LM's vocab-parallel cross entropy, unfused by default
    (``cross_entropy_loss_fusion`` False, model_parallel_config.py:320 at d98e8a64), makes six
    passes over the logits (core/tensor_parallel/cross_entropy.py:25-77 at d98e8a64, the same
    at core_r0.8.0): the fp32 upcast (read 2, write 4), the max (read 4), the in-place subtract,
    exp and divide (read and write 4 each) and the exp-sum (read 4): 6 + 4 + 8 + 8 + 4 + 8 = 38.
    Megatron-DeepSpeed (the deepspeed profile's time side) upcasts before its copy of the same
    function, whose out-of-place subtract moves the same bytes (megatron/model/gpt_model.py:314
    at f4157bea)."""
    loss_bytes_backward: int = 14
    """HBM bytes per logit element the loss moves in backward: Megatron-LM's in-place multiply of
    the saved softmax by the output gradient (read and write 4, cross_entropy.py:114 at
    d98e8a64) and the gradient's cast back to the 16-bit logits' dtype (read 4, write 2): 14."""
