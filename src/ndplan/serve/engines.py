"""Each serving engine's rule for the memory its KV cache gets, and the capacity that follows.

* vLLM (``gpu_memory_utilization``, default 0.9): the instance may use that fraction of the
  device's total memory; the KV cache gets what the model weights, the forward's peak
  workspace (its profile run over the largest scheduled batch) and the memory outside torch's
  allocator (CUDA context, NCCL) leave of it: ``total x fraction - weights - activation peak -
  non-torch`` (its worker log line "the current vLLM instance can use total_gpu_memory (...) x
  gpu_memory_utilization (...) = ...; model weights take ...; non_torch_memory takes ...;
  PyTorch activation peak memory takes ...; the rest of the memory reserved for KV Cache",
  vllm-project/vllm PRs #10511, #12126). Pages of 16 tokens (``block_size``).
* SGLang (``mem_fraction_static``): weights and the KV pool together take that fraction of the
  total: ``total x fraction - weights``; the workspace and CUDA graphs live in the rest. Pages
  of one token (``page_size`` 1).
* TensorRT-LLM (``free_gpu_memory_fraction`` of the KV cache config, default 0.9): that fraction
  of the memory still free after the weights and the runtime's workspace are allocated:
  ``fraction x (total - weights - activation peak - non-torch)``. Pages of 32 tokens
  (``tokens_per_block``).

``NON_TORCH_GIB`` and each engine's default batch limits are named defaults, not fitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ndplan import limits
from ndplan.errors import NdplanError
from ndplan.serve import derived
from ndplan.units import GIB

NON_TORCH_GIB = 0.35
"""Device memory outside torch's allocator at tp = 1 (CUDA context, cuBLAS workspace): vLLM's log
of Llama-3.1-8B on an RTX 3090 prints non_torch_memory 0.35 GiB (vllm-project/vllm#10517); its
own H100 logs print 0.16 to 1.79 GiB across versions (#12126, #10511). NCCL's buffers at tp > 1
are not modelled."""


@dataclass(frozen=True)
class ServeEngine:
    name: str
    knob: str
    """The engine's own memory flag."""
    default_fraction: float
    rule: str
    """"total_minus_peak" (vLLM), "static" (SGLang), "free_after_load" (TensorRT-LLM): module docstring."""
    block_tokens: int
    """Tokens per KV page: capacity is counted in whole pages."""
    max_seqs: int
    """Default maximum running sequences (vLLM ``max_num_seqs``; SGLang ``max_running_requests``
    is derived from its pool, TensorRT-LLM's ``max_batch_size``)."""
    max_tokens: int
    """Default largest batch of scheduled tokens per forward (vLLM ``max_num_batched_tokens``,
    TensorRT-LLM ``max_num_tokens``, SGLang ``chunked_prefill_size``)."""
    source: str
    dense_with_attention_dp: bool = False
    """Under attention DP the dense MLPs and shared experts run with the attention (per DP rank, over
    the attention-TP group): TensorRT-LLM builds them with ``overridden_tp_size=1 if
    self.enable_attention_dp`` (tensorrt_llm/_torch/models/modeling_qwen3.py, modeling_llama.py's
    Llama 4 shared expert); vLLM's data-parallel ranks are whole models whose MoE layers alone span
    the DP x TP expert group. SGLang splits them over all tp devices (``--moe-dense-tp-size`` unset)."""
    seqs_per_stage: bool = False
    """``max_seqs`` is per pipeline stage: the engine keeps pp batches of that many in flight
    (TensorRT-LLM's PyTorch executor admits pp_size x max_batch_size, ``get_max_num_sequences``)."""
    bench_limits: bool = False
    """The batch limits are trtllm-bench's own tuning heuristic (``trtllm_bench_limits``), not fixed defaults."""
    reserves_output: bool = False
    """A request holds pages for its whole ISL + OSL from admission (TensorRT-LLM's default
    GUARANTEED_NO_EVICT capacity scheduler); without it pages are taken as tokens are written and
    a request holds ISL + OSL / 2 on average while it decodes (vLLM and SGLang, which preempt when
    the pool runs out)."""


ENGINES = {
    "vllm": ServeEngine("vllm", "gpu_memory_utilization", 0.9, "total_minus_peak", 16, 256, 8192,
                        "vllm EngineArgs: gpu_memory_utilization 0.9, block_size 16, max_num_seqs 256; "
                        "max_num_batched_tokens 8192 (chunked prefill; without it max(max_model_len, 2048))",
                        dense_with_attention_dp=True),
    "sglang": ServeEngine("sglang", "mem_fraction_static", 0.88, "static", 1, 4096, 8192,
                          "sglang ServerArgs: mem_fraction_static about 0.88 on 80 GB devices at tp 1 (it is "
                          "set from the device memory and tp when not given), page_size 1, chunked_prefill_size 8192"),
    "trtllm": ServeEngine("trtllm", "free_gpu_memory_fraction", 0.9, "free_after_load", 32, 2048, 8192,
                          "TensorRT-LLM KvCacheConfig.free_gpu_memory_fraction 0.9, tokens_per_block 32, "
                          "max_batch_size 2048, max_num_tokens 8192 (LLM API defaults; trtllm-serve's own "
                          "max_batch_size default differs across versions), GUARANTEED_NO_EVICT",
                          dense_with_attention_dp=True, reserves_output=True, seqs_per_stage=True),
    "trtllm-bench": ServeEngine("trtllm-bench", "kv_cache_free_gpu_mem_fraction", 0.9, "free_after_load", 32, 2048,
                                8192, "trtllm-bench throughput (TensorRT-LLM's offline benchmark, PyTorch backend): "
                                "TensorRT-LLM's rules, with max_batch_size and max_num_tokens from its tuning "
                                "heuristic (tensorrt_llm/bench/build/tuning.py) and chunked prefill off",
                                dense_with_attention_dp=True, reserves_output=True, seqs_per_stage=True,
                                bench_limits=True),
}


def engine(name: str) -> ServeEngine:
    if name not in ENGINES:
        raise NdplanError("--engine", name, "not a serving engine ndplan models", f"one of {', '.join(ENGINES)}")
    return ENGINES[name]


def kv_pool_bytes(eng: ServeEngine, total_bytes: float, weights: float, activation: float, fraction: float | None = None,
                  non_torch: float = NON_TORCH_GIB * GIB) -> float:
    """Bytes of one device's KV pool under ``eng``'s rule (module docstring); negative when the
    weights do not fit."""
    return derived.kv_pool(eng.rule, total_bytes, mem_fraction(eng, fraction), weights, activation, non_torch)


def mem_fraction(eng: ServeEngine, fraction: float | None) -> float:
    """The engine's memory knob: ``fraction`` (checked) or its default."""
    return eng.default_fraction if fraction is None else limits.fraction(f"--engine-mem-fraction ({eng.knob})", fraction)


def kv_capacity(pool_bytes: float, kv_per_token: float, block_tokens: int) -> int:
    """Tokens one device's pool holds, in whole pages of ``block_tokens`` (0 when it is empty)."""
    if pool_bytes <= 0:
        return 0
    return derived.capacity_tokens(pool_bytes, kv_per_token, block_tokens)


def _round_up(raw: float, least: int, steps: tuple[tuple[float, int], ...]) -> int:
    """tuning.py finetune_setting's rounding: up to a multiple of the step of the first band whose
    bound ``raw`` is under, never below ``least``."""
    step = next(st for bound, st in steps if raw < bound)
    return max(least, step * math.ceil(raw / step))


BATCH_STEPS = ((256, 32), (1024, 128), (math.inf, 256))
"""max_batch_size: at least 64, in steps of 32 below 256, 128 below 1024, else 256."""
TOKEN_STEPS = ((4096, 256), (8192, 512), (math.inf, 1024))
"""max_num_tokens: at least 2048, in steps of 256 below 4096, 512 below 8192, else 1024."""


TRTLLM_BENCH_MAX_REQUESTS = 4096
"""tuning.py caps the requests it sizes for ("avoid decoder buffer size becoming too large")."""
TRTLLM_BENCH_MAX_TOKENS = 32768
"""tuning.py caps the tokens per step ("avoid TRT activation buffer becoming too large")."""


def trtllm_bench_limits(params: int, weight_bytes: float, kv_heads: int, head_dim: int, layers: int,
                        kv_bytes: int, device_gib: float, tp: int, pp: int, isl: int, osl: int,
                        fraction: float) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) that ``trtllm-bench throughput`` runs with when not given
    (NVIDIA/TensorRT-LLM tensorrt_llm/bench/build/tuning.py ``calc_engine_setting`` and
    ``finetune_setting``; bench/build/build.py ``get_benchmark_engine_settings``): it sizes the KV
    cache as if every layer kept max(tp, num_key_value_heads) heads of head_size (for MLA models the
    config's head count and hidden / heads, far above the latent the engine stores), over
    tp x pp devices less the checkpoint's parameters at their bytes, and rounds the requests that
    fit up. Its max_batch_size is per attention-DP rank (the executor admits tp x max_num_active_requests
    under enable_attention_dp). Without chunked prefill (trtllm-bench's default) max_num_tokens is
    raised to the longest prompt plus the batch."""
    per_token_gib = 2 * layers * max(tp, kv_heads) * head_dim * kv_bytes / 2 ** 30
    available_gib = device_gib * tp * pp - params * weight_bytes / 2 ** 30
    requests = available_gib * fraction / (per_token_gib * (isl + osl))
    raw_batch = min(requests, TRTLLM_BENCH_MAX_REQUESTS) / pp
    batch = _round_up(raw_batch, 64, BATCH_STEPS)
    tokens = _round_up(min(raw_batch * (1 + isl / osl), TRTLLM_BENCH_MAX_TOKENS), 2048, TOKEN_STEPS)
    return batch, max(tokens, isl + batch)
