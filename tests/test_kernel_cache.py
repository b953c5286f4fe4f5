"""Cached kernels (in memory, then from disk) equal a fresh, uncached evaluation of the
SymPy Terms, over random strategies covering every structural variant.

The oracle builds each Breakdown anew from the Strategy (formulas/memory.py
``stage_memory`` at a concrete stage, formulas/step.py ``step_time``), substitutes the
point with ``xreplace`` and evaluates with ``evalf``: no kernel, no cache, no
``estimate.strategy_point`` (the point is written out here). ``estimate`` reads
compiled kernels under the key derived from the strategy's Structure. Every example
runs a strategy and its *variants*, each changed in one field (every categorical field
the builders read, and the numbers a Structure may hold): a key that missed a field
would hand a variant the strategy's kernel, which the oracle catches (checked by
removing fields from the key: ``test_the_oracle_catches_a_key_that_misses_m`` keeps
the case of the bug fixed before, m under an uneven layout with vpp > 1).

One process: the disk round is forced by emptying the in-memory cache.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict

import pytest
import sympy as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ndplan
from tests.helpers import runnable
from ndplan import kernels
from ndplan import symbols as S
from ndplan.errors import NdplanError
from ndplan.formulas.memory import stage_memory
from ndplan.formulas.step import step_time
from ndplan.symbols import model_symbols

HW = ndplan.load_hardware("h100-sxm")
MODELS = {n: ndplan.load_model(n) for n in ("llama3-8b", "mixtral-8x7b", "deepseek-v2-lite")}
ENGINES = ("megatron", "fsdp", "deepspeed", "mindspore", "megatron[overlap_grad_reduce=0,overlap_tp_comm=1]")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """A fresh disk cache, an empty memory cache and no shipped kernels (prebuilt.py): every
    kernel here is built in this test."""
    monkeypatch.setenv("NDPLAN_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("NDPLAN_PREBUILT", "0")
    monkeypatch.setattr(kernels, "_READ_SETS", {})
    monkeypatch.setattr(kernels, "_MEMORY", OrderedDict())
    monkeypatch.setattr(kernels._ModelMemo, "_BY_SPEC", {})  # the resolved-digest shortcut of other tests
    monkeypatch.setattr(kernels, "_UNSAVED_READS", {})


def _point(s: ndplan.Strategy, stage: int) -> dict:
    """The kernel arguments, written out by hand: the strategy's degrees, m = gbs/(dp*mbs),
    the stage and that stage's recompute count (0 when recompute_layers is None)."""
    rl = s.recompute_layers
    nrec = 0 if rl is None else (rl[stage] if isinstance(rl, tuple) else rl)
    lps = s.layers_per_stage  # an uneven split at vpp 1: stage 0's and the last stage's layers
    first, last = (lps[0], lps[-1]) if lps and s.vpp == 1 else (0, 0)
    return {S.dp: s.dp, S.tp: s.tp, S.pp: s.pp, S.vpp: s.vpp, S.cp: s.cp, S.ep: s.ep, S.etp: s.etp,
            S.mbs: s.mbs, S.m: s.gbs // (s.dp * s.mbs), S.seq: s.seq, S.nrec: nrec, S.stage: stage,
            S.first_layers: first, S.last_layers: last}


def _value(expr, point) -> float:
    exact = {k: sp.Float(v, 30) if isinstance(v, float) else sp.Integer(v) for k, v in point.items()}
    return float(sp.sympify(expr).xreplace(exact).evalf(30))


def _oracle(model, s: ndplan.Strategy):
    """(memory Term values per stage, time Term values), uncached."""
    M = model_symbols(model)
    mem = []
    for i in range(s.pp):
        bd = stage_memory(model, M, s, sp.Integer(i))
        mem.append({t.key: _value(t.expr, _point(s, i)) for t in bd})
    head = 0 if s.schedule == "zbv" else s.pp - 1  # the time Terms describe the head's stage
    hw = {S.BY_NAME[k]: v for k, v in HW.kernel_values(fp8=s.weight_dtype == "fp8").items()}
    time = {t.key: _value(t.expr, _point(s, head) | hw) for t in step_time(model, M, s)}
    return mem, time


def _assert_matches(model, s: ndplan.Strategy, oracle) -> None:
    est = ndplan.estimate(model, HW, s)
    mem, time = oracle
    for i, row in enumerate(est.per_stage):
        for k, v in mem[i].items():
            assert abs(row["terms"][k] - v) <= 1 + 1e-9 * abs(v), (s, i, k, row["terms"][k], v)
    for k, v in time.items():
        assert est.time_terms[k] == pytest.approx(v, rel=1e-9, abs=1e-15), (s, k)


def _composition(draw, total: int, parts: int) -> tuple[int, ...]:
    cuts = sorted(draw(st.lists(st.integers(1, total - 1), min_size=parts - 1, max_size=parts - 1, unique=True)))
    bounds = [0, *cuts, total]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


def _alternating(model):
    """A model whose MoE layers alternate with dense ones (Qwen-MoE ``decoder_sparse_step
    = 2``): its layout is not symbolic in pp, so pp enters the Structure."""
    kinds = tuple("moe" if i % 2 else "dense" for i in range(model.num_hidden_layers))
    return dataclasses.replace(model, name=model.name + "-alternating", layer_kinds=kinds)


MODELS["mixtral-alternating"] = _alternating(MODELS["mixtral-8x7b"])


def _next(values: tuple, v):
    return values[(values.index(v) + 1) % len(values)]


def _variants(s: ndplan.Strategy, model) -> list[ndplan.Strategy]:
    """``s`` changed in one field at a time: every categorical field the builders read,
    and the numbers a Structure may hold (pp, cp, m through gbs); a change the strategy's
    engine cannot run (rules.py: DeepSpeed's pipeline and AutoTP) is left out."""
    def R(s, **kw):
        try:
            return dataclasses.replace(s, **kw)
        except NdplanError:
            return None
    out = [R(s, sp=not s.sp), R(s, offload_optimizer=not s.offload_optimizer),
           R(s, flash_attention=not s.flash_attention), R(s, zero=_next((0, 1, 2, 3), s.zero)),
           R(s, grad_dtype=_next(("fp32", "bf16"), s.grad_dtype)),
           R(s, weight_dtype=_next(("auto", "fp32", "bf16", "fp8"), s.weight_dtype)),
           R(s, engine=_next(ENGINES, s.engine)), R(s, order="dp-tp-cp-ep-pp"),
           R(s, gbs=2 * s.gbs), R(s, cp=2 if s.cp == 1 else 1, tp=2 if s.tp == 1 else 1)]
    if s.recompute != "none":
        out.append(R(s, recompute_layers=None if s.recompute_layers is not None else 1))
        out.append(R(s, recompute=_next(("selective", "full"), s.recompute)))
    other_schedule = {"gpipe": "1f1b", "1f1b": "zb-h1", "zb-h1": "gpipe", "interleaved": "zbv", "zbv": "interleaved"}
    out.append(R(s, schedule=other_schedule[s.schedule]))  # same vpp (1, or 2 for both V and interleaved)
    if s.layers_per_stage is not None and len(set(s.layers_per_stage)) > 1:
        out.append(R(s, layers_per_stage=tuple(reversed(s.layers_per_stage))))
    if s.schedule == "interleaved" and model.num_hidden_layers % (s.pp * 4) == 0 and s.layers_per_stage is None:
        out.append(R(s, vpp=4))
    if s.layers_per_stage is None and s.vpp == 1:
        other = 4 if s.pp == 2 else 2
        out.append(R(s, pp=other, gbs=s.dp * s.mbs * other, recompute_layers=None if isinstance(
            s.recompute_layers, tuple) else s.recompute_layers))
    return [v for v in out if v is not None]


@st.composite
def strategy_families(draw):
    name = draw(st.sampled_from(sorted(MODELS)))
    model = MODELS[name]
    L = model.num_hidden_layers
    schedule = draw(st.sampled_from(("gpipe", "1f1b", "interleaved", "zb-h1", "zbv")))
    pp = draw(st.sampled_from((2, 4) if schedule in ("interleaved", "zbv") else (1, 2, 4)))
    vpp = 2 if schedule in ("interleaved", "zbv") else 1
    uneven = L % (pp * vpp) != 0 or draw(st.booleans())
    layers = _composition(draw, L, pp * vpp) if uneven else None
    recompute = draw(st.sampled_from(("none", "selective", "full")))
    counts = None
    if recompute != "none" and draw(st.booleans()):
        counts = draw(st.one_of(st.integers(0, L // pp), st.tuples(*[st.integers(0, L // pp)] * pp)))
    dp, tp, cp, mbs = (draw(st.sampled_from((1, 2))) for _ in range(4))
    ep = draw(st.sampled_from((1, 2))) if model.is_moe else 1
    m = pp * draw(st.sampled_from((1, 2, 3)))
    seq, zero, sp = draw(st.sampled_from((1024, 2048))), draw(st.sampled_from((0, 1, 2, 3))), draw(st.booleans())
    engine = draw(st.sampled_from(ENGINES))
    engine, zero, sp = runnable(engine, pp, schedule, tp, zero, sp, m=m, moe=model.is_moe, dp=dp, ep=ep)
    s = ndplan.Strategy(
        dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, mbs=mbs, gbs=dp * mbs * m, seq=seq,
        zero=zero, sp=sp, recompute=recompute,
        recompute_layers=counts, schedule=schedule, engine=engine,
        flash_attention=draw(st.booleans()), layers_per_stage=layers,
        grad_dtype=draw(st.sampled_from(("fp32", "bf16"))),
        weight_dtype=draw(st.sampled_from(("auto", "fp32", "bf16", "fp8"))),
        offload_optimizer=draw(st.booleans()))
    return model, s


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(strategy_families())
def test_cached_kernels_equal_fresh_substitution(case):
    """The strategy first (its kernels built), then each one-field variant (which must
    get its own kernel where its Structure differs), then all again from disk."""
    _check_family(*case)


#: Strategies whose variants reach what random draws reach only by chance: cp > 1 under an
#: engine whose SP follows CP with sp off, m under an uneven layout with vpp > 1, pp under a
#: layout not symbolic in pp, a placement order that moves a group across nodes. (Checked by
#: removing each Structure field from the key in turn: every removal fails this file.)
BASES = {
    "mindspore-cp-sp-off": ("llama3-8b", ndplan.Strategy(dp=2, pp=2, gbs=8, sp=False, engine="mindspore",
                                                         recompute="selective", recompute_layers=(3, 1))),
    "interleaved-uneven": ("llama3-8b", ndplan.Strategy(tp=2, pp=2, vpp=2, gbs=2, schedule="interleaved",
                                                        layers_per_stage=(7, 9, 9, 7), recompute="full")),
    "alternating-moe-1f1b": ("mixtral-alternating", ndplan.Strategy(dp=2, ep=2, pp=2, gbs=8, zero=3,
                                                                    engine="fsdp")),
    # 32 devices, 8 per node: the order decides whether the TP group stays in a node
    "order-across-nodes": ("llama3-8b", ndplan.Strategy(dp=4, tp=8, gbs=32, zero=0)),
}


@pytest.mark.parametrize("name", list(BASES))
def test_cached_kernels_equal_fresh_substitution_at_chosen_points(name):
    model, s = BASES[name]
    _check_family(MODELS[model], s)


def _check_family(model, s: ndplan.Strategy) -> None:
    family = []
    for v in [s, *_variants(s, model)]:
        try:
            v.check(model)
        except NdplanError:
            continue
        family.append((v, _oracle(model, v)))
    for v, o in family:
        _assert_matches(model, v, o)
    kernels._MEMORY.clear()
    for v, o in reversed(family):
        _assert_matches(model, v, o)


def test_the_oracle_catches_a_key_that_misses_m(monkeypatch):
    """The check above has teeth: with a key that forgets m (the bug of a hand-written
    key), two strategies that differ only in m share a kernel and one of them disagrees
    with the fresh substitution."""
    import importlib
    E = importlib.import_module("ndplan.estimate")  # the module (ndplan.estimate is the function)
    real = E.kernel_key

    def forgets_m(model, view, what, stage=None):
        return real(model, dataclasses.replace(view, m=None), what, stage)
    monkeypatch.setattr(E, "kernel_key", forgets_m)
    model = MODELS["llama3-8b"]
    a = ndplan.Strategy(dp=1, pp=2, vpp=2, gbs=2, schedule="interleaved", layers_per_stage=(2, 14, 2, 14))
    b = dataclasses.replace(a, gbs=8)
    _assert_matches(model, a, _oracle(model, a))
    with pytest.raises(AssertionError):
        _assert_matches(model, b, _oracle(model, b))


def test_two_hooks_never_share_a_kernel():
    """Hooks registered one after the other (the first one freed, so the second may sit at
    its memory address) get kernels of their own: the registration number is in the key."""
    from ndplan import hooks
    model, s = MODELS["llama3-8b"], ndplan.Strategy(dp=2, tp=4, gbs=8)
    base = ndplan.estimate(model, HW, s).time_terms["time.tp_comm"]
    try:
        for k in (2, 3, 5):
            hooks.replace_term("time.tp_comm", lambda term, spec, view, k=k: term.expr * k)
            assert ndplan.estimate(model, HW, s).time_terms["time.tp_comm"] == pytest.approx(k * base, rel=1e-12)
    finally:
        hooks.clear()


def test_structure_holds_only_what_the_builders_read():
    """Numbers enter a Structure only where a builder branches on them (structure.py):
    pp for a layout not symbolic in pp, cp > 1 for an engine whose SP follows CP with sp
    off, m for an uneven layout under vpp > 1; an ends layout at vpp 1 enters as kernel arguments."""
    from ndplan.structure import structure
    llama = MODELS["llama3-8b"]
    even = ndplan.Strategy(dp=2, pp=4, gbs=64)
    assert (structure(llama, even).pp, structure(llama, even).m, structure(llama, even).cp_gt1) == (None, None, None)
    uneven = ndplan.Strategy(pp=2, vpp=2, gbs=4, schedule="interleaved", layers_per_stage=(7, 9, 9, 7))
    assert structure(llama, uneven).pp == 2 and structure(llama, uneven).m == 4
    uneven_1f1b = ndplan.Strategy(pp=4, gbs=4, layers_per_stage=(8, 7, 9, 8))  # middle stages differ
    assert structure(llama, uneven_1f1b).pp == 4 and structure(llama, uneven_1f1b).m is None
    ends = ndplan.Strategy(pp=4, gbs=4, layers_per_stage=(7, 9, 9, 7))  # first/last apart: kernel arguments
    assert structure(llama, ends).pp is None and structure(llama, ends).ends
    assert structure(llama, ends).layers_per_stage is None
    ms = ndplan.Strategy(cp=2, sp=False, engine="mindspore", seq=4096, gbs=1)
    assert structure(llama, ms).cp_gt1 is True
    assert structure(llama, dataclasses.replace(ms, engine="megatron")).cp_gt1 is None
    assert math.isfinite(ndplan.estimate(llama, HW, ms).step_s)


def test_the_cache_key_covers_every_module_the_formulas_import():
    """The kernel cache is keyed by the sources of kernels._EXPR_MODULES: every ndplan module the
    formulas reach (transitively, by their imports) is either one of them or named value-free.
    Before 2026-12-03 engine fields, torch facts, units and vocabulary could change without a new key."""
    import ast
    from pathlib import Path
    from ndplan import kernels
    pkg = Path(kernels.__file__).resolve().parent

    def imported(path: Path) -> set[str]:
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "ndplan":
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ndplan."):
                out.add(node.module.split(".", 1)[1])
        return out

    seen, todo = set(), [f"formulas.{p.stem}" for p in (pkg / "formulas").glob("*.py")]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        for path in (pkg / (mod.replace(".", "/") + ".py"), pkg / mod.replace(".", "/") / "__init__.py"):
            if path.exists():
                todo += sorted(imported(path))
    tops = {m.split(".")[0] + ("" if (pkg / m.split(".")[0]).is_dir() else ".py") for m in seen}
    missing = tops - set(kernels._EXPR_MODULES) - set(kernels._VALUE_FREE_MODULES)
    assert not missing, missing


#: Pairs of catalog models of one architecture class (same layer pattern and structural
#: flags, different sizes): the second must be answered by the first one's kernels.
SAME_CLASS = [("llama3-8b", "llama3-70b"), ("mixtral-8x7b", "mixtral-8x22b"), ("qwen3-8b", "qwen3-32b"),
              ("qwen3-30b-a3b", "qwen3-235b-a22b")]
CLASS_STRATEGIES = [ndplan.Strategy(dp=2, tp=2, pp=2, gbs=8, recompute="selective"),
                    ndplan.Strategy(dp=2, tp=2, pp=2, vpp=2, gbs=8, schedule="interleaved", zero=3, engine="fsdp"),
                    ndplan.Strategy(dp=2, pp=2, vpp=2, gbs=8, schedule="zbv", recompute="full", sp=False,
                                    engine="mindspore"),
                    ndplan.Strategy(dp=4, tp=2, gbs=16, zero=2, sp=False, engine="deepspeed", flash_attention=False)]


def _with_ep(model, s: ndplan.Strategy) -> ndplan.Strategy:
    return dataclasses.replace(s, ep=2) if model.is_moe else s


@pytest.mark.parametrize("pair", SAME_CLASS, ids=["-".join(p) for p in SAME_CLASS])
def test_a_second_model_of_a_class_is_answered_by_the_first_ones_kernels(pair):
    """Model sizes are kernel arguments (kernels.model_kernel): after the first model's
    estimates, the second one's compile nothing, and equal its own fresh substitution."""
    a, b = (ndplan.load_model(n) for n in pair)
    assert a.layer_pattern == b.layer_pattern and a.hidden_size != b.hidden_size
    both = [s for s in CLASS_STRATEGIES if all(_valid(x, _with_ep(x, s)) for x in (a, b))]
    assert len(both) >= 2
    for s in both:
        ndplan.estimate(a, HW, _with_ep(a, s))
    builds = []
    with kernels.compile_listener(lambda: builds.append(1)):
        for s in both:
            sb = _with_ep(b, s)
            _assert_matches(b, sb, _oracle(b, sb))
    assert builds == []


def _valid(model, s: ndplan.Strategy) -> bool:
    try:
        s.check(model)
        return True
    except NdplanError:
        return False


def test_the_oracle_catches_a_kernel_shared_across_models_that_differ(monkeypatch):
    """The check above has teeth: if the stored kernel's key forgot what the builder read
    from the model (readlog.values_of), a GPT-style model (LayerNorm, biases, learned
    positions, a 2-matrix MLP) would get Llama's kernel and disagree with its substitution."""
    from ndplan import readlog
    monkeypatch.setattr(readlog, "values_of", lambda spec, names, derived=None: ())
    a, b = ndplan.load_model("llama3-8b"), ndplan.load_model("megatron-gpt-1.7b")
    s = ndplan.Strategy(dp=2, tp=2, pp=2, gbs=8, seq=2048)
    ndplan.estimate(a, HW, s)
    with pytest.raises(AssertionError):
        _assert_matches(b, s, _oracle(b, s))


def test_an_entry_without_this_pythons_code_is_compiled_once_and_kept(tmp_path, monkeypatch):
    """The disk cache holds the source (any Python) and each Python's marshalled code: an entry
    whose code another Python wrote is compiled and its code written beside it, so the next run
    loads it (the same values either way)."""
    model, s = MODELS["llama3-8b"], ndplan.Strategy(dp=2, tp=2, pp=2, gbs=8)
    first = ndplan.estimate(model, HW, s)
    cache = tmp_path / "kernels"
    codes = sorted(cache.glob("*.kc"))
    assert codes and len(codes) == len(list(cache.glob("*.json"))) - len(list(cache.glob("reads-*.json"))) - len(list(cache.glob("model-*.json")))
    for p in codes:
        p.rename(p.with_name(p.name.replace(kernels._CODE_TAG, "other-python")))
    monkeypatch.setattr(kernels, "_MEMORY", OrderedDict())
    again = ndplan.estimate(model, HW, s)
    assert sorted(cache.glob(f"*.{kernels._CODE_TAG}.kc")) == codes
    assert again.per_stage == first.per_stage and again.step_s == first.step_s


def test_a_stale_or_corrupt_model_memo_costs_speed_never_values(tmp_path, monkeypatch):
    """kernels._ModelMemo keeps, per model, the kernel each key resolved to: a memo whose digests
    name kernels that are gone, or a memo that is not JSON, gives the same estimate."""
    import json
    model, s = ndplan.load_model("llama3-8b"), ndplan.Strategy(dp=2, tp=2, pp=2, gbs=8)
    first = ndplan.estimate(model, HW, s)
    kernels.flush()
    memos = list((tmp_path / "kernels").glob("model-*.json"))
    assert len(memos) == 1
    doc = json.loads(memos[0].read_text())
    assert doc["resolved"]
    memos[0].write_text(json.dumps(doc | {"resolved": {k: "0" * 32 for k in doc["resolved"]}}))
    for text in (None, "\x00 not json"):
        if text is not None:
            memos[0].write_text(text)
        monkeypatch.setattr(kernels, "_MEMORY", OrderedDict())
        monkeypatch.setattr(kernels._ModelMemo, "_BY_SPEC", {})
        again = ndplan.estimate(model, HW, s)
        assert again.per_stage == first.per_stage and again.step_s == first.step_s
