"""A Python hook replaces a Term everywhere it is built (estimate and sweep kernels)."""

import pytest

import ndplan
from ndplan import hooks


def test_hook_replaces_time_term_in_estimate_and_sweep():
    model, hw = ndplan.load_model("llama3-8b"), ndplan.load_hardware("h100-sxm")
    strat = ndplan.Strategy(dp=2, tp=4, pp=1, mbs=1, gbs=8, seq=4096)
    base = ndplan.estimate(model, hw, strat).time_terms["time.tp_comm"]
    assert base > 0
    hooks.replace_term("time.tp_comm", lambda term, spec, st: term.expr / 2)
    try:
        hooked = ndplan.estimate(model, hw, strat)
        assert hooked.time_terms["time.tp_comm"] == pytest.approx(base / 2)
        assert "user hook" in hooked.time_breakdown["time.tp_comm"].source
        r = ndplan.sweep(model, hw, 8, 4096, 8, {"tp": 4, "pp": 1, "cp": 1, "mbs": 1, "zero": 1,
                                                  "recompute": "none"}, top=1)
        assert r.table.time_terms["time.tp_comm"][0] == pytest.approx(base / 2)
    finally:
        hooks.clear()
    assert ndplan.estimate(model, hw, strat).time_terms["time.tp_comm"] == pytest.approx(base)
