"""Launch arguments of a serving layout for vLLM, SGLang and TensorRT-LLM (``ndplan serve --emit``).

Flag names as each engine documents them: vLLM ``vllm serve`` engine arguments (docs.vllm.ai
"Engine Arguments": --tensor-parallel-size, --pipeline-parallel-size, --data-parallel-size,
--enable-expert-parallel, --gpu-memory-utilization, --max-model-len, --max-num-seqs,
--kv-cache-dtype, --quantization); SGLang ``sglang.launch_server`` server arguments (--tp-size,
--pp-size, --dp-size with --enable-dp-attention, --ep-size, --mem-fraction-static,
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


def launch(engine: str, model: str, est: ServeEstimate, recipe: WeightRecipe, kv_dtype: str,
           mem_fraction: float, max_model_len: int, max_seqs: int, max_tokens: int) -> str:
    """The launch command (and, for TensorRT-LLM, its options file) of ``est``'s layout."""
    lay = est.layout
    if engine == "vllm":
        args = [f"vllm serve {model}", f"--tensor-parallel-size {lay.attention_tp}"]
        if lay.pp > 1:
            args.append(f"--pipeline-parallel-size {lay.pp}")
        if lay.dp_attention > 1:
            args.append(f"--data-parallel-size {lay.dp_attention}")
        if lay.ep > 1:
            args.append("--enable-expert-parallel")
        args += [f"--gpu-memory-utilization {mem_fraction:g}", f"--max-model-len {max_model_len}",
                 f"--max-num-seqs {max_seqs}"]
        if kv_dtype == "fp8":
            args.append("--kv-cache-dtype fp8")
        if recipe.dtype == "fp8":
            args.append("--quantization fp8")
        return " \\\n  ".join(args)
    if engine == "sglang":
        args = [f"python -m sglang.launch_server --model-path {model}", f"--tp-size {lay.tp}"]
        if lay.pp > 1:
            args.append(f"--pp-size {lay.pp}")
        if lay.dp_attention > 1:
            args += [f"--dp-size {lay.dp_attention}", "--enable-dp-attention"]
        if lay.ep > 1:
            args.append(f"--ep-size {lay.ep}")
        args += [f"--mem-fraction-static {mem_fraction:g}", f"--context-length {max_model_len}",
                 f"--max-running-requests {max_seqs}"]
        if kv_dtype == "fp8":
            args.append("--kv-cache-dtype fp8_e4m3")
        if recipe.dtype == "fp8":
            args.append("--quantization fp8")
        return " \\\n  ".join(args)
    options = [f"enable_attention_dp: {'true' if lay.dp_attention > 1 else 'false'}", "kv_cache_config:",
               f"  free_gpu_memory_fraction: {mem_fraction:g}", f"  dtype: {'fp8' if kv_dtype == 'fp8' else 'auto'}"]
    args = [f"trtllm-serve {model}", f"--tp_size {lay.tp}", f"--pp_size {lay.pp}", f"--ep_size {lay.ep}",
            f"--max_batch_size {max_seqs}", f"--max_num_tokens {max_tokens}", f"--max_seq_len {max_model_len}",
            "--config config.yml"]
    return "cat > config.yml <<EOF\n" + "\n".join(options) + "\nEOF\n" + " \\\n  ".join(args)
