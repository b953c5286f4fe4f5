"""Megatron-FSDP (``--use-megatron-fsdp --data-parallel-sharding-strategy ...``): what it allocates,
derived here by hand from its source and compared with ndplan's memory Terms.

Source: NVIDIA/Megatron-LM@d98e8a64, files under megatron/core/distributed/fsdp/src/megatron_fsdp/
(pgb = param_and_grad_buffer.py, mf = megatron_fsdp.py), megatron/training/arguments.py (A) and
training.py. The fixture imitates examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh: llama3-8b
on 8 H100s, dp 8, tp 1, micro-batch 1, bf16.

llama3-8b sizes (tests/test_mechanisms.py test_fp8_weight_cache): one decoder layer, the FSDP unit,
holds q, o 2 x 4096^2 + k, v 2 x 4096 x 1024 + gate, up, down 3 x 4096 x 14336 + 2 norms of 4096 =
218,112,000 parameters; the embedding and the untied output layer 128,256 x 4,096 each; the final
norm 4,096.

Per sharding strategy, from pgb:2330-2348 (which buffers are distributed over the dp*cp group),
pgb:2651-2733 (which exist, in which dtype) and the defaults (A:3687-3698, mapped at A:1077-1093;
mixed_precision.py:382-395: main weights fp32, main gradients the parameters' dtype, bf16 here):

| strategy           | model weights (bf16)        | main weights (fp32) | main grads (bf16) | Adam (2 x fp32) |
|--------------------|-----------------------------|---------------------|-------------------|-----------------|
| no_shard           | the module's own, unsharded | unsharded           | unsharded         | unsharded       |
| optim              | buffer, unsharded           | sharded             | unsharded         | sharded         |
| optim_grads        | buffer, unsharded           | sharded             | sharded           | sharded         |
| optim_grads_params | buffer, sharded, + the      | sharded             | sharded           | sharded         |
|                    | embedding and output layer  |                     |                   |                 |
|                    | kept gathered (not units)   |                     |                   |                 |

The optimizer keeps its states on the main weights (pgb:3224-3293: sharded for every strategy but
no_shard). Transient: at optim_grads_params the running unit and the units prefetched until
comm_unit // 2 elements are in flight (pgb:4487-4514, mf:420-444); at optim_grads and
optim_grads_params every gradient goes through an unsharded bucket kept in the reduce-scatter
queue (pgb:3094-3118, 3924-3954, 4231-4250); at the optimizer step the main gradients are cast to
fp32 (pgb:3376-3381). Each is simulated below from those lines.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import sympy as sp

import ndplan
from ndplan import symbols as S
from ndplan.estimate import strategy_point
from ndplan.formulas import activations as A
from ndplan.formulas import megatron_fsdp as MF
from ndplan.formulas.local import act_context
from ndplan.interop import read_config
from ndplan.structure import structure
from ndplan.symbols import model_symbols

FIXTURE = Path(__file__).parent / "data" / "recipes" / "megatron_llama3_8b_fsdp.sh"
H100 = ndplan.load_hardware("h100-sxm")
LAYER = 218_112_000
VOCAB = 128_256 * 4_096
NORM = 4_096
LAYERS = 32
P = LAYERS * LAYER + 2 * VOCAB + NORM
DP = 8
LOGIT_BYTES = 6
"""The megatron engine's loss transient per logit (bf16 logits and the fp32 softmax the fused
cross entropy saves, core/tensor_parallel/cross_entropy.py): an input here, not Megatron-FSDP's."""
STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")


@pytest.fixture
def env(monkeypatch):
    for name in ("SHARDING_STRATEGY", "USE_MEGATRON_FSDP"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def run(tmp_path, env, strategy="optim_grads_params", extra="", seq=8192, tp=1, recompute=False, gpus=None):
    """(CheckInput, per-stage rows) of the fixture under ``strategy`` with ``extra`` flags."""
    env.setenv("SHARDING_STRATEGY", strategy)
    text = FIXTURE.read_text()
    edits = {"--ckpt-format fsdp_dtensor": "--ckpt-format fsdp_dtensor " + extra,
             "--seq-length 8192": f"--seq-length {seq}", "--tensor-model-parallel-size 1": f"--tensor-model-parallel-size {tp}"}
    if recompute:
        edits["--micro-batch-size 1"] = "--micro-batch-size 1 --recompute-granularity full --recompute-method uniform"
    for old, new in edits.items():
        assert old in text
        text = text.replace(old, new)
    f = tmp_path / FIXTURE.name
    f.write_text(text)
    ci = read_config(f, gpus=gpus or (DP * tp if tp > 1 else None))
    return ci, ndplan.estimate(ci.model, H100, ci.strategy).per_stage


def padded_vocab(tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of --make-vocab-size-divisible-by (128) x tp
    (megatron/training/vocab_utils.py:58-59): 128,256 at tp 1 and 2, 129,024 at tp 8."""
    multiple = 128 * tp
    return math.ceil(128_256 / multiple) * multiple


def value(expr, strat, stage=0) -> float:
    v = sp.sympify(expr).xreplace(strategy_point(strat, stage) | {S.stage: stage})
    assert v.is_Number, v
    return float(v)


def layer_activation(ci, mode: str) -> int:
    """ndplan's stored bytes of one llama3-8b layer for one micro-batch (an input of the phases
    below; its own tests hold it to Korthikanti et al. and traces)."""
    spec = ci.model
    return int(value(A.layer_activation(spec, model_symbols(spec), act_context(spec, ci.strategy), "dense", mode),
                     ci.strategy))


# ----------------------------------------------------------------------------- the mechanisms, simulated

def comm_unit(strategy: str, unit: int, given=None, dp=DP) -> int:
    """suggested_communication_unit_size (mf:420-441): the flag, else max(1e9, 2 x the average
    unit) at optim_grads_params, else max(1e9, the DDP bucket or 1e9), the bucket being
    max(4e7, 1e6 x dp*cp) with --overlap-grad-reduce (training.py:2179-2194)."""
    if given is not None:
        return given
    if strategy == "optim_grads_params":
        return max(1_000_000_000, unit * 2)
    return max(1_000_000_000, max(40_000_000, 1_000_000 * dp))


def gathered_units(unit: int, cap: int, layers: int = LAYERS, double_buffer=False) -> int:
    """AllGatherPipeline.all_gather_params (pgb:4487-4514): from the running unit, add the next
    unit while the added elements are below comm_unit // 2 (mf:444); with double buffering stop
    at two units (need_skip_prefetch, pgb:4475-4484)."""
    limit, added, units = cap // 2, 0, 1
    while units < layers:
        if added >= limit or (double_buffer and units == 2):
            break
        added += unit
        units += 1
    return units


def backward_buckets(head: int, unit: int, layers: int, emb: int, cap: int, g: int, freed: int) -> int:
    """GradReducePipeline over one backward: the output layer's bucket, the final norm's, then each
    layer's, then the embedding's. A bucket is allocated at its first gradient (the main_grad getter,
    pgb:3094-3118); before a complete bucket group is reduce-scattered the queue is popped from the
    front while it holds more than ``cap`` elements (pgb:3936-3948), and the group is appended; a
    popped bucket is freed (pgb:4231-4250). Returns the largest bytes of buckets alive less the
    activations freed (``freed`` per finished layer), while a layer or the embedding runs."""
    queue, phases = [], []

    def reduce(size):
        while sum(queue) > cap:
            queue.pop(0)
        queue.append(size)

    if head:
        reduce(head)
        reduce(NORM)
    for j in range(layers):
        phases.append(g * (sum(queue) + unit) - j * freed)
        reduce(unit)
    if emb:
        phases.append(g * (sum(queue) + emb) - layers * freed)
    return max(phases)


# ----------------------------------------------------------------------------- states per strategy

@pytest.mark.parametrize("strategy", STRATEGIES)
def test_states_per_sharding_strategy(tmp_path, env, strategy):
    """The persistent buffers of the table above: bf16 model weights (2 B), fp32 main weights
    (4 B), bf16 main gradients (2 B), Adam's two fp32 moments on the main weights (8 B), each
    unsharded or over the 8 data-parallel ranks; at optim_grads_params a 16-bit copy of the
    embedding and the output layer beside their shards, gathered by their forward pre-hooks and
    never released (mf:1086-1099 registers no post-forward release for non-units; pgb:4636-4641,
    4364-4367)."""
    ci, rows = run(tmp_path, env, strategy)
    t = rows[0]["terms"]
    zero = STRATEGIES.index(strategy)
    assert ci.strategy.zero == zero and "megatron_fsdp=1" in ci.strategy.engine
    shard = lambda level: P // DP if zero >= level else P  # noqa: E731
    assert P % DP == 0
    kept = 2 * 2 * VOCAB if zero == 3 else 0
    assert t["mem.weights"] == 2 * shard(3) + kept
    assert t["mem.master"] == 4 * shard(1)
    assert t["mem.grads"] == 2 * shard(2)
    assert t["mem.optimizer"] == 8 * shard(1)


# ----------------------------------------------------------------------------- gather and the loss

@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gather_and_transient_at_8k(tmp_path, env, strategy):
    """At optim_grads_params 1 + ceil(5e8 / 218,112,000) = 4 units are gathered in bf16 (comm unit
    max(1e9, 2 x 218,112,000) = 1e9, half of it prefetched), none below. At the loss no unit is
    gathered (each is released after its forward, mf:977-998), so the loss phase is the logits
    less those units; the first layer's backward holds the output layer's, the final norm's and its
    own gradient buckets (optim_grads and optim_grads_params); the optimizer step's fp32 copy of the
    main gradients (4 B per optimizer parameter, pgb:3376-3381) comes after the activations are
    freed. At seq 8192 the logits decide."""
    ci, rows = run(tmp_path, env, strategy)
    t = rows[0]["terms"]
    zero = STRATEGIES.index(strategy)
    cap = comm_unit(strategy, LAYER)
    units = gathered_units(LAYER, cap)
    assert (cap, units) == (1_000_000_000, 4)
    gather = 2 * units * LAYER if zero == 3 else 0
    assert t.get("mem.zero3_gather", 0) == gather
    logits = LOGIT_BYTES * 8192 * 128_256
    a = layer_activation(ci, "none")
    phases = [max(logits - gather, 0)]
    if zero >= 2:
        phases.append(backward_buckets(VOCAB, LAYER, LAYERS, VOCAB, cap, 2, a))
    opt = P if zero == 0 else P // DP
    regather = 2 * (units - 1) * LAYER if zero == 3 else 0  # start_param_sync from the embedding (mf:1302-1308)
    phases.append(4 * opt + regather - t["mem.activations"] - gather)
    assert max(phases) == phases[0] == logits - gather
    assert t["mem.transient"] == pytest.approx(max(phases), abs=2 * NORM)


# ----------------------------------------------------------------------------- the reduce-scatter queue

CASES = {  # name: (strategy, tp, seq, full recompute, --suggested-communication-unit-size)
    "zero3-8k": ("optim_grads_params", 1, 8192, False, None),
    "zero3-2k": ("optim_grads_params", 1, 2048, False, None),
    "zero3-8k-full": ("optim_grads_params", 1, 8192, True, None),
    "zero3-tp8-full": ("optim_grads_params", 8, 8192, True, None),
    "zero3-unit-4e8-full": ("optim_grads_params", 1, 8192, True, 400_000_000),
    "zero2-2k": ("optim_grads", 1, 2048, False, None),
    "zero2-tp2-full": ("optim_grads", 2, 4096, True, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_buckets_follow_the_queue(tmp_path, env, name):
    """formulas/megatron_fsdp.grad_phase against the queue simulated above (backward_buckets),
    with per-device sizes: a unit of 218,103,808 / tp + 8,192 (the norms are not split), the
    padded vocabulary matrices / tp; dp stays 8. ndplan leaves the final norm's 4,096-element
    bucket out."""
    strategy, tp, seq, full, given = CASES[name]
    extra = f"--suggested-communication-unit-size {given}" if given else ""
    ci, rows = run(tmp_path, env, strategy, extra=extra, seq=seq, tp=tp, recompute=full)
    unit, vocab = 218_103_808 // tp + 8_192, padded_vocab(tp) * 4_096 // tp
    assert ci.strategy.dp == DP
    cap = comm_unit(strategy, unit, given)
    a = layer_activation(ci, "full" if full else "none")
    want = backward_buckets(vocab, unit, LAYERS, vocab, cap, 2, a)
    got = value(MF.grad_phase(ci.model, model_symbols(ci.model), structure(ci.model, ci.strategy)), ci.strategy)
    assert got == pytest.approx(want, abs=2 * NORM)
    # the transient Term: the loss, or the backward (the rebuilt layer beside the buckets), or the
    # optimizer step (the fp32 copy of the sharded bf16 main gradients and, at optim_grads_params,
    # the units start_param_sync gathers again from the embedding, mf:1302-1308)
    t = rows[0]["terms"]
    units = gathered_units(unit, cap) if strategy == "optim_grads_params" else 0
    gather = 2 * units * unit
    assert t.get("mem.zero3_gather", 0) == gather
    rebuild = layer_activation(ci, "none") if full else 0
    logits = LOGIT_BYTES * seq * padded_vocab(tp) // tp
    local = LAYERS * unit + 2 * vocab + NORM  # parameters on one device
    step = 4 * local / DP + 2 * max(units - 1, 0) * unit
    phases = [max(logits - gather, 0), rebuild + want, step - t["mem.activations"] - gather]
    assert t["mem.transient"] == pytest.approx(max(phases), abs=2 * 2 * NORM)


def test_pipeline_stages_hold_their_own_buckets(tmp_path, env):
    """pp 2: stage 0 holds 16 layers and the embedding (its backward ends with the embedding's
    bucket), stage 1 the 16 others and the output layer (its backward starts with it)."""
    ci, rows = run(tmp_path, env, "optim_grads_params", extra="--pipeline-model-parallel-size 2", seq=2048,
                   recompute=True, gpus=16)
    assert (ci.strategy.pp, ci.strategy.dp) == (2, 8)
    a = layer_activation(ci, "full")
    M = model_symbols(ci.model)
    for stage, (head, emb) in enumerate(((0, VOCAB), (VOCAB, 0))):
        want = backward_buckets(head, LAYER, LAYERS // 2, emb, 1_000_000_000, 2, a)
        got = value(MF.grad_phase(ci.model, M, structure(ci.model, ci.strategy), stage), ci.strategy, stage)
        assert got == pytest.approx(want, abs=2 * NORM), stage
    # each stage keeps its own vocabulary matrix gathered, beside its shard
    kept = [rows[s]["terms"]["mem.weights"] - 2 * (16 * LAYER + VOCAB + NORM * s) // DP for s in (0, 1)]
    assert kept == [2 * VOCAB, 2 * VOCAB]


# ----------------------------------------------------------------------------- flags

def test_double_buffer_pools(tmp_path, env):
    """--use-nccl-ub sets --fsdp-double-buffer (A:1172-1177): FixedPoolAllocator pools of two units
    for the weights and for the gradients (pgb:2519-2576, UB_BUFFER_NUM = 2), kept in the global
    memory buffer for the run (pgb:855-857), so the gathered units do not leave before the loss;
    the queue keeps at most two units (pgb:3956-3978, where the non-unit buckets count as one
    more unit), so the output layer's bucket lives through the last layer's backward only and the
    backward adds it alone (2 B x 128,256 x 4,096)."""
    ci, rows = run(tmp_path, env, "optim_grads_params", extra="--use-nccl-ub")
    t = rows[0]["terms"]
    assert "megatron_fsdp_double_buffer=1" in ci.strategy.engine
    assert any("double buffers" in n for n in ci.notes)
    assert t["mem.zero3_gather"] == 2 * 2 * LAYER + 2 * 2 * LAYER
    logits = LOGIT_BYTES * 8192 * 128_256
    assert t["mem.transient"] == max(logits, 2 * VOCAB)
    ci, rows = run(tmp_path, env, "optim_grads", extra="--fsdp-double-buffer")
    assert rows[0]["terms"]["mem.zero3_gather"] == 2 * 2 * LAYER  # the gradient pool only


def test_fp8_param_gather_gathers_fp8_units(tmp_path, env):
    """--fp8-param-gather: the units' linear weights are Float8Tensors, their bucket dtype uint8
    (pgb:2632), so 4 units at 1 B each (the prefetch counts elements, pgb:4497-4503), and the running
    unit's transpose made in backward (mf:497-498; released with the unit unless
    --keep-fp8-transpose-cache). The embedding and output layer stay bf16 (states.FP8_VOCAB_BYTES)
    and kept gathered. The layers' norms are counted at 1 B with their layer, as ndplan does."""
    ci, rows = run(tmp_path, env, "optim_grads_params", extra="--fp8-format hybrid --fp8-param-gather")
    t = rows[0]["terms"]
    assert ci.strategy.weight_dtype == "fp8"
    assert t["mem.zero3_gather"] == 4 * LAYER + LAYER
    assert t["mem.weights"] == (LAYERS * LAYER + NORM) // DP + 2 * 2 * VOCAB // DP + 2 * 2 * VOCAB


def test_communication_unit_flag(tmp_path, env):
    """--suggested-communication-unit-size 400000000 (no max then, mf:420-421): prefetch 2e8
    elements, one unit ahead (1 + ceil(2e8 / 218,112,000) = 2 gathered)."""
    ci, rows = run(tmp_path, env, "optim_grads_params", extra="--suggested-communication-unit-size 400000000")
    assert gathered_units(LAYER, 400_000_000) == 2
    assert rows[0]["terms"]["mem.zero3_gather"] == 2 * 2 * LAYER


@pytest.mark.parametrize("dtype,master", [("fp32", 4), ("bf16", 2), ("auto", 0)])
def test_main_params_dtype(tmp_path, env, dtype, master):
    """--megatron-fsdp-main-params-dtype: the main weight buffer's dtype (pgb:2689-2705); auto maps
    to None (A:1091), and then no main weight buffer exists. With bf16 main weights and bf16 main
    gradients the optimizer step casts nothing (pgb:3376-3381); at optim and seq 512 with full
    recompute the fp32 cast is the transient's largest phase."""
    ci, rows = run(tmp_path, env, "optim", extra=f"--megatron-fsdp-main-params-dtype {dtype}", seq=512,
                   recompute=True)
    t = rows[0]["terms"]
    assert t["mem.master"] == master * P // DP
    logits = LOGIT_BYTES * 512 * 128_256
    rebuild = layer_activation(ci, "none")
    cast = 4 * P // DP - t["mem.activations"] if master == 4 else 0
    assert t["mem.transient"] == max(logits, rebuild, cast)
    if master == 4:
        assert cast > logits


def test_fp32_main_gradients_with_bf16_communication(tmp_path, env):
    """--megatron-fsdp-main-grads-dtype fp32 --megatron-fsdp-grad-comm-dtype bf16 at optim_grads:
    the sharded main gradients in fp32 (4 B, pgb:2313-2318), the unsharded buckets fetched in the
    communication dtype (pgb:3107-3111, 2 B), and no cast at the optimizer step (fp32 main
    gradients on fp32 main weights, pgb:3377-3381). At seq 2048 the queue of buckets is the
    transient's largest phase."""
    ci, rows = run(tmp_path, env, "optim_grads", seq=2048,
                   extra="--megatron-fsdp-main-grads-dtype fp32 --megatron-fsdp-grad-comm-dtype bf16")
    t = rows[0]["terms"]
    assert ci.strategy.grad_dtype == "fp32"
    assert t["mem.grads"] == 4 * P // DP
    want = backward_buckets(VOCAB, LAYER, LAYERS, VOCAB, 1_000_000_000, 2, layer_activation(ci, "none"))
    logits = LOGIT_BYTES * 2048 * 128_256
    assert want > logits
    assert t["mem.transient"] == pytest.approx(want, abs=2 * NORM)


def test_one_rank_shards_nothing(tmp_path, env):
    """On one data-parallel rank no buffer is distributed (``... and dp_group.size() > 1``,
    pgb:2656-2657, 2718): no gathered copies, no buckets; the weights are the whole model."""
    ci, rows = run(tmp_path, env, "optim_grads_params", gpus=1)
    t = rows[0]["terms"]
    assert ci.strategy.dp == 1
    assert t["mem.weights"] == 2 * P and t.get("mem.zero3_gather", 0) == 0
    assert t["mem.transient"] == LOGIT_BYTES * 8192 * 128_256


def test_flags_not_modelled_are_said(tmp_path, env):
    ci, _ = run(tmp_path, env, "optim_grads_params", extra="--num-distributed-optimizer-instances 2 "
                "--megatron-fsdp-version 2 --keep-fp8-transpose-cache")
    notes = " ".join(ci.notes)
    assert "hybrid FSDP" in notes and "v1" in notes and "--keep-fp8-transpose-cache" in notes


# ----------------------------------------------------------------------------- emit and check

@pytest.mark.parametrize("strategy", STRATEGIES)
def test_emit_reads_back_as_megatron_fsdp(tmp_path, env, strategy):
    """The Megatron emit of a Megatron-FSDP strategy writes --use-megatron-fsdp with its sharding
    strategy (and the fsdp_dtensor checkpoint format it asserts, A:1169-1170), never
    --use-torch-fsdp2, and reads back as the same strategy and engine."""
    from ndplan.export import emit
    ci, _ = run(tmp_path, env, strategy, extra="--fsdp-double-buffer --megatron-fsdp-main-params-dtype bf16")
    text = emit("megatron", ci.model, ci.strategy)
    assert "--use-megatron-fsdp" in text and f"--data-parallel-sharding-strategy {strategy}" in text
    assert "--use-torch-fsdp2" not in text and "--ckpt-format fsdp_dtensor" in text
    f = tmp_path / "emitted.sh"
    f.write_text(text)
    back = read_config(f, model=ci.model, gpus=DP)
    assert back.strategy == ci.strategy


def test_check_proposal_keeps_megatron_fsdp(tmp_path, env):
    """A proposal that changes the sharding level edits the strategy flag and keeps
    --use-megatron-fsdp (interop/megatron.py follow_up); one that leaves it does not touch it."""
    import dataclasses
    from ndplan.check import file_diff
    ci, _ = run(tmp_path, env, "optim")
    diff, text = file_diff(ci, dataclasses.replace(ci.strategy, zero=3))
    assert "+" in diff and "--data-parallel-sharding-strategy optim_grads_params" in diff
    assert "--use-megatron-fsdp" in text and "--use-torch-fsdp2" not in text
    diff, _ = file_diff(ci, dataclasses.replace(ci.strategy, recompute="full"))
    assert "--data-parallel-sharding-strategy" not in diff
