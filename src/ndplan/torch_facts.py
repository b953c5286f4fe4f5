"""Measured facts of the PyTorch stack that engine profiles and the CPU harness cite: what
torch's own kernels and backends allocate, and the published allocator pairs behind the
reserved line. Each is a named, sourced constant (engines.py re-exports them)."""

from __future__ import annotations


GLOO_REDUCE_SCATTER_COPY_BYTES = 4
"""Bytes per input parameter that torch's gloo backend allocates inside a reduce-scatter: its
``_reduce_scatter_base`` splits a full-size copy of the fp32 input into world chunks and copies
the reduced chunk out (measured: 4.19 MB above start for a 4.19 MB input at world 4; in FSDP2's
peak at world 4, four chunk tensors of a quarter layer each). NCCL reduces in place; only the
CPU harness (trace/runtime.py) adds it."""


COMPILED_LOSS_BYTES = 4
"""Bytes per logit at the peak of a compiled cross_entropy(logits.float()): the saved bf16
logits (2) and the bf16 gradient (2). Measured with inductor on the CPU (torch 2.13): the
forward allocates per-token fp32 statistics only, the backward one bf16 buffer of the logits'
shape. tests/test_trace.py test_compiled_loss_saves_bf16_logits checks the saved set with
inductor's decompositions and min-cut partitioner (backend aot_eager_decomp_partition), which
decide it before code generation."""


TORCH_ALLOCATOR_PAIRS = (
    "published (max allocated, max reserved) pairs of one training run each, 46 pairs from 24 sources "
    "(Megatron-LM report_memory logs in GitHub threads and repositories, e.g. NVIDIA/Megatron-LM PR #5662 "
    "5670/6406 MB and issue #60 12606/17482 MB; DeepSpeed see_memory_usage Max_MA/Max_CA, e.g. "
    "microsoft/DeepSpeed#522; onnxruntime ORTModule PRs #16213, #19620): reserved/allocated per source, "
    "median 1.058, quartiles 1.023 and 1.221, 90th percentile 1.385, range 1.006-1.541; Megatron-core "
    "runs 1.004-1.22 (8 pairs of one r0.10 run 1.007-1.044), Megatron-DeepSpeed ZeRO-1/2 runs 1.23-1.60. "
    "No pair states expandable_segments (torchtitan's run_train.sh:43 sets it, which lowers fragmentation) "
    "and none is an FSDP run")
