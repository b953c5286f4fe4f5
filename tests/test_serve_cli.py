"""``ndplan serve``: the JSON fields issue 17 names, one-line errors with exit 2, a fixed layout."""

import json

import pytest
from click.testing import CliRunner

from ndplan.cli import main

FIELDS = {"tp", "pp", "ep", "dp_attention", "replicas", "weights_bytes", "kv_bytes_per_token", "kv_cache_tokens",
          "max_concurrency", "ttft_s", "tpot_s", "output_tokens_per_s_per_gpu", "fits"}


def _run(*args):
    return CliRunner().invoke(main, ["serve", *args])


def test_json_has_every_field_and_a_fixed_layout_is_kept():
    r = _run("-m", "llama3.1-70b", "--gpus", "8", "--tp", "4", "--isl", "2000", "--osl", "500", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert all(FIELDS <= set(c) for c in doc["candidates"])
    assert {c["tp"] for c in doc["candidates"]} == {4}
    assert all(c["replicas"] * c["devices"] <= 8 for c in doc["candidates"])


@pytest.mark.parametrize("args,field", [
    (("--isl", "130000", "--osl", "2000"), "--isl"),          # above llama3.1-8b's 131,072 context
    (("--isl", "100", "--osl", "10", "--tp", "3"), "--tp"),     # does not divide the heads
    (("--isl", "100", "--osl", "10", "--concurrency", "0"), "--concurrency"),
    (("--isl", "100", "--osl", "10", "--rate", "-1"), "--rate"),
    (("--isl", "100", "--osl", "10", "--tpot-ms", "0.01"), "--tpot-ms"),  # no layout is that fast
    (("--isl", "100", "--osl", "10", "--rate", "1", "--concurrency", "4"), "--rate"),
    (("--isl", "100", "--osl", "10", "--find-min-gpus"), "--find-min-gpus"),
    (("--isl", "100", "--osl", "10", "--max-model-len", "1000000"), "--max-model-len"),
    (("--isl", "nan", "--osl", "10"), "--isl"),
])
def test_bad_input_is_one_line(args, field):
    r = _run("-m", "llama3.1-8b", "--gpus", "1", *args)
    assert r.exit_code == 2 and r.output.count("\n") == 1 and field in r.output, r.output


def test_an_unattainable_limit_names_the_best_achievable():
    r = _run("-m", "llama3.1-8b", "--gpus", "1", "--isl", "1000", "--osl", "100", "--tpot-ms", "1")
    assert r.exit_code == 2 and "the best is TPOT" in r.output


@pytest.mark.parametrize("engine,flags", [
    ("vllm", ["vllm serve qwen3-30b-a3b", "--tensor-parallel-size 1", "--data-parallel-size 4",
              "--enable-expert-parallel", "--kv-cache-dtype fp8", "--quantization fp8", "--max-model-len 2000"]),
    ("sglang", ["--model-path qwen3-30b-a3b", "--tp-size 4", "--dp-size 4", "--enable-dp-attention", "--ep-size 4",
                "--mem-fraction-static 0.88", "--kv-cache-dtype fp8_e4m3"]),
    ("trtllm", ["trtllm-serve qwen3-30b-a3b", "--tp_size 4", "--ep_size 4", "enable_attention_dp: true",
                "dtype: fp8", "--config config.yml"]),
])
def test_emit_writes_the_layout_in_each_engines_flags(engine, flags):
    """A DP-attention, expert-parallel layout (tp 4 = dp 4 x attention tp 1, ep 4) in each engine's terms."""
    r = _run("-m", "qwen3-30b-a3b", "--gpus", "4", "--tp", "4", "--dp-attention", "4", "--ep", "4", "--isl", "1000",
             "--osl", "1000", "--weight-dtype", "fp8", "--kv-dtype", "fp8", "--emit", engine, "--json")
    assert r.exit_code == 0, r.output
    launch = json.loads(r.output)["launch"]
    assert all(f in launch for f in flags), launch


def test_emit_and_engine_must_agree():
    r = _run("-m", "llama3.1-8b", "--gpus", "1", "--isl", "10", "--osl", "10", "--engine", "vllm", "--emit", "sglang")
    assert r.exit_code == 2 and "--emit" in r.output


def test_explain_prints_every_term_with_its_formula():
    r = _run("-m", "llama3.1-8b", "--gpus", "1", "--isl", "1000", "--osl", "200", "--explain", "--json")
    terms = {t["key"]: t for t in json.loads(r.output)["terms"]}
    assert {"serve.weights", "serve.kv_per_token", "serve.step.gemm", "serve.step.attention"} <= set(terms)
    assert "Max" in terms["serve.kv_per_token"]["formula"] and terms["serve.kv_per_token"]["value"] == 131072


def test_report_tables_match_the_json_and_carry_the_terms(tmp_path):
    args = ("-m", "llama3.1-70b", "--gpus", "8", "--isl", "2000", "--osl", "500", "--tpot-ms", "50")
    doc = json.loads(_run(*args, "--json").output)
    r = _run(*args, "--report", str(tmp_path / "s.md"))
    assert r.exit_code == 0, r.output
    layouts = json.loads((tmp_path / "s_layouts.json").read_text())
    assert [(x["tp"], x["pp"], x["tpot_s"]) for x in layouts] == [(c["tp"], c["pp"], c["tpot_s"])
                                                                   for c in doc["candidates"]]
    pareto = json.loads((tmp_path / "s_pareto.json").read_text())
    assert [(x["tp"], x["pp"]) for x in pareto] == [(c["tp"], c["pp"]) for c in doc["pareto"]]
    text = (tmp_path / "s.md").read_text()
    for key in ("serve.weights", "serve.kv_pool", "serve.max_concurrency", "serve.step.gemm", "serve.ttft",
                "serve.output_tokens_per_s_per_gpu"):
        assert f"`{key}`" in text


@pytest.mark.parametrize("extra", [("--disaggregate", "--rate", "5"), ("--find-min-gpus", "--rate", "5")])
def test_report_refused_where_there_is_no_search(tmp_path, extra):
    r = _run("-m", "llama3.1-8b", "--isl", "100", "--osl", "10", *extra, "--report", str(tmp_path / "x.md"))
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "--report" in r.output, r.output


def test_deepep_backend_reaches_the_launch_flags_and_is_refused_where_unused():
    r = _run("-m", "qwen3-30b-a3b", "--gpus", "8", "--tp", "8", "--ep", "8", "--dp-attention", "8", "--isl", "1000",
             "--osl", "200", "--weight-dtype", "fp8", "--ep-a2a", "deepep", "--emit", "sglang")
    assert r.exit_code == 0 and "--moe-a2a-backend deepep" in r.output, r.output
    r = _run("-m", "qwen3-30b-a3b", "--isl", "100", "--osl", "10", "--rate", "5", "--disaggregate", "--ep-a2a", "deepep")
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "--ep-a2a" in r.output, r.output


@pytest.mark.parametrize("args", [("-m", "llama3.1-8b", "--ep-a2a", "deepep"),
                                  ("-m", "qwen3-30b-a3b", "--ep", "1", "--ep-a2a", "deepep"),
                                  ("-m", "qwen3-30b-a3b", "--engine", "trtllm", "--ep-a2a", "deepep")])
def test_deepep_where_it_does_nothing_is_one_line(args):
    r = _run(*args, "--gpus", "8", "--isl", "100", "--osl", "10")
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "--ep-a2a" in r.output, r.output


def test_trtllm_admits_a_batch_per_pipeline_stage():
    """TensorRT-LLM's executor admits pp_size x max_batch_size requests (get_max_num_sequences)."""
    import ndplan
    from ndplan.serve.estimate import serve_estimate
    from ndplan.serve.layout import ServeLayout, WeightRecipe
    spec, hw = ndplan.load_model("llama3.1-70b"), ndplan.load_hardware("h200")
    est = serve_estimate(spec, hw, ServeLayout(pp=4), isl=1000, osl=1000, recipe=WeightRecipe("fp8"),
                         engine_name="trtllm", max_seqs=100)
    assert est.running == 400
