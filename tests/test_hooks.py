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


def test_set_overrides_an_engine_setting_without_code():
    """--set overlap_tp_comm=1 hides TP communication (an engine setting, no Python)."""
    from click.testing import CliRunner

    from ndplan.cli import main
    args = ["estimate", "-m", "llama3-8b", "-H", "h100-sxm", "--gpus", "8", "--tp", "4", "--gbs", "8", "--json"]
    base = CliRunner().invoke(main, args)
    hid = CliRunner().invoke(main, args + ["--set", "overlap_tp_comm=1"])
    assert base.exit_code == 0 and hid.exit_code == 0, hid.output
    import json
    t0, t1 = json.loads(base.stdout)["time"]["terms"], json.loads(hid.stdout)["time"]["terms"]
    assert t0["time.tp_comm"] > 0 and t1["time.tp_comm"] == 0
    bad = CliRunner().invoke(main, args + ["--set", "overlap_tp_com=1"])
    assert bad.exit_code == 2 and "overlap_tp_comm" in bad.output
