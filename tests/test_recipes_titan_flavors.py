"""torchtitan 0.2.x flavors (the TOML job config's versions, v0.2.0 .. v0.2.2) of the catalog's
families, each mapped to its catalog model (issue #14).

The flavor tables and model arguments below are transcribed from pytorch/torchtitan at the tags
v0.2.0 (29624e37fa6dd319fd671b009338651b5c665da2), v0.2.1 (81af8833ddeff9b5f1874dc7e20594aa17da6b86)
and v0.2.2 (73a0e6979dd10b6b1904098eb3c8f62c18ab87ce); the catalog sizes are derived from them with
torchtitan's own formulas (cited), not read from ndplan.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import ndplan
from ndplan.cli import main
from ndplan.errors import NdplanError
from ndplan.export import torchtitan as X
from ndplan.interop import read_config

SUPPORTED = {"v0.2.0": {"deepseek_v3", "llama3", "llama3_ft", "llama4", "qwen3"},
             "v0.2.1": {"deepseek_v3", "flux", "llama3", "llama3_ft", "llama4", "qwen3"},
             "v0.2.2": {"deepseek_v3", "flux", "gpt_oss", "llama3", "llama3_ft", "llama4", "qwen3"}}
"""torchtitan/models/__init__.py:7-9 ``_supported_models`` at each tag; flux (image) and gpt_oss are
not families of the catalog. llama3_ft reuses llama3's flavors (models/llama3_ft/__init__.py:17,
``from ..llama3 import llama3_args``)."""

FLAVOR_TABLES = {  # (tag, [model] name) -> the keys of models/<name>/__init__.py's *_args dict
    ("v0.2.0", "llama3"): ["debugmodel", "debugmodel_flex_attn", "8B", "70B", "405B"],  # :29-68
    ("v0.2.1", "llama3"): ["debugmodel", "debugmodel_flex_attn", "debugmodel_varlen_attn", "8B", "8B_flex",
                           "8B_varlen", "70B", "405B"],  # :29-99, the same at v0.2.2
    ("v0.2.0", "llama4"): ["debugmodel", "17bx16e", "17bx128e", "debugmodel_irope", "17bx16e_irope",
                           "17bx128e_irope"],  # :29-101, the same at v0.2.1 and v0.2.2
    ("v0.2.0", "qwen3"): ["debugmodel", "0.6B", "1.7B", "4B", "8B", "14B", "32B", "debugmodel_moe", "30B-A3B",
                          "235B-A22B"],  # :32-190, the same at v0.2.1 and v0.2.2
    ("v0.2.0", "deepseek_v3"): ["debugmodel", "debugmodel_flex_attn", "16B", "236B", "671B"],  # :29-155, all tags
}


def _flavors():
    out = set()
    for (tag, name), flavors in FLAVOR_TABLES.items():
        names = [name] + (["llama3_ft"] if name == "llama3" else [])
        out |= {(n, f) for n in names for f in flavors}
    return sorted(out)


@pytest.mark.parametrize("key", _flavors(), ids=lambda k: "/".join(k))
def test_every_0_2_flavor_is_mapped_or_is_a_test_model(key):
    """Every 0.2.x flavor of the catalog's families reads as a catalog model, except torchtitan's
    debug models (dim 256, 6 layers: models/<name>/__init__.py), which ask for -m."""
    assert key[0] in set.union(*SUPPORTED.values())
    if key[1].startswith("debugmodel"):
        assert key in X.DEBUG_FLAVORS
        return
    model = X.FLAVORS.get(key) or X.FLAVOR_VARIANTS.get(key, (None,))[0]
    assert model is not None, f"{key} not mapped"
    ndplan.load_model(model)


LLAMA3_ARGS = {  # v0.2.1 models/llama3/__init__.py:
    # (dim, n_layers, n_heads, n_kv_heads, ffn_dim_multiplier, multiple_of), attention keys
    "8B": ((4096, 32, 32, 8, 1.3, 1024), {}),  # :51-59
    "8B_flex": ((4096, 32, 32, 8, 1.3, 1024), {"attn_type": "flex", "attn_mask_type": "block_causal"}),  # :60-70
    "8B_varlen": ((4096, 32, 32, 8, 1.3, 1024), {"attn_type": "varlen", "attn_mask_type": "block_causal"}),  # :71-81
    "70B": ((8192, 80, 64, 8, 1.3, 4096), {}),  # :82-90
    "405B": ((16384, 126, 128, 8, 1.2, 4096), {}),  # :91-99
}
LLAMA3_VOCAB = 128256  # models/llama3/model/args.py:33 (v0.2.1) vocab_size default


def _llama3_ffn(dim: int, mult: float, multiple_of: int) -> int:
    """FeedForward.__init__ (v0.2.1 models/llama3/model/model.py:331-335) with hidden_dim = 4 * dim
    (:377): int(2h/3), times ffn_dim_multiplier, rounded up to multiple_of."""
    hidden = int(2 * 4 * dim / 3)
    hidden = int(mult * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@pytest.mark.parametrize("name", ["llama3", "llama3_ft"])
@pytest.mark.parametrize("flavor", sorted(LLAMA3_ARGS))
def test_llama3_flavors_are_the_catalog_architecture(name, flavor):
    """The flavor's model arguments give the mapped catalog model's sizes (8B: int(2*16384/3) = 10922,
    x 1.3 = 14198, up to a multiple of 1024: 14336)."""
    (dim, layers, heads, kv, mult, multiple_of), attn = LLAMA3_ARGS[flavor]
    model = X.FLAVORS.get((name, flavor)) or X.FLAVOR_VARIANTS[(name, flavor)][0]
    spec = ndplan.load_model(model)
    got = (spec.hidden_size, spec.num_hidden_layers, spec.num_attention_heads, spec.num_key_value_heads,
           spec.intermediate_size, spec.vocab_size)
    assert got == (dim, layers, heads, kv, _llama3_ffn(dim, mult, multiple_of), LLAMA3_VOCAB)
    # a variant differs from its base flavor in attention only, and says so
    base = flavor.split("_")[0]
    assert LLAMA3_ARGS[base][0] == LLAMA3_ARGS[flavor][0]
    if attn or name == "llama3_ft":
        note = X.FLAVOR_VARIANTS[(name, flavor)][1]
        assert "not modelled" in note
        assert all(v in note for v in attn.values())


LLAMA4_ARGS = {  # v0.2.0 models/llama4/__init__.py: (num_experts, interleave_moe_layer_step), extra keys
    "17bx16e": ((16, 1), {}),  # :38-50
    "17bx128e": ((128, 2), {}),  # :51-60 (interleave_moe_layer_step: the args.py:63 default, 2)
    "17bx16e_irope": ((16, 1), {"every_n_layers_nope": 4, "attn_mask_type": "block_causal"}),  # :73-88
    "17bx128e_irope": ((128, 2), {"every_n_layers_nope": 4, "attn_mask_type": "block_causal"}),  # :89-100
}
LLAMA4_COMMON = (5120, 48, 40, 8, 1.2, 2048)  # dim, n_layers, n_heads, n_kv_heads, ffn_dim_multiplier, multiple_of
LLAMA4_VOCAB = 202048  # models/llama4/model/args.py:35
MOE_TOP_K, MOE_SHARED = 1, 1  # models/moe/moe.py:20-30 MoEArgs defaults (top_k 1, num_shared_experts 1)


@pytest.mark.parametrize("flavor", sorted(LLAMA4_ARGS))
def test_llama4_flavors_are_the_catalog_architecture(flavor):
    """v0.2.0 models/llama4/model/model.py:356-380: MoE layers where (layer_id + 1) % step == 0, the
    experts' hidden dim int(2 * 4 * 5120 / 3) = 13653, x 1.2 = 16383, / (top_k + shared = 2) = 8191,
    rounded up to 2048: 8192; the dense layers' FeedForward (model.py:295-299): 16383 up to 2048: 16384."""
    (experts, step), extra = LLAMA4_ARGS[flavor]
    dim, layers, heads, kv, mult, multiple_of = LLAMA4_COMMON
    hidden = int(mult * int(2 * 4 * dim / 3))
    expert_hidden = int(hidden / (MOE_TOP_K + MOE_SHARED))
    expert_hidden += -expert_hidden % multiple_of
    dense_hidden = multiple_of * ((hidden + multiple_of - 1) // multiple_of)
    model = X.FLAVORS.get(("llama4", flavor)) or X.FLAVOR_VARIANTS[("llama4", flavor)][0]
    spec = ndplan.load_model(model)
    assert (spec.hidden_size, spec.num_hidden_layers, spec.num_attention_heads, spec.num_key_value_heads,
            spec.vocab_size) == (dim, layers, heads, kv, LLAMA4_VOCAB)
    assert (spec.num_experts, spec.experts_per_token, spec.moe_intermediate_size) == (experts, MOE_TOP_K, expert_hidden)
    assert spec.shared_intermediate_size == MOE_SHARED * expert_hidden
    assert list(spec.layer_kinds) == ["moe" if (i + 1) % step == 0 else "dense" for i in range(layers)]
    if step > 1:
        assert spec.intermediate_size == dense_hidden == 16384
    if extra:
        note = X.FLAVOR_VARIANTS[("llama4", flavor)][1]
        assert "every_n_layers_nope=4" in note and "block_causal" in note and "not modelled" in note


@pytest.mark.parametrize("key", sorted(X.FLAVOR_VARIANTS), ids=lambda k: "/".join(k))
def test_variant_flavor_reads_with_its_note(tmp_path, key):
    """check on a TOML naming the flavor: the catalog model without -m, and the one-line note."""
    name, flavor = key
    f = tmp_path / "job.toml"
    f.write_text(f'[model]\nname = "{name}"\nflavor = "{flavor}"\n[parallelism]\ndata_parallel_shard_degree = -1\n'
                 "[training]\nseq_len = 8192\nlocal_batch_size = 1\n")
    ci = read_config(f, gpus=64)
    assert ci.model.name == X.FLAVOR_VARIANTS[key][0]
    assert ci.model_origin == f"[model] name/flavor -> catalog {X.FLAVOR_VARIANTS[key][0]}"
    assert X.FLAVOR_VARIANTS[key][1] in ci.notes
    if key == ("llama3", "8B_flex"):  # the CLI prints it (one model: check's proposals are slow to build cold)
        r = CliRunner().invoke(main, ["check", str(f), "--gpus", "64"])
        assert "note: " + X.FLAVOR_VARIANTS[key][1] in r.output


def test_emit_writes_the_base_flavor():
    """A catalog model is emitted as its base flavor, never as an attention variant."""
    assert X.CATALOG_FLAVOR["llama3.1-8b"] == ("llama3", "8B")
    assert X.CATALOG_FLAVOR["llama4-scout"] == ("llama4", "17bx16e")
    assert X.CATALOG_FLAVOR["llama4-maverick"] == ("llama4", "17bx128e")


def test_debug_flavor_is_a_one_line_error(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text('[model]\nname = "llama4"\nflavor = "debugmodel_irope"\n'
                 '[parallelism]\ndata_parallel_shard_degree = -1\n')
    with pytest.raises(NdplanError) as e:
        read_config(f, gpus=8)
    assert e.value.field == "--model" and "torchtitan's test model" in str(e.value)
    r = CliRunner().invoke(main, ["check", str(f), "--gpus", "8"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
