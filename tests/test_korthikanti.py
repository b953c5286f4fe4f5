"""Activation memory against Korthikanti et al. 2022, "Reducing Activation Recomputation
in Large Transformer Models" (arXiv:2205.05198).

Table 2 (activations per transformer layer, bytes; 16-bit activations, 1-byte dropout
masks, 4h GeLU MLP, attention and hidden dropout, no FlashAttention), with s sequence,
b micro-batch, h hidden, a heads, t tensor-parallel degree:

    no parallelism             s*b*h*(34 + 5*a*s/h)
    TP                         s*b*h*(10 + 24/t + 5*a*s/(h*t))
    TP + SP                    s*b*h*(34/t + 5*a*s/(h*t))
    TP + selective recompute   s*b*h*(10 + 24/t)
    TP + SP + selective        s*b*h*34/t
    full recompute             2*s*b*h           (the layer input; /t when it is SP-sharded)

The formulas are written here independently, as plain Python arithmetic over exact
fractions, and compared with ndplan's per-layer dense activation expression.

Models: Table 3 of the paper (GPT 22B h=6144 a=64 L=48; 175B h=12288 a=96 L=96;
530B h=20480 a=128 L=105; 1T h=25600 a=160 L=128), s=2048, t=8.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import sympy as sp

import ndplan
from ndplan import symbols as S
from ndplan.formulas import activations as A
from ndplan.formulas.local import act_context
from ndplan.symbols import model_symbols

SEQ = 2048
TP = 8

# name -> (h, a, L, pp of Table 3)
PAPER_MODELS = {
    "megatron-gpt-22b": (6144, 64, 48, 1),
    "megatron-gpt-175b": (12288, 96, 96, 8),
    "megatron-gpt-530b": (20480, 128, 105, 35),
    "megatron-gpt-1t": (25600, 160, 128, 64),
}
MICRO_BATCHES = (1, 2, 4)


# ---------------------------------------------------------------- Table 2, by hand

def table2_no_parallelism(s, b, h, a) -> Fraction:
    return s * b * h * (34 + Fraction(5 * a * s, h))


def table2_tp(s, b, h, a, t) -> Fraction:
    return s * b * h * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t))


def table2_tp_sp(s, b, h, a, t) -> Fraction:
    return s * b * h * (34 + Fraction(5 * a * s, h)) / t


def table2_tp_selective(s, b, h, a, t) -> Fraction:
    return s * b * h * (10 + Fraction(24, t))


def table2_tp_sp_selective(s, b, h, a, t) -> Fraction:
    return Fraction(34 * s * b * h, t)


def table2_full(s, b, h, a, t, sp_on) -> Fraction:
    return Fraction(2 * s * b * h, t if sp_on else 1)


# ---------------------------------------------------------------- ndplan side

def strategy(t, sp_on, recompute, **kw) -> ndplan.Strategy:
    return ndplan.Strategy(tp=t, sp=sp_on, recompute=recompute, engine="megatron",
                           flash_attention=False, seq=SEQ, **kw)


def ndplan_layer(name, t, b, sp_on, recompute) -> sp.Expr:
    spec = ndplan.load_model(name)
    strat = strategy(t, sp_on, recompute)
    ctx = act_context(spec, strat)
    expr = A.layer_activation(spec, model_symbols(spec), ctx, "dense", strat.recompute)
    val = sp.sympify(expr).subs({S.tp: t, S.cp: 1, S.mbs: b, S.seq: SEQ})
    assert val.is_Rational, f"unsubstituted symbols left: {val}"
    return val


def as_rational(x: Fraction) -> sp.Rational:
    return sp.Rational(x.numerator, x.denominator)


def test_catalog_models_are_the_papers():
    for name, (h, a, L, _) in PAPER_MODELS.items():
        spec = ndplan.load_model(name)
        assert (spec.hidden_size, spec.num_attention_heads, spec.num_hidden_layers) == (h, a, L), name
        assert spec.num_key_value_heads == a, "MHA"
        assert spec.head_dim * a == h
        assert spec.intermediate_size == 4 * h, "4h MLP"
        assert not spec.gated_mlp, "GeLU MLP (2 matrices)"
        assert spec.attention_dropout > 0 and spec.hidden_dropout > 0, "dropout (paper assumes it)"


CASES = [(name, b) for name in PAPER_MODELS for b in MICRO_BATCHES]
IDS = [f"{n}-b{b}" for n, b in CASES]


@pytest.mark.parametrize("name,b", CASES, ids=IDS)
def test_no_parallelism(name, b):
    h, a, _, _ = PAPER_MODELS[name]
    expected = as_rational(table2_no_parallelism(SEQ, b, h, a))
    for sp_on in (True, False):  # at t=1 SP changes nothing
        assert ndplan_layer(name, 1, b, sp_on, "none") == expected


@pytest.mark.parametrize("name,b", CASES, ids=IDS)
def test_tp_only(name, b):
    h, a, _, _ = PAPER_MODELS[name]
    assert ndplan_layer(name, TP, b, False, "none") == as_rational(table2_tp(SEQ, b, h, a, TP))


@pytest.mark.parametrize("name,b", CASES, ids=IDS)
def test_tp_sp(name, b):
    h, a, _, _ = PAPER_MODELS[name]
    assert ndplan_layer(name, TP, b, True, "none") == as_rational(table2_tp_sp(SEQ, b, h, a, TP))


@pytest.mark.parametrize("name,b", CASES, ids=IDS)
def test_tp_selective(name, b):
    h, a, _, _ = PAPER_MODELS[name]
    assert ndplan_layer(name, TP, b, False, "selective") == as_rational(table2_tp_selective(SEQ, b, h, a, TP))


@pytest.mark.parametrize("name,b", CASES, ids=IDS)
def test_tp_sp_selective(name, b):
    h, a, _, _ = PAPER_MODELS[name]
    assert ndplan_layer(name, TP, b, True, "selective") == as_rational(table2_tp_sp_selective(SEQ, b, h, a, TP))


@pytest.mark.parametrize("sp_on", [True, False], ids=["sp", "nosp"])
@pytest.mark.parametrize("name,b", CASES, ids=IDS)
def test_full_recompute(name, b, sp_on):
    h, a, _, _ = PAPER_MODELS[name]
    assert ndplan_layer(name, TP, b, sp_on, "full") == as_rational(table2_full(SEQ, b, h, a, TP, sp_on))
    assert ndplan_layer(name, 1, b, sp_on, "full") == 2 * SEQ * b * h


def test_paper_headline_numbers_175b():
    """Sec. 5 / Table 2 orders: for GPT-3 175B at t=8, SP + selective is 34/(34+5as/h)
    of the SP-only amount (5as/h = 80 here), and full recompute 2/34 of SP + selective."""
    name, b = "megatron-gpt-175b", 1
    sp_only = ndplan_layer(name, TP, b, True, "none")
    sel = ndplan_layer(name, TP, b, True, "selective")
    full = ndplan_layer(name, TP, b, True, "full")
    assert sel / sp_only == sp.Rational(34, 34 + 80)
    assert full / sel == sp.Rational(2, 34)


# ---------------------------------------------------------------- pipeline identity

def megatron_interleaved_chunk_counts(pp: int, vpp: int, m: int, rank: int) -> list[int]:
    """Micro-batches whose forward is held per chunk of pipeline rank ``rank`` at its
    peak, simulated from Megatron-LM's interleaved schedule: warm-up forwards
    (pp - rank - 1)*2 + (vpp - 1)*pp (capped at m*vpp), then one steady-state forward
    before the first backward; forward k runs chunk (k // pp) % vpp."""
    warmup = min((pp - rank - 1) * 2 + (vpp - 1) * pp, m * vpp)
    held = min(warmup + 1, m * vpp)
    counts = [0] * vpp
    for k in range(held):
        counts[(k // pp) % vpp] += 1
    return counts


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_pipeline_identity_175b_1f1b_vs_interleaved(recompute):
    """Korthikanti et al. Sec. 4.2.3: with 1F1B the first stage holds L/pp layers for pp
    micro-batches = L layers' worth, independent of pp; the interleaved schedule
    multiplies this by (1 + (pp-1)/(pp*vpp)).

    Besides the layers, stage 0 holds the embedding-output dropout mask, s*b*h/t bytes
    per in-flight micro-batch of its first chunk (Sec. 4.3; SP shards it by t). With
    1F1B that is pp micro-batches; with the interleaved schedule it is the chunk-0
    forwards held at the peak (Megatron warm-up rule, simulated above: 15 for pp=8,
    vpp=3). No head/loss terms: with pp > 1 they live on the last stage.
    """
    name = "megatron-gpt-175b"
    h, a, L, _ = PAPER_MODELS[name]
    t, pp, b, m = 8, 8, 1, 64
    layer = {"none": table2_tp_sp(SEQ, b, h, a, t),
             "selective": table2_tp_sp_selective(SEQ, b, h, a, t),
             "full": table2_full(SEQ, b, h, a, t, True)}[recompute]
    emb_mask = Fraction(SEQ * b * h, t)
    model, hw = ndplan.load_model(name), ndplan.load_hardware("h100-sxm")

    def stage0(vpp):
        strat = strategy(t, True, recompute, pp=pp, vpp=vpp, mbs=b, gbs=m * b,
                         schedule="1f1b" if vpp == 1 else "interleaved")
        est = ndplan.estimate(model, hw, strat, gpus=t * pp)
        return est.per_stage[0]["terms"]["mem.activations"]

    # 1F1B: L/pp layers x pp micro-batches = L layers, plus pp embedding masks
    expected_1f1b = layer * (L // pp) * pp + pp * emb_mask
    assert layer * (L // pp) * pp == layer * L
    assert stage0(1) == expected_1f1b

    # interleaved, vpp = 3: L*(1 + (pp-1)/(pp*vpp)) layers' worth
    vpp = 3
    counts = megatron_interleaved_chunk_counts(pp, vpp, m, rank=0)
    assert sum(counts) == pp * vpp + pp - 1 == 31
    assert counts == [15, 8, 8]
    layers_worth = Fraction(L) * (1 + Fraction(pp - 1, pp * vpp))
    assert layers_worth == sum(counts) * (L // (pp * vpp)) == 124
    expected_int = layer * layers_worth + counts[0] * emb_mask
    assert stage0(vpp) == expected_int

    # the layer part of the ratio is the paper's factor
    assert (stage0(vpp) - counts[0] * emb_mask) / (stage0(1) - pp * emb_mask) == 1 + Fraction(pp - 1, pp * vpp)


def test_uneven_interleaved_chunks_peak_on_the_heavier_chunk():
    """A given uneven layout under the interleaved schedule: the stage peaks at the held
    vector that favours its heavier chunk, not at the warm-up split.

    Hand timeline of rank 0 (Megatron-LM order), pp = 2, vpp = 2, m = 4: forward k runs
    chunk (k // pp) % vpp; warm-up 2*(pp-1) + (vpp-1)*pp = 4 forwards F0c0 F1c0 F0c1 F1c1,
    then F2c0 B0c1 F3c0 B1c1 F2c1 B0c0 F3c1 B1c0, then the remaining backwards. Held
    (chunk 0, chunk 1) micro-batches right after each steady forward: (3, 2), (4, 1),
    (4, 1), (3, 2); so the peak is max(3 A0 + 2 A1, 4 A0 + A1) with A_c a chunk's bytes
    per micro-batch (chunk 0 of rank 0 also keeps the embedding dropout mask).
    Layers: Korthikanti Table 2 (tp + sp), 96 layers as 36 | 24 | 12 | 24 per virtual
    stage, so rank 0 runs 36 layers in chunk 0 and 12 in chunk 1 (and the mirror 12 | 36).
    """
    name, recompute = "megatron-gpt-175b", "selective"
    h, a, L, _ = PAPER_MODELS[name]
    t, pp, vpp, b, m = 8, 2, 2, 1, 4
    layer = table2_tp_sp_selective(SEQ, b, h, a, t)
    emb_mask = Fraction(SEQ * b * h, t)
    model, hw = ndplan.load_model(name), ndplan.load_hardware("h100-sxm")

    def stage0(layout, m=m):
        strat = strategy(t, True, recompute, pp=pp, vpp=vpp, mbs=b, gbs=m * b, schedule="interleaved",
                         layers_per_stage=layout)
        return ndplan.estimate(model, hw, strat, gpus=t * pp).per_stage[0]["terms"]["mem.activations"]

    for layout, (n0, n1) in [((36, 24, 12, 24), (36, 12)), ((12, 24, 36, 24), (12, 36))]:
        A0, A1 = n0 * layer + emb_mask, n1 * layer
        assert stage0(layout) == max(3 * A0 + 2 * A1, 4 * A0 + A1)
    # the heavy-chunk-0 layout peaks at (4, 1): 24 layers' worth more than the warm-up split
    assert stage0((36, 24, 12, 24)) - (3 * (36 * layer + emb_mask) + 2 * 12 * layer) == 24 * layer + emb_mask
    # m = 2: the warm-up (4 forwards = m * vpp) runs every forward, so (2, 2) is held; the
    # same layout at another m (compiled kernels are cached per layout) must not reuse m = 4
    assert stage0((36, 24, 12, 24), m=2) == 2 * (36 * layer + emb_mask) + 2 * 12 * layer


@pytest.mark.parametrize("name", ["megatron-gpt-175b", "megatron-gpt-530b", "megatron-gpt-1t"])
def test_first_stage_holds_L_layers_with_1f1b(name):
    """Table 3 pipeline sizes (175B pp=8, 530B pp=35, 1T pp=64) with 1F1B: the first
    stage holds L layers' worth of TP+SP+selective activations plus pp embedding
    dropout masks, whatever pp is."""
    h, a, L, pp = PAPER_MODELS[name]
    t, b = 8, 1
    m = 2 * pp
    strat = strategy(t, True, "selective", pp=pp, mbs=b, gbs=m * b)
    est = ndplan.estimate(ndplan.load_model(name), ndplan.load_hardware("h100-sxm"), strat, gpus=t * pp)
    expected = table2_tp_sp_selective(SEQ, b, h, a, t) * L + pp * Fraction(SEQ * b * h, t)
    assert est.per_stage[0]["terms"]["mem.activations"] == expected
