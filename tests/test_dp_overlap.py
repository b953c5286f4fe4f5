"""Exposed data-parallel time per engine (formulas/dp_comm.py ``_zero012_exposed``, ``_zero3_exposed``),
hand-derived on Llama-3-8B over two ranks of one H100 node.

Parameter counts from the config (h 4096, 32 layers, 32 heads of 128, 8 KV heads, f 14336,
vocab 128256, untied): one layer 2 x 4096^2 + 2 x 4096 x 1024 (q, o, k, v) + 3 x 4096 x 14336
(gate, up, down) + 2 x 4096 (norms) = 218,112,000; the embedding and the output layer
128256 x 4096 = 525,336,576 each; the model 8,030,261,248. A ring collective over two ranks
moves half the buffer: all-gather / reduce-scatter B/2 / (450 GB/s x efficiency) + one
latency, all-reduce twice that (formulas/comm.py; NCCL's busbw convention).

The engines' lines:
DeepSpeed reducing in its communication dtype, bf16 under bf16 (runtime/engine.py:1719-1730); Megatron-LM's gradient buckets of max(40M, 1M x dp) parameters, the last
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
    bucket = 40_000_000  # max(40M, 1M x 2)
    expected = ring(4 * bucket) + ring(2 * bucket)  # fp32 gradients, bf16 weights; whole collectives
    assert dp_comm(strat) == pytest.approx(expected, rel=1e-9)


def test_deepspeed_pipeline_reduces_after_the_last_backward():
    """ZeRO-0 at pp = 2 under DeepSpeed: the head stage's whole fp32 gradient all-reduce, exposed;
    Megatron hides it behind the last micro-batch's backward, up to its last bucket."""
    strat = ndplan.Strategy(dp=2, pp=2, gbs=8, seq=4096, zero=0, engine="deepspeed")
    assert dp_comm(strat) == pytest.approx(2 * ring(2 * HEAD_STAGE), rel=1e-9)  # reduced in bf16
    megatron = dp_comm(dataclasses.replace(strat, engine="megatron"))
    assert megatron == pytest.approx(2 * ring(4 * 40_000_000), rel=1e-9)  # the last fp32 bucket


def test_deepspeed_zero1_without_overlap_comm_exposes_both_collectives():
    """overlap_comm is off below ZeRO-3 by default: the gradients all-reduced in bf16 (DeepSpeed's
    communication_data_type under bf16) and the post-step all-gather of the bf16 weights, both
    exposed; overlap_comm hides the reduction."""
    strat = ndplan.Strategy(dp=2, gbs=2, seq=4096, zero=1, engine="deepspeed")
    assert dp_comm(strat) == pytest.approx(2 * ring(2 * TOTAL) + ring(2 * TOTAL), rel=1e-9)
    overlap = dataclasses.replace(profile("deepspeed"), overlap_grad_reduce=True)
    assert dp_comm(strat, overlap) == pytest.approx(ring(2 * TOTAL), rel=1e-9)


@pytest.mark.parametrize("m", [2, 4])
def test_deepspeed_zero2_reduces_every_micro_batch(m):
    """ZeRO-2 reduces as each backward fills its buckets, on the compute stream by default: m
    all-reduces of the bf16 gradients, and one all-gather of the weights after the step."""
    strat = ndplan.Strategy(dp=2, gbs=2 * m, seq=4096, zero=2, engine="deepspeed")
    assert dp_comm(strat) == pytest.approx(m * 2 * ring(2 * TOTAL) + ring(2 * TOTAL), rel=1e-9)


def test_megatron_later_stages_gather_at_their_first_forward():
    """ZeRO-1 at pp = 4, 1F1B: stage 0's first bucket, then each of the 3 later stages' whole
    bf16 all-gather on the fill (about 0.99 GB each, 2.2 ms over NVLink); the head stage's
    gradients hide behind its last micro-batch's backward but their last bucket."""
    strat = ndplan.Strategy(dp=2, pp=4, gbs=16, seq=4096, zero=1)
    head = 8 * LAYER + 4096 + VOCAB
    bucket = 40_000_000
    expected = ring(4 * bucket) + ring(2 * bucket) + 3 * ring(2 * head)
    assert dp_comm(strat) == pytest.approx(expected, rel=1e-9)
    interleaved = dataclasses.replace(strat, vpp=2, schedule="interleaved")
    assert dp_comm(interleaved) < expected / 2  # dispatched when the interleaved schedule starts


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


def test_deepspeed_communication_data_type_is_read(tmp_path):
    """communication_data_type (runtime/config.py:216-230) sets the bytes on the wire; bf16
    training without it reduces in bf16 (engine.py:1719-1730); a bad value is one line."""
    import json

    from ndplan.interop import read_config
    f = tmp_path / "ds.json"
    doc = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
           "zero_optimization": {"stage": 1}}
    for extra, want in (({}, 2), ({"communication_data_type": "FP32"}, 4)):
        f.write_text(json.dumps(doc | extra))
        eng = profile(read_config(f, model="llama3-8b", gpus=2, seq=4096).strategy.engine)
        assert eng.grad_comm_bytes == want
    f.write_text(json.dumps(doc | {"communication_data_type": "int8"}))
    with pytest.raises(ndplan.NdplanError, match="communication_data_type"):
        read_config(f, model="llama3-8b", gpus=2, seq=4096)


LINEARS = LAYER - 2 * 4096  # q, k, v, o, gate, up, down: the weights torchao's float8 converter swaps


def test_fsdp_float8_all_gather_sends_one_byte_per_linear_weight():
    """torchtitan's enable_fsdp_float8_all_gather (EngineProfile.float8_all_gather): the swapped
    linears' weights are gathered at 1 B, the norms and the embedding at 2 (torchao
    fsdp_utils.py fsdp_pre_all_gather); the fp32 reduce-scatter is unchanged. Exposed: the first
    unit's gather and the last unit's reduce; exposed + hidden: every gather (forward and
    backward) and the reduce-scatter of the whole model."""
    strat = ndplan.Strategy(dp=2, gbs=2, seq=4096, zero=3, engine="fsdp", weight_dtype="fp8")
    eng = dataclasses.replace(profile("fsdp"), float8_all_gather=True)
    unit = VOCAB + LAYER
    assert dp_comm(strat, eng) == pytest.approx(ring(2 * unit - LINEARS) + ring(4 * unit), rel=1e-9)
    est = ndplan.estimate(ndplan.load_model("llama3-8b"), HW, strat, 2, engine=eng)
    every = 2 * ring(2 * TOTAL - 32 * LINEARS) + ring(4 * TOTAL)
    assert est.time_terms["time.dp_comm"] + est.hidden_terms["hidden.dp_comm"] == pytest.approx(every, rel=1e-9)


def all_reduce(nbytes: float) -> float:
    """All-reduce of ``nbytes`` over two ranks: twice a ring's bytes and latencies."""
    return nbytes / LINK + 2 * LAT


@pytest.mark.parametrize("overlap,recompute,layers", [(False, "none", None), (True, "none", None),
                                                     (True, "full", None), (True, "full", 4), (True, "full", 0)])
def test_tp_collectives_are_exposed_or_hidden(overlap, recompute, layers):
    """TP = 2 with SP: 4 all-reduce equivalents of the 2 x s x h-byte activation per layer and
    micro-batch, and 2 more for each layer a full recompute reruns (all 32, or the first
    ``--recompute-layers``), exposed (time.tp_comm, the recompute's in time.recompute) or,
    under overlap_tp_comm, hidden (hidden.tp_comm)."""
    strat = ndplan.Strategy(tp=2, gbs=1, seq=4096, zero=0, recompute=recompute, recompute_layers=layers)
    eng = dataclasses.replace(profile("megatron"), overlap_tp_comm=overlap)
    est = ndplan.estimate(ndplan.load_model("llama3-8b"), HW, strat, 2, engine=eng)
    one = all_reduce(2 * 4096 * 4096)  # per layer
    rerun = 0 if recompute == "none" else (32 if layers is None else layers)
    hidden = (4 * 32 + 2 * rerun) * one
    assert est.hidden_terms["hidden.tp_comm"] == pytest.approx(hidden if overlap else 0.0, rel=1e-9, abs=1e-12)
    assert est.time_terms["time.tp_comm"] == pytest.approx(0.0 if overlap else 4 * 32 * one, rel=1e-9, abs=1e-12)


def test_hidden_dp_leaves_out_the_later_stages_gathers():
    """ZeRO-1 at pp = 4, 1F1B (the case of test_megatron_later_stages_gather_at_their_first_forward):
    time.dp_comm holds the head stage's last bucket, first gather bucket and the three later
    stages' gathers on the fill; hidden.dp_comm is the rest of the head stage's own collectives:
    its fp32 reduce-scatter and bf16 all-gather less the two buckets."""
    strat = ndplan.Strategy(dp=2, pp=4, gbs=16, seq=4096, zero=1)
    est = ndplan.estimate(ndplan.load_model("llama3-8b"), HW, strat, 8)
    head, bucket = 8 * LAYER + 4096 + VOCAB, 40_000_000
    own = ring(4 * head) + ring(2 * head)
    assert est.hidden_terms["hidden.dp_comm"] == pytest.approx(own - ring(4 * bucket) - ring(2 * bucket), rel=1e-9)


def test_cp_ring_is_hidden_under_the_attention_core():
    """CP = 2: per layer and micro-batch, forward K, V and backward K, V, dK, dV of the 2,048 local
    tokens (2 x 8 KV heads x 128 x 2 B per token each pair) cross the one ring step; a 2,048-token
    attention core hides them all."""
    strat = ndplan.Strategy(cp=2, gbs=1, seq=4096, zero=0)
    est = ndplan.estimate(ndplan.load_model("llama3-8b"), HW, strat, 2)
    kv = 2 * 2048 * 2 * 8 * 128
    assert est.time_terms["time.cp_comm"] == 0.0
    assert est.hidden_terms["hidden.cp_comm"] == pytest.approx(32 * 3 * (kv / LINK + LAT), rel=1e-9)


def test_hidden_cp_ring_holds_the_link_the_dp_collectives_hide_on(monkeypatch):
    """CP = 2 and DP = 2 inside one node share NVLink: while the ring hides under the attention
    core, the link is busy, so where the data-parallel collectives are the bottleneck of their
    windows (ZeRO-1 at 512 tokens: the 8B model's fp32 reduce-scatter outlasts a micro-batch's
    backward, the bf16 all-gather its forward) each hidden ring second exposes one more
    data-parallel second. The same expression with the links taken as separate
    (dp_comm._same_link = 0) is the counterfactual; the difference is the whole hidden ring."""
    from ndplan.explain import explain
    from ndplan.formulas import dp_comm as D
    model = ndplan.load_model("llama3-8b")
    strat = ndplan.Strategy(dp=2, cp=2, gbs=2, seq=512, zero=1)
    eng = dataclasses.replace(profile("megatron"), grad_bucket_min_elements=0)  # no bucket floor
    strat = dataclasses.replace(strat, engine="megatron[grad_bucket_min_elements=0]")
    shared = explain(model, strat, hardware=HW, term="time.dp_comm")[0].value
    est = ndplan.estimate(model, HW, strat, 4, engine=eng)
    assert shared == pytest.approx(est.time_terms["time.dp_comm"], rel=1e-9)
    monkeypatch.setattr(D, "_same_link", lambda a, b: 0)
    apart = explain(model, strat, hardware=HW, term="time.dp_comm")[0].value
    assert est.hidden_terms["hidden.cp_comm"] > 0
    assert shared - apart == pytest.approx(est.hidden_terms["hidden.cp_comm"], rel=1e-9)


def test_hidden_tp_across_nodes_holds_the_nics_of_the_dp_group(monkeypatch):
    """With 4 devices per node, tp 8 and its dp 2 both cross nodes: the TP collectives hidden
    under the GEMMs (overlap_tp_comm) hold the NICs the data-parallel collectives hide on. The
    step's DP collectives are the same seconds either way (exposed + hidden is conserved), more
    of them exposed, by at most the hidden TP seconds; the counterfactual has the links apart."""
    from ndplan.explain import explain
    from ndplan.formulas import dp_comm as D
    hw = HW.with_overrides({"devices_per_node": 4})
    model = ndplan.load_model("llama3-8b")
    strat = ndplan.Strategy(tp=8, dp=2, gbs=2, seq=512, zero=1,
                            engine="megatron[grad_bucket_min_elements=0,overlap_tp_comm=1]")

    def dp():
        got = {e.key: e.value for e in explain(model, strat, hardware=hw)}
        return got["time.dp_comm"], got["hidden.dp_comm"], got["hidden.tp_comm"]
    shared, shared_hidden, tp_hidden = dp()
    monkeypatch.setattr(D, "_same_link", lambda a, b: 0)
    apart, apart_hidden, _ = dp()
    assert shared > apart and shared - apart <= tp_hidden
    assert shared + shared_hidden == pytest.approx(apart + apart_hidden, rel=1e-9)


def test_a_full_recompute_exposes_no_more_data_parallel_time():
    """The backward window is B + W with or without a recompute, and the TP collectives the
    recompute reruns (hidden under overlap_tp_comm) are not charged to it: turning full
    recompute on never exposes more data-parallel time."""
    model = ndplan.load_model("llama3-8b")
    eng = "megatron[overlap_tp_comm=1]"
    for seq in (256, 1024):
        dp = [ndplan.estimate(model, HW, ndplan.Strategy(tp=2, dp=4, gbs=4, seq=seq, zero=1, recompute=rc, engine=eng),
                              8).time_terms["time.dp_comm"] for rc in ("none", "full")]
        assert dp[1] <= dp[0], (seq, dp)
