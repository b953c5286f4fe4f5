"""Compute-time mechanisms of formulas/step.py against published kernel speeds and hand derivations.

* The attention core's length factor L / (L + ATTN_HALF_TOKENS) against the FlashAttention-3
  paper's H100 SXM5 bars (Shah et al. 2024, arXiv 2407.08608, Figs. 5-6, head dim 128),
  transcribed here in TFLOPs/s for 512, 1k, 2k, 4k, 8k, 16k tokens.
* The attention core, router and output layer at the 16-bit peak under fp8 GEMMs (Megatron-LM
  runs Transformer Engine's fp8 attention only from a config field that has no flag; the
  output layer is a plain ColumnParallelLinear): compute(fp8) - compute(bf16) holds only the
  transformer-layer GEMMs' peak change and their operands' quantisation bytes, counted here from
  the Llama-2-7B shapes and Transformer Engine's casts (3 B per input element forward; 4 B per
  output-gradient element and 2 B per input element backward).
* The MLP backward's two fp8 copies of the up projection's output gradient (memory).
* The GEMM roofline with fp8 operands (1 B per input element, formulas/step.FP8_OPERAND_BYTES)
  against DeepGEMM's published H800 FP8 table (deepseek-ai/DeepGEMM README.md at a6d97a1,
  "Normal GEMMs for dense models"), transcribed here.
"""

import dataclasses

import numpy as np
import pytest

import ndplan
from ndplan import symbols as S
from ndplan.engines import profile
from ndplan.formulas import activations as A
from ndplan.formulas.local import act_context
from ndplan.formulas.step import ATTN_HALF_TOKENS
from ndplan.structure import structure
from ndplan.symbols import model_symbols

LENGTHS = np.array([512, 1024, 2048, 4096, 8192, 16384], dtype=float)
FA3_PAPER = {  # (kernel, pass): TFLOPs/s, H100 SXM5, head dim 128
    ("FlashAttention-2", "forward causal"): [191, 260, 298, 319, 333, 335],
    ("cuDNN", "forward causal"): [315, 410, 484, 518, 529, 539],
    ("FlashAttention-2", "backward"): [214, 260, 291, 310, 318, 322],
    ("cuDNN", "backward"): [305, 408, 465, 499, 518, 516],
}


def _fit_top(bars, half):
    """Least-squares T_max of T(L) = T_max L / (L + half) through the bars."""
    x = LENGTHS / (LENGTHS + half)
    return float(x @ bars / (x @ x))


@pytest.mark.parametrize("series", sorted(FA3_PAPER))
def test_length_factor_reproduces_the_published_bars(series):
    """With the one ATTN_HALF_TOKENS and each kernel's own plateau, every published bar of the
    kernels the engines run (FlashAttention-2, cuDNN) is within 4 % for the causal forward, and
    within 10 % for the paper's backward, which is non-causal (its own half points, 274 and 377
    tokens, lie below the causal ones: a causal call wastes more of its short diagonal)."""
    bars = np.array(FA3_PAPER[series], dtype=float)
    top = _fit_top(bars, ATTN_HALF_TOKENS)
    model = top * LENGTHS / (LENGTHS + ATTN_HALF_TOKENS)
    tolerance = 0.04 if "causal" in series[1] else 0.10
    assert np.max(np.abs(model / bars - 1)) < tolerance, (series, model.round(), bars)


def test_a_constant_misses_the_short_bars():
    """The best constant (the former model: one efficiency at every length) misses the causal
    forwards' 512-token bars by more than a quarter."""
    for kernel in ("FlashAttention-2", "cuDNN"):
        bars = np.array(FA3_PAPER[(kernel, "forward causal")], dtype=float)
        assert abs(bars.mean() / bars[0] - 1) > 0.25


LLAMA2_7B = dict(h=4096, L=32, a=32, kv=32, d=128, f=11008)  # meta-llama/Llama-2-7b-hf config.json


def _compute(strat, hw=None):
    model = ndplan.load_model("llama2-7b")
    hw = hw or ndplan.load_hardware("h100-sxm")
    return ndplan.estimate(model, hw, strat, strat.dp * strat.tp * strat.pp * strat.cp).time_terms["time.compute"]


@pytest.mark.parametrize("cp", [1, 2])
def test_attention_core_time_uses_the_cp_shard_length(cp):
    """compute(eff_attn=0.5) - compute(eff_attn=1) = forward + backward (1 + 5/2) core FLOPs of
    every layer, causal, at the 16-bit peak, times (L + 400) / L for the L = seq / cp tokens of
    each call."""
    s = 4096
    strat = ndplan.Strategy(cp=cp, seq=s, gbs=1, mbs=1, zero=0)
    hw = ndplan.load_hardware("h100-sxm")
    lo, hi = (_compute(strat, hw.with_overrides({"attention_efficiency": e})) for e in (0.5, 1.0))
    m = LLAMA2_7B
    core_flops = 0.5 * 2 * (s / cp) * s * m["a"] * 2 * m["d"]  # QK^T and PV, half the square, per device
    local = s / cp
    expected = 3.5 * m["L"] * core_flops / (hw.bf16_tflops * 1e12) * (local + ATTN_HALF_TOKENS) / local * (2 - 1)
    assert lo - hi == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("hw_name", ["h100-sxm", "a100-80gb"])
def test_flash_attention_2_runs_at_its_own_hopper_plateau(hw_name):
    """An engine running FlashAttention-2 (attention_fa2: PyTorch SDPA's flash backend, the
    flash-attn package) times the core at the device's fa2_attention_efficiency: on H100 the
    plateau the FlashAttention-2 bars above fit (backward, the longer pass), 0.347 of the peak
    against the fused kernels' 0.55; the A100 has no such field (FlashAttention-2 is its
    reference kernel), so nothing changes."""
    s = 4096
    hw = ndplan.load_hardware(hw_name)
    fused = _compute(ndplan.Strategy(seq=s, gbs=1, mbs=1, zero=0, engine="fsdp"), hw)
    fa2 = _compute(ndplan.Strategy(seq=s, gbs=1, mbs=1, zero=0, engine="fsdp[attention_fa2=1]"), hw)
    if hw_name == "a100-80gb":
        assert fa2 == fused
        return
    top = _fit_top(np.array(FA3_PAPER[("FlashAttention-2", "backward")], dtype=float), ATTN_HALF_TOKENS)
    assert hw.fa2_attention_efficiency == pytest.approx(top / 989.4, abs=5e-4)
    m = LLAMA2_7B
    core_flops = 0.5 * 2 * s * s * m["a"] * 2 * m["d"]
    per_eff = 3.5 * m["L"] * core_flops / (hw.bf16_tflops * 1e12) * (s + ATTN_HALF_TOKENS) / s
    expected = per_eff * (1 / hw.fa2_attention_efficiency - 1 / hw.attention_efficiency)
    assert fa2 - fused == pytest.approx(expected, rel=1e-9)


def test_fp8_changes_only_the_layer_gemms_and_their_casts():
    s = 4096
    hw = ndplan.load_hardware("h100-sxm")
    base = dict(seq=s, gbs=1, mbs=1, zero=0, engine="fsdp")
    bf16 = _compute(ndplan.Strategy(**base), hw)
    fp8 = _compute(ndplan.Strategy(**base, weight_dtype="fp8"), hw)
    m = LLAMA2_7B
    h, f, q = m["h"], m["f"], (m["a"] + 2 * m["kv"]) * m["d"]
    # (inner, cols) of q/k/v, o, gate+up, down
    gemms = [(h, q), (m["a"] * m["d"], h), (h, 2 * f), (f, h)]
    flops = sum(2 * s * k * n for k, n in gemms)
    inputs = sum(s * k for k, _ in gemms)
    outputs = sum(s * n for _, n in gemms)
    hbm = hw.hbm_gb_per_s * 1e9 * hw.hbm_efficiency
    gemm_delta = 3 * flops * (1 / (hw.fp8_tflops * 1e12 * hw.fp8_gemm_efficiency)
                              - 1 / (hw.bf16_tflops * 1e12 * hw.gemm_efficiency))
    casts = (3 * inputs + 4 * outputs + 2 * inputs) / hbm
    assert fp8 - bf16 == pytest.approx(m["L"] * (gemm_delta + casts), rel=1e-9)


def test_megatron_fp8_linears_are_timed_as_fp8_gemms():
    """--fp8-format without --fp8-param-gather (16-bit primary weights, fp8 linears) runs the same
    fp8 GEMMs as fp8 weights: the same compute time."""
    s = 4096
    linears = ndplan.Strategy(seq=s, gbs=1, mbs=1, engine="megatron[fp8_linear_inputs=1,fp8_weight_cache_bytes=2]")
    weights = ndplan.Strategy(seq=s, gbs=1, mbs=1, weight_dtype="fp8",
                              engine="megatron[fp8_linear_inputs=1,fp8_weight_cache_bytes=1]")
    plain = ndplan.Strategy(seq=s, gbs=1, mbs=1)
    assert _compute(linears) == pytest.approx(_compute(weights), rel=1e-12)
    assert _compute(linears) < 0.8 * _compute(plain)


@pytest.mark.parametrize("recipe,scale", [({}, 0), ({"fp8_scale_bytes": 1, "fp8_act_block": 32}, 1 / 32)])
def test_mlp_backward_holds_two_fp8_copies_of_the_up_gradient(recipe, scale):
    """Transformer Engine quantises fc1's output gradient (2f wide under SwiGLU) into a row-wise
    and a column-wise fp8 copy beside the 16-bit gradient (linear.py:903-905): 2 x 2f x (1 + scale)
    bytes per token more than with 16-bit GEMMs."""
    model = ndplan.load_model("llama2-7b")
    M = model_symbols(model)
    strat = ndplan.Strategy(seq=4096, gbs=1, mbs=1, tp=2)
    fp8_eng = dataclasses.replace(profile("megatron"), fp8_linear_inputs=True, **recipe)
    plain = A.mlp_backward_workspace(model, M, act_context(model, structure(model, strat)), "dense")
    fp8 = A.mlp_backward_workspace(model, M, act_context(model, structure(model, strat, fp8_eng)), "dense")
    tokens, width = 4096, 2 * LLAMA2_7B["f"] / 2  # gate + up, split over tp = 2
    delta = (fp8 - plain).subs({S.seq: 4096, S.cp: 1, S.mbs: 1, S.tp: 2})
    assert float(delta) == pytest.approx(tokens * 2 * width * (1 + scale), rel=1e-12)


def test_torchtitan_float8_leaves_the_routed_experts_16_bit():
    """torchtitan's float8 converter swaps nn.Linear modules only (params.float8_linear_pieces):
    on Mixtral-8x7B (h 4096, 32 heads, 8 KV heads of 128, 32 layers) only q/k/v and o change
    peak and pay casts; the GroupedExperts and the router stay 16-bit."""
    s = 4096
    model = ndplan.load_model("mixtral-8x7b")
    hw = ndplan.load_hardware("h100-sxm")
    base = dict(seq=s, gbs=1, mbs=1, zero=0, engine="fsdp")
    bf16, fp8 = (ndplan.estimate(model, hw, ndplan.Strategy(**base, **kw), 1).time_terms["time.compute"]
                 for kw in ({}, {"weight_dtype": "fp8"}))
    gemms = [(4096, 6144), (4096, 4096)]
    flops = sum(2 * s * k * n for k, n in gemms)
    inputs, outputs = sum(s * k for k, _ in gemms), sum(s * n for _, n in gemms)
    hbm = hw.hbm_gb_per_s * 1e9 * hw.hbm_efficiency
    per_layer = (3 * flops * (1 / (hw.fp8_tflops * 1e12 * hw.fp8_gemm_efficiency)
                              - 1 / (hw.bf16_tflops * 1e12 * hw.gemm_efficiency))
                 + (3 * inputs + 4 * outputs + 2 * inputs) / hbm)
    assert fp8 - bf16 == pytest.approx(32 * per_layer, rel=1e-9)


DEEPGEMM_H800 = [  # (M, N, K, TFLOPS, GB/s) as published; FP8 operands, bf16 output
    (64, 2112, 7168, 206, 1688), (64, 24576, 1536, 289, 2455), (64, 32768, 512, 219, 2143),
    (64, 7168, 16384, 336, 2668), (64, 4096, 7168, 287, 2320), (64, 7168, 2048, 295, 2470),
    (128, 2112, 7168, 352, 1509), (128, 24576, 1536, 535, 2448), (128, 32768, 512, 358, 2103),
    (128, 7168, 16384, 645, 2604), (128, 4096, 7168, 533, 2221), (128, 7168, 2048, 510, 2277),
    (4096, 2112, 7168, 1058, 527), (4096, 24576, 1536, 990, 786), (4096, 32768, 512, 590, 1232),
    (4096, 7168, 16384, 1358, 343), (4096, 4096, 7168, 1304, 500), (4096, 7168, 2048, 1025, 697),
]


def _roofline_tflops(m, n, k, hw, operand_bytes):
    """TFLOP/s of an (m x k) @ (k x n) GEMM through formulas/step.gemm_time on ``hw`` under fp8 GEMMs,
    beside the same roofline written out by hand with ``operand_bytes`` per input element."""
    from ndplan.formulas.flops import Gemm
    from ndplan.formulas.step import gemm_time
    values = {S.peak: hw.fp8_tflops * 1e12, S.peak_bf16: hw.bf16_tflops * 1e12, S.fp8_gemm: 1,
              S.eff_gemm: hw.gemm_efficiency, S.eff_gemm8: hw.fp8_gemm_efficiency,
              S.hbm_bytes_per_s: hw.hbm_gb_per_s * 1e9, S.eff_hbm: hw.hbm_efficiency}
    seconds = float(gemm_time(Gemm("g", m, k, n), fp8=True).subs(values))
    by_hand = max(2 * m * n * k / (hw.fp8_tflops * 1e12 * hw.fp8_gemm_efficiency),
                  (operand_bytes * (m * k + k * n) + 2 * m * n) / (hw.hbm_gb_per_s * 1e9 * hw.hbm_efficiency))
    return 2 * m * n * k / seconds / 1e12, 2 * m * n * k / by_hand / 1e12


def test_fp8_gemm_roofline_reads_one_byte_operands():
    """The table's bandwidth-bound rows (M = 64 and 128 tokens; N >= 4096, so at least 32 of the 132
    SMs hold a 128-wide output tile) are within 30 % of the roofline with 1-byte operands (median
    |error| 12.5 %: the roofline's 80 % of the HBM bandwidth is a little above what the kernel
    draws), where 2-byte operands would put the median 41 % low. The N = 2112 rows (17 tiles:
    too few SMs to draw the full bandwidth, +59 % and +78 %) and the M = 4096 rows (compute-bound, at
    the training fraction of the MAMF, catalog/mamf.py) are outside this check."""
    hw = ndplan.load_hardware("h800")
    rows = [r for r in DEEPGEMM_H800 if r[0] <= 128 and r[1] >= 4096]
    assert len(rows) == 10
    errs, errs_2b = [], []
    for m, n, k, published, _ in rows:
        model, one_byte = _roofline_tflops(m, n, k, hw, 1)
        assert model == pytest.approx(one_byte, rel=1e-12)
        errs.append(model / published - 1)
        errs_2b.append(_roofline_tflops(m, n, k, hw, 2)[1] / published - 1)
    assert max(abs(e) for e in errs) < 0.30, np.round(errs, 3)
    assert float(np.median(np.abs(errs))) < 0.15
    assert float(np.median(errs_2b)) < -0.35


def test_deepgemm_peak_is_below_the_fp8_mamf():
    """Two independent sources agree on the FP8 ceiling: DeepGEMM's fastest published shape (1358
    TFLOPS on H800) lies below Bekman's brute-force FP8 MAMF of the same die (1402.6 on H100 SXM,
    hardware/h800.yaml), within 5 %."""
    best = max(r[3] for r in DEEPGEMM_H800)
    mamf = ndplan.load_hardware("h800").mamf_fp8_tflops
    assert best <= mamf and best / mamf > 0.95


def test_deepgemm_bandwidth_column_counts_one_byte_operands():
    """The table's own bandwidth column, times each GEMM's time (2 M N K / TFLOPS), is the bytes
    Gemm.bytes_with(FP8_OPERAND_BYTES) counts for the forward product (fp8 A and B, a bf16 C) on
    every row within 0.2 % (the published figures' rounding); 16-bit operands would count 7 %
    (M = 4096, K = 512, where the bf16 output dominates) to 99 % more."""
    from ndplan.formulas.flops import Gemm
    from ndplan.formulas.step import FP8_OPERAND_BYTES
    for m, n, k, tflops, gbps in DEEPGEMM_H800:
        moved = gbps * 1e9 * 2 * m * n * k / (tflops * 1e12)
        g = Gemm("g", m, k, n)
        assert float(g.bytes_with(FP8_OPERAND_BYTES)) == pytest.approx(moved, rel=2e-3)
        assert float(g.bytes_with(2)) / moved > 1.06

