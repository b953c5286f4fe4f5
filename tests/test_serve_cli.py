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
