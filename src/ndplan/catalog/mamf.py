"""GEMM efficiency per device and dtype from its maximum achievable matmul FLOP/s (MAMF).

A training step's GEMMs run at a fraction of what the best-shaped matmul reaches on the same
device, and that best-shaped matmul runs at a device- and dtype-dependent fraction of the
datasheet peak (51 % on MI300X, 80 % on H100 BF16, 71 % on H100 FP8, 87 % on A100). So

    gemm_efficiency     = mamf_bf16_tflops / bf16_tflops x TRAINING_GEMM_FRACTION
    fp8_gemm_efficiency = mamf_fp8_tflops  / fp8_tflops  x TRAINING_GEMM_FRACTION

with the MAMF values measured per device in hardware/<name>.yaml (Bekman, "Machine Learning
Engineering", compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table",
stas00/ml-engineering@744d01e1: brute-force search over matmul shapes, mean of 100 iterations).
A device without a published MAMF takes the named priors below, and its source says so; a
value in the YAML, ``--set``, ``--profile`` or ``ndplan calibrate`` replaces the derived one.
Small per-device GEMMs fall further through the roofline of formulas/step.py.

No per-shape factor is applied beyond that roofline. DeepGEMM's published H800 FP8 table
(deepseek-ai/DeepGEMM README.md at a6d97a1) does fall with K at M = 4096 (590 TFLOPS at K = 512,
1025 at 2048, 1358 at 16384: about T_max K / (K + 700)) and with wave quantisation (N = 2112:
1058), but the best shapes of Bekman's BF16 searches have K = 1024 to 3072 on B200, B300 and
GB200 and 4096 to 5120 on GH200 and A100: cuBLAS's kernels lose no measurable throughput to K
above about 1k there, so DeepGEMM's constant would not carry over (tests/test_attention_speed.py
holds the table's bandwidth-bound rows to the roofline).
"""

from __future__ import annotations

import math

MAMF_FIELDS = ("mamf_bf16_tflops", "mamf_fp8_tflops")

TRAINING_GEMM_FRACTION = 0.78
"""Achieved / MAMF of a training step's GEMMs, fitted once with the per-device MAMF ratios on the
38 published step times of four sources (benchmarks/steptime_validation.py FIT_SOURCES:
Narayanan 2021, Korthikanti 2022, Megatron-Core r0.8, torchtitan 2024-08; A100 and H100). The
mean |error| over them is lowest at 0.78: 8.92 % (0.74: 9.68, 0.76: 9.21, 0.80: 9.04, 0.82:
9.61 %; signed median -0.4 %); again after the engines' loss passes (engine_time.py): 8.70 %
(0.76: 9.01, 0.80: 8.82, 0.82: 9.34 %). Held out of the fit: BLOOM, MT-NLG, the Llama 3 paper
and NeMo long-sequence (FP8), 16 rows, median |error| 24.0 % at 0.78 (23.5 % at 0.76, 25.0 % at
0.82: they lean to a lower fraction), and the MindFormers ranking sets; the benchmark prints both
groups."""

PRIOR_BF16_RATIO = 0.781
"""MAMF / peak for a device without a published MAMF: the median of the twelve BF16 rows of
Bekman's table (0.514 MI300X to 0.969 Gaudi 2)."""
PRIOR_BF16_SIGMA = round(math.log(0.969 / 0.514) / 2, 3)
"""Log-scale deviation of that prior: half the log range of the twelve rows, 0.317."""
PRIOR_FP8_TO_BF16 = 0.966
"""FP8 MAMF ratio / BF16 MAMF ratio for a device without a published FP8 MAMF: the median over
the eight FP8 rows of Bekman's table, each over its BF16 row (the H200's BF16 row is the H100's,
"H200 is the same"): 0.883 H100 to 1.038 Gaudi 3."""
PRIOR_FP8_SIGMA = round(math.log(1.038 / 0.883) / 2, 3)
"""Log-scale deviation of that ratio: half the log range of the eight pairs, 0.081."""

DERIVED = "derived from the device's MAMF"
PRIOR = "named prior (no published MAMF for this device)"


def derived(peak_bf16: float, peak_fp8: float | None, mamf_bf16: float | None,
            mamf_fp8: float | None) -> dict[str, tuple[float, str]]:
    """``gemm_efficiency`` and ``fp8_gemm_efficiency`` with their source text, from the peaks
    and MAMF values in TFLOPS (module docstring)."""
    f = TRAINING_GEMM_FRACTION
    if mamf_bf16:
        r16 = mamf_bf16 / peak_bf16
        out = {"gemm_efficiency": (r16 * f, f"{DERIVED}: mamf_bf16_tflops / bf16_tflops x TRAINING_GEMM_FRACTION"
                                            f" = {mamf_bf16:g} / {peak_bf16:g} x {f:g}")}
    else:
        r16 = PRIOR_BF16_RATIO
        out = {"gemm_efficiency": (r16 * f, f"{PRIOR}: PRIOR_BF16_RATIO x TRAINING_GEMM_FRACTION = "
                                            f"{r16:g} x {f:g}, the median of the published MAMF ratios")}
    if mamf_fp8 and peak_fp8:
        out["fp8_gemm_efficiency"] = (mamf_fp8 / peak_fp8 * f, f"{DERIVED}: mamf_fp8_tflops / fp8_tflops x "
                                      f"TRAINING_GEMM_FRACTION = {mamf_fp8:g} / {peak_fp8:g} x {f:g}")
    else:
        bf16 = "PRIOR_BF16_RATIO" if not mamf_bf16 else "the BF16 MAMF ratio"
        out["fp8_gemm_efficiency"] = (r16 * PRIOR_FP8_TO_BF16 * f, f"{PRIOR}: {bf16} {r16:.3g} x "
                                      f"PRIOR_FP8_TO_BF16 {PRIOR_FP8_TO_BF16:g} x TRAINING_GEMM_FRACTION {f:g}")
    return out


def prior_sigma(field: str, source: str) -> float:
    """Extra log-scale deviation of a derived efficiency whose MAMF is a prior: BF16's for
    ``gemm_efficiency``; for ``fp8_gemm_efficiency`` the FP8-to-BF16 ratio's, plus BF16's when
    that too is a prior. 0 for a measured MAMF or a value from elsewhere."""
    if PRIOR not in source:
        return 0.0
    if field == "gemm_efficiency":
        return PRIOR_BF16_SIGMA
    return math.hypot(PRIOR_FP8_SIGMA, PRIOR_BF16_SIGMA if "PRIOR_BF16_RATIO" in source else 0.0)
