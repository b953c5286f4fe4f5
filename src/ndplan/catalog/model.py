"""ModelSpec: a decoder-only transformer described with Hugging Face config.json names.

The architecture (dense, GQA/MQA, MoE with shared experts and first-k dense layers,
MLA, MTP) is detected from the fields, never from the model's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ndplan.catalog.files import catalog_names, read_mapping, resolve
from ndplan import limits
from ndplan.errors import NdplanError, warn

#: model_type values whose MLP is the 2-matrix (non-gated) GeLU MLP with LayerNorm,
#: biases everywhere and learned absolute positions (GPT-2/GPT-3/Megatron GPT).
GPT_TYPES = frozenset({"gpt", "gpt2", "megatron_gpt"})
#: Hugging Face model_type values of encoder, encoder-decoder and vision models (transformers'
#: BERT/RoBERTa/DeBERTa/ELECTRA/ALBERT/DistilBERT, T5/mT5/UMT5/BART/mBART/Pegasus/Whisper, ViT/CLIP/SigLIP):
#: bidirectional or cross attention, which the decoder formulas do not describe.
NOT_DECODERS = frozenset({"bert", "roberta", "xlm-roberta", "deberta", "deberta-v2", "electra", "albert",
                          "distilbert", "t5", "mt5", "umt5", "bart", "mbart", "pegasus", "whisper", "vit", "clip",
                          "siglip"})
#: model_type values with q/k/v biases that their config.json does not spell out.
QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe"})
#: model_type values with per-head RMSNorm on q and k (Qwen3 "QK-norm").
QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe"})
#: model_type values whose MoE router carries a learned per-expert bias counted as a
#: parameter. DeepSeek-V3's ``e_score_correction_bias`` is a buffer in transformers
#: (671,026,404,352 = our count without it; 58 MoE layers x 256 would add 14,848), so
#: no catalog type is listed; the field stays for configs that need it.
ROUTER_BIAS_TYPES: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    """Catalog name or file path it was loaded from."""
    source: str
    """Where the numbers come from."""
    model_type: str
    """Hugging Face model_type (llama, qwen2, qwen3, qwen3_moe, mixtral, deepseek_v2, deepseek_v3) or gpt."""
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    """Dense MLP intermediate size (also of the first-k dense layers of MoE models)."""
    vocab_size: int
    max_position_embeddings: int = 0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    """Biases on q/k/v projections (and on o_proj for GPT-style models)."""
    gated_mlp: bool = True
    """SwiGLU-style gate+up+down (3 matrices) vs GeLU fc1+fc2 (2 matrices)."""
    layernorm: bool = False
    """LayerNorm with bias (GPT) instead of RMSNorm (weight only)."""
    qk_norm: bool = False
    learned_positions: bool = False
    mlp_bias: bool = False
    """Biases on MLP linears (GPT-style)."""
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    # --- MoE ---
    num_experts: int = 0
    """Routed experts (num_local_experts / n_routed_experts / num_experts)."""
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    """Total intermediate size of the shared expert(s) (n_shared_experts * moe_intermediate_size)."""
    router_bias: bool = False
    layer_kinds: tuple[str, ...] = field(default_factory=tuple)
    """Per decoder layer, ``dense`` or ``moe``."""
    # --- MLA ---
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # --- MTP ---
    mtp_layers: int = 0
    """num_nextn_predict_layers: MTP modules after the last decoder layer (last stage)."""
    # --- attention span ---
    attention_windows: tuple[int, ...] = ()
    """Per decoder layer, the sliding window in tokens (a query attends to the last ``window`` keys,
    itself included), 0 for full causal attention; empty when every layer is full (``_windows``
    reads the Hugging Face fields). Serving reads it (the KV cache and decode reads of a sliding
    layer stop growing at the window); the training formulas cost every layer as full attention
    (``warn_long_seq`` says so past the window)."""
    # --- measured inputs ---
    traced: object = None
    """formulas.traced.TracedActivations: the activation bytes ``ndplan trace`` measured on the
    real modules, used instead of the closed form (``--activations traced``; ndplan.trace.traced_spec)."""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def layer_pattern(self) -> tuple:
        """The layer-kind pattern with no layer count in it where there is none to give:
        ("dense",) all dense, ("moe",) all MoE, ("leading", k) k dense then MoE, else
        ("mixed", layer_kinds). Kernels are keyed by what builders read (kernels.py), so
        builders read this instead of the per-layer list wherever the pattern suffices."""
        kinds = self.layer_kinds
        k = kinds.count("dense")
        if k == len(kinds):
            return ("dense",)
        if all(x == "dense" for x in kinds[:k]):
            return ("leading", k) if k else ("moe",)
        return ("mixed", kinds)

    @property
    def has_q_lora(self) -> bool:
        """MLA compresses q through a low-rank latent (q_lora_rank > 0)."""
        return self.q_lora_rank > 0

    @property
    def has_shared_experts(self) -> bool:
        return self.shared_intermediate_size > 0

    @property
    def implicit_qkv_bias(self) -> bool:
        """q/k/v biases that the model_type implies though config.json does not spell them out."""
        return self.model_type in QKV_BIAS_TYPES

    @property
    def edge_layer_kinds(self) -> tuple[str, ...]:
        """Kinds of the first three and the last three decoder layers (every layer when there
        are fewer than six): code that looks only at the ends of the stack reads this, which
        is the same at every depth of a pattern."""
        kinds = self.layer_kinds
        return kinds if len(kinds) < 6 else kinds[:3] + kinds[-3:]

    @property
    def architecture(self) -> str:
        parts = []
        if self.is_mla:
            parts.append("MLA")
        elif self.num_key_value_heads == 1:
            parts.append("MQA")
        elif self.num_key_value_heads < self.num_attention_heads:
            parts.append("GQA")
        else:
            parts.append("MHA")
        if self.is_moe:
            dense = self.layer_kinds.count("dense")
            parts.append(f"MoE {self.num_experts}x top-{self.experts_per_token}"
                         + (" + shared" if self.shared_intermediate_size else "")
                         + (f", {dense} dense layers" if dense else ""))
        else:
            parts.append("dense")
        if self.mtp_layers:
            parts.append(f"MTP {self.mtp_layers}")
        return ", ".join(parts)

    def __post_init__(self):
        for f_ in POSITIVE_FIELDS:
            _check_int(f_, getattr(self, f_), 1)
        for f_ in OPTIONAL_FIELDS:
            _check_int(f_, getattr(self, f_), 0)
        for f_ in ("attention_dropout", "hidden_dropout"):
            limits.real(f_, getattr(self, f_), 0.0, 1.0, lo_open=False, what="a probability")
        if self.num_attention_heads % self.num_key_value_heads:
            raise NdplanError("num_key_value_heads", self.num_key_value_heads,
                              f"does not divide num_attention_heads={self.num_attention_heads}",
                              "fix the model file (GQA groups must be equal)")
        if self.is_moe:
            if not 0 < self.experts_per_token <= self.num_experts:
                raise NdplanError("num_experts_per_tok", self.experts_per_token,
                                  f"outside 1..{self.num_experts} (the routed expert count)", "fix the model file")
            if self.moe_intermediate_size <= 0:
                raise NdplanError("moe_intermediate_size", self.moe_intermediate_size,
                                  "MoE models need a positive expert size", "add moe_intermediate_size")
        if len(self.layer_kinds) != self.num_hidden_layers:
            raise NdplanError("layer_kinds", len(self.layer_kinds),
                              f"not one kind per layer ({self.num_hidden_layers})", "give one kind per layer")
        if self.attention_windows and len(self.attention_windows) != self.num_hidden_layers:
            raise NdplanError("attention_windows", len(self.attention_windows),
                              f"not one window per layer ({self.num_hidden_layers})", "give one window per layer")
        if any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in self.attention_windows):
            raise NdplanError("sliding_window", self.attention_windows, "not a whole number of tokens >= 0",
                              "fix the model file")
        if self.learned_positions and self.max_position_embeddings <= 0:
            raise NdplanError("max_position_embeddings", self.max_position_embeddings,
                              "learned positions need a positive max_position_embeddings",
                              "add max_position_embeddings")

    def window(self, layer: int) -> int:
        """Layer ``layer``'s sliding window in tokens, 0 for full attention."""
        return self.attention_windows[layer] if self.attention_windows else 0

    @property
    def sliding_layers(self) -> int:
        return sum(1 for w in self.attention_windows if w)

    def warn_long_seq(self, seq: int) -> None:
        """A warning (not an error) when ``seq`` exceeds max_position_embeddings, or the smallest
        sliding window (the training formulas cost those layers as full attention)."""
        if self.max_position_embeddings and seq > self.max_position_embeddings:
            warn("seq", seq, f"above {self.name}'s max_position_embeddings={self.max_position_embeddings}",
                 "the estimate assumes the model runs at this length (e.g. after RoPE scaling)")
        windows = [w for w in self.attention_windows if w]
        if windows and seq > min(windows):
            warn("seq", seq, f"above {self.name}'s sliding window of {min(windows)} tokens "
                 f"({len(windows)} of {self.num_hidden_layers} layers)",
                 "training estimates cost those layers as full attention (an upper bound on their FLOPs)")


POSITIVE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                   "intermediate_size", "vocab_size")
OPTIONAL_FIELDS = ("max_position_embeddings", "num_experts", "experts_per_token", "moe_intermediate_size",
                   "shared_intermediate_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                   "v_head_dim", "mtp_layers")


def _check_int(f_: str, v, lo: int) -> int:
    """Model sizes are integers in lo..MAX_MODEL_DIM (layers: MAX_LAYERS)."""
    hi = limits.MAX_LAYERS if f_ in ("num_hidden_layers", "mtp_layers") else limits.MAX_MODEL_DIM
    if not isinstance(v, int) or isinstance(v, bool):
        raise NdplanError(f_, v, "not an integer", f"give a whole number in {lo}..{hi:,}")
    return limits.count(f_, v, lo, hi, "a model size")


def _first(cfg: dict, *names, default=None):
    for n in names:
        if n in cfg and cfg[n] is not None:
            return cfg[n]
    return default


def _int_field(cfg: dict, where: str, *names, default=None, lo: int = 0) -> int:
    """An integer field (the first of ``names`` present) in lo..MAX_MODEL_DIM."""
    v = _first(cfg, *names, default=default)
    if v is None:
        raise NdplanError(names[0], None, f"missing in {where}", f"add `{names[0]}: <int>`")
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise NdplanError(names[0], v, f"not an integer (in {where})", "give a whole number")
    try:
        return limits.count(names[0], v, lo, limits.MAX_MODEL_DIM, "a model size")
    except NdplanError as e:
        raise NdplanError(e.field, e.value, f"{e.problem} (in {where})", e.fix) from None


def _float_field(cfg: dict, where: str, *names, default: float) -> float:
    v = _first(cfg, *names, default=default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise NdplanError(names[0], v, f"not a number (in {where})", "give a probability in [0, 1]")
    return float(v)


def _layer_kinds(cfg: dict, model_type: str, L: int, n_experts: int, where: str) -> tuple[str, ...]:
    """Which decoder layers are MoE. HF conventions:
    DeepSeek: layer i is MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0;
    Qwen-MoE: iff i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0;
    Mixtral: every layer."""
    if n_experts == 0:
        return ("dense",) * L
    first_k = _int_field(cfg, where, "first_k_dense_replace", default=0)
    freq = _int_field(cfg, where, "moe_layer_freq", default=1)
    step = _int_field(cfg, where, "decoder_sparse_step", default=1)
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
        raise NdplanError("mlp_only_layers", only, f"not a list of layer indices (in {where})", "write e.g. [0, 1]")
    only_mlp = set(only)
    if freq <= 0 or step <= 0:
        raise NdplanError("moe_layer_freq" if freq <= 0 else "decoder_sparse_step", min(freq, step),
                          "must be >= 1", "fix the model file")
    kinds = []
    for i in range(L):
        moe = i >= first_k and i % freq == 0 and (i + 1) % step == 0 and i not in only_mlp
        kinds.append("moe" if moe else "dense")
    return tuple(kinds)


#: model_type values whose sliding_window, when set, applies to every layer (transformers' Mistral,
#: Mixtral, Phi-3 and Starcoder2 attention pass ``sliding_window=config.sliding_window`` to every layer).
EVERY_LAYER_WINDOW_TYPES = frozenset({"mistral", "mixtral", "phi3", "starcoder2"})
QWEN_MAX_WINDOW_LAYERS = 28
"""transformers' Qwen2Config / Qwen3Config default ``max_window_layers``: with use_sliding_window and
no max_window_layers, layers from the 29th on slide."""


def _windows(cfg: dict, model_type: str, L: int, where: str) -> tuple[int, ...]:
    """Per-layer sliding windows from the Hugging Face fields (0: full attention):
    ``layer_types`` ("sliding_attention" / "full_attention", gpt-oss, Gemma 3, newer configs)
    with ``sliding_window``; else by model_type: Mistral, Mixtral, Phi-3 and Starcoder2 every layer;
    Gemma 2 the even layers (``is_sliding = not bool(layer_idx % 2)``); a ``sliding_window_pattern``
    (Gemma 3's and Cohere2's older configs) every layer but each pattern-th; Qwen2 and Qwen3 only
    under ``use_sliding_window``, layers from ``max_window_layers`` (default 28) on. Anything else:
    full attention. Fields nested under ``text_config`` (multimodal Gemma 3) are not read."""
    w = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != L or not all(isinstance(t, str) for t in types):
            raise NdplanError("layer_types", types, f"not one layer type per layer ({L}) in {where}",
                              'list "full_attention" or "sliding_attention" per layer')
        unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise NdplanError("layer_types", unknown[0], f"in {where}: a layer kind ndplan does not model",
                              "use a config whose layers are full_attention or sliding_attention")
        if "sliding_attention" in types:
            window = _int_field(cfg, where, "sliding_window", lo=1)
            return tuple(window if t == "sliding_attention" else 0 for t in types)
        return ()
    if w is None or cfg.get("use_sliding_window") is False:
        return ()
    window = _int_field(cfg, where, "sliding_window", lo=1)
    if model_type in EVERY_LAYER_WINDOW_TYPES:
        return (window,) * L
    if model_type == "gemma2":
        return tuple(0 if i % 2 else window for i in range(L))
    if cfg.get("sliding_window_pattern"):
        n = _int_field(cfg, where, "sliding_window_pattern", lo=1)
        return tuple(0 if (i + 1) % n == 0 else window for i in range(L))
    if model_type.startswith(("qwen2", "qwen3")) and cfg.get("use_sliding_window"):
        first = _int_field(cfg, where, "max_window_layers", default=QWEN_MAX_WINDOW_LAYERS)
        return tuple(window if i >= first else 0 for i in range(L))
    return ()


def model_from_config(cfg: dict, name: str, where: str) -> ModelSpec:
    """Build a ModelSpec from a mapping with HF config.json field names."""
    model_type = str(_first(cfg, "model_type", default="")).lower()
    if not model_type:
        arch = (cfg.get("architectures") or [""])[0].lower()
        model_type = "gpt" if arch.startswith("gpt") else ("llama" if arch else "")
    if not model_type:
        raise NdplanError("model_type", None, f"missing in {where}; add e.g. `model_type: llama`")
    if model_type in NOT_DECODERS:
        raise NdplanError("model_type", model_type, f"in {where}: an encoder, encoder-decoder or vision model, which "
                          "ndplan does not model (decoder-only language models)", "give a decoder-only model's config")
    gpt = model_type in GPT_TYPES
    h = _int_field(cfg, where, "hidden_size", "n_embd", lo=1)
    L = _int_field(cfg, where, "num_hidden_layers", "n_layer", lo=1)
    a = _int_field(cfg, where, "num_attention_heads", "n_head", lo=1)
    kv = _int_field(cfg, where, "num_key_value_heads", default=a, lo=1)
    hd = _first(cfg, "head_dim")
    if hd is None:
        if h % a:
            raise NdplanError("head_dim", None, f"hidden_size {h} is not divisible by heads {a}", "give head_dim")
        hd = h // a
    hd = _int_field({"head_dim": hd}, where, "head_dim", lo=1)
    f = _int_field(cfg, where, "intermediate_size", "n_inner", "ffn_hidden_size", default=4 * h if gpt else None, lo=1)
    n_exp = _int_field(cfg, where, "num_local_experts", "n_routed_experts", "num_experts", default=0)
    moe_f = _int_field(cfg, where, "moe_intermediate_size", default=f if n_exp else 0)
    shared = 0
    if n_exp:
        n_shared = _int_field(cfg, where, "n_shared_experts", default=0)
        shared = n_shared * moe_f + _int_field(cfg, where, "shared_expert_intermediate_size", default=0)
    kv_lora = _int_field(cfg, where, "kv_lora_rank", default=0)
    dropout_default = 0.1 if gpt else 0.0  # Megatron GPT / GPT-2 default dropout
    spec = ModelSpec(
        name=name,
        source=str(cfg.get("source", where)),
        model_type=model_type,
        hidden_size=h, num_hidden_layers=L, num_attention_heads=a, num_key_value_heads=kv,
        head_dim=int(hd), intermediate_size=f,
        vocab_size=_int_field(cfg, where, "vocab_size", lo=1),
        max_position_embeddings=_int_field(cfg, where, "max_position_embeddings", "n_positions", default=0),
        tie_word_embeddings=bool(_first(cfg, "tie_word_embeddings", default=gpt)),
        attention_bias=bool(_first(cfg, "attention_bias", default=gpt or model_type in QKV_BIAS_TYPES)),
        gated_mlp=not gpt,
        layernorm=gpt,
        qk_norm=model_type in QK_NORM_TYPES,
        learned_positions=gpt,
        mlp_bias=bool(_first(cfg, "mlp_bias", default=gpt)),
        attention_dropout=_float_field(cfg, where, "attention_dropout", "attn_pdrop", default=dropout_default),
        hidden_dropout=_float_field(cfg, where, "hidden_dropout", "resid_pdrop", default=dropout_default),
        num_experts=n_exp,
        experts_per_token=_int_field(cfg, where, "num_experts_per_tok", default=0) if n_exp else 0,
        moe_intermediate_size=moe_f if n_exp else 0,
        shared_intermediate_size=shared,
        router_bias=model_type in ROUTER_BIAS_TYPES,
        layer_kinds=_layer_kinds(cfg, model_type, L, n_exp, where),
        q_lora_rank=_int_field(cfg, where, "q_lora_rank", default=0) if kv_lora else 0,
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=_int_field(cfg, where, "qk_nope_head_dim", default=0) if kv_lora else 0,
        qk_rope_head_dim=_int_field(cfg, where, "qk_rope_head_dim", default=0) if kv_lora else 0,
        v_head_dim=_int_field(cfg, where, "v_head_dim", default=0) if kv_lora else 0,
        mtp_layers=_int_field(cfg, where, "num_nextn_predict_layers", default=0),
        attention_windows=_windows(cfg, model_type, L, where),
    )
    return spec


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog name (``llama3-70b``), a YAML path, or an HF model directory / config.json."""
    path = resolve("models", name_or_path, "model")
    cfg = read_mapping(path, "model")
    name = path.stem if path.parent.name == "models" else (
        path.parent.name if path.name == "config.json" else str(path))
    return model_from_config(cfg, name, str(path))


def list_models() -> list[ModelSpec]:
    return [load_model(n) for n in catalog_names("models")]
