"""Serving memory (ndplan.serve) against hand derivations and the engines' own logs.

* KV bytes per token by hand for one MHA (Llama-2-7B), one GQA (Llama-3-8B, also with more
  attention-TP ranks than KV heads) and one MLA model (DeepSeek-V3).
* Weights per device against vLLM's "model weights take" / "Loading model weights took" lines:
  Llama-3-8B at tp 1 and 2 (vllm-project/vllm#10511: 14.96 and 7.48 GiB), Llama-3.1-8B
  (#10517: 14.9888 GiB, its 131,072-position RoPE table included) and Llama-3.1-405B-FP8 at
  tp 8 (#6746: 57.752 GB, printed from GiB), whose July-2024 checkpoint carried 16 KV heads and
  Meta's recipe (row-wise fp8 linears, attention and the first and last layers in bf16).
* vLLM's KV-pool rule with the components its log prints, and the pages it makes of it.
"""

import dataclasses

import pytest

import ndplan
from ndplan.serve import ENGINES, ServeLayout, WeightRecipe
from ndplan.serve import memory as SM
from ndplan.serve.engines import kv_capacity, kv_pool_bytes

GIB = 2 ** 30


def _kv(name, kv_dtype="bf16", **layout):
    spec = ndplan.load_model(name)
    lay = ServeLayout(**layout).check(spec)
    return float(SM.kv_bytes_per_token(spec, lay, kv_dtype, 0).subs(SM.values(lay)))


def _weights(spec, recipe=WeightRecipe(), **layout):
    lay = ServeLayout(**layout).check(spec)
    return float(SM.weight_bytes(spec, lay, recipe, 0).subs(SM.values(lay)))


def test_kv_per_token_mha():
    # Llama-2-7B: 32 layers x (K, V) x 32 heads x 128 x 2 B
    assert _kv("llama2-7b") == 32 * 2 * 32 * 128 * 2 == 512 * 1024
    assert _kv("llama2-7b", tp=4) == 32 * 2 * 8 * 128 * 2


def test_kv_per_token_gqa_replicates_heads_beyond_the_kv_count():
    # Llama-3-8B: 8 KV heads; at attention tp 16 each device keeps one whole head (vLLM max(1, kv // tp))
    assert _kv("llama3-8b") == 32 * 2 * 8 * 128 * 2 == 128 * 1024
    assert _kv("llama3-8b", tp=2) == 64 * 1024
    assert _kv("llama3-8b", tp=16) == 32 * 2 * 1 * 128 * 2
    assert _kv("llama3-8b", tp=8, dp_attention=2) == _kv("llama3-8b", tp=4)
    assert _kv("llama3-8b", "fp8") == 64 * 1024


def test_kv_per_token_mla_is_the_latent_on_every_rank():
    # DeepSeek-V3: (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers, not split by tp
    assert _kv("deepseek-v3") == (512 + 64) * 61 * 2 == 70_272
    assert _kv("deepseek-v3", tp=8) == _kv("deepseek-v3", tp=8, dp_attention=8) == 70_272
    assert _kv("deepseek-v3", "fp8", tp=8) == 35_136
    assert _kv("deepseek-v3", pp=2) == (512 + 64) * 31 * 2  # stage 0 takes the remainder: 31 + 30 layers


def test_stage_split_puts_the_remainder_before_the_last_stage():
    """vLLM get_pp_indices: floor(L / pp) each, one more on each of the L mod pp stages counting back
    from the second-to-last: 80 layers on 3 stages are 27, 27, 26; 61 on 2 are 31, 30."""
    assert [len(s) for s in SM.stage_layers(ndplan.load_model("llama3.1-70b"), 3)] == [27, 27, 26]
    assert [len(s) for s in SM.stage_layers(ndplan.load_model("deepseek-v3"), 2)] == [31, 30]
    assert [len(s) for s in SM.stage_layers(ndplan.load_model("deepseek-v3"), 4)] == [15, 15, 16, 15]


def test_kv_projections_are_replicated_past_the_kv_heads():
    """Llama-3-8B at tp 16: 8 KV heads over 16 ranks, each keeps one whole head of k and v (vLLM
    QKVParallelLinear num_kv_head_replicas): 32 layers x 2 x 4096 x 128 x 2 B x (16 - 8) / 16 more."""
    spec = ndplan.load_model("llama3-8b")
    at16 = _weights(spec, tp=16)
    spec_kv16 = dataclasses.replace(spec, num_key_value_heads=16)
    assert at16 == _weights(spec_kv16, tp=16)


@pytest.mark.parametrize("name,tp,logged_gib", [
    ("llama3-8b", 1, 14.96), ("llama3-8b", 2, 7.48), ("llama3.1-8b", 1, 14.9888)])
def test_weights_match_vllm_logs(name, tp, logged_gib):
    got = _weights(ndplan.load_model(name), tp=tp) / GIB
    assert got == pytest.approx(logged_gib, abs=0.5 * 10 ** -(len(str(logged_gib).split(".")[1])))


def test_llama_405b_fp8_weights_match_the_logged_tp8_rank():
    spec = dataclasses.replace(ndplan.load_model("llama3.1-405b"), num_key_value_heads=16)
    recipe = WeightRecipe("fp8", keep_pieces=("attn",), keep_layers=(0, spec.num_hidden_layers - 1),
                          channel_scales=True)
    assert _weights(spec, recipe, tp=8) / GIB == pytest.approx(57.752, abs=0.01)  # vLLM prints GiB as "GB"
    # without the row scales the figure is 14 MiB lower, with 8 KV heads about 1 GiB lower
    no_scales = _weights(spec, dataclasses.replace(recipe, channel_scales=False), tp=8) / GIB
    assert 57.752 - no_scales == pytest.approx(14 / 1024, abs=0.003)
    kv8 = _weights(ndplan.load_model("llama3.1-405b"), recipe, tp=8)
    # 8 more KV heads: 126 layers x (k, v) x 16384 x 8 x 128 / tp 8, bf16 (attention kept 16-bit)
    assert _weights(spec, recipe, tp=8) - kv8 == 126 * 2 * 16384 * 8 * 128 // 8 * 2


def test_int4_bytes_per_element():
    spec = ndplan.load_model("llama3-8b")
    bf16, int4 = _weights(spec), _weights(spec, WeightRecipe("int4", group=128))
    linear = 32 * (4096 * (32 + 16) * 128 + 32 * 128 * 4096 + 3 * 4096 * 14336)
    assert bf16 - int4 == pytest.approx(linear * (2 - (0.5 + 2.5 / 128)), rel=1e-12)


@pytest.mark.parametrize("case", [
    # vllm-project/vllm#10517, Llama-3.1-8B on an RTX 3090: total 23.58 GiB x 0.9, peak torch memory
    # (weights + activation) 17.06 / 17.98 GiB, non-torch 0.35 GiB -> KV 3.81 / 2.89 GiB, 1952 / 1478 pages
    (23.58, 17.06, 0.35, 3.81, 1952), (23.58, 17.98, 0.35, 2.89, 1478)])
def test_vllm_pool_rule_with_the_logged_components(case):
    total, peak, non_torch, kv_gib, pages = case
    pool = kv_pool_bytes(ENGINES["vllm"], total * GIB, peak * GIB, 0, 0.9, non_torch * GIB)
    assert pool / GIB == pytest.approx(kv_gib, abs=0.006)
    tokens = kv_capacity(pool, _kv("llama3.1-8b"), ENGINES["vllm"].block_tokens)
    assert tokens / 16 == pytest.approx(pages, rel=0.002)  # the log's figures are rounded to 0.01 GiB


def test_bad_layouts_are_one_line():
    spec = ndplan.load_model("llama3-8b")
    for layout, field in ((dict(tp=3), "--tp"), (dict(tp=4, dp_attention=3), "--dp-attention"),
                          (dict(ep=2, tp=2), "--ep"), (dict(pp=64), "--pp"), (dict(tp=0), "--tp")):
        with pytest.raises(ndplan.NdplanError, match=field):
            ServeLayout(**layout).check(spec)
    with pytest.raises(ndplan.NdplanError, match="--weight-dtype"):
        WeightRecipe("int3").check()


def test_dense_mlps_go_with_the_attention_where_the_engine_does():
    """DeepSeek-V3 at tp 8 with attention DP 8: TensorRT-LLM (overridden_tp_size=1 under attention DP) keeps
    the 3 dense MLPs and the 58 shared experts whole on every device, SGLang splits them over the 8; the
    difference is 7/8 of their bf16 bytes."""
    from ndplan.serve.estimate import serve_estimate
    spec, hw = ndplan.load_model("deepseek-v3"), ndplan.load_hardware("h200")
    lay = ServeLayout(tp=8, ep=8, dp_attention=8)
    w = {e: serve_estimate(spec, hw, lay, isl=10, osl=10, engine_name=e).weights_bytes for e in ("trtllm", "sglang")}
    dense = 3 * 3 * 7168 * 18432 + 58 * 3 * 7168 * 2048
    assert w["trtllm"] - w["sglang"] == pytest.approx(dense * 7 / 8 * 2, abs=2)
