"""Launch arguments of a serving layout for vLLM, SGLang and TensorRT-LLM (``ndplan serve --emit``).

Flag names as each engine documents them: vLLM ``vllm serve`` engine arguments (docs.vllm.ai
"Engine Arguments": --tensor-parallel-size, --pipeline-parallel-size, --data-parallel-size,
--enable-expert-parallel, --all2all-backend, --gpu-memory-utilization, --max-model-len, --max-num-seqs,
--kv-cache-dtype, --quantization); SGLang ``sglang.launch_server`` server arguments (--tp-size,
--pp-size, --dp-size with --enable-dp-attention, --ep-size, --moe-a2a-backend, --mem-fraction-static,
--context-length, --kv-cache-dtype fp8_e4m3, --quantization); TensorRT-LLM ``trtllm-serve``
(--tp_size, --pp_size, --ep_size, --max_batch_size, --max_num_tokens, --max_seq_len,
--kv_cache_free_gpu_memory_fraction) with the LLM-API options file it takes through --config
(enable_attention_dp, kv_cache_config.dtype; the form of NVIDIA's DeepSeek-R1 trtllm-serve
example). The model argument is the name given to ndplan: put the checkpoint's path or Hugging
Face id there; an int4 layout needs a GPTQ/AWQ checkpoint, which the engines detect themselves.
"""

from __future__ import annotations

from ndplan.serve.estimate import ServeEstimate
from ndplan.serve.layout import WeightRecipe

EMIT_ENGINES = ("vllm", "sglang", "trtllm")
FLAGS = {  # engine -> (command, [flag, or (condition, flag)]); conditions in _conditions
    "vllm": ("vllm serve {model}", [
        "--tensor-parallel-size {atp}", ("pp", "--pipeline-parallel-size {pp}"), ("dpa", "--data-parallel-size {dpa}"),
        ("ep", "--enable-expert-parallel"), ("deepep", "--all2all-backend deepep_high_throughput"),
        "--gpu-memory-utilization {frac}", "--max-model-len {mml}",
        "--max-num-seqs {seqs}", ("kv8", "--kv-cache-dtype fp8"), ("w8", "--quantization fp8")]),
    "sglang": ("python -m sglang.launch_server --model-path {model}", [
        "--tp-size {tp}", ("pp", "--pp-size {pp}"), ("dpa", "--dp-size {dpa}"), ("dpa", "--enable-dp-attention"),
        ("ep", "--ep-size {ep}"), ("deepep", "--moe-a2a-backend deepep"), "--mem-fraction-static {frac}", "--context-length {mml}",
        "--max-running-requests {seqs}", ("kv8", "--kv-cache-dtype fp8_e4m3"), ("w8", "--quantization fp8")]),
    "trtllm": ("trtllm-serve {model}", [
        "--tp_size {tp}", "--pp_size {pp}", "--ep_size {ep}", "--max_batch_size {seqs}", "--max_num_tokens {tokens}",
        "--max_seq_len {mml}", "--config config.yml"]),
}
TRTLLM_OPTIONS = ("enable_attention_dp: {dpa_on}", "kv_cache_config:", "  free_gpu_memory_fraction: {frac}",
                  "  dtype: {kv}")
"""The LLM-API options trtllm-serve reads from --config (enable_attention_dp, kv_cache_config)."""


def launch(engine: str, model: str, est: ServeEstimate, recipe: WeightRecipe, kv_dtype: str,
           mem_fraction: float, max_model_len: int, max_seqs: int, max_tokens: int) -> str:
    """The launch command (and, for TensorRT-LLM, its options file) of ``est``'s layout."""
    lay = est.layout
    values = {"model": model, "tp": lay.tp, "atp": lay.attention_tp, "pp": lay.pp, "dpa": lay.dp_attention,
              "ep": lay.ep, "frac": f"{mem_fraction:g}", "mml": max_model_len, "seqs": max_seqs, "tokens": max_tokens,
              "dpa_on": "true" if lay.dp_attention > 1 else "false", "kv": "fp8" if kv_dtype == "fp8" else "auto"}
    conditions = {"pp": lay.pp > 1, "dpa": lay.dp_attention > 1, "ep": lay.ep > 1, "kv8": kv_dtype == "fp8",
                  "w8": recipe.dtype == "fp8", "deepep": lay.ep > 1 and lay.a2a == "deepep"}
    command, flags = FLAGS[engine]
    args = [command] + [f if isinstance(f, str) else f[1] for f in flags if isinstance(f, str) or conditions[f[0]]]
    text = " \\\n  ".join(a.format(**values) for a in args)
    if engine == "trtllm":
        text = "cat > config.yml <<EOF\n" + "\n".join(o.format(**values) for o in TRTLLM_OPTIONS) + "\nEOF\n" + text
    return text
