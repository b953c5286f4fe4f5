"""The architecture a Megatron-LM script defines with its flags (interop/megatron.py).

Defaults and rules are Megatron-LM's (NVIDIA/Megatron-LM@d98e8a64, ``A`` =
megatron/training/arguments.py, ``TC`` = megatron/core/transformer/transformer_config.py):

* dense: ``--ffn-hidden-size`` default 4h, or int(8h/3) rounded down to 64 with
  ``--swiglu``; ``--num-query-groups`` with ``--group-query-attention``; ``--kv-channels``
  the head dim (default h / heads); embeddings tied unless
  ``--untie-embeddings-and-output-weights``; ``--qk-layernorm`` norms on q and k;
  ``--add-qkv-bias`` with SwiGLU: Qwen2's biases on q, k and v;
* MoE: ``--num-experts`` (0 = dense, A:1648), ``--moe-router-topk`` (default 2, TC:760),
  ``--moe-ffn-hidden-size`` (default ``--ffn-hidden-size``, A:1650-1652),
  ``--moe-shared-expert-intermediate-size`` (none by default, TC:701),
  ``--moe-layer-freq``: an int f (layer i is MoE iff i % f == 0) or a list pattern such as
  ``([0]*3+[1]*58)``, which Megatron reads with eval after allowing only ``,\\d[]()+*``
  (A:245-253, 327-350); here a small parser of that grammar, never eval;
* MLA (``--multi-latent-attention``): ``--q-lora-rank`` (default none), ``--kv-lora-rank``
  (32), ``--qk-head-dim`` (128), ``--qk-pos-emb-head-dim`` (64), ``--v-head-dim`` (128)
  (A:3548-3556); MTP: ``--mtp-num-layers``;
* vocabulary: ``--vocab-size``, else the tokenizer's own size where it is fixed
  (``GPT2BPETokenizer`` 50,257: the gpt2-vocab.json of Radford et al.; a
  ``HuggingFaceTokenizer`` whose ``--tokenizer-model`` is the Hugging Face repository of a
  catalog model: that model's ``vocab_size``), padded as Megatron pads it
  (megatron/core/tokenizers/utils/build_tokenizer.py ``vocab_size_with_padding``: up to a
  multiple of ``--make-vocab-size-divisible-by`` (128, A:2441) x tp).
"""

from __future__ import annotations

import dataclasses
import math
import re

from ndplan.catalog.model import list_models, model_from_config
from ndplan.errors import NdplanError

FLAGS = {"hidden": "--hidden-size", "heads": "--num-attention-heads", "ffn": "--ffn-hidden-size",
         "groups": "--num-query-groups", "vocab": "--vocab-size", "positions": "--max-position-embeddings",
         "kv_channels": "--kv-channels", "experts": "--num-experts", "topk": "--moe-router-topk",
         "moe_ffn": "--moe-ffn-hidden-size", "shared_ffn": "--moe-shared-expert-intermediate-size",
         "moe_freq": "--moe-layer-freq", "q_lora": "--q-lora-rank", "kv_lora": "--kv-lora-rank",
         "qk_head": "--qk-head-dim", "qk_pos": "--qk-pos-emb-head-dim", "v_head": "--v-head-dim",
         "tokenizer": "--tokenizer-type", "tokenizer_model": "--tokenizer-model",
         "vocab_divisible": "--make-vocab-size-divisible-by"}
"""Architecture flags with a value (argparse dest -> flag)."""
SWITCHES = {"gqa": "--group-query-attention", "swiglu": "--swiglu", "untie": "--untie-embeddings-and-output-weights",
            "mla": "--multi-latent-attention", "qk_norm": "--qk-layernorm", "qkv_bias": "--add-qkv-bias"}
MLA_DEFAULTS = {"q_lora": 0, "kv_lora": 32, "qk_head": 128, "qk_pos": 64, "v_head": 128}
"""A:3548-3556 (``--q-lora-rank`` None: no query compression)."""
FIXED_VOCAB = {"GPT2BPETokenizer": 50257}
"""Tokenizers whose vocabulary does not depend on a file the script names: GPT-2's BPE
(gpt2-vocab.json: 50,257 tokens, Radford et al. 2019)."""
ASSUMED_VOCAB = {"Llama2Tokenizer": 32000}
"""Tokenizers whose size is that of one file everyone passes: Llama 2's tokenizer.model
(32,000 SentencePiece pieces, Touvron et al. 2023; Mixtral's is the same size). Read
with a note that the file decides."""
VOCAB_DIVISIBLE_DEFAULT = 128
"""``--make-vocab-size-divisible-by`` default (A:2441)."""


def moe_pattern(text: str, layers: int) -> list[int]:
    """``--moe-layer-freq``: 1/0 per layer. An int f gives ``i % f == 0``; a pattern is
    lists of 0/1 joined by ``+`` and repeated by ``*n``, in parentheses or not."""
    flag = FLAGS["moe_freq"]
    s = re.sub(r"\s+", "", text)
    if re.fullmatch(r"\d+", s):
        f = int(s)
        if f < 1:
            raise NdplanError(flag, text, "must be >= 1", "give a layer frequency or a 0/1 list")
        return [1 if i % f == 0 else 0 for i in range(layers)]
    if not re.fullmatch(r"[\d,\[\]()+*]+", s):
        raise NdplanError(flag, text, "not an int or a list pattern like ([0]*3+[1]*58)",
                          "write it as Megatron-LM accepts it")
    pos = 0

    def expr() -> list[int]:
        nonlocal pos
        out = term()
        while pos < len(s) and s[pos] == "+":
            pos += 1
            out = out + term()
        return out

    def term() -> list[int]:
        nonlocal pos
        out = atom()
        while pos < len(s) and s[pos] == "*":
            m = re.match(r"\d+", s[pos + 1:])
            if not m or int(m.group(0)) > layers:
                raise NdplanError(flag, text, f"repeat count at column {pos + 2} missing or above {layers}",
                                  "write e.g. [0]*3+[1]*58")
            pos += 1 + len(m.group(0))
            out = out * int(m.group(0))
            if len(out) > layers:  # nested repeats must not build more than one entry per layer
                raise NdplanError(flag, text, f"gives more than {layers} entries, one per layer",
                                  "give one 0/1 entry per layer")
        return out

    def atom() -> list[int]:
        nonlocal pos
        if s.startswith("(", pos):
            pos += 1
            out = expr()
            if not s.startswith(")", pos):
                raise NdplanError(flag, text, "unbalanced parentheses", "write e.g. ([0]*3+[1]*58)")
            pos += 1
            return out
        m = re.match(r"\[([\d,]*)\]", s[pos:])
        if not m:
            raise NdplanError(flag, text, f"expected a [0/1 list] at column {pos + 1}", "write e.g. [0]*3+[1]*58")
        pos += len(m.group(0))
        return [int(x) for x in m.group(1).split(",") if x]

    pattern = expr()
    if pos != len(s):
        raise NdplanError(flag, text, f"unexpected {s[pos]!r} at column {pos + 1}", "write e.g. [0]*3+[1]*58")
    if len(pattern) != layers or any(x not in (0, 1) for x in pattern):
        raise NdplanError(flag, text, f"gives {len(pattern)} entries, not one 0/1 per layer ({layers})",
                          "give one entry per layer (Megatron-LM asserts the same)")
    return pattern


GPT2_DEFAULT_ENTRIES = {"pretrain_gpt.py": "Megatron-LM@d98e8a64 pretrain_gpt.py:527; Megatron-DeepSpeed :364",
                        "pretrain_hybrid.py": "pretrain_hybrid.py:544", "pretrain_vlm.py": "pretrain_vlm.py:498",
                        "pretrain_gpt_core.py": "Megatron-DeepSpeed pretrain_gpt_core.py:126",
                        "pretrain_gpt2.py": "Megatron-LM v1.1.5 pretrain_gpt2.py:158 (DeepSpeedExamples@1bee84f6 "
                                            "Megatron-LM-v1.1.5-3D_parallelism)"}
"""Entry scripts that default --tokenizer-type to GPT2BPETokenizer (their args_defaults)."""


def default_tokenizer(args, words: list[str], notes: list) -> None:
    """``--tokenizer-type`` when the script gives none: the entry script's default
    (``GPT2_DEFAULT_ENTRIES``), said in a note."""
    entry = next((w.rsplit("/", 1)[-1] for w in words if w.rsplit("/", 1)[-1] in GPT2_DEFAULT_ENTRIES), None)
    if args.tokenizer is None and entry:
        args.tokenizer = "GPT2BPETokenizer"
        notes.append(f"--tokenizer-type not given: {entry}'s default GPT2BPETokenizer ({GPT2_DEFAULT_ENTRIES[entry]})")


def _catalog_vocab(repo_id: str) -> tuple[int, str] | None:
    """(vocab_size, catalog name) of the catalog model whose source is ``HF <repo_id> ...``."""
    for m in list_models():
        if m.source.startswith(f"HF {repo_id} ") or m.source.startswith(f"HF {repo_id}("):
            return m.vocab_size, m.name
    return None


def vocab(args, get, tp: int, notes: list) -> int | None:
    """The padded vocabulary, or None when the script does not fix it."""
    v = get("vocab")
    if v is None:
        tok = args.tokenizer or ""
        if tok in FIXED_VOCAB:
            v = FIXED_VOCAB[tok]
            notes.append(f"vocabulary {v} of --tokenizer-type {tok}")
        elif tok in ASSUMED_VOCAB:
            v = ASSUMED_VOCAB[tok]
            notes.append(f"vocabulary {v} assumed for --tokenizer-type {tok} (the size of Llama 2's tokenizer.model; "
                         "the file the script passes decides: give --vocab-size or -m if it differs)")
        elif tok == "HuggingFaceTokenizer" and args.tokenizer_model and _catalog_vocab(args.tokenizer_model):
            v, name = _catalog_vocab(args.tokenizer_model)
            notes.append(f"vocabulary {v} of --tokenizer-model {args.tokenizer_model} (catalog {name})")
        else:
            return None
    div = get("vocab_divisible", VOCAB_DIVISIBLE_DEFAULT)
    multiple = div * tp
    padded = math.ceil(v / multiple) * multiple
    if padded != v:
        notes.append(f"vocabulary {v} padded to {padded}, a multiple of --make-vocab-size-divisible-by {div} "
                     f"x tp {tp} (Megatron-LM vocab_size_with_padding)")
    return padded


def missing_vocab_reason(args) -> str:
    tok = args.tokenizer
    if tok:
        return f"--vocab-size (the vocabulary of --tokenizer-type {tok} comes from its file)"
    return "--vocab-size"


def model(args, get, L: int | None, tp: int, name: str, notes: list):
    """ModelSpec of the flags, or None when one of layers, hidden, heads, vocab is missing.
    ``get(dest, default)`` reads an integer flag."""
    h, a = get("hidden"), get("heads")
    V = vocab(args, get, tp, notes) if None not in (L, h, a) else None
    if None in (L, h, a, V):
        return None
    ffn_default = (int(8 * h / 3) // 64) * 64 if args.swiglu else 4 * h  # A: ffn_hidden_size defaults
    ffn = get("ffn", ffn_default)
    experts = get("experts", 0, lo=0)
    mla = bool(args.mla)
    qwen2 = bool(args.qkv_bias) and args.swiglu and not mla  # biases on q, k, v only (Qwen2)
    # experts are the MLP's kind: gated only with --swiglu (TransformerConfig.gated_linear_unit)
    cfg = {"model_type": "deepseek_v3" if mla else "mixtral" if experts and args.swiglu else "qwen2" if qwen2 else
           "llama" if args.swiglu else "gpt",
           "hidden_size": h, "num_hidden_layers": L, "num_attention_heads": a, "intermediate_size": ffn,
           "vocab_size": V, "num_key_value_heads": get("groups", a) if args.gqa and not mla else a,
           "tie_word_embeddings": not args.untie, "attention_bias": qwen2 or not args.swiglu, "max_position_embeddings": get("positions", 0, lo=0) or 0}
    if get("kv_channels") is not None:
        cfg["head_dim"] = get("kv_channels")
    if experts:
        pattern = moe_pattern(args.moe_freq or "1", L)
        cfg |= {"num_experts": experts, "num_experts_per_tok": get("topk", 2),
                "moe_intermediate_size": get("moe_ffn", ffn),
                "shared_expert_intermediate_size": get("shared_ffn", 0, lo=0)
                or (ffn if getattr(args, "ds_residual", False) else 0),  # Megatron-DeepSpeed --mlp-type residual
                "mlp_only_layers": [i for i, x in enumerate(pattern) if not x]}
    if mla:
        d = {k: get(k, MLA_DEFAULTS[k], lo=0) for k in MLA_DEFAULTS}
        cfg |= {"q_lora_rank": d["q_lora"], "kv_lora_rank": d["kv_lora"], "qk_nope_head_dim": d["qk_head"],
                "qk_rope_head_dim": d["qk_pos"], "v_head_dim": d["v_head"]}
        cfg.setdefault("head_dim", d["qk_head"] + d["qk_pos"])
    cfg["num_nextn_predict_layers"] = get("mtp_layers", 0, lo=0)
    spec = model_from_config(cfg, name, f"Megatron-LM flags in {name}")
    if args.qk_norm and not mla:
        spec = dataclasses.replace(spec, qk_norm=True)
    return spec
