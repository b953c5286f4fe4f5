"""Exact parts of the time model against published closed forms and hand-counted timelines.

* Model FLOPs of the Narayanan (2021, Table 1) / Korthikanti (2022, Table 3) GPTs: the
  papers' 72*B*s*l*h^2*(1 + s/6h + V/12lh) counts the attention core (QK^T, PV: 4*s^2*h
  forward per layer) over the full s x s square. ndplan's MFU numerator is causal (half the
  square; flops.CAUSAL_FACTOR), so only the s/6h term halves:
      forward per sequence = l*(24*s*h^2 + 2*s^2*h) + 2*s*h*V
      x3 (forward + 2x backward) = 72*s*l*h^2*(1 + s/12h + V/12lh).
* Pipeline: for equal stages the 1F1B step is (m + pp - 1) * t per micro-batch time t
  (Narayanan et al. 2021 Sec. 2.2.1), the interleaved one m*t + (pp - 1)*t/vpp (Sec. 2.2.2);
  checked on literal timelines whose makespan is counted here, then on step_time.
* Multi-rail inter-node bandwidth (formulas/comm.py): a group with n_in members per node
  crosses nodes through n_in NICs.
"""

from fractions import Fraction

import pytest
import sympy as sp

import ndplan
from ndplan import symbols as S
from ndplan.catalog.model import model_from_config
from ndplan.formulas import comm as C
from ndplan.formulas import flops as FL
from ndplan.symbols import model_symbols

# (catalog model, global batch B, seq s) - Korthikanti Table 3/5 and Narayanan Table 1 rows
GPT_CASES = [
    ("megatron-gpt-22b", 4, 2048),       # Korthikanti 22B
    ("megatron-gpt-175b", 64, 2048),     # Korthikanti 175B
    ("megatron-gpt-530b", 280, 2048),    # Korthikanti 530B / Narayanan 529.6B
    ("megatron-gpt-1t", 512, 2048),      # Korthikanti 1T / Narayanan 1008B
    ("megatron-gpt-1.7b", 512, 2048),    # Narayanan 1.7B
    ("megatron-gpt-145b", 2304, 2048),   # Narayanan 145.6B
]


@pytest.mark.parametrize("name,B,s", GPT_CASES)
def test_gpt_model_flops_closed_form(name, B, s):
    model = ndplan.load_model(name)
    h, l, V = model.hidden_size, model.num_hidden_layers, model.vocab_size
    ours = FL.model_flops_per_sequence(model, model_symbols(model), s) * B
    h_, l_, s_, V_, B_ = map(Fraction, (h, l, s, V, B))
    expected = 72 * B_ * s_ * l_ * h_ ** 2 * (1 + s_ / (12 * h_) + V_ / (12 * l_ * h_))
    assert sp.Rational(ours) == sp.Rational(expected.numerator, expected.denominator)


def test_gpt_model_flops_vs_paper_noncausal():
    """Ours = paper minus half of the attention-core term 72Bslh^2 * s/6h."""
    model = ndplan.load_model("megatron-gpt-175b")
    h, l, V, s, B = 12288, 96, 51200, 2048, 64
    paper = 72 * B * s * l * h ** 2 * (1 + Fraction(s, 6 * h) + Fraction(V, 12 * l * h))
    ours = sp.Rational(FL.model_flops_per_sequence(model, model_symbols(model), s) * B)
    half_core = Fraction(72 * B * s * l * h ** 2 * s, 6 * h) / 2
    assert ours == sp.Rational(paper - half_core)


# ---------------------------------------------------------------- literal pipeline timelines
# (device, op, micro-batch, chunk, start, end); F = 1, B = 2 time units per chunk.
# Chunk c of the model lives on device c % pp (Megatron interleaving).

# pp = 2, m = 3, 1F1B (device 0 warms up with pp-1 = 1 forward)
TIMELINE_1F1B = [
    (0, "F", 1, 0, 0, 1), (0, "F", 2, 0, 1, 2), (0, "B", 1, 0, 4, 6), (0, "F", 3, 0, 6, 7),
    (0, "B", 2, 0, 7, 9), (0, "B", 3, 0, 10, 12),
    (1, "F", 1, 1, 1, 2), (1, "B", 1, 1, 2, 4), (1, "F", 2, 1, 4, 5), (1, "B", 2, 1, 5, 7),
    (1, "F", 3, 1, 7, 8), (1, "B", 3, 1, 8, 10),
]
# pp = 2, vpp = 2, m = 2, interleaved (device 0 runs all 4 forwards in warm-up)
TIMELINE_INTERLEAVED = [
    (0, "F", 1, 0, 0, 1), (0, "F", 2, 0, 1, 2), (0, "F", 1, 2, 2, 3), (0, "F", 2, 2, 3, 4),
    (0, "B", 1, 2, 6, 8), (0, "B", 2, 2, 9, 11), (0, "B", 1, 0, 11, 13), (0, "B", 2, 0, 13, 15),
    (1, "F", 1, 1, 1, 2), (1, "F", 2, 1, 2, 3), (1, "F", 1, 3, 3, 4), (1, "B", 1, 3, 4, 6),
    (1, "F", 2, 3, 6, 7), (1, "B", 2, 3, 7, 9), (1, "B", 1, 1, 9, 11), (1, "B", 2, 1, 11, 13),
]


def _check_timeline(tl, pp, vpp, m, F=1, Bk=2) -> int:
    """Validate durations, device exclusivity and data dependencies; return the makespan."""
    chunks = pp * vpp
    end = {(op, mb, c): e for _, op, mb, c, _, e in tl}
    assert len(end) == 2 * m * chunks  # every (op, micro-batch, chunk) exactly once
    for dev, op, mb, c, st, e in tl:
        assert dev == c % pp
        assert e - st == (F if op == "F" else Bk)
        if op == "F" and c > 0:
            assert st >= end[("F", mb, c - 1)]
        if op == "B":
            assert st >= end[("F", mb, c)]
            if c < chunks - 1:
                assert st >= end[("B", mb, c + 1)]
    for dev in range(pp):
        spans = sorted((st, e) for d, *_, st, e in tl if d == dev)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    return max(e for *_, e in tl)


def test_1f1b_timeline_makespan():
    pp, m, t = 2, 3, 1 + 2
    assert _check_timeline(TIMELINE_1F1B, pp, 1, m) == 12 == (m + pp - 1) * t


def test_interleaved_timeline_makespan():
    pp, vpp, m = 2, 2, 2
    t = vpp * (1 + 2)  # one micro-batch on one device: vpp chunks of F + B
    assert _check_timeline(TIMELINE_INTERLEAVED, pp, vpp, m) == 15 == m * t + Fraction((pp - 1) * t, vpp)


# pp = 2, m = 3, ZB-H1 (Qi et al. 2024 Fig. 3): B is the input gradient only, W the weight
# gradient, F = B = W = 1; 1F1B's warm-up is kept and the Ws fill the cool-down.
# (device, op, micro-batch, start, end)
TIMELINE_ZBH1 = [
    (0, "F", 1, 0, 1), (0, "F", 2, 1, 2), (0, "B", 1, 3, 4), (0, "F", 3, 4, 5), (0, "B", 2, 5, 6),
    (0, "W", 1, 6, 7), (0, "B", 3, 7, 8), (0, "W", 2, 8, 9), (0, "W", 3, 9, 10),
    (1, "F", 1, 1, 2), (1, "B", 1, 2, 3), (1, "F", 2, 3, 4), (1, "B", 2, 4, 5), (1, "F", 3, 5, 6),
    (1, "B", 3, 6, 7), (1, "W", 1, 7, 8), (1, "W", 2, 8, 9), (1, "W", 3, 9, 10),
]


def test_zbh1_timeline_makespan():
    """Makespan m*t + (pp-1)(F+B-W), the ZB-H1 bubble of step.py (1F1B's times (t-2W)/t)."""
    pp, m, F, B, W = 2, 3, 1, 1, 1
    end = {(d, op, mb): e for d, op, mb, _, e in TIMELINE_ZBH1}
    assert len(end) == 3 * m * pp
    for d, op, mb, st, e in TIMELINE_ZBH1:
        assert e - st == 1
        if op == "F" and d > 0:
            assert st >= end[(d - 1, "F", mb)]
        if op == "B":
            assert st >= end[(d, "F", mb)] and (d == pp - 1 or st >= end[(d + 1, "B", mb)])
        if op == "W":
            assert st >= end[(d, "B", mb)]
    for dev in range(pp):
        spans = sorted((st, e) for d, _, _, st, e in TIMELINE_ZBH1 if d == dev)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    t = F + B + W
    one_f_one_b_bubble = (pp - 1) * t
    assert max(e for *_, e in TIMELINE_ZBH1) == 10 == m * t + one_f_one_b_bubble * Fraction(t - 2 * W, t)


# pp = 2, m = 2, ZB-V: device 0 runs virtual stages v0 and v3, device 1 v1 and v2 (the V);
# F = B = W = 1 per chunk. (device, op, micro-batch, virtual stage, start, end)
TIMELINE_ZBV = [
    (0, "F", 1, 0, 0, 1), (0, "F", 2, 0, 1, 2), (0, "F", 1, 3, 3, 4), (0, "B", 1, 3, 4, 5),
    (0, "F", 2, 3, 5, 6), (0, "B", 2, 3, 6, 7), (0, "B", 1, 0, 7, 8), (0, "W", 1, 3, 8, 9),
    (0, "B", 2, 0, 9, 10), (0, "W", 2, 3, 10, 11), (0, "W", 1, 0, 11, 12), (0, "W", 2, 0, 12, 13),
    (1, "F", 1, 1, 1, 2), (1, "F", 1, 2, 2, 3), (1, "F", 2, 1, 3, 4), (1, "F", 2, 2, 4, 5),
    (1, "B", 1, 2, 5, 6), (1, "B", 1, 1, 6, 7), (1, "B", 2, 2, 7, 8), (1, "B", 2, 1, 8, 9),
    (1, "W", 1, 2, 9, 10), (1, "W", 1, 1, 10, 11), (1, "W", 2, 2, 11, 12), (1, "W", 2, 1, 12, 13),
]


def test_zbv_timeline_makespan():
    """Makespan m*t + (pp-1) max(F, F+B-2W) per chunk (step.py's ZB-V bubble with its
    start-up floor): 12 + 1. No ZB-V order can beat it: device 1 starts after one F."""
    pp, m, chunks = 2, 2, 4
    dev_of = {0: 0, 1: 1, 2: 1, 3: 0}
    end = {(op, mb, v): e for _, op, mb, v, _, e in TIMELINE_ZBV}
    assert len(end) == 3 * m * chunks
    for d, op, mb, v, st, e in TIMELINE_ZBV:
        assert d == dev_of[v] and e - st == 1
        if op == "F" and v > 0:
            assert st >= end[("F", mb, v - 1)]
        if op == "B":
            assert st >= end[("F", mb, v)] and (v == chunks - 1 or st >= end[("B", mb, v + 1)])
        if op == "W":
            assert st >= end[("B", mb, v)]
    for dev in range(pp):
        spans = sorted((st, e) for d, *_, st, e in TIMELINE_ZBV if d == dev)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    F = B = W = 1  # per chunk
    t = 2 * (F + B + W)  # one micro-batch on one device: two chunks
    assert max(e for *_, e in TIMELINE_ZBV) == 13 == m * t + (pp - 1) * max(F, F + B - 2 * W)


# ---------------------------------------------------------------- the same on step_time

PIPE_KEYS = ("time.compute", "time.recompute", "time.tp_comm", "time.cp_comm", "time.ep_comm",
             "time.imbalance", "time.pp_bubble")


REL = 5e-3


def _tiny():
    """Uniform decoder with an 8-token vocabulary: the head on the last stage (its input read
    is bandwidth-bound) is < 0.2 % of a stage, so the stages are equal to REL."""
    cfg = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 32, "num_attention_heads": 8,
           "num_key_value_heads": 8, "intermediate_size": 4096, "vocab_size": 8}
    model = model_from_config(cfg, "tiny", "test")
    hw = ndplan.load_hardware("h100-sxm")
    return model, hw


@pytest.mark.parametrize("pp,m", [(2, 3), (4, 8), (4, 1)])
def test_step_time_1f1b_equals_m_plus_pp_minus_1(pp, m):
    model, hw = _tiny()
    strat = ndplan.Strategy(pp=pp, mbs=1, gbs=m, seq=2048, schedule="1f1b")
    est = ndplan.estimate(model, hw, strat)
    t = est.time_terms["time.compute"] / m  # one micro-batch on one stage (F + B + W)
    pipe = sum(est.time_terms[k] for k in PIPE_KEYS)
    assert pipe == pytest.approx((m + pp - 1) * t, rel=REL)


@pytest.mark.parametrize("pp,vpp,m", [(2, 2, 2), (4, 2, 8)])
def test_step_time_interleaved_bubble(pp, vpp, m):
    model, hw = _tiny()
    strat = ndplan.Strategy(pp=pp, vpp=vpp, mbs=1, gbs=m, seq=2048, schedule="interleaved")
    est = ndplan.estimate(model, hw, strat)
    t = est.time_terms["time.compute"] / m
    assert est.time_terms["time.pp_bubble"] == pytest.approx((pp - 1) * t / vpp, rel=REL)
    pipe = sum(est.time_terms[k] for k in PIPE_KEYS)
    assert pipe == pytest.approx(m * t + (pp - 1) * t / vpp, rel=REL)


# ---------------------------------------------------------------- multi-rail bandwidth

HWV = {S.node: 8, S.bw_intra: 300e9, S.eff_intra: 1, S.bw_inter: 25e9, S.eff_inter: 1,
       S.lat_intra: 0, S.lat_inter: 0}


@pytest.mark.parametrize("n,span,n_in", [(64, 64, 8), (32, 64, 4), (8, 64, 1), (16, 256, 1), (4, 4, None)])
def test_inter_node_bandwidth_uses_members_nics(n, span, n_in):
    B = 1e9
    t = float(C.all_gather(n, B, span).subs(HWV))
    if n_in is None:  # inside one node
        assert t == pytest.approx((n - 1) / n * B / 300e9)
    else:
        assert t == pytest.approx((n - 1) / n * B / (n_in * 25e9))
