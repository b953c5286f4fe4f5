"""Step-time bands and ties (ndplan.bands), against hand derivations.

* Euler's theorem: with no collective (one device) every Term of the step is a time divided by one
  efficiency, so T is homogeneous of degree -1 in them and the sensitivities sum to -1.
* The band is T exp(+-1.96 sqrt(sum (S_i sigma_i)^2)), here recomputed from the sensitivities.
* A calibrated entry's interval [lo, hi] gives sigma = ln(hi/lo) / (2 x 1.96).
* Ties: the deviation of ln T_b - ln T_a is sqrt(sum ((S_b - S_a) sigma)^2), worked by hand.
"""

import dataclasses
import json
import math

import pytest
from click.testing import CliRunner

import ndplan
from ndplan import bands
from ndplan.cli import main


def _est(strat, gpus=None, hw="h100-sxm"):
    model = ndplan.load_model("llama3-8b")
    return ndplan.estimate(model, ndplan.load_hardware(hw), strat, gpus or strat.world)


def test_single_device_sensitivities_sum_to_minus_one():
    b = bands.band(_est(ndplan.Strategy(seq=4096, gbs=4, mbs=1, zero=0)))
    assert sum(b.sensitivity.values()) == pytest.approx(-1, abs=1e-4)
    assert b.sensitivity["intra_node_efficiency"] == 0 and b.sensitivity["inter_node_efficiency"] == 0
    assert -1 < b.sensitivity["gemm_efficiency"] < -0.5  # GEMMs are most of an 8B model's step


def test_band_is_the_root_sum_of_squares_of_the_constants():
    b = bands.band(_est(ndplan.Strategy(dp=8, tp=2, seq=8192, gbs=64, zero=1)))
    half = 1.959964 * math.sqrt(sum((b.sensitivity[f] * b.sigma[f]) ** 2 for f in b.sigma))
    assert b.low_s == pytest.approx(b.step_s * math.exp(-half), rel=1e-12)
    assert b.high_s == pytest.approx(b.step_s * math.exp(half), rel=1e-12)
    assert b.sigma == {f: s for f, (s, _) in bands.PRIORS.items()}


def test_calibrates_own_text_round_trips():
    """The interval ndplan calibrate writes (4 significant digits, 'lo to hi') is read back; one
    reaching 0 means the runs hardly fix the constant (UNFIXED); garbled text keeps the prior."""
    from ndplan.calibrate import Fit
    hw = ndplan.load_hardware("h100-sxm")
    for iv, sigma in (((0.61234, 0.70001), math.log(0.7 / 0.6123) / (2 * 1.959964)), ((0.0, 0.2), bands.UNFIXED)):
        text = f"fitted by ndplan calibrate on r.yaml (3 runs: a, b, c); 95 % interval {iv[0]:.4g} to {iv[1]:.4g}; x"
        got = bands.spreads(dataclasses.replace(hw, sources={"gemm_efficiency": text}))["gemm_efficiency"][0]
        assert got == pytest.approx(sigma, rel=1e-3)
    bad = "fitted by ndplan calibrate on r.yaml; 95 % interval 0.6.1-0.7"
    assert bands.spreads(dataclasses.replace(hw, sources={"gemm_efficiency": bad}))["gemm_efficiency"][0] == \
        bands.PRIORS["gemm_efficiency"][0]
    assert Fit  # the writer's format is calibrate.hardware_yaml's


def test_a_calibrated_interval_replaces_the_prior():
    hw = ndplan.load_hardware("h100-sxm")
    src = ("fitted by ndplan calibrate on runs.yaml (5 runs: a, b, c, d, e); 95 % interval 0.600-0.700; "
           "leave-one-out median |error| 3.0 %; was 0.67")
    hw = dataclasses.replace(hw, sources=dict(hw.sources) | {"gemm_efficiency": src})
    sigma, why = bands.spreads(hw)["gemm_efficiency"]
    assert sigma == pytest.approx(math.log(0.7 / 0.6) / (2 * 1.959964))
    assert "calibrate" in why
    assert bands.spreads(hw)["attention_efficiency"][0] == bands.PRIORS["attention_efficiency"][0]


def _band(step, inter):
    sens = {f: 0.0 for f in bands.PRIORS} | {"gemm_efficiency": -0.8, "inter_node_efficiency": inter}
    return bands.Band(step_s=step, low_s=step, high_s=step, sensitivity=sens,
                      sigma={f: s for f, (s, _) in bands.PRIORS.items()})


def test_ties_by_the_difference_not_the_common_constants():
    """b differs from a by exposed inter-node time: S_inter -0.5 against 0, sigma 0.23, so the
    difference's deviation is 0.5 x 0.23 = 0.115 and the tie limit 1.96 x 0.115 = 0.225 in ln T:
    15 % slower (ln 1.15 = 0.140) ties, 30 % slower (0.262) does not. The GEMM sensitivity they
    share cancels (alone it would give 1.96 x 0.8 x 0.08 = 0.13): with the same sensitivities
    5 % slower does not tie, 2 % slower does (STRUCTURE_FLOOR, 3 %)."""
    a = _band(10.0, 0.0)
    assert bands.tied_with_best([a, _band(11.5, -0.5), _band(13.0, -0.5)]) == [True, True, False]
    assert bands.tied_with_best([a, _band(10.5, 0.0), _band(10.2, 0.0)]) == [True, False, True]


def test_bands_of_different_hardware_add_their_variances():
    """No shared constant: the deviation is sqrt((0.8 x 0.08)^2 x 2) = 0.0905, limit 0.177:
    15 % slower (0.140) ties."""
    a, b = _band(10.0, 0.0), _band(11.5, 0.0)
    b = dataclasses.replace(b, sigma=dict(b.sigma) | {"hbm_efficiency": 0.31})
    assert bands.tied_with_best([a, b]) == [True, True]
    assert bands.tied_with_best([a, dataclasses.replace(b, step_s=13.0)]) == [True, False]


def test_the_band_follows_an_engine_override():
    """estimate(engine=...) times the strategy under another profile: the band is centred on
    that step time."""
    from ndplan.engines import MEGATRON
    model, hw = ndplan.load_model("llama3-8b"), ndplan.load_hardware("h100-sxm")
    strat = ndplan.Strategy(dp=8, gbs=64, zero=1)
    for eng in (dataclasses.replace(MEGATRON, overlap_grad_reduce=False),
                dataclasses.replace(MEGATRON, fp8_linear_inputs=True)):
        est = ndplan.estimate(model, hw, strat, 8, engine=eng)
        assert bands.band(est).step_s == pytest.approx(est.step_s, rel=1e-12)


def test_sweep_reports_bands_and_ties():
    args = ["sweep", "-m", "llama3-8b", "-H", "h100-sxm", "--gpus", "16", "--gbs", "64", "--seq", "4096",
            "--top", "4"]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "95% band" in out.output
    doc = json.loads(CliRunner().invoke(main, args + ["--json"]).output)
    for row in doc["top"]:
        b = row["time"]["band_95"]
        assert b["low_s"] < b["step_s"] < b["high_s"]
        assert b["step_s"] == pytest.approx(row["time"]["step_s"], rel=1e-9)
    assert doc["top"][0]["time"]["tied_with_best"] is True


def test_estimate_prints_its_band():
    args = ["estimate", "-m", "llama3-8b", "-H", "h100-sxm", "--dp", "8", "--gbs", "64"]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "95% band" in out.output
    b = json.loads(CliRunner().invoke(main, args + ["--json"]).output)["time"]["band_95"]
    assert b["low_s"] < b["step_s"] < b["high_s"]
