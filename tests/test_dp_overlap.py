"""Exposed data-parallel time per engine (formulas/step.py ``_zero012_exposed``, ``_zero3_exposed``),
hand-derived on Llama-3-8B over two ranks of one H100 node.

Parameter counts from the config (h 4096, 32 layers, 32 heads of 128, 8 KV heads, f 14336,
vocab 128256, untied): one layer 2 x 4096^2 + 2 x 4096 x 1024 (q, o, k, v) + 3 x 4096 x 14336
(gate, up, down) + 2 x 4096 (norms) = 218,112,000; the embedding and the output layer
128256 x 4096 = 525,336,576 each; the model 8,030,261,248. A ring collective over two ranks
moves half the buffer: all-gather / reduce-scatter B/2 / (450 GB/s x efficiency) + one
latency, all-reduce twice that (formulas/comm.py; NCCL's busbw convention).

The engines' lines: Megatron-LM's gradient buckets of max(40M, 1M x dp) parameters, the last
one (first layers, embedding) launched when backward ends (training.py:2179-2194,
param_and_grad_buffer.py:959, 787-832); DeepSpeed's PipelineEngine reducing after the last
backward (pipe/schedule.py:238-241); FSDP2's first all-gather and last reduce-scatter waited
outside compute (_fsdp_state.py:146-154, _fsdp_param_group.py:763-766); torch.distributed
.pipelining reducing once per step (stage.py:1164-1191).
"""

import dataclasses

import pytest

import ndplan
from ndplan.engines import profile

LAYER = 218_112_000
VOCAB = 128_256 * 4096
TOTAL = 8_030_261_248
HEAD_STAGE = 16 * LAYER + 4096 + VOCAB  # pp = 2: layers 16-31, the final norm, the output layer
HW = ndplan.load_hardware("h100-sxm")
LINK = HW.intra_node_gb_per_s * 1e9 * HW.intra_node_efficiency
LAT = HW.intra_node_latency_us * 1e-6


def ring(nbytes: float) -> float:
    """All-gather or reduce-scatter of ``nbytes`` over two ranks."""
    return nbytes / 2 / LINK + LAT


def dp_comm(strat, engine=None) -> float:
    model = ndplan.load_model("llama3-8b")
    return ndplan.estimate(model, HW, strat, strat.dp * strat.pp, engine=engine).time_terms["time.dp_comm"]


def test_megatron_exposes_the_last_gradient_and_first_gather_bucket():
    """ZeRO-1, overlap on: one micro-batch's backward (about 0.2 s) hides the 45 ms reduce-scatter,
    but not its last 40M-parameter bucket, nor the all-gather's first."""
    strat = ndplan.Strategy(dp=2, gbs=2, seq=4096, zero=1)
    share = 40_000_000 / TOTAL
    expected = share * (ring(4 * TOTAL) + ring(2 * TOTAL))  # fp32 gradients, bf16 weights
    assert dp_comm(strat) == pytest.approx(expected, rel=1e-9)


def test_deepspeed_pipeline_reduces_after_the_last_backward():
    """ZeRO-0 at pp = 2 under DeepSpeed: the head stage's whole fp32 gradient all-reduce, exposed;
    Megatron hides it behind the last micro-batch's backward, up to its last bucket."""
    strat = ndplan.Strategy(dp=2, pp=2, gbs=8, seq=4096, zero=0, engine="deepspeed")
    assert dp_comm(strat) == pytest.approx(2 * ring(4 * HEAD_STAGE), rel=1e-9)
    megatron = dp_comm(dataclasses.replace(strat, engine="megatron"))
    assert megatron == pytest.approx(40_000_000 / HEAD_STAGE * 2 * ring(4 * HEAD_STAGE), rel=1e-9)


def test_deepspeed_zero1_without_overlap_comm_exposes_both_collectives():
    """overlap_comm is off below ZeRO-3 by default: the all-reduced fp32 gradients and the
    post-step all-gather of the bf16 weights, both exposed; overlap_comm hides the reduction."""
    strat = ndplan.Strategy(dp=2, gbs=2, seq=4096, zero=1, engine="deepspeed")
    assert dp_comm(strat) == pytest.approx(2 * ring(4 * TOTAL) + ring(2 * TOTAL), rel=1e-9)
    overlap = dataclasses.replace(profile("deepspeed"), overlap_grad_reduce=True)
    assert dp_comm(strat, overlap) == pytest.approx(ring(2 * TOTAL), rel=1e-9)


@pytest.mark.parametrize("m", [1, 4])
def test_fsdp_exposes_the_first_unit_gather_and_last_unit_reduce_per_micro_batch(m):
    """ZeRO-3: per micro-batch the embedding's and the first layer's all-gather (bf16) and their
    fp32 reduce-scatter; everything else hides under a 4096-token layer's compute."""
    strat = ndplan.Strategy(dp=2, gbs=2 * m, seq=4096, zero=3, engine="fsdp")
    unit = VOCAB + LAYER
    assert dp_comm(strat) == pytest.approx(m * (ring(2 * unit) + ring(4 * unit)), rel=1e-9)


@pytest.mark.parametrize("m", [2, 8])
def test_fsdp_under_pipelining_gathers_once_and_reduces_after_the_last_backward(m):
    """torchtitan with pp = 2: the stage stays unsharded through its micro-batches, so the step
    pays one first-layer gather and the head stage's whole fp32 reduce-scatter, whatever m."""
    strat = ndplan.Strategy(dp=2, pp=2, gbs=2 * m, seq=4096, zero=3, engine="fsdp")
    assert dp_comm(strat) == pytest.approx(ring(2 * LAYER) + ring(4 * HEAD_STAGE), rel=1e-9)
