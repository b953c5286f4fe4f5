"""The CLI's single sources (issue #12): points.strategy_from_point derives dp, the
default global batch and schedule; labels.label writes every strategy; every option is
checked before the long work (the sweep, the estimate) starts; check keeps a memory
limit in bytes. Expected values are worked out by hand, not read from ndplan."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from ndplan import Strategy
from ndplan.cli import main
from ndplan.errors import NdplanError
from ndplan.labels import label
from ndplan.points import strategy_from_point

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


# ---------------------------------------------------------------- points

def test_point_derives_dp_gbs_and_schedule():
    # 16 devices, pp 2, vpp 2: dp = 16 / (1*2*1) = 8; gbs = dp*mbs*pp = 8*1*2 = 16; vpp > 1: interleaved
    s = strategy_from_point({"pp": 2, "vpp": 2}, gpus=16)
    assert (s.dp, s.gbs, s.schedule, s.m) == (8, 16, "interleaved", 2)
    # tp 4, cp 2, mbs 2 on 64: dp = 64 / 8 = 8; gbs = 8*2*1 = 16; 1f1b
    s = strategy_from_point({"tp": 4, "cp": 2, "mbs": 2}, gpus=64)
    assert (s.dp, s.gbs, s.schedule) == (8, 16, "1f1b")


def test_point_keeps_what_is_given():
    s = strategy_from_point({"dp": 2, "gbs": 64, "schedule": "gpipe", "pp": 4, "recompute": "full"}, gpus=None)
    assert (s.dp, s.gbs, s.schedule, s.recompute, s.zero, s.sp) == (2, 64, "gpipe", "full", 1, True)
    assert strategy_from_point({}, gpus=None) == Strategy(dp=1, gbs=1)  # no devices: dp 1, gbs 1*1*1


def test_point_errors_name_the_field():
    with pytest.raises(NdplanError) as e:
        strategy_from_point({"tp": 4, "pp": 2}, gpus=12)
    assert e.value.field == "--gpus" and "1*" not in str(e.value) and "4*2*1 = 8" in str(e.value)
    with pytest.raises(NdplanError) as e:
        strategy_from_point({"tensor": 2})
    assert e.value.field == "tensor"


def test_estimate_and_compare_derive_the_same_strategy():
    """Both commands take their defaults from points (they had a copy each)."""
    args = ["-m", "llama3-8b", "--gpus", "16", "--seq", "2048"]
    est = CliRunner().invoke(main, ["estimate", *args, "--pp", "2", "--vpp", "2", "--gbs", "32", "--json"])
    cmp = CliRunner().invoke(main, ["compare", *args, "--gbs", "32", "pp=2,vpp=2", "pp=2", "--json"])
    assert est.exit_code == 0 and cmp.exit_code == 0, (est.output, cmp.output)
    a = json.loads(est.stdout)["strategy"]
    b = [e["strategy"] for e in json.loads(cmp.stdout)["estimates"]]
    assert a == b[0]
    assert (a["dp"], a["schedule"], b[1]["schedule"]) == (8, "interleaved", "1f1b")


def test_why_defaults_the_schedule_as_estimate_does():
    """``sweep --why "pp=2,vpp=2"`` on 16 devices: estimate takes that point as an
    interleaved pipeline (dp 8, m = 16/8 = 2, a multiple of pp), a valid candidate."""
    from ndplan import load_model
    from ndplan.space import why
    assert why(load_model("llama3-8b"), 16, 4096, 16, None, {"pp": 2, "vpp": 2}) is None


# ---------------------------------------------------------------- labels

def test_one_label_for_strategies_and_rows():
    s = Strategy(dp=8, tp=2, pp=2, vpp=2, mbs=1, gbs=32, seq=2048, schedule="interleaved", recompute="selective")
    text = "dp=8 tp=2 pp=2 vpp=2 cp=1 ep=1 etp=1 mbs=1 zero=1 recompute=selective schedule=interleaved"
    assert label(s) == text
    row = {k: v for k, v in s.as_dict().items() if k not in ("recompute_layers", "seq", "gbs")}
    assert label(row) == text  # a sweep row (no recompute_layers, seq, gbs) reads the same
    assert label(Strategy(tp=2, sp=False)).endswith(" sp=off")
    assert label(s, full=True) == ("dp=8 tp=2 pp=2 vpp=2 cp=1 ep=1 etp=1 mbs=1 gbs=32 m=4 seq=2048 zero=1 sp=on "
                                   "recompute=selective schedule=interleaved engine=megatron")


def test_label_shows_recompute_layers():
    s = Strategy(pp=2, gbs=4, recompute="full", recompute_layers=(4, 2))
    assert "recompute=full[first 4,2]" in label(s, full=True)
    assert "recompute=selective[first 3]" in label(Strategy(recompute="selective", recompute_layers=3))


def test_label_with_commas_reads_back_as_a_point():
    from ndplan.cli_sweep import _parse_point
    from ndplan.space import normalize_space
    s = Strategy(dp=4, tp=2, pp=2, gbs=16, zero=3, recompute="full")  # (sp=off: the space reads true/false)
    point = {k: v[0] for k, v in normalize_space(_parse_point(label(s, sep=","))).items() if v is not None}
    assert strategy_from_point({**point, "gbs": 16}, gpus=16) == s


# ---------------------------------------------------------------- checks before work

def _never(*a, **k):
    raise AssertionError("the long work started before the options were checked")


SWEEP = ["sweep", "-m", "llama3-8b", "--gpus", "8", "--gbs", "8"]


@pytest.mark.parametrize("extra, field", [
    (["--mem-limit-gib", "1000"], "mem_limit_gib"),                      # above the h100's 80 GiB
    (["--mem-limit-gib", "10", "--mem-fraction", "0.5"], "mem_fraction"),  # both
    (["--mem-fraction", "1.5"], "--mem-fraction"),
    (["--mem-limit-gib", "-1"], "--mem-limit-gib"),
    (["--report", "{tmp}/plan.txt"], "--report"),
    (["--report", "{tmp}/no/such/plan.md"], "--report"),
    (["--emit", "megatron", "--emit-out", "{tmp}/no/such/x.sh"], "--emit-out"),
    (["--why", "dp8"], "--why"),
    (["--tp", "three"], "tp"),
    (["--set", "gemm_eficiency=0.7"], "--set"),
])
@pytest.mark.parametrize("min_gpus", [False, True])
def test_sweep_options_fail_before_the_sweep(monkeypatch, tmp_path, extra, field, min_gpus):
    import ndplan.cli_sweep as cs
    monkeypatch.setattr(cs, "sweep", _never)
    monkeypatch.setattr(cs, "find_min_gpus", _never)
    args = SWEEP if not min_gpus else ["sweep", "-m", "llama3-8b", "--gbs", "8", "--find-min-gpus"]
    res = CliRunner().invoke(main, args + [a.replace("{tmp}", str(tmp_path)) for a in extra])
    assert res.exit_code == 2, (res.output, res.exception)
    [line] = res.output.strip().splitlines()
    assert line.startswith("error: ") and f"{field}=" in line, line


@pytest.mark.parametrize("extra, field", [
    (["--report", "{tmp}/plan.pdf"], "--report"),
    (["--export-layers", "{tmp}/no/such/layers.yaml"], "--export-layers"),
    (["--pp", "2", "--vpp", "2", "--schedule", "zbv", "--emit", "megatron"], "schedule"),  # megatron has no zbv
    (["--emit-out", "{tmp}/x.sh"], "--emit-out"),  # without --emit
])
def test_estimate_options_fail_before_the_estimate(monkeypatch, tmp_path, extra, field):
    import ndplan.cli as cli
    monkeypatch.setattr(cli, "run_estimate", _never)
    res = CliRunner().invoke(main, ["estimate", "-m", "llama3-8b", "--gpus", "8", "--gbs", "16",
                                    *[a.replace("{tmp}", str(tmp_path)) for a in extra]])
    assert res.exit_code == 2, (res.output, res.exception)
    [line] = res.output.strip().splitlines()
    assert line.startswith("error: ") and f"{field}=" in line, line


def test_check_limit_fails_before_the_estimate(monkeypatch):
    import ndplan.check as check
    monkeypatch.setattr(check, "estimate", _never)
    res = CliRunner().invoke(main, ["check", str(EXAMPLES / "torchtitan/llama3_8b.toml"), "--gpus", "16",
                                    "--mem-limit-gib", "1000"])
    assert res.exit_code == 2 and "mem_limit_gib=1000" in res.output, res.output


# ---------------------------------------------------------------- check: a limit in bytes

def test_check_reads_a_half_gib_cap_as_half_a_gib(tmp_path):
    """A MindFormers cap of 0.5GB is 2^29 bytes; the proposals' sweep gets it in bytes,
    not as 0.5 "GiB" that it would take for a forgotten --mem-fraction."""
    from ndplan.check import check
    from ndplan.interop import read_config
    text = (EXAMPLES / "mindformers/pretrain_llama3_8b.yaml").read_text()
    assert 'max_device_memory: "58GB"' in text
    path = tmp_path / "half.yaml"
    path.write_text(text.replace('max_device_memory: "58GB"', 'max_device_memory: "0.5GB"'))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = check(read_config(str(path)), top=1)
    assert res.limit_bytes == 2**29 and "max_device_memory" in res.limit_source
    assert not res.fits and res.proposals == []  # nothing fits in 512 MiB
    assert not [w for w in seen if "under 1 GiB" in str(w.message)], [str(w.message) for w in seen]


# ---------------------------------------------------------------- structure

@pytest.mark.parametrize("module", ["cli", "cli_check", "cli_sweep", "cli_format", "cli_options", "cli_emit",
                                    "labels", "points"])
def test_cli_modules_import_alone(module):
    """No import cycle: each module imports in a fresh interpreter on its own."""
    r = subprocess.run([sys.executable, "-c", f"import ndplan.{module}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
