"""Megatron-LM's Muon step scratch (formulas/muon.py) against measurements of the real code.

The peaks below were measured on 2026-12-06 by running NVIDIA Emerging-Optimizers@fd772972
``newton_schulz`` (copied byte for byte) and Megatron-LM@d98e8a64 ``TensorParallelMuon.step`` on
CPU under a live-storage counter (every new op-output storage counted until freed), at the
default quintic coefficients and 5 steps: bytes above the input. ``medium`` is the default
``--muon-fp32-matmul-prec`` (bf16 iterations), ``high`` fp32.
"""

import pytest
import sympy as sp

import ndplan
from ndplan import symbols as S
from ndplan.engines import derive, profile
from ndplan.formulas import muon as MU
from ndplan.interop import read_config
from ndplan.symbols import model_symbols

NS_MEASURED = {  # (rows, cols, fp32 iterations): peak bytes of one newton_schulz call
    (256, 1024, False): 1_572_864, (1024, 256, False): 1_572_864, (512, 512, False): 2_097_152,
    (384, 1536, False): 3_538_944, (1536, 384, False): 3_538_944, (1000, 600, False): 3_840_000,
    (96, 4096, False): 2_359_296,
    (256, 1024, True): 2_621_440, (1024, 256, True): 2_621_440, (512, 512, True): 4_194_304,
    (384, 1536, True): 5_898_240, (1000, 600, True): 7_680_000, (96, 4096, True): 3_219_456,
}
DUPLICATED_MEASURED = {(1024, 256): 3_670_016, (256, 1024): 3_670_016, (512, 512): 4_194_304}
"""TensorParallelMuon.step, --muon-tp-mode duplicated, one parameter, at tp 1 and tp 2 alike."""


@pytest.mark.parametrize("shape", sorted(NS_MEASURED), ids=lambda s: f"{s[0]}x{s[1]}-{'fp32' if s[2] else 'bf16'}")
def test_newton_schulz_peak_matches_the_measurement(shape):
    rows, cols, fp32 = shape
    assert int(MU._ns(sp.Integer(rows), sp.Integer(cols), fp32)) == NS_MEASURED[shape]


@pytest.mark.parametrize("shape", sorted(DUPLICATED_MEASURED))
def test_duplicated_step_adds_the_gathered_fp32_matrix(shape):
    rows, cols = shape
    assert 8 * rows * cols + int(MU._ns(sp.Integer(rows), sp.Integer(cols), False)) == DUPLICATED_MEASURED[shape]


def test_llama3_8b_step_scratch_by_hand():
    """Default settings: the largest matrix is fc1, 2f x h = 28672 x 4096 = 117,440,512 elements,
    gathered whole: 8 MN = 939,524,096 B; Newton-Schulz in bf16 max(6 MN, 4 MN + 4 h^2) =
    704,643,072 B; the previous parameter's fp32 result, 4 B x the largest local matrix (fc1 at
    tp 1) = 469,762,048 B. At tp 2 only that last share halves."""
    model = ndplan.load_model("llama3-8b")
    M = model_symbols(model)
    eng = derive("megatron", {"muon_tp_mode": 1})
    expr = MU.muon_step_bytes(model, M, profile(eng))
    mn = 2 * 14336 * 4096
    assert int(expr.subs({S.tp: 1, S.etp: 1})) == 8 * mn + 6 * mn + 4 * mn
    assert int(expr.subs({S.tp: 2, S.etp: 1})) == 8 * mn + 6 * mn + 4 * mn // 2


def test_blockwise_orthogonalises_the_shard():
    """--muon-tp-mode blockwise at tp 4: fc1's shard 7168 x 4096, max(NS, 12 rc) = 12 rc, plus the
    4 B of the largest local matrix."""
    model = ndplan.load_model("llama3-8b")
    eng = profile(derive("megatron", {"muon_tp_mode": 2}))
    rc = 2 * 14336 * 4096 // 4
    assert int(MU.muon_step_bytes(model, model_symbols(model), eng).subs({S.tp: 4, S.etp: 1})) == 12 * rc + 4 * rc


def test_the_reader_sets_the_step_scratch_and_it_reaches_the_peak(tmp_path):
    """Full recompute leaves few activations, so the Muon step is the transient: mem.transient at
    least the step's bytes less the activations."""
    script = tmp_path / "run.sh"
    script.write_text("torchrun --nproc_per_node 1 pretrain_gpt.py --seq-length 1024 --bf16 --micro-batch-size 1 "
                      "--global-batch-size 8 --use-distributed-optimizer --optimizer muon "
                      "--muon-tp-mode blockwise --recompute-granularity full --recompute-method uniform "
                      "--recompute-num-layers 1\n")
    ci = read_config(script, model="llama3-8b")
    eng = profile(ci.strategy.engine)
    assert (eng.muon_tp_mode, eng.muon_ns_fp32, eng.muon_split_qkv) == (2, False, True)
    est = ndplan.estimate(ci.model, ndplan.load_hardware("h100-sxm"), ci.strategy, 1)
    terms = est.per_stage[0]["terms"]
    rc = 2 * 14336 * 4096
    assert terms["mem.transient"] >= 16 * rc - terms["mem.activations"]
    assert any("Newton-Schulz" in n for n in ci.notes)


def test_a_bad_tp_mode_is_one_line(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("torchrun --nproc_per_node 1 pretrain_gpt.py --seq-length 1024 --bf16 --micro-batch-size 1 "
                      "--global-batch-size 8 --optimizer muon --muon-tp-mode sideways\n")
    with pytest.raises(ndplan.NdplanError, match="muon-tp-mode"):
        read_config(script, model="llama3-8b")


def test_a_matrix_tp_does_not_split_is_not_gathered():
    """MLA's q_down (1536 x 7168 on DeepSeek-V3) has no partition_dim: newton_schulz_tp runs plain
    Newton-Schulz on it even under duplicated (no gather): max(NS, 12 MN) = 12 MN, not 8 MN + NS."""
    rows, cols = sp.Integer(1536), sp.Integer(7168)
    assert int(MU.matrix_scratch(rows, cols, "none", sp.Integer(8), MU.DUPLICATED, False)) == 12 * 1536 * 7168
    assert int(MU.matrix_scratch(rows, cols, "rows", sp.Integer(1), MU.DUPLICATED, False)) == \
        8 * 1536 * 7168 + max(6 * 1536 * 7168, 4 * 1536 * 7168 + 4 * 1536 ** 2)
