"""Property tests (hypothesis) over random strategies on a few catalog models.

(a) the compiled numpy kernel equals exact SymPy substitution for every term and stage;
(b) every term is >= 0 and peak >= static on every stage;
(c) monotonicity invariants in tp, pp and dp (each stated in its test's docstring);
(d) Strategy.check accepts exactly the strategies that satisfy the divisibility rules.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import ndplan
from tests.helpers import runnable
from ndplan import symbols as S
from ndplan.errors import NdplanError
from ndplan.formulas.memory import STATIC_KEYS
from ndplan.strategy import ENGINES

MODELS = ["llama3-8b", "mixtral-8x7b", "deepseek-v2-lite", "megatron-gpt-22b"]
_SPECS = {}
HW = ndplan.load_hardware("h100-sxm")

FAST = settings(max_examples=10, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def spec_of(name):
    if name not in _SPECS:
        _SPECS[name] = ndplan.load_model(name)
    return _SPECS[name]


def _divisors(n, cap):
    return [x for x in range(1, cap + 1) if n % x == 0]


def _compositions(draw, total, parts):
    """Random split of ``total`` layers into ``parts`` non-negative counts."""
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=parts - 1, max_size=parts - 1)))
    bounds = [0] + cuts + [total]
    return tuple(bounds[i + 1] - bounds[i] for i in range(parts))


@st.composite
def valid_strategies(draw, spec, allow_uneven=True, allow_tuple=True,
                     schedules=("1f1b", "gpipe", "zb-h1", "interleaved", "zbv")):
    """Strategies valid for ``spec`` by construction (checked with Strategy.check)."""
    a, kv, L = spec.num_attention_heads, spec.num_key_value_heads, spec.num_hidden_layers
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if a % t == 0 and (spec.is_mla or kv % t == 0)]))
    schedule = draw(st.sampled_from(schedules))
    vpp = {"interleaved": draw(st.sampled_from([2, 3, 4])), "zbv": 2}.get(schedule, 1)
    uneven = allow_uneven and draw(st.integers(0, 3)) == 0
    if uneven:
        pp = draw(st.sampled_from([p for p in (1, 2, 3, 4) if p * vpp <= L and (vpp == 1 or p > 1)]))
        lps = _compositions(draw, L, pp * vpp)
    else:
        pps = [p for p in _divisors(L, 8) if L % (p * vpp) == 0 and (vpp == 1 or p > 1)]  # vpp > 1 needs pp > 1
        assume(pps)
        pp = draw(st.sampled_from(pps))
        lps = None
    cp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 4]))
    mbs = draw(st.sampled_from([1, 2]))
    m = draw(st.integers(1, 12))
    if schedule == "interleaved" and pp > 1:
        m = pp * -(-m // pp)  # Megatron's interleaved schedule: m a multiple of pp
    seq = draw(st.sampled_from([512, 2048, 4096]))
    ep = etp = 1
    if spec.is_moe:
        ranks = dp * cp * tp
        ep = draw(st.sampled_from([e for e in _divisors(spec.num_experts, 64) if ranks % e == 0]))
        etp = draw(st.sampled_from([x for x in (1, 2, 4) if ranks % (ep * x) == 0]))
    recompute = draw(st.sampled_from(["none", "selective", "full"]))
    rec_layers = None
    if recompute != "none" and draw(st.booleans()):
        chunk_max = (L // (pp * vpp)) if lps is None else max(lps)
        if allow_tuple and draw(st.booleans()):
            rec_layers = tuple(draw(st.lists(st.integers(0, chunk_max), min_size=pp, max_size=pp)))
        else:
            rec_layers = draw(st.integers(0, chunk_max))
    zero, sp = draw(st.integers(0, 3)), draw(st.booleans())
    engine = draw(st.sampled_from(ENGINES))
    engine, zero, sp = runnable(engine, pp, schedule, tp, zero, sp, m=m, moe=spec.is_moe, dp=dp, ep=ep)
    strat = ndplan.Strategy(
        dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs, gbs=dp * mbs * m, seq=seq,
        zero=zero, sp=sp, recompute=recompute, recompute_layers=rec_layers,
        schedule=schedule, engine=engine, flash_attention=draw(st.booleans()),
        layers_per_stage=lps, grad_dtype=draw(st.sampled_from(["fp32", "bf16"])),
        weight_dtype=draw(st.sampled_from(["auto", "fp32", "bf16", "fp8"])),
        offload_optimizer=draw(st.booleans()))
    strat.check(spec, strat.world)
    return strat


def point_of(strat, stage: int) -> dict:
    """Strategy symbol values by name, written from the Strategy fields (stage excluded;
    nrec is the count of ``stage`` when recompute_layers is given per stage)."""
    rl = strat.recompute_layers
    nrec = 0 if rl is None else (rl[stage] if isinstance(rl, tuple) else rl)
    return {"dp": strat.dp, "tp": strat.tp, "pp": strat.pp, "vpp": strat.vpp, "cp": strat.cp,
            "ep": strat.ep, "etp": strat.etp, "mbs": strat.mbs, "m": strat.gbs // (strat.dp * strat.mbs),
            "seq": strat.seq, "nrec": nrec, **_ends(strat)}


def _ends(strat) -> dict:
    """first_layers/last_layers: stage 0's and the last stage's layers of an uneven split at vpp 1
    (the only kernels that read them), else 0."""
    lps = strat.layers_per_stage
    first, last = (lps[0], lps[-1]) if lps and strat.vpp == 1 else (0, 0)
    return {"first_layers": first, "last_layers": last}


# ------------------------------------------------------------------------- (a)

@pytest.mark.parametrize("name", MODELS)
@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_kernel_equals_subs(name, data):
    """Every term of every stage: compiled kernel == float(expr.subs(point)), rel 1e-9."""
    spec = spec_of(name)
    strat = data.draw(valid_strategies(spec))
    for i in range(strat.pp):
        point = point_of(strat, i)
        sym_point = {S.BY_NAME[k]: v for k, v in point.items()}
        if strat.layers_per_stage is None:
            bd = ndplan.stage_breakdown(spec, strat)  # symbolic stage where possible
        else:
            bd = ndplan.stage_breakdown(spec, strat, i)
        out = ndplan.compile_breakdown(bd)(**point, stage=i)
        for term in bd:
            exact = term.expr.subs(sym_point).subs({S.stage: i})
            assert not getattr(exact, "free_symbols", set()), (term.key, exact)
            got = float(out[term.key])
            want = float(exact)
            assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9), (
                f"{name} stage {i} {term.key}: kernel {got!r} != subs {want!r} for {strat}")


# ------------------------------------------------------------------------- (b)

@pytest.mark.parametrize("name", MODELS)
@FAST
@given(data=st.data())
def test_peak_at_least_static(name, data):
    """Terms are non-negative, so peak >= static and dynamic >= 0 on every stage (an
    uneven split may leave a middle stage with no layers and static 0); peak is the
    sum of the terms and Estimate.peak_bytes the max over stages."""
    spec = spec_of(name)
    strat = data.draw(valid_strategies(spec))
    est = ndplan.estimate(spec, HW, strat, strat.world)
    assert [r["stage"] for r in est.per_stage] == list(range(strat.pp))
    for row in est.per_stage:
        assert all(v >= 0 for v in row["terms"].values()), row["terms"]
        assert row["peak_bytes"] >= row["static_bytes"] >= 0
        assert row["dynamic_bytes"] == row["peak_bytes"] - row["static_bytes"] >= 0
        assert row["peak_bytes"] == sum(row["terms"].values())
    assert est.per_stage[0]["static_bytes"] > 0, "stage 0 holds the embedding"
    assert est.peak_bytes == max(r["peak_bytes"] for r in est.per_stage)


# ------------------------------------------------------------------------- (c)

def _with(strat, spec, **kw):
    """``strat`` with ``kw`` changed; under DeepSpeed SP off once tp > 1 (AutoTP has none, and
    at tp = 1 it changes nothing); a change DeepSpeed's pipeline refuses (ZeRO >= 2, or a
    schedule other than 1F1B, at pp > 1; under MindSpore a layout its rules refuse) is no
    example (assume); under MindSpore a MoE model at tp > 1 runs SP."""
    d = strat.as_dict()
    d.pop("m")
    d["layers_per_stage"] = strat.layers_per_stage
    d["recompute_layers"] = strat.recompute_layers
    d.update(kw)
    engine, zero, d["sp"] = runnable(d["engine"], d["pp"], d["schedule"], d["tp"], d["zero"], d["sp"],
                                     m=d["gbs"] // (d["dp"] * d["mbs"]), moe=spec.is_moe, dp=d["dp"], ep=d["ep"])
    assume(engine == d["engine"] and zero == d["zero"])
    return ndplan.Strategy(**d)


def _grads_exclusive(strat) -> bool:
    """Gradients built during backward (EngineProfile.grads_built_in_backward): mem.grads is the
    part of them above the dynamic Terms, so only mem.grads + dynamic = max(grads, dynamic)
    is monotone, not mem.grads alone."""
    eng = ndplan.engines.profile(strat.engine)
    return eng.grads_built_in_backward and strat.zero >= eng.weights_sharded_from


def _grads_and_dyn(row) -> int:
    t = row["terms"]
    return t["mem.grads"] + _dyn(row) + t.get("mem.zero3_gather", 0)


def _static_wo_grads(row, strat) -> int:
    return row["static_bytes"] - (row["terms"]["mem.grads"] if _grads_exclusive(strat) else 0)


def _dyn(row) -> int:
    """Activations + exclusive transients. Summed because the MindSpore profile's
    transient is max(loss/rebuild, optimizer-step temporaries - activations): only
    the sum max(activations + transient, optimizer temporaries) is monotone."""
    return row["terms"]["mem.activations"] + row["terms"]["mem.transient"]


SLOW = settings(max_examples=10, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.parametrize("name", MODELS)
@SLOW
@given(data=st.data())
def test_tp_doubling_does_not_increase_memory(name, data):
    """Invariant: doubling tp (heads and kv heads permitting; ep*etp still divides
    dp*cp*tp) leaves static terms, zero3_gather and activations + transients
    non-increasing on every stage: each is a sum of tp-sharded pieces (/tp) and
    replicated ones, and the expert shards' data-parallel group dp*cp*tp/(ep*etp) only
    grows. Layer placement does not depend on tp, so stage i compares with stage i.

    mem.comm_buffers (the SP all-gather of one layer input, 2*s*b*h/cp) appears when
    tp goes 1 -> 2 with SP and is constant for tp >= 2. The total of every stage (so
    the peak) is still non-increasing: the >= 8*s*b*h/cp residual-stream bytes every
    layer keeps under SP (two norm inputs, the qkv and fc1/router inputs), or the
    layer rebuilt under full recompute, halve and save >= 4*s*b*h/cp > 2*s*b*h/cp."""
    spec = spec_of(name)
    strat = data.draw(valid_strategies(spec, allow_uneven=False))
    t2 = 2 * strat.tp
    assume(spec.num_attention_heads % t2 == 0 and (spec.is_mla or spec.num_key_value_heads % t2 == 0))
    bigger = _with(strat, spec, tp=t2)
    bigger.check(spec)
    e1 = ndplan.estimate(spec, HW, strat)
    e2 = ndplan.estimate(spec, HW, bigger)
    for r1, r2 in zip(e1.per_stage, e2.per_stage):
        where = f"stage {r1['stage']}, tp {strat.tp} -> {t2}"
        for key in ("mem.weights", "mem.grads", "mem.master", "mem.optimizer", "mem.zero3_gather", "mem.reserve"):
            if key in r1["terms"] and not (key == "mem.grads" and _grads_exclusive(strat)):
                assert r2["terms"][key] <= r1["terms"][key], f"{key} grew, {where}"
        if _grads_exclusive(strat):
            assert _grads_and_dyn(r2) <= _grads_and_dyn(r1), f"max(grads, dynamic) grew, {where}"
        assert _static_wo_grads(r2, strat) <= _static_wo_grads(r1, strat), where
        assert _dyn(r2) <= _dyn(r1), f"activations + transient grew, {where}"
        if strat.tp >= 2:
            assert r2["terms"]["mem.comm_buffers"] == r1["terms"]["mem.comm_buffers"], where
        assert r2["peak_bytes"] <= r1["peak_bytes"], f"total grew, {where}"
    assert e2.peak_bytes <= e1.peak_bytes


@pytest.mark.parametrize("name", ["llama3-8b", "mixtral-8x7b"])
@SLOW
@given(data=st.data())
def test_pp_doubling_does_not_increase_peak(name, data):
    """Invariant (even split, homogeneous layers, non-interleaved schedules
    1f1b/gpipe/zb-h1, same dp, tp, cp, mbs, m and per-chunk recompute count; L divisible
    by 2*pp): with 2*pp stages, stage j holds half the layers of old stage i = j // 2
    (plus the embedding on stage 0, the head on the last stage, as before) and at most
    twice its in-flight micro-batches (min(2pp - j, m) <= 2*min(pp - i, m); gpipe m <= 2m),
    so static bytes, activations and activations + transients of new stage j are at
    most old stage i's, and the peak cannot grow.

    Excluded on purpose, because the model says otherwise:
    * models with dropout (GPT): stage 0's embedding-dropout mask, min(pp, m)*s*b*h/t
      bytes (Korthikanti Sec. 4.3), grows with pp;
    * mixed dense/MoE stacks (DeepSeek; 27 layers never split in two anyway): half a
      stage can be heavier than half its layer count suggests;
    * engine mindspore at pp = 1, m = 1: it keeps no accumulated-gradient buffer
      without accumulation (engines.py grads_without_accumulation), which appears at pp=2.
    """
    spec = spec_of(name)
    assert spec.hidden_dropout == 0 and len(set(spec.layer_kinds)) == 1
    strat = data.draw(valid_strategies(spec, allow_uneven=False, allow_tuple=False,
                                       schedules=("1f1b", "gpipe", "zb-h1")))
    p2 = 2 * strat.pp
    assume(spec.num_hidden_layers % p2 == 0)
    assume(not (strat.engine == "mindspore" and strat.pp == 1 and strat.m == 1))
    bigger = _with(strat, spec, pp=p2)
    assert bigger.m == strat.m
    bigger.check(spec)
    e1 = ndplan.estimate(spec, HW, strat)
    e2 = ndplan.estimate(spec, HW, bigger)
    for r2 in e2.per_stage:
        r1 = e1.per_stage[r2["stage"] // 2]
        where = f"new stage {r2['stage']} vs old stage {r1['stage']}, pp {strat.pp} -> {p2}"
        assert r2["static_bytes"] <= r1["static_bytes"], where
        assert r2["terms"]["mem.activations"] <= r1["terms"]["mem.activations"], where
        assert _dyn(r2) <= _dyn(r1), where
        assert r2["peak_bytes"] <= r1["peak_bytes"], where
    assert e2.peak_bytes <= e1.peak_bytes


@pytest.mark.parametrize("name", MODELS)
@SLOW
@given(data=st.data())
def test_dp_doubling_does_not_increase_memory(name, data):
    """Invariant: activations depend on mbs and the micro-batch count m, not on dp; the
    ZeRO level shards states over dp*cp (experts over dp*cp*tp/(ep*etp)). So, for
    dp -> 2*dp holding m (gbs doubles):

    * mem.activations is equal; static terms and activations + transients are
      non-increasing (static equal for zero=0, strictly smaller for zero>=1 without
      optimizer offload, since the optimizer states are then split in two);
    * mem.zero3_gather (sharded weights gathered for use) is 0 while dp*cp = 1 and
      constant for dp*cp >= 2, so every stage's total is non-increasing whenever
      dp*cp >= 2 (at dp*cp = 1 -> 2 the gather buffer appears and a stage holding
      few layers can grow).

    Holding gbs instead (m halves, when still valid), activations are non-increasing
    too (in-flight micro-batches are non-decreasing in m) and the same total holds.
    """
    spec = spec_of(name)
    strat = data.draw(valid_strategies(spec, allow_uneven=False))
    same_m = _with(strat, spec, dp=2 * strat.dp, gbs=2 * strat.gbs)
    assert same_m.m == strat.m
    same_m.check(spec)
    e1 = ndplan.estimate(spec, HW, strat)
    e2 = ndplan.estimate(spec, HW, same_m)
    sharded_before = strat.dp * strat.cp >= 2
    for r1, r2 in zip(e1.per_stage, e2.per_stage):
        where = f"stage {r1['stage']}, dp {strat.dp} -> {2 * strat.dp}, m={strat.m}"
        assert r2["terms"]["mem.activations"] == r1["terms"]["mem.activations"], where
        assert _dyn(r2) <= _dyn(r1), where
        for key in ("mem.comm_buffers", "mem.reserve"):
            assert r2["terms"][key] == r1["terms"][key], f"{key}, {where}"
        for key in STATIC_KEYS:
            if not (key == "mem.grads" and _grads_exclusive(strat)):
                assert r2["terms"][key] <= r1["terms"][key], f"{key}, {where}"
        if _grads_exclusive(strat):
            assert _grads_and_dyn(r2) <= _grads_and_dyn(r1), f"max(grads, dynamic) grew, {where}"
        if strat.zero == 0:
            assert r2["static_bytes"] == r1["static_bytes"], where
        elif strat.zero >= 1 and not strat.offload_optimizer:
            assert r2["terms"]["mem.optimizer"] < r1["terms"]["mem.optimizer"], where
            assert _static_wo_grads(r2, strat) < _static_wo_grads(r1, strat), where
        if "mem.zero3_gather" in r1["terms"] and sharded_before:
            # per layer, except FSDP2's sharded gradient outputs in backward (/(dp*cp))
            assert r2["terms"]["mem.zero3_gather"] <= r1["terms"]["mem.zero3_gather"], where
        if sharded_before:
            assert r2["peak_bytes"] <= r1["peak_bytes"], f"total grew, {where}"
    if sharded_before:
        assert e2.peak_bytes <= e1.peak_bytes

    try:
        same_gbs = _with(strat, spec, dp=2 * strat.dp)
    except NdplanError:
        return  # gbs not divisible by 2*dp*mbs, or interleaved m not a multiple of pp
    e3 = ndplan.estimate(spec, HW, same_gbs)
    for r1, r3 in zip(e1.per_stage, e3.per_stage):
        where = f"stage {r1['stage']}, dp {strat.dp} -> {2 * strat.dp}, gbs={strat.gbs}"
        assert r3["static_bytes"] <= r1["static_bytes"], where
        assert r3["terms"]["mem.activations"] <= r1["terms"]["mem.activations"], where
        assert _dyn(r3) <= _dyn(r1), where
        if sharded_before:
            assert r3["peak_bytes"] <= r1["peak_bytes"], where


# ------------------------------------------------------------------------- (d)

def rules_hold(spec, s, gpus) -> bool:
    """The divisibility rules, written independently of Strategy.check."""
    chunks = s.pp * s.vpp
    L = spec.num_hidden_layers
    ok = (s.dp * s.tp * s.pp * s.cp == gpus
          and spec.num_attention_heads % s.tp == 0
          and spec.num_key_value_heads % s.tp == 0
          and L >= chunks
          and s.gbs % (s.dp * s.mbs) == 0
          and s.seq % s.cp == 0)
    if s.layers_per_stage is None:
        ok = ok and L % chunks == 0
    else:
        ok = ok and len(s.layers_per_stage) == chunks and sum(s.layers_per_stage) == L \
            and min(s.layers_per_stage) >= 0
    if spec.is_moe:
        ok = ok and (s.dp * s.cp * s.tp) % (s.ep * s.etp) == 0 and spec.num_experts % s.ep == 0
    else:
        ok = ok and s.ep == 1 and s.etp == 1
    return ok


@st.composite
def any_strategy(draw):
    """Strategies with sizes drawn loosely (mostly friendly powers of two, sometimes
    anything), so that both accepted and rejected ones are common."""
    def degree(hi, ones=2):
        return draw(st.one_of(st.sampled_from([1] * ones + [2, 2, 4, 8]), st.integers(1, hi)))

    vpp = draw(st.sampled_from([1, 1, 1, 2, 3]))
    schedule = "interleaved" if vpp > 1 else "1f1b"
    dp, tp, pp, cp, mbs = degree(16), degree(16), degree(16), degree(4), degree(4)
    m = draw(st.integers(1, 32))
    if draw(st.integers(0, 3)):
        gbs = dp * mbs * m  # usually valid
    else:
        gbs = draw(st.integers(1, 512))
    kw = dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=degree(16, ones=6), etp=degree(4, ones=8), vpp=vpp, mbs=mbs, gbs=gbs,
              seq=draw(st.sampled_from([1000, 1024, 2048, 4096, 4097])), schedule=schedule)
    lps = draw(st.integers(0, 9))
    if lps == 0:
        kw["layers_per_stage"] = tuple(draw(st.lists(st.integers(0, 40), min_size=1, max_size=8)))
    elif lps == 1 and pp * vpp <= 8:
        total = draw(st.sampled_from([27, 32, 48]))  # the models' layer counts
        kw["layers_per_stage"] = _compositions(draw, total, pp * vpp)
    try:
        return ndplan.Strategy(**kw), kw
    except NdplanError:
        return None, kw


@pytest.mark.parametrize("name", MODELS)
@settings(max_examples=800, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(drawn=any_strategy(), gpus_factor=st.sampled_from([None, 1, 2]))
def test_check_accepts_exactly_the_rules(name, drawn, gpus_factor):
    """Soundness: every strategy Strategy(...) + Strategy.check accept satisfies the
    rules (heads % tp, kv % tp, layers % (pp*vpp) for even splits, gbs % (dp*mbs),
    interleaved: m % pp, vpp > 1 needs pp > 1,
    ep*etp | dp*cp*tp, experts % ep, dp*tp*pp*cp == gpus). Completeness: every strategy
    that satisfies them is accepted (no hidden extra rule)."""
    spec = spec_of(name)
    strat, kw = drawn
    if strat is None:
        # rejected at construction: then some construction-time rule fails
        d, mbs, gbs, seq, cp = kw["dp"], kw["mbs"], kw["gbs"], kw["seq"], kw["cp"]
        interleaved_m = kw["schedule"] == "interleaved" and kw["pp"] > 1 and (gbs // (d * mbs)) % kw["pp"] != 0
        vpp_without_pp = kw["vpp"] > 1 and kw["pp"] == 1  # Megatron-core: virtual chunks need pp > 1
        assert gbs % (d * mbs) or seq % cp or interleaved_m or vpp_without_pp, kw
        return
    world = strat.world
    gpus = None if gpus_factor is None else world * gpus_factor
    try:
        strat.check(spec, gpus)
        accepted = True
    except NdplanError as e:
        accepted = False
        assert "\n" not in str(e)
    expected = rules_hold(spec, strat, world if gpus is None else gpus)
    assert accepted == expected, f"check accepted={accepted}, rules={expected} for {strat}"
    if accepted:
        assert spec.num_attention_heads % strat.tp == 0
        assert spec.num_key_value_heads % strat.tp == 0
        if strat.layers_per_stage is None:
            assert spec.num_hidden_layers % (strat.pp * strat.vpp) == 0
        assert strat.gbs % (strat.dp * strat.mbs) == 0
        if spec.is_moe:
            assert (strat.dp * strat.cp * strat.tp) % (strat.ep * strat.etp) == 0
            assert spec.num_experts % strat.ep == 0
