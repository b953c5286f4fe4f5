"""Prefill-decode disaggregation (ndplan.serve.disagg): pools that carry the rate within the limits,
and the KV cache's transfer in TTFT by hand."""

import math

import pytest
from click.testing import CliRunner

import ndplan
from ndplan.cli import main
from ndplan.serve.disagg import disaggregated
from ndplan.serve.estimate import StepKernel

HW = ndplan.load_hardware("h100-sxm")


def test_pools_carry_the_rate_within_the_limits():
    spec = ndplan.load_model("llama3.1-70b")
    pools = disaggregated(spec, HW, isl=2000, osl=500, rate=20, ttft_s=1.0, tpot_s=0.05)
    for role, limit in (("prefill", 1.0), ("decode", 0.05)):
        p = pools[role]
        assert p.instances * p.requests_per_s >= 20 > (p.instances - 1) * p.requests_per_s
        assert p.latency_s <= limit


def test_ttft_holds_the_wait_the_prompt_and_the_kv_transfer():
    """A full prefill pool: half a step's wait, ceil(2000 / 8192) = 1 full step of the 8192-token budget,
    then the KV cache: Llama-3.1-70B, bf16 KV, 80 layers x (K, V) x 8 heads x 128 x 2 B = 327,680 B per
    token, 2000 tokens over the NICs of the attention-tp x pp devices at 50 GB/s x 0.85 each."""
    spec = ndplan.load_model("llama3.1-70b")
    p = disaggregated(spec, HW, isl=2000, osl=500, rate=20)["prefill"]
    kernel = StepKernel(spec, p.layout, ndplan.serve.WeightRecipe(), "bf16", HW.kernel_values())
    step = sum(kernel(0, 0, 8192, 1000).values())
    send = 2000 * 327_680 / (p.layout.attention_tp * p.layout.pp * 50e9 * 0.85)
    assert p.latency_s == pytest.approx(step / 2 + math.ceil(2000 / 8192) * step + send, rel=1e-12)
    assert p.requests_per_s == pytest.approx(8192 * p.layout.dp_attention * p.layout.pp / step / 2000, rel=1e-12)


def test_disaggregate_needs_a_rate():
    r = CliRunner().invoke(main, ["serve", "-m", "llama3.1-8b", "--isl", "10", "--osl", "10", "--disaggregate"])
    assert r.exit_code == 2 and "--rate" in r.output


def test_options_that_do_not_apply_are_refused():
    r = CliRunner().invoke(main, ["serve", "-m", "llama3.1-8b", "--isl", "10", "--osl", "10", "--rate", "1",
                                  "--disaggregate", "--tp", "2"])
    assert r.exit_code == 2 and "--tp" in r.output and r.output.count("\n") == 1

