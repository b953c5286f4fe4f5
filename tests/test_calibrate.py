"""ndplan calibrate: constants recovered from runs generated with known values (and noise),
published runs predicted better after calibration (leave-one-out), the override file used
by another command, and one-line errors for bad RUNS files."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import ndplan
from ndplan.calibrate import Run, fit, load_runs
from ndplan.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "calibrate" / "torchtitan_a100_runs.yaml"
TRUTH = {"gemm_efficiency": 0.58, "attention_efficiency": 0.42, "intra_node_efficiency": 0.65}


def _generated_runs(noise: float, seed: int = 7) -> list[Run]:
    """Runs whose 'measured' step is ndplan.estimate's at TRUTH (hardware.with_overrides, the
    path every command takes) times exp(N(0, noise)): compute-bound ones at 2k-8k tokens
    (GEMM vs attention share differs with the sequence) and tp = 8 ones (NVLink-bound)."""
    rng = random.Random(seed)
    base = ndplan.load_hardware("h100-sxm")
    truth = base.with_overrides(TRUTH)
    cases = [("llama3-8b", dict(dp=8, seq=2048, gbs=64)), ("llama3-8b", dict(dp=8, seq=8192, gbs=16)),
             ("llama3-8b", dict(tp=8, seq=4096, gbs=16)), ("llama3-8b", dict(dp=2, tp=4, seq=8192, gbs=16)),
             ("llama2-13b", dict(dp=8, seq=4096, gbs=32, recompute="full")),
             ("llama2-13b", dict(tp=8, seq=2048, gbs=32)), ("llama3-70b", dict(tp=8, seq=8192, gbs=8)),
             ("llama3-8b", dict(dp=8, seq=4096, gbs=32, recompute="selective"))]
    runs = []
    for k, (name, kw) in enumerate(cases):
        model = ndplan.load_model(name)
        strat = ndplan.Strategy(**({"recompute": "none"} | kw))
        step = ndplan.estimate(model, truth, strat).step_s * math.exp(rng.gauss(0.0, noise))
        runs.append(Run(name=f"{name}-{k}", model=model, hardware=base, strategy=strat, step_s=step))
    return runs


def test_recovers_known_constants_within_their_intervals():
    f = fit(_generated_runs(noise=0.01), list(TRUTH))
    assert f.dof == 5 and not f.not_fitted
    for k, want in TRUTH.items():
        lo, hi = f.intervals[k]
        assert lo <= want <= hi, (k, want, f.values[k], (lo, hi))
        assert abs(f.values[k] - want) < 0.05, (k, f.values[k])
    assert max(abs(e) for e in f.after) < 0.04  # the residuals are the 1 % noise, not model error


def test_noise_free_runs_give_the_constants_exactly():
    f = fit(_generated_runs(noise=0.0), list(TRUTH))
    for k, want in TRUTH.items():
        assert f.values[k] == pytest.approx(want, abs=1e-4)
    assert all(abs(e) < 1e-6 for e in f.after)
    assert not f.outliers


def test_a_constant_no_run_moves_is_kept_and_named():
    """Every generated run sits in one node: the NIC's efficiency moves no step time."""
    f = fit(_generated_runs(noise=0.0), list(TRUTH) + ["inter_node_efficiency"])
    assert "inter_node_efficiency" in f.not_fitted and "inter_node_efficiency" not in f.values


def test_published_runs_are_predicted_better_after_calibration():
    """torchtitan's 8 published A100 runs (examples/calibrate, pytorch/torchtitan docs/
    performance.md @3faaa1a0): the median |error| of each run predicted by a fit that left it
    out is below the median |error| of the hardware's own constants."""
    runs = load_runs(EXAMPLE)
    f = fit(runs)
    before = sorted(abs(x) for x in f.before)
    loo = sorted(abs(x) for x in f.loo if x is not None)
    assert len(loo) == len(runs) == 8
    med = lambda xs: (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2  # noqa: E731
    assert med(loo) < med(before), (med(loo), med(before))


def test_cli_writes_a_hardware_file_every_command_takes(tmp_path):
    out = tmp_path / "a100-fit.yaml"
    r = CliRunner().invoke(main, ["calibrate", str(EXAMPLE), "--fit", "gemm_efficiency", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    fitted = doc["constants"]["gemm_efficiency"]["value"]
    hw = yaml.safe_load(out.read_text())
    assert hw["gemm_efficiency"]["value"] == round(fitted, 4)
    assert "fitted by ndplan calibrate" in hw["gemm_efficiency"]["source"]
    assert ndplan.load_hardware(str(out)).gemm_efficiency == round(fitted, 4)
    r = CliRunner().invoke(main, ["estimate", "-m", "llama3-8b", "-H", str(out), "--dp", "8", "--json"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("edit,field", [
    ({"step_time_s": -1}, "runs[0].step_time_s"),
    ({"step_time_s": "fast"}, "runs[0].step_time_s"),
    ({"step_time_s": float("nan")}, "runs[0].step_time_s"),
    ({"hardware": "h100-sxm"}, "hardware"),
    ({"model": "no-such-model"}, "model"),
    ({"strategy": {"dp": 3, "gbs": 64, "seq": 8192}}, "gbs"),
])
def test_bad_runs_file_is_one_line_exit_2(tmp_path, edit, field):
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["runs"][0] |= edit
    f = tmp_path / "runs.yaml"
    f.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(main, ["calibrate", str(f)])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    assert field in lines[0], lines[0]


def test_unknown_constant_is_one_line_exit_2():
    r = CliRunner().invoke(main, ["calibrate", str(EXAMPLE), "--fit", "gemm_speed"])
    assert r.exit_code == 2 and "--fit" in r.output and "gemm_efficiency" in r.output
