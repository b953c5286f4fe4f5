#!/usr/bin/env python3
"""Exact parameter counts of the catalog models, from Hugging Face transformers.

An oracle independent of ndplan: it builds each models/*.yaml as a transformers
config, instantiates the causal-LM on the meta device (no memory, no weights) and
sums ``p.numel()`` over ``model.parameters()`` (parameters only, not buffers; tied
weights counted once).  ``gpt`` models (Megatron / GPT-3 style) are built as
GPT2Config(n_embd, n_layer, n_head, n_positions, vocab_size, n_inner), which has the
same tensors as Megatron GPT.  DeepSeek-V3 is counted without its MTP module, which
transformers does not build.

Needs torch and transformers, which are NOT ndplan dependencies; run it in a
throwaway environment, e.g.

    python3.11 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch transformers accelerate pyyaml
    /tmp/hfvenv/bin/python benchmarks/hf_param_counts.py --write

Not imported by the tests: they only read its output, tests/data/hf_param_counts.yaml.
Options: --write (write that file), --layers (print each model's per-layer tensors).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch
import transformers
import yaml
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "hf_param_counts.yaml"
META_KEYS = {"name", "source", "model_type"}


def build_config(spec: dict):
    fields = {k: v for k, v in spec.items() if k not in META_KEYS}
    if spec["model_type"] == "gpt":
        return GPT2Config(
            n_embd=fields["hidden_size"],
            n_layer=fields["num_hidden_layers"],
            n_head=fields["num_attention_heads"],
            n_positions=fields["max_position_embeddings"],
            vocab_size=fields["vocab_size"],
            n_inner=fields["intermediate_size"],
            activation_function="gelu",
            tie_word_embeddings=fields["tie_word_embeddings"],
        )
    if spec["model_type"] == "qwen2":
        fields.pop("attention_bias", None)  # not a Qwen2Config field: q/k/v biases are hard-wired
    if spec["model_type"] == "llama4_text":
        return _llama4_config(fields)
    return AutoConfig.for_model(spec["model_type"], **fields)


def _llama4_config(f: dict):
    """The catalog's names back to Llama4TextConfig's: HF intermediate_size is the expert
    width (the catalog's moe_intermediate_size), intermediate_size_mlp the dense one, and
    interleave_moe_layer_step the MoE layer step (the catalog's decoder_sparse_step)."""
    from transformers import Llama4TextConfig
    keep = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "vocab_size", "num_local_experts", "num_experts_per_tok", "max_position_embeddings", "rms_norm_eps",
            "rope_theta", "attention_bias", "hidden_act", "tie_word_embeddings")
    return Llama4TextConfig(**{k: f[k] for k in keep if k in f}, intermediate_size=f["moe_intermediate_size"],
                            intermediate_size_mlp=f["intermediate_size"],
                            interleave_moe_layer_step=f.get("decoder_sparse_step", 1))


def count(spec: dict):
    cfg = build_config(spec)
    with torch.device("meta"):
        if spec["model_type"] == "llama4_text":
            from transformers import Llama4ForCausalLM
            model = Llama4ForCausalLM(cfg)
        else:
            model = AutoModelForCausalLM.from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    return n, type(model).__name__, model


def layer_tensors(model) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """Parameter and buffer shapes of the first layer of each distinct layer kind."""
    out: dict[str, list] = {}
    layers = None
    for name, mod in model.named_modules():
        if name.endswith(".layers") or name.endswith(".h"):
            layers = mod
            break
    seen = set()
    for i, layer in enumerate(layers or []):
        kind = type(getattr(layer, "mlp", None)).__name__
        if kind in seen:
            continue
        seen.add(kind)
        rows = [(f"param {n}", tuple(p.shape)) for n, p in layer.named_parameters()]
        rows += [(f"buffer {n}", tuple(b.shape)) for n, b in layer.named_buffers()]
        out[f"layer {i} ({kind})"] = rows
    top = [(f"param {n}", tuple(p.shape)) for n, p in model.named_parameters() if ".layers." not in n and ".h." not in n]
    out["outside layers"] = top
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    ap.add_argument("--layers", action="store_true", help="print per-layer tensors")
    args = ap.parse_args()

    counts = {}
    for path in sorted((ROOT / "models").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        n, cls, model = count(spec)
        counts[spec["name"]] = {"params": n, "class": cls}
        print(f"{spec['name']:20s} {cls:24s} {n:>18,d}")
        if args.layers:
            for k, rows in layer_tensors(model).items():
                print(f"    {k}:")
                for r, shp in rows:
                    print(f"        {r} {list(shp)}")
        del model

    if args.write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        head = (
            "# Exact parameter counts from Hugging Face transformers, independent of ndplan.\n"
            f"# Method: benchmarks/hf_param_counts.py -- each models/<name>.yaml built with\n"
            "#   AutoConfig.for_model(model_type, **fields) (gpt: GPT2Config with n_embd/n_layer/n_head/\n"
            "#   n_positions/vocab_size/n_inner, tied embeddings), AutoModelForCausalLM.from_config under\n"
            "#   torch.device('meta'), params = sum(p.numel() for p in model.parameters()) (parameters only,\n"
            "#   no buffers, tied weights once). DeepSeek-V3: main model only, MTP module not built by\n"
            "#   transformers; e_score_correction_bias is a registered buffer there, so it is NOT counted.\n"
            f"# transformers {transformers.__version__}, torch {torch.__version__}, "
            f"date {datetime.date.today().isoformat()}.\n"
        )
        body = yaml.safe_dump({"counts": counts}, sort_keys=False, default_flow_style=None, width=120)
        OUT.write_text(head + body)
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
