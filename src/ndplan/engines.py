"""Engine profiles: the framework-specific choices behind a memory estimate, as named,
documented settings (never literals inside formulas).

Bytes per parameter are per element of the state named; ``*_sharded_from`` gives the
ZeRO level from which that state is sharded over the data-parallel group.
"""

from __future__ import annotations

from dataclasses import dataclass

from ndplan.units import GIB, MIB


@dataclass(frozen=True, kw_only=True)
class EngineProfile:
    name: str
    weight_bytes: int
    """Persistent weight copy per parameter (bf16 = 2; FSDP2 keeps fp32 shards = 4)."""
    master_bytes: int
    """Separate fp32 master copy per parameter (0 if the weights are the master)."""
    optimizer_bytes: int
    """Adam first and second moments, fp32: 2 x 4 bytes."""
    grad_bytes_fp32: int
    """Gradient bytes per parameter when grad_dtype=fp32."""
    weights_sharded_from: int
    """Lowest ZeRO level that shards the persistent weights (3 for ZeRO-3/FSDP)."""
    grads_sharded_from: int
    master_sharded_from: int
    logits_bytes_per_element: int
    """Transient bytes per (token, vocab/tp) element at the loss on the last stage."""
    gather_prefetch_layers: int
    """ZeRO-3/FSDP: layers whose unsharded bf16 weights are alive at once (current + prefetch)."""
    reserve_bytes: int
    """Named framework reserve added to every device's peak (allocator, library workspaces)."""
    sources: dict


MEGATRON = EngineProfile(
    name="megatron",
    weight_bytes=2, master_bytes=4, optimizer_bytes=8, grad_bytes_fp32=4,
    weights_sharded_from=3, grads_sharded_from=2, master_sharded_from=1,
    logits_bytes_per_element=6, gather_prefetch_layers=2, reserve_bytes=1 * GIB,
    sources={
        "states": "Megatron-LM theoretical_memory_usage.py: 18 bytes/param without the distributed "
                  "optimizer (bf16 param 2 + fp32 main grad 4 + fp32 master 4 + Adam 8); with it, "
                  "6 + 12/dp (master and moments sharded over dp*cp) = ZeRO-1 here",
        "logits": "bf16 logits (2) kept until the fused vocab-parallel cross entropy has built its fp32 "
                  "softmax (4), which it saves for backward: 6 bytes per element "
                  "(Megatron core/tensor_parallel/cross_entropy.py)",
        "reserve": "CUDA context, cuBLAS/NCCL workspaces and caching-allocator slack: 1 GiB, a named "
                   "default, not fitted to any case",
    })

FSDP = EngineProfile(
    name="fsdp",
    weight_bytes=4, master_bytes=0, optimizer_bytes=8, grad_bytes_fp32=4,
    weights_sharded_from=3, grads_sharded_from=2, master_sharded_from=1,
    logits_bytes_per_element=10, gather_prefetch_layers=2, reserve_bytes=1 * GIB,
    sources={
        "states": "torchtitan FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): sharded "
                  "parameters are fp32 (4) and are the optimizer's master; fp32 grads (4); Adam (8)",
        "logits": "bf16 logits (2) upcast to fp32 (4) and fp32 log-softmax saved by cross_entropy (4): "
                  "10 bytes per element (torchtitan loss on .float() logits)",
        "reserve": "1 GiB named default for CUDA context/NCCL/allocator slack",
    })

DEEPSPEED = EngineProfile(
    name="deepspeed",
    weight_bytes=2, master_bytes=4, optimizer_bytes=8, grad_bytes_fp32=4,
    weights_sharded_from=3, grads_sharded_from=2, master_sharded_from=1,
    logits_bytes_per_element=10, gather_prefetch_layers=2, reserve_bytes=1 * GIB,
    sources={
        "states": "ZeRO paper (Rajbhandari et al. 2020) Sec. 3: K=12 bytes of optimizer state "
                  "(fp32 master 4 + Adam 8) per parameter, bf16 params 2, gradients",
        "logits": "HF-style loss: bf16 logits, fp32 upcast, fp32 log-softmax: 10 bytes per element",
        "reserve": "1 GiB named default",
    })

MINDSPORE = EngineProfile(
    name="mindspore",
    weight_bytes=2, master_bytes=0, optimizer_bytes=8, grad_bytes_fp32=2,
    weights_sharded_from=1, grads_sharded_from=4, master_sharded_from=1,
    logits_bytes_per_element=4, gather_prefetch_layers=1, reserve_bytes=0,
    sources={
        "states": "MindFormers FP32StateAdamWeightDecay: fp16/bf16 parameters updated in place (no separate "
                  "master), fp32 moments (8); accumulated gradients `accu_grad` in the parameter dtype (2), "
                  "not sharded unless gradient_accumulation_shard (False in the validation cases). With "
                  "enable_parallel_optimizer (our zero>=1) weights and moments are sharded over dp and "
                  "all-gathered before use. Checked on shared/validation/mindformers llama2/70b stage 0: "
                  "params 2165 MiB, optimizer 8661 MiB (= 4x), accu_grad 4205 MiB (~ 2x, unsharded)",
        "logits": "fp32 logits for the loss: 4 bytes per element",
        "reserve": "0: the measured MindSpore peaks (Static+Dynamic) contain no safety margin "
                   "(shared/validation/mindformers/README.md)",
    })

ENGINE_PROFILES = {p.name: p for p in (MEGATRON, FSDP, DEEPSPEED, MINDSPORE)}

#: Default bucket for data-parallel gradient reduction (Megatron DDP bucket_size
#: default max(40M, 1M*dp) elements; we keep the 40M-element floor in fp32 = 160 MB).
COMM_BUCKET_BYTES = 40_000_000 * 4
_ = MIB  # MIB re-exported for engines that state buffers in MiB
