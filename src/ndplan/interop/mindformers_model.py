"""The architecture a MindFormers yaml defines: ``model.model_config`` in the legacy form
(hidden_size, num_layers, num_heads, ..., the FFN width of LlamaFeedForward) or the mcore form
(HF-style keys and their MindFormers aliases), and the legacy ``moe_config`` (interop/mindformers.py
reads the parallel layout)."""

from __future__ import annotations

import dataclasses

from ndplan.catalog.model import model_from_config
from ndplan.errors import NdplanError
from ndplan.interop.base import positive

MC = "model.model_config"


def get(doc: dict, dotted: str, default=None):
    node = doc
    for k in dotted.split("."):
        if not isinstance(node, dict) or k not in node:
            return default
        node = node[k]
    return default if node is None else node


def ffn_hidden_size(mc: dict, h: int) -> int:
    """MindFormers LlamaFeedForward: x = 4h; if ffn_dim_multiplier: x = int((fdm + 0.01) x);
    x = int(2x/3); round up to multiple_of."""
    if mc.get("intermediate_size"):
        return int(mc["intermediate_size"])
    x = 4 * h
    if mc.get("ffn_dim_multiplier"):
        x = int((float(mc["ffn_dim_multiplier"]) + 0.01) * x)
    x = int(2 * x / 3)
    mult = int(mc.get("multiple_of") or 256)
    return mult * ((x + mult - 1) // mult)


MOE = "moe_config"
MOE_INTERMEDIATE_DEFAULT = 1407
"""MoEConfig's moe_intermediate_size default (mindspore-lab/mindformers@fd4deebc
mindformers/modules/transformer/moe.py:138)."""
MCORE_ALIASES = {"expert_num": "num_experts", "num_experts_chosen": "num_experts_per_tok",
                 "shared_expert_num": "n_shared_experts", "mtp_num_layers": "num_nextn_predict_layers",
                 "num_mtp_layers": "num_nextn_predict_layers"}
"""MindFormers' own names for HF keys in an mcore ``model_config`` (mindformers/parallel_core/
transformer_config_utils.py L239-248, L340-357 at mindspore-lab/mindformers@f52743ca)."""


def is_mcore(doc: dict) -> bool:
    """The mcore (parallel_core) model: ``use_legacy: False``, or an HF-style model_config
    (``num_hidden_layers`` instead of the legacy ``num_layers``)."""
    mc = model_config(doc)
    return doc.get("use_legacy") is False or ("num_hidden_layers" in mc and "num_layers" not in mc)


MCORE_NEEDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
LEGACY_NEEDS = ("hidden_size", "num_layers", "num_heads", "vocab_size")


def missing_keys(doc: dict) -> list[str]:
    """The model_config keys the architecture needs that the yaml does not give."""
    mc = get(doc, MC, {})
    mc = mc if isinstance(mc, dict) else {}
    return [k for k in (MCORE_NEEDS if is_mcore(doc) else LEGACY_NEEDS) if mc.get(k) is None]


def _mcore_model(mc: dict, name: str):
    """An mcore model_config holds HF config.json keys (model_type, num_hidden_layers, ...)."""
    if any(mc.get(k) is None for k in MCORE_NEEDS):
        return None
    cfg = {MCORE_ALIASES.get(k, k): v for k, v in mc.items()}
    experts = next((cfg[k] for k in ("num_experts", "n_routed_experts", "num_local_experts") if cfg.get(k)), 0)
    if experts and cfg.get("num_experts_per_tok") is None:
        raise NdplanError(f"{MC}.num_experts_per_tok", None, f"not given for {experts} experts: MindFormers takes the "
                          "config class's default (e.g. DeepseekV3Config 8, models/deepseek3/configuration_deepseek_v3.py"
                          ":179 at v1.7.0), which ndplan does not read", "write num_experts_per_tok in model_config")
    cfg.setdefault("model_type", "llama")
    if "untie_embeddings_and_output_weights" in mc and "tie_word_embeddings" not in mc:
        cfg["tie_word_embeddings"] = not mc["untie_embeddings_and_output_weights"]
    spec = model_from_config(cfg, name, f"MindFormers mcore model_config in {name}")
    return dataclasses.replace(spec, qk_norm=True) if mc.get("qk_layernorm") and not spec.qk_norm else spec


def is_deepseek(doc: dict) -> bool:
    """The legacy DeepSeek model (research/deepseek3/deepseek2_model.py), named by its arch or config type."""
    return "deepseek" in (str(get(doc, "model.arch.type", "")) + str(get(doc, MC + ".type", ""))).lower()


def _legacy_moe(doc: dict, ffn: int) -> dict:
    """HF MoE keys of a legacy ``moe_config`` (mindformers/modules/transformer/moe.py
    ``MoEConfig``: expert_num 1 = dense, num_experts_chosen 1, moe_intermediate_size 1407,
    shared_expert_num 0). The routed experts are ``model_config.intermediate_size`` wide in
    the Llama path (llama_transformer.py L912-916: Mixtral) and ``moe_intermediate_size``
    in DeepSeek's (research/deepseek3/deepseek2_model.py L1058/L1072, whose first
    ``first_k_dense_replace`` layers are dense); shared experts are shared_expert_num x
    moe_intermediate_size (llama_layer.py L821; deepseek2_model.py L283)."""
    moe = doc.get(MOE) or {}
    if not isinstance(moe, dict):
        raise NdplanError(MOE, moe, "not a mapping", "write moe_config as keys (expert_num, num_experts_chosen, ...)")
    experts = _whole(moe, "expert_num", 1)
    if experts <= 1:
        return {}
    small = _whole(moe, "moe_intermediate_size", MOE_INTERMEDIATE_DEFAULT)
    deepseek = is_deepseek(doc)
    first_k = moe.get("first_k_dense_replace", 0) if deepseek else 0
    first_k = int(first_k) if isinstance(first_k, bool) else _whole(moe, "first_k_dense_replace", 0)
    return {"num_experts": experts, "num_experts_per_tok": _whole(moe, "num_experts_chosen", 1),
            "moe_intermediate_size": small if deepseek else ffn,
            "n_shared_experts": _whole(moe, "shared_expert_num", 0), "first_k_dense_replace": first_k}


def _mtp_depth(mc: dict) -> int:
    return _whole(mc, "mtp_depth", 0, MC)


def _whole(table: dict, key: str, default: int, where: str = MOE) -> int:
    """A whole number >= 0 of the yaml table at ``where`` (an integral float too: MindFormers
    1.3.0's Qwen2-57B writes shared_expert_num: 8.0 and takes int() of it, llama_layer.py:587),
    or NdplanError naming the key."""
    v = table.get(key)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise NdplanError(f"{where}.{key}", v, "not a whole number", "write an integer >= 0")
    return v


def model_config(doc: dict) -> dict:
    """``model.model_config`` ({} when absent), or NdplanError when it is not a mapping."""
    mc = get(doc, MC, {})
    if not isinstance(mc, dict):
        raise NdplanError(MC, mc, "not a mapping", "write model_config as keys (hidden_size, num_layers, ...)")
    return mc


def model_of(doc: dict, name: str, where: str):
    mc = model_config(doc)
    if not mc:
        return None
    if is_mcore(doc):
        return _mcore_model(mc, name)
    if any(mc.get(k) is None for k in LEGACY_NEEDS):
        return None
    h = positive(f"{MC}.hidden_size", mc["hidden_size"], where)
    a = positive(f"{MC}.num_heads", mc["num_heads"], where)
    ffn = ffn_hidden_size(mc, h)
    moe = _legacy_moe(doc, ffn)
    if moe and moe["n_shared_experts"] and not is_deepseek(doc):
        moe["shared_expert_intermediate_size"] = moe.pop("n_shared_experts") * _whole(doc[MOE], "moe_intermediate_size", MOE_INTERMEDIATE_DEFAULT)
    mla = {k: mc[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
           if mc.get(k) is not None}
    qkv_bias = bool(mc.get("qkv_has_bias"))  # Qwen2-style biases on q, k, v only
    model_type = "deepseek_v3" if mla else "mixtral" if moe else "qwen2" if qkv_bias else "llama"
    return model_from_config({"model_type": model_type, "hidden_size": h,
                              "num_hidden_layers": positive(f"{MC}.num_layers", mc["num_layers"], where),
                              "num_attention_heads": a, "num_key_value_heads": mc.get("n_kv_heads") or a,
                              "intermediate_size": ffn, "vocab_size": mc["vocab_size"],
                              "tie_word_embeddings": bool(mc.get("tie_word_embeddings")), "attention_bias": qkv_bias,
                              "num_nextn_predict_layers": _mtp_depth(mc)} | moe | mla,
                             name, f"MindFormers model_config in {name}")
