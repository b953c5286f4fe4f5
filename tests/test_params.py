"""Parameter counts: ndplan's symbolic totals against independent counts.

* tests/data/hf_param_counts.yaml: exact counts produced by Hugging Face transformers
  itself (AutoModelForCausalLM.from_config on the meta device, sum of p.numel() over
  parameters, tied weights once, buffers excluded; see the file header).
* Four counts from issue #2 / the HF model cards, written literally below.
* An HF-style model directory (config.json) must load and count like the catalog entry.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import ndplan
from ndplan.formulas.params import params_total
from ndplan.symbols import model_symbols

DATA = Path(__file__).parent / "data" / "hf_param_counts.yaml"
HF_COUNTS: dict[str, int] = {name: int(row["params"])
                             for name, row in yaml.safe_load(DATA.read_text())["counts"].items()}


def _count(spec) -> int:
    n = params_total(spec, model_symbols(spec))
    assert n.is_Integer, f"params_total of {spec.name} is not an integer: {n}"
    return int(n)


def test_reference_file_is_not_empty():
    assert len(HF_COUNTS) >= 20


def test_every_catalog_model_has_a_reference_count():
    """A catalog model without an independent count would escape this test file."""
    missing = sorted(set(m.name for m in ndplan.list_models()) - set(HF_COUNTS))
    assert not missing, f"catalog models without an HF count in {DATA.name}: {missing}"


@pytest.mark.parametrize("name", sorted(HF_COUNTS))
def test_params_total_matches_transformers(name):
    spec = ndplan.load_model(name)
    assert _count(spec) == HF_COUNTS[name]


# source: issue #2 / HF model cards
ISSUE_COUNTS = [
    ("llama3-70b", 70_553_706_496, "issue #2 / HF model cards"),
    ("llama3-8b", 8_030_261_248, "issue #2 / HF model cards"),
    ("mixtral-8x7b", 46_702_792_704, "issue #2 / HF model cards"),
    # DeepSeek-V3 main model, without the MTP module
    ("deepseek-v3", 671_026_404_352, "issue #2 / HF model cards"),
]


@pytest.mark.parametrize("name,expected,source", ISSUE_COUNTS, ids=[r[0] for r in ISSUE_COUNTS])
def test_params_total_matches_issue(name, expected, source):
    spec = ndplan.load_model(name)
    assert _count(spec) == expected, source


def test_deepseek_v3_mtp_is_excluded_by_default():
    spec = ndplan.load_model("deepseek-v3")
    assert spec.mtp_layers >= 1
    main = int(params_total(spec, model_symbols(spec)))
    with_mtp = int(params_total(spec, model_symbols(spec), mtp=True))
    assert main == 671_026_404_352
    assert with_mtp > main


# llama3-8b as its HF config.json spells it (meta-llama/Meta-Llama-3-8B)
LLAMA3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}


def test_hf_config_dir_loads_and_counts_like_catalog(tmp_path):
    d = tmp_path / "Meta-Llama-3-8B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA3_8B_CONFIG, indent=2))
    from_dir = ndplan.load_model(str(d))
    catalog = ndplan.load_model("llama3-8b")
    assert from_dir.name == "Meta-Llama-3-8B"
    assert _count(from_dir) == _count(catalog) == 8_030_261_248 == HF_COUNTS["llama3-8b"]
    for f in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings", "gated_mlp",
              "layer_kinds"):
        assert getattr(from_dir, f) == getattr(catalog, f), f


def test_hf_config_json_path_loads(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(LLAMA3_8B_CONFIG))
    assert _count(ndplan.load_model(str(p))) == 8_030_261_248


def test_hf_config_dir_works_through_estimate(tmp_path):
    d = tmp_path / "llama3-8b-hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA3_8B_CONFIG))
    est = ndplan.estimate(ndplan.load_model(str(d)), ndplan.load_hardware("h100-sxm"),
                          ndplan.Strategy(dp=8, gbs=8, seq=4096))
    assert est.params_total == 8_030_261_248


def test_float8_linear_weights_are_the_hand_count():
    """The decoder-layer weights torchtitan's float8 converter swaps for Float8Linear, from the
    configs' widths: Llama-3-8B q 4096x4096, k and v 4096x1024, o 4096x4096, gate/up/down 3x4096x14336
    (the norms stay); Mixtral-8x7B only attention (experts are not nn.Linear, the router is filtered)."""
    from ndplan.formulas.params import float8_linear_pieces
    llama, mixtral = ndplan.load_model("llama3-8b"), ndplan.load_model("mixtral-8x7b")
    n = sum(int(p.count) for p in float8_linear_pieces(llama, model_symbols(llama), "dense"))
    assert n == 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    n = sum(int(p.count) for p in float8_linear_pieces(mixtral, model_symbols(mixtral), "moe"))
    assert n == 2 * 4096 * 4096 + 2 * 4096 * 1024


@pytest.mark.parametrize("pp, layers_gathered", [(1, 2), (2, 16)])
def test_float8_all_gather_holds_a_byte_per_swapped_weight(pp, layers_gathered):
    """FSDP float8 all-gather (engine setting float8_all_gather) shrinks the gather Term by one byte per
    Float8Linear weight element of each gathered layer: the current and the prefetched one without
    pipelining, every layer of the stage (16 of 32) under pipelining (reshard_after_forward=False)."""
    spec, hw = ndplan.load_model("llama3-8b"), ndplan.load_hardware("h100-sxm")
    swapped = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    kw = dict(dp=8 // pp, pp=pp, mbs=1, gbs=8 * (8 // pp), seq=4096, zero=3, recompute="selective")
    terms = [ndplan.estimate(spec, hw, ndplan.Strategy(engine=e, **kw)).per_stage[0]["terms"]
             for e in ("fsdp", ndplan.engines.derive("fsdp", {"float8_all_gather": 1}))]
    assert terms[0]["mem.zero3_gather"] - terms[1]["mem.zero3_gather"] == layers_gathered * swapped
    assert terms[0]["mem.activations"] == terms[1]["mem.activations"]  # Float8Linear saves bf16 inputs
