"""Kernel argument names, in the canonical order of compiled kernels, without SymPy.

symbols.py makes the SymPy symbols of these names; kernels.py, estimate.py and the sweep
pass values by these names, so a run that finds its kernels in the cache imports no SymPy.
"""

from __future__ import annotations

#: Strategy arguments (symbols.py docstring says what each means).
STRATEGY_ARGS: tuple[str, ...] = ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "m", "seq", "stage", "nrec",
                                  "first_layers", "last_layers")

#: Hardware arguments (catalog.hardware.Hardware.kernel_values gives their values).
HW_ARGS: tuple[str, ...] = ("peak", "peak_bf16", "eff_gemm", "eff_gemm8", "eff_attn", "hbm_bytes_per_s", "eff_hbm", "bw_intra",
                            "bw_inter", "eff_intra", "eff_inter", "lat_intra", "lat_inter", "node", "fp8_gemm")

#: Model sizes: kernel argument (the short math name of symbols.ModelSymbols) -> ModelSpec field.
MODEL_FIELDS: dict[str, str] = {
    "h": "hidden_size", "L": "num_hidden_layers", "a": "num_attention_heads", "kv": "num_key_value_heads",
    "d": "head_dim", "f": "intermediate_size", "V": "vocab_size", "P": "max_position_embeddings",
    "E": "num_experts", "k": "experts_per_token", "fe": "moe_intermediate_size", "fs": "shared_intermediate_size",
    "ql": "q_lora_rank", "kl": "kv_lora_rank", "dn": "qk_nope_head_dim", "dr": "qk_rope_head_dim",
    "dv": "v_head_dim",
}

#: Model-size arguments in kernel order (they follow the strategy and hardware arguments).
MODEL_ARGS: tuple[str, ...] = tuple(MODEL_FIELDS)


def model_arg_values(spec) -> dict[str, float]:
    """A model's sizes by kernel argument name (MODEL_ARGS)."""
    return {name: float(int(getattr(spec, field))) for name, field in MODEL_FIELDS.items()}
