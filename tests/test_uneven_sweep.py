"""Uneven ("ends") pipeline layouts in the sweep (layouts.py).

Oracles: a brute-force enumeration of every split of the layers over the stages,
filtered by the family's form written here from its statement (not from layouts.py);
the layer list counted layer by layer (the concrete placement path, which knows no
closed form); Megatron-LM's own rules for --decoder-first/last-pipeline-num-layers
(NVIDIA/Megatron-LM@d98e8a64 transformer_config.py:2294-2345, transformer_block.py:
104-146 and 175-178), transcribed below.
"""

from __future__ import annotations

import itertools
from unittest import mock

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings, strategies as st

import ndplan
from ndplan import layouts
from ndplan import symbols as S
from ndplan.formulas import placement as PL
from ndplan.space import generate, why
from ndplan.strategy import Strategy
from ndplan.structure import structure


def _compositions(L: int, parts: int, unit: int):
    """Every split of L layers into ``parts`` stage counts, each a positive multiple of ``unit``."""
    if L % unit:
        return
    n = L // unit
    for cuts in itertools.combinations(range(1, n), parts - 1):
        bounds = (0,) + cuts + (n,)
        yield tuple((b - a) * unit for a, b in zip(bounds, bounds[1:]))


def _allowed(counts: tuple[int, ...], vpp: int) -> bool:
    """The family as stated in the sweep's help: pp >= 3, the middle stages equal (M), the
    first and last each within [M - 2 vpp, M + vpp]; pp = 2: at most 3 vpp apart; the
    even split excluded (it is the even row)."""
    if len(set(counts)) == 1:
        return False
    if len(counts) == 2:
        return abs(counts[0] - counts[1]) <= 3 * vpp
    mid = set(counts[1:-1])
    if len(mid) != 1:
        return False
    m = mid.pop()
    return all(m - 2 * vpp <= c <= m + vpp for c in (counts[0], counts[-1]))


def _megatron_accepts(L: int, pp: int, vpp: int, first: int, last: int) -> bool:
    """Megatron-LM's checks of --decoder-first/last-pipeline-num-layers, transcribed."""
    if first <= 0 or last <= 0:
        return False
    if vpp > 1 and (first % vpp or last % vpp):
        return False
    rest, stages = L - first - last, pp - 2
    if bool(rest) != bool(stages):
        return False  # "Mismatch: ... middle layers remaining but ... middle PP stages"
    if stages and rest % stages:
        return False
    per_rank = rest // stages if stages else 0
    return all(n % vpp == 0 for n in (first, last, per_rank))


def _sweep_layouts(model, gpus, space) -> set:
    out = set()
    for g in generate(model, gpus, 4096, 64, space).groups:
        for pp, f, last, u in zip(g.grid["pp"], g.grid["first_layers"], g.grid["last_layers"], g.grid["uneven"]):
            if u:
                out.add((int(pp), g.vpp, int(f), int(last)))
    return out


@pytest.mark.parametrize("name,vpps", [("llama3.2-1b", (1, 2)), ("deepseek-v2-lite", (1, 3))])
def test_sweep_holds_every_layout_of_the_family(name, vpps):
    """The sweep's uneven rows are exactly the brute-force layouts of the stated form, and
    every one of them passes Megatron-LM's own rules."""
    model = ndplan.load_model(name)
    L = model.num_hidden_layers
    space = {"tp": 1, "cp": 1, "ep": 1, "mbs": 1, "zero": 1, "recompute": "none", "vpp": list(vpps),
             "schedule": ["1f1b", "interleaved"]}
    got = _sweep_layouts(model, 16, space)
    want = set()
    for pp in (2, 4, 8, 16):
        for vpp in vpps:
            schedule_ok = vpp == 1 or (64 // (16 // pp)) % pp == 0  # interleaved: m a multiple of pp
            if pp * vpp > L or not schedule_ok:
                continue
            for counts in _compositions(L, pp, vpp):
                if _allowed(counts, vpp):
                    want.add((pp, vpp, counts[0], counts[-1]))
    assert want, "the case must hold uneven layouts"
    assert got == want
    assert all(_megatron_accepts(L, pp, vpp, f, last) for pp, vpp, f, last in got)


def _concrete():
    """Estimate with layer counts taken from the layer list (no ends closed form): ends_layout
    (layouts.py) patched where it is defined and where it is imported by name."""
    no = lambda spec, strat: False  # noqa: E731
    return (mock.patch("ndplan.layouts.ends_layout", no), mock.patch("ndplan.formulas.placement.ends_layout", no),
            mock.patch("ndplan.structure.ends_layout", no))


def test_best_uneven_layout_equals_brute_force():
    """On deepseek-v2-lite (27 layers, the first dense) on 8 devices, the sweep's fastest
    fitting uneven row is the fastest fitting layout of a brute-force enumeration
    evaluated layer list by layer list (the concrete placement path). The memory limit is
    the median peak of the enumeration, so that about half the layouts are rejected."""
    model, hw = ndplan.load_model("deepseek-v2-lite"), ndplan.load_hardware("h100-sxm")
    gpus, seq, gbs = 8, 4096, 32
    fixed = {"tp": 1, "cp": 1, "ep": 1, "etp": 1, "mbs": 1, "zero": 1, "recompute": "none",
             "schedule": "1f1b", "vpp": 1, "sp": True}
    results = []
    p1, p2, p3 = _concrete()
    with p1, p2, p3:
        for pp in (2, 4, 8):
            for counts in _compositions(model.num_hidden_layers, pp, 1):
                if not _allowed(counts, 1):
                    continue
                s = Strategy(dp=gpus // pp, pp=pp, layers_per_stage=counts, gbs=gbs, seq=seq, **fixed)
                assert structure(model, s).layers_per_stage == counts  # the concrete path
                e = ndplan.estimate(model, hw, s, gpus)
                results.append((e.step_s, e.peak_bytes, counts))
    limit = float(np.median([x[1] for x in results]))
    fits = [x for x in results if x[1] <= limit]
    assert fits and len(fits) < len(results), "the limit must reject some layouts"
    step, _, _ = min(fits)
    winners = {c for s_, _, c in fits if s_ == pytest.approx(step, rel=1e-9)}

    r = ndplan.sweep(model, hw, gpus, seq, gbs, {**fixed, "uneven": True}, top=0, mem_limit_gib=limit / 2**30)
    t = r.table
    uneven = np.nonzero(t.grid["uneven"][:r.feasible])[0]
    assert len(uneven)
    best = r.strategy(int(uneven[0]))
    assert best.layers_per_stage in winners
    assert float(t.step_s[uneven[0]]) == pytest.approx(step, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["llama3.2-1b", "deepseek-v2-lite", "qwen3-30b-a3b", "deepseek-v3"]),
       pp=st.integers(2, 9), schedule=st.sampled_from(["1f1b", "interleaved", "zbv"]), seed=st.integers(0, 10**6))
def test_ends_closed_form_counts_the_layer_list(name, pp, schedule, seed):
    """placement's ends closed form (dense, MoE layers of every (stage, chunk)) equals the
    layer list counted layer by layer, for every layout of the family."""
    model = ndplan.load_model(name)
    vpp = {"1f1b": 1, "interleaved": 3 if model.num_hidden_layers % 3 == 0 else 2, "zbv": 2}[schedule]
    options = layouts.ends_options(model.num_hidden_layers, pp, vpp)
    if not options:
        return
    f, last = options[seed % len(options)]
    lps = layouts.layers_per_stage(model.num_hidden_layers, pp, vpp, schedule, f, last)
    assert sum(lps) == model.num_hidden_layers and layouts.ends_of(pp, vpp, schedule, lps) == (f, last)
    given_ = Strategy(pp=pp, vpp=vpp, schedule=schedule, layers_per_stage=lps, gbs=pp * 2, seq=4096)
    view = structure(model, given_)
    import dataclasses
    ends = dataclasses.replace(view, ends=True, layers_per_stage=None, pp=None, m=None)
    values = {S.pp: pp, S.first_layers: f, S.last_layers: last}
    for stage in range(pp):
        for chunk in range(vpp):
            want = PL.chunk_layers(model, given_, stage, chunk, pp)
            got = PL.chunk_layers(model, ends, S.stage, chunk, S.pp)
            got = tuple(sp.sympify(x).subs(values | {S.stage: stage}) for x in got)
            assert tuple(int(x) for x in want) == got, (stage, chunk)


def test_sweep_row_equals_estimate_on_uneven_rows():
    """Peak and step time of uneven sweep rows (vpp 1) equal estimate() of their Strategy,
    every stage evaluated."""
    model, hw = ndplan.load_model("deepseek-v2-lite"), ndplan.load_hardware("h100-sxm")
    r = ndplan.sweep(model, hw, 16, 4096, 64, {"tp": [1, 2], "cp": 1, "mbs": [1, 2], "zero": [1, 3], "vpp": 1,
                                                "schedule": ["1f1b", "zb-h1"], "uneven": True}, top=0)
    rows = np.nonzero(r.table.grid["uneven"])[0]
    assert len(rows) > 20
    for i in rows[:: max(1, len(rows) // 25)]:
        e = ndplan.estimate(model, hw, r.strategy(int(i)), 16)
        assert float(r.table.peak_bytes[i]) == pytest.approx(e.peak_bytes, rel=1e-9)
        assert float(r.table.step_s[i]) == pytest.approx(e.step_s, rel=1e-9)


def test_why_names_the_layout_rule():
    model = ndplan.load_model("deepseek-v3")
    assert why(model, 1024, 4096, 1024, {}, {"pp": 16, "tp": 8}).startswith("layers:")
    assert why(model, 1024, 4096, 1024, {}, {"pp": 16, "tp": 8, "first_layers": 3, "last_layers": 2}) is None
    msg = why(model, 1024, 4096, 1024, {}, {"pp": 16, "tp": 8, "first_layers": 9})
    # 61 = 3 + 14*4 + 2: the middle holds 4, the ends 4-2 .. 4+1 with first + last = 5
    assert msg.startswith("layout: first_layers=9") and msg.endswith("the ones there: 2/3, 3/2")


def test_emit_writes_the_uneven_layout(tmp_path):
    """The Megatron launch of an uneven sweep row carries the first/last stage counts, and
    check reads them back to the same split."""
    from click.testing import CliRunner
    from ndplan.cli import main
    out = tmp_path / "run.sh"
    res = CliRunner().invoke(main, ["sweep", "-m", "deepseek-v3", "-H", "h800", "--gpus", "2048", "--seq", "4096",
                                    "--gbs", "2048", "--pp", "16", "--tp", "8", "--cp", "1", "--vpp", "1",
                                    "--schedule", "1f1b", "--zero", "1", "--recompute", "full", "--mbs", "1",
                                    "--emit", "megatron", "--emit-out", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "--decoder-first-pipeline-num-layers" in text and "--decoder-last-pipeline-num-layers" in text
