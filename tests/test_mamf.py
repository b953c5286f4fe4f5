"""GEMM efficiency per device and dtype from the maximum achievable matmul FLOP/s (catalog/mamf.py).

The oracle is Bekman's "Maximum Achievable Matmul FLOPS comparison table" (Machine Learning
Engineering, compute/accelerator/README.md at stas00/ml-engineering@744d01e1), transcribed
below row by row as (MAMF TFLOPS, the table's theoretical TFLOPS): the catalog's MAMF values,
the priors for devices without a row, and the derived efficiencies are recomputed from it.
"""

import dataclasses
import math
import statistics

import pytest

from click.testing import CliRunner

import ndplan
from ndplan import bands
from ndplan.cli import main
from ndplan.catalog import mamf
from ndplan.errors import NdplanError

BF16 = {  # accelerator: (MAMF, theory), TFLOPS
    "Intel Gaudi 2": (418.7, 432), "NVIDIA A100 SXM": (271.2, 312), "NVIDIA GH200 SXM": (828.6, 989),
    "NVIDIA A100 PCIe": (252.9, 312), "NVIDIA H100 SXM": (794.5, 989), "NVIDIA B300 SXM": (1769.0, 2250),
    "NVIDIA B200 SXM": (1745.0, 2250), "Intel Gaudi 3": (1243.0, 1677), "NVIDIA GB200 SXM": (1822.0, 2500),
    "AMD MI355X": (1565.0, 2300), "AMD MI325X": (784.9, 1300), "AMD MI300X": (668.4, 1300),
}
FP8 = {
    "Intel Gaudi 2": (826.5, 865), "NVIDIA GH200 SXM": (1535.0, 1979), "Intel Gaudi 3": (1289.5, 1677),
    "NVIDIA B200 SXM": (3432.5, 4500), "NVIDIA B300 SXM": (3353.3, 4500), "NVIDIA H200 SXM": (1453.4, 1979),
    "NVIDIA GB200 SXM": (3615.6, 5000), "NVIDIA H100 SXM": (1402.6, 1979),
}
# catalog device -> (its BF16 row, its FP8 row or None); the H200's BF16 row is the H100's ("H200 is
# the same"); the H800 and the 500 W HBM2e H100 take the H100 rows (unverified in their YAML)
CATALOG = {
    "a100-40gb": ("NVIDIA A100 SXM", None), "a100-80gb": ("NVIDIA A100 SXM", None),
    "h100-sxm": ("NVIDIA H100 SXM", "NVIDIA H100 SXM"), "h100-96gb-hbm2e": ("NVIDIA H100 SXM", "NVIDIA H100 SXM"),
    "h800": ("NVIDIA H100 SXM", "NVIDIA H100 SXM"), "h200": ("NVIDIA H100 SXM", "NVIDIA H200 SXM"),
    "b200": ("NVIDIA B200 SXM", "NVIDIA B200 SXM"), "mi300x": ("AMD MI300X", None),
    "ascend-910b": (None, None), "ascend-a3": (None, None),
}


def _ratio(row):
    return row[0] / row[1]


def test_the_priors_are_the_tables_medians_and_half_log_ranges():
    r16 = [_ratio(r) for r in BF16.values()]
    pairs = [_ratio(FP8[k]) / _ratio(BF16[k if k != "NVIDIA H200 SXM" else "NVIDIA H100 SXM"]) for k in FP8]
    assert mamf.PRIOR_BF16_RATIO == pytest.approx(statistics.median(r16), abs=6e-4)
    assert mamf.PRIOR_BF16_SIGMA == pytest.approx(math.log(max(r16) / min(r16)) / 2, abs=6e-4)
    assert mamf.PRIOR_FP8_TO_BF16 == pytest.approx(statistics.median(pairs), abs=6e-4)
    assert mamf.PRIOR_FP8_SIGMA == pytest.approx(math.log(max(pairs) / min(pairs)) / 2, abs=6e-4)


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_catalog_efficiencies_follow_the_table(name):
    """Each device's MAMF is its row's; its GEMM efficiencies are MAMF / its own peak x the one
    fitted training fraction; a device without a row takes the priors (and its source says so)."""
    hw = ndplan.load_hardware(name)
    f = mamf.TRAINING_GEMM_FRACTION
    bf16_row, fp8_row = CATALOG[name]
    if bf16_row:
        mamf16, theory = BF16[bf16_row]
        assert hw.mamf_bf16_tflops == mamf16
        assert hw.bf16_tflops == pytest.approx(theory, rel=0.01)  # the table's peak is the catalog's
        r16 = mamf16 / hw.bf16_tflops
        assert hw.sources["gemm_efficiency"].startswith(mamf.DERIVED)
    else:
        assert hw.mamf_bf16_tflops is None
        r16 = statistics.median(_ratio(r) for r in BF16.values())
        assert mamf.PRIOR in hw.sources["gemm_efficiency"]
    assert hw.gemm_efficiency == pytest.approx(r16 * f, abs=5e-4)
    if fp8_row:
        mamf8, theory8 = FP8[fp8_row]
        assert hw.mamf_fp8_tflops == mamf8 and hw.fp8_tflops == pytest.approx(theory8, rel=0.01)
        assert hw.fp8_gemm_efficiency == pytest.approx(mamf8 / hw.fp8_tflops * f, rel=1e-12)
    else:
        assert hw.fp8_gemm_efficiency == pytest.approx(r16 * mamf.PRIOR_FP8_TO_BF16 * f, abs=5e-4)


def test_a_given_efficiency_wins_and_a_new_mamf_rederives():
    hw = ndplan.load_hardware("h100-sxm")
    moved = hw.with_overrides({"mamf_bf16_tflops": 700})
    assert moved.gemm_efficiency == pytest.approx(700 / 989.4 * mamf.TRAINING_GEMM_FRACTION, rel=1e-12)
    assert moved.fp8_gemm_efficiency == hw.fp8_gemm_efficiency  # the FP8 MAMF did not move
    both = hw.with_overrides({"mamf_bf16_tflops": 700, "gemm_efficiency": 0.5})
    assert both.gemm_efficiency == 0.5
    fixed = hw.with_overrides({"gemm_efficiency": 0.5}).with_overrides({"mamf_bf16_tflops": 700})
    assert fixed.gemm_efficiency == 0.5  # a value from --set is not a derivation: it stays


def test_a_mamf_above_the_peak_is_refused():
    hw = ndplan.load_hardware("h100-sxm")
    with pytest.raises(NdplanError, match="mamf_bf16_tflops"):
        hw.with_overrides({"mamf_bf16_tflops": 1000})
    with pytest.raises(NdplanError, match="mamf_fp8_tflops"):
        dataclasses.replace(hw, fp8_tflops=None, mamf_fp8_tflops=1000.0)


def test_fp8_efficiency_times_only_the_fp8_gemms():
    """A bf16 run does not read fp8_gemm_efficiency; an fp8 run's layer GEMMs do (the rest of the
    fp8 time is test_attention_speed's hand derivation)."""
    model = ndplan.load_model("llama2-7b")
    hw = ndplan.load_hardware("h100-sxm")
    plain, fp8 = ndplan.Strategy(seq=4096, gbs=1, mbs=1), ndplan.Strategy(seq=4096, gbs=1, mbs=1, weight_dtype="fp8")
    slow = hw.with_overrides({"fp8_gemm_efficiency": hw.fp8_gemm_efficiency / 2})
    assert ndplan.estimate(model, slow, plain, 1).step_s == ndplan.estimate(model, hw, plain, 1).step_s
    assert ndplan.estimate(model, slow, fp8, 1).step_s > 1.2 * ndplan.estimate(model, hw, fp8, 1).step_s


def test_a_prior_mamf_widens_the_band():
    """The GEMM deviation of a device on the prior adds the prior's half log range in quadrature."""
    base = bands.PRIORS["gemm_efficiency"][0]
    assert bands.spreads(ndplan.load_hardware("h100-sxm"))["gemm_efficiency"][0] == base
    sigma = bands.spreads(ndplan.load_hardware("ascend-910b"))["gemm_efficiency"][0]
    assert sigma == pytest.approx(math.hypot(base, mamf.PRIOR_BF16_SIGMA), rel=1e-12)
    fp8 = bands.spreads(ndplan.load_hardware("mi300x"))["fp8_gemm_efficiency"][0]
    assert fp8 == pytest.approx(math.hypot(bands.PRIORS["fp8_gemm_efficiency"][0], mamf.PRIOR_FP8_SIGMA), rel=1e-12)


def test_a_new_peak_keeps_the_mamf_ratio():
    """--set bf16_tflops (a power-capped or other-clocked part) scales the catalog's MAMF with it:
    the efficiency, a ratio, stays; the MAMF never ends above the new peak."""
    hw = ndplan.load_hardware("h100-sxm")
    for peak in (756.0, 900.0):
        moved = hw.with_overrides({"bf16_tflops": peak})
        assert moved.mamf_bf16_tflops == pytest.approx(794.5 * peak / 989.4, rel=1e-12)
        assert moved.gemm_efficiency == pytest.approx(hw.gemm_efficiency, rel=1e-12)
    r = CliRunner().invoke(main, ["estimate", "-m", "llama3-8b", "-H", "h100-sxm", "--set", "bf16_tflops=756"])
    assert r.exit_code == 0, r.output


def test_a_mamf_without_its_peak_is_one_line():
    hw = ndplan.load_hardware("a100-80gb")
    with pytest.raises(NdplanError, match="mamf_fp8_tflops.*has no fp8_tflops"):
        hw.with_overrides({"mamf_fp8_tflops": 500})


def test_a_calibrated_fa2_interval_sets_the_band():
    """The band of an engine running FlashAttention-2 takes the fa2 field's calibrated interval,
    not the attention prior (bands.spreads)."""
    hw = ndplan.load_hardware("h100-sxm")
    text = "fitted by ndplan calibrate on runs.yaml (4 runs: a); 95 % interval 0.2 to 0.4"
    hw = dataclasses.replace(hw, sources=dict(hw.sources) | {"fa2_attention_efficiency": text})
    assert bands.spreads(hw, fa2=True)["attention_efficiency"][0] == pytest.approx(math.log(2) / (2 * bands.Z95))
    assert bands.spreads(hw)["attention_efficiency"][0] == bands.PRIORS["attention_efficiency"][0]


def test_a_tiny_peak_scales_the_mamf_below_the_peak_floor():
    """--set bf16_tflops=1 (the floor) keeps H100's 80.3 % MAMF ratio: 0.803 TFLOPS, accepted."""
    moved = ndplan.load_hardware("h100-sxm").with_overrides({"bf16_tflops": 1})
    assert moved.mamf_bf16_tflops == pytest.approx(794.5 / 989.4, rel=1e-12)
