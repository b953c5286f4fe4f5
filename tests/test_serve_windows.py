"""Sliding-window and hybrid attention in serving, against hand derivations.

* Hugging Face's per-layer rules (transformers' model code): Mistral every layer, Gemma 2 the even
  layers, Qwen2 only under use_sliding_window and from max_window_layers on, ``layer_types`` lists
  (gpt-oss, Gemma 3) as written.
* vLLM's sliding-window page rule (``SlidingWindowSpec.max_memory_usage_bytes``): a sliding layer
  holds cdiv(min(window - 1 + max_num_batched_tokens, tokens), block) + 1 pages, never more than a
  full layer's cdiv(tokens, block).
* A sliding layer's decode step reads at most its window of keys.
"""

import pytest

import ndplan
from ndplan.catalog.model import model_from_config
from ndplan.errors import NdplanError
from ndplan.serve import ServeLayout
from ndplan.serve import memory as SM
from ndplan.serve import time as ST
from ndplan.serve.estimate import StepKernel, serve_estimate

BASE = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 2, "intermediate_size": 1024, "vocab_size": 1000}


def _spec(**extra):
    return model_from_config({**BASE, **extra}, "toy", "test")


def test_hf_window_rules():
    assert ndplan.load_model("mistral-7b").attention_windows == (4096,) * 32
    assert _spec(model_type="mistral", sliding_window=4096).attention_windows == (4096,) * 4
    assert _spec(model_type="gemma2", sliding_window=4096).attention_windows == (4096, 0, 4096, 0)
    assert _spec(model_type="qwen2", sliding_window=131072, use_sliding_window=False).attention_windows == ()
    assert _spec(model_type="qwen2", sliding_window=64, use_sliding_window=True,
                 max_window_layers=2).attention_windows == (0, 0, 64, 64)
    hybrid = _spec(sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 2)
    assert hybrid.attention_windows == (128, 0, 128, 0) and hybrid.sliding_layers == 2
    assert ndplan.load_model("llama3-8b").attention_windows == ()  # no sliding_window field


@pytest.mark.parametrize("bad", [{"layer_types": ["linear_attention"] * 4, "sliding_window": 8},
                                 {"layer_types": ["sliding_attention"] * 3, "sliding_window": 8},
                                 {"layer_types": ["sliding_attention"] * 4},
                                 {"model_type": "mistral", "sliding_window": -1}])
def test_bad_window_fields_name_the_field(bad):
    with pytest.raises(NdplanError) as e:
        _spec(**bad)
    assert any(f in str(e.value) for f in ("layer_types", "sliding_window"))


def test_held_tokens_follow_vllm_sliding_window_pages():
    # window 4096, chunk 8192, pages of 16: cdiv(min(4095 + 8192, T), 16) + 1 pages
    assert SM.held_tokens(4096, 32768, 8192, 16) == (12287 // 16 + 1 + 1) * 16 == 12304
    assert SM.held_tokens(4096, 1000, 8192, 16) == 1008  # a short request: its own pages (cdiv(1000, 16) x 16)
    assert SM.held_tokens(0, 32768, 8192, 16) == 32768  # full attention
    assert SM.held_tokens(128, 5000, 2048, 16) == (2175 // 16 + 1 + 1) * 16 == 2192  # gpt-oss's 128-token window


def test_mistral_request_bytes_and_concurrency():
    """Mistral-7B at 32,768 tokens: every layer holds 12,304 tokens of 2 x 8 x 128 x 2 B, not 32,768."""
    spec = ndplan.load_model("mistral-7b")
    lay = ServeLayout()
    per_layer_token = 2 * 8 * 128 * 2
    got = float(SM.kv_request_bytes(spec, lay, "bf16", 0, 32768, 8192, 16).subs(SM.values(lay)))
    assert got == 32 * 12304 * per_layer_token
    hw = ndplan.load_hardware("h100-sxm")
    windowed = serve_estimate(spec, hw, lay, isl=30000, osl=2768)
    full = serve_estimate(spec.__class__(**{**spec.__dict__, "attention_windows": ()}), hw, lay, isl=30000, osl=2768)
    assert windowed.kv_cache_tokens == full.kv_cache_tokens  # the pool in tokens is the same pages
    assert windowed.max_concurrency == windowed.kv_cache_tokens // 12304
    assert full.max_concurrency == full.kv_cache_tokens // 32768


def test_hybrid_request_bytes_count_each_layer_kind():
    spec = _spec(sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 2)
    lay = ServeLayout()
    per_layer_token = 2 * 2 * 64 * 2  # K and V, 2 KV heads of 512 / 8 = 64
    got = float(SM.kv_request_bytes(spec, lay, "bf16", 0, 5000, 2048, 16).subs(SM.values(lay)))
    assert got == (2 * 2192 + 2 * 5008) * per_layer_token


def test_sliding_decode_reads_stop_at_the_window():
    spec = ndplan.load_model("mistral-7b")
    hw = ndplan.load_hardware("h100-sxm")
    k = StepKernel(spec, ServeLayout(), ndplan.serve.WeightRecipe(), "bf16", hw.kernel_values())
    at_window, beyond, inside = (k(64, c, 0, 0)["serve.step.attention"] for c in (4096, 20000, 2048))
    assert at_window == beyond
    assert inside < at_window
    assert ST.CTX not in ST.step_terms(spec, ServeLayout(), ndplan.serve.WeightRecipe(), "bf16")[
        "serve.step.attention"].expr.subs(ST.CTX, 5000).free_symbols


def test_decoding_requests_hold_the_window_only():
    """While decoding a sliding layer holds its window in whole pages and one more (vLLM's
    SlidingWindowManager frees the pages behind it): 4096 + 16 at 32k tokens, not 12,304."""
    assert SM.held_tokens(4096, 32768, 8192, 16, steady=True) == 4096 + 16
    assert SM.held_tokens(4096, 1000, 8192, 16, steady=True) == 1008
    spec = ndplan.load_model("mistral-7b")
    est = serve_estimate(spec, ndplan.load_hardware("h100-sxm"), ServeLayout(), isl=30000, osl=2768,
                         max_seqs=10 ** 5)
    assert est.running == est.kv_cache_tokens // (4096 + 16)


def test_window_rules_match_transformers_layer_types():
    """transformers' own configs derive ``layer_types`` (5.x). Read with them, and without them by
    ndplan's model_type rules (Qwen2 under use_sliding_window with its default max_window_layers 28,
    Gemma 2's even layers), the windows are transformers'; Cohere2 (pattern of 4) through layer_types."""
    transformers = pytest.importorskip("transformers")
    cases = ((transformers.Qwen2Config(num_hidden_layers=32, use_sliding_window=True, sliding_window=4096), True),
             (transformers.Gemma2Config(num_hidden_layers=6, sliding_window=4096), True),
             (transformers.Cohere2Config(num_hidden_layers=8, sliding_window=4096), False))
    for cfg, by_rule in cases:
        want = tuple(cfg.sliding_window if t == "sliding_attention" else 0 for t in cfg.layer_types)
        d = cfg.to_dict()
        d.setdefault("vocab_size", 1000)
        assert model_from_config(d, cfg.model_type, "transformers").attention_windows == want, cfg.model_type
        if by_rule:
            d.pop("layer_types")
            assert model_from_config(d, cfg.model_type, "transformers").attention_windows == want, cfg.model_type
