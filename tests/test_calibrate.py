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
    ({"peak_gb": 50}, "runs[0].peak_gb"),  # a typo of peak_gib: its value would be dropped
    ({"seq": 4096}, "runs[0].seq"),  # the strategy says seq 8192
    ({"peak_gib": -3}, "runs[0].peak_gib"),
    ({"file": "run.sh"}, "runs[0].strategy"),  # a launch file beside a strategy: which one runs?
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


def test_left_out_run_keeps_the_hardware_value_of_what_only_it_moves():
    """Leave-one-out without leaking: three runs in one node and one across nodes (tp 8 x pp 2 over
    two 8-GPU nodes); the left-out multi-node run's error is the one predicted with the other three's
    GEMM efficiency and the hardware's own inter-node efficiency, which only it moves (its
    pipeline send/recv crosses the nodes)."""
    base = ndplan.load_hardware("h100-sxm")
    truth = base.with_overrides({"gemm_efficiency": 0.6, "inter_node_efficiency": 0.5})
    model = ndplan.load_model("llama3-70b")
    strategies = [ndplan.Strategy(tp=8, seq=4096, gbs=8), ndplan.Strategy(tp=8, seq=2048, gbs=16),
                  ndplan.Strategy(tp=4, pp=2, seq=4096, gbs=8), ndplan.Strategy(tp=8, pp=2, seq=4096, gbs=8)]
    runs = [Run(name=f"r{k}", model=model, hardware=base, strategy=s,
                step_s=ndplan.estimate(model, truth, s, s.world).step_s) for k, s in enumerate(strategies)]
    f = fit(runs, ["gemm_efficiency", "inter_node_efficiency"])
    # the other three are noise-free and in one node: their fit is the true GEMM efficiency, 0.6
    predicted = ndplan.estimate(model, base.with_overrides({"gemm_efficiency": 0.6}), strategies[3], 16).step_s
    assert f.loo[3] == pytest.approx(predicted / runs[3].step_s - 1, abs=1e-5)
    assert abs(f.loo[3]) > 1e-4  # 0.85 is not the truth's 0.5: a fit that leaked the run would give 0


def test_a_constant_driven_to_its_bound_is_named_and_the_file_still_loads(tmp_path):
    """Runs measured 3x faster than the model can be at any GEMM efficiency <= 1: the fit ends at
    the bound, says so, and the file it writes is a valid hardware entry (efficiency in (0, 1])."""
    from ndplan.calibrate import hardware_yaml
    runs = [Run(name=r.name, model=r.model, hardware=r.hardware, strategy=r.strategy, step_s=r.step_s / 3)
            for r in _generated_runs(noise=0.0)]
    f = fit(runs, ["gemm_efficiency"])
    assert f.at_bound == ["gemm_efficiency"]
    out = tmp_path / "fit.yaml"
    out.write_text(hardware_yaml(f, "runs.yaml"))
    assert 0 < ndplan.load_hardware(str(out)).gemm_efficiency <= 1


def test_a_run_given_as_a_launch_file(tmp_path):
    """file: runs are read as check reads them (paths relative to RUNS.yaml)."""
    from ndplan.interop import read_config
    script = ROOT / "examples" / "megatron" / "pretrain_llama2_7b.sh"
    (tmp_path / "launch.sh").write_text(script.read_text())
    doc = {"hardware": "h100-sxm", "runs": [{"name": "launch", "file": "launch.sh", "step_time_s": 9.5}]
           + yaml.safe_load(EXAMPLE.read_text())["runs"][:1]}
    doc["runs"][1]["hardware"] = "h100-sxm"
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump(doc))
    runs = load_runs(tmp_path / "runs.yaml")
    assert runs[0].strategy == read_config(script).strategy and runs[0].step_s == 9.5


@pytest.mark.parametrize("args,field", [(["--fit", ","], "--fit"), (["--fit", ""], "--fit"),
                                        (["--fit", "gemm_efficiency,gemm_speed"], "--fit")])
def test_fit_names_are_checked(args, field):
    r = CliRunner().invoke(main, ["calibrate", str(EXAMPLE)] + args)
    assert r.exit_code == 2 and r.output.count("error:") == 1 and field in r.output, r.output


def test_one_run_cannot_fit_a_constant(tmp_path):
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["runs"] = doc["runs"][:1]
    f = tmp_path / "runs.yaml"
    f.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(main, ["calibrate", str(f)])
    assert r.exit_code == 2 and r.output.count("error:") == 1, r.output


def test_runs_on_flash_attention_2_recover_its_plateau_and_write_it_there():
    """Runs whose engine runs FlashAttention-2 on H100 read fa2_attention_efficiency: generated
    at 0.30 there, the fitted attention constant is 0.30, written into that field of the YAML
    (the fused kernels' attention_efficiency keeps the catalog's)."""
    from ndplan.calibrate import hardware_yaml
    base = ndplan.load_hardware("h100-sxm")
    truth = base.with_overrides({"fa2_attention_efficiency": 0.30})
    model = ndplan.load_model("llama3-8b")
    runs = []
    for k, seq in enumerate((1024, 2048, 4096, 8192)):
        strat = ndplan.Strategy(dp=8, seq=seq, gbs=8, engine="fsdp[attention_fa2=1]")
        runs.append(Run(name=f"fa2-{k}", model=model, hardware=base, strategy=strat,
                        step_s=ndplan.estimate(model, truth, strat).step_s))
    f = fit(runs, ["attention_efficiency"])
    assert f.values["attention_efficiency"] == pytest.approx(0.30, abs=1e-4)
    doc = yaml.safe_load(hardware_yaml(f, "runs.yaml"))
    assert doc["fa2_attention_efficiency"]["value"] == pytest.approx(0.30, abs=1e-4)
    assert "fitted by ndplan calibrate" in doc["fa2_attention_efficiency"]["source"]
    assert doc["attention_efficiency"]["value"] == base.attention_efficiency
