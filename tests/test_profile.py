"""``ndplan profile`` and ``--profile FILE`` (ndplan.profile_run, ndplan.profile_file).

* From measurement to prediction on CPU: torchrun with two gloo ranks writes a profile, and
  estimate / explain take it (the same code runs on GPUs with NCCL).
* The constants a profile gives, derived by hand from a synthetic profile: GEMM rates
  interpolated in log space (a geometric mean halfway), attention FLOPs of a causal call
  (4 b h s^2 d / 2 forward, 2.5x that backward) over the length factor, the copy's read + write
  bytes, the all-gather bus bandwidth (n - 1)/n B / t and the latency per ring step.
* Bad profiles are one-line errors.
"""

import math
import shutil
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

import ndplan
from ndplan import profile_file
from ndplan.cli import main
from ndplan.formulas.step import ATTN_HALF_TOKENS

HW = ndplan.load_hardware("h100-sxm")


def _doc(**over):
    doc = {"ndplan_profile": 1, "meta": {"device": "test", "backend": "nccl", "dtype": "bfloat16", "nodes": 1,
                                         "seq": 1024, "mbs": 1},
           "gemm": [{"m": 1000, "k": 1000, "n": 500, "seconds": 1e-3},        # 1e9 FLOPs at 1e12 FLOP/s
                    {"m": 10000, "k": 1000, "n": 5000, "seconds": 1e-3}],     # 1e11 FLOPs at 1e14 FLOP/s
           "attention": [{"batch": 1, "heads": 8, "seq": 2048, "head_dim": 128, "forward_s": 1e-3,
                          "backward_s": 2e-3}],
           "hbm": [{"bytes": 2 ** 30, "seconds": 1e-3}],
           "collectives": [{"op": "all_gather", "group": "world", "ranks": 8, "bytes": 2 ** 20, "seconds": 7e-5},
                           {"op": "all_gather", "group": "world", "ranks": 8, "bytes": 2 ** 30, "seconds": 4e-3}]}
    return doc | over


def test_gemm_rate_is_interpolated_in_log_space():
    rows = _doc()["gemm"]
    assert profile_file.interpolate_rate(rows, 1e10) == pytest.approx(1e13, rel=1e-12)  # halfway in log FLOPs
    assert profile_file.interpolate_rate(rows, 1e8) == pytest.approx(1e12, rel=1e-12)   # flat below
    assert profile_file.interpolate_rate(rows, 1e12) == pytest.approx(1e14, rel=1e-12)  # and above


def test_constants_of_a_profile_by_hand():
    found = profile_file.overrides(_doc(), HW)
    peak = HW.bf16_tflops * 1e12
    # the two measured GEMMs themselves: (1e9 + 1e11) FLOPs in 2 ms
    assert found["gemm_efficiency"][0] == pytest.approx((1e9 + 1e11) / 2e-3 / peak, rel=1e-12)
    fwd = 0.5 * 4 * 1 * 8 * 2048 ** 2 * 128
    attn = fwd * 3.5 / 3e-3 / peak * (2048 + ATTN_HALF_TOKENS) / 2048
    assert found["attention_efficiency"][0] == pytest.approx(attn, rel=1e-12)
    assert found["hbm_efficiency"][0] == pytest.approx(2 * 2 ** 30 / 1e-3 / (HW.hbm_gb_per_s * 1e9), rel=1e-12)
    busbw = 2 ** 30 / 4e-3 * 7 / 8
    assert found["intra_node_efficiency"][0] == pytest.approx(busbw / (HW.intra_node_gb_per_s * 1e9), rel=1e-12)
    assert found["intra_node_latency_us"][0] == pytest.approx(7e-5 / 7 * 1e6, rel=1e-12)
    assert "inter_node_efficiency" not in found  # one node: no inter-node group measured
    # 16-bit GEMMs were timed: the FP8 efficiency moves with them at the catalog's MAMF ratio
    # (1402.6 / 1978.9 over 794.5 / 989.4, Bekman's H100 SXM rows); the attention plateau is SDPA's
    ratio = (1402.6 / 1978.9) / (794.5 / 989.4)
    assert found["fp8_gemm_efficiency"][0] == pytest.approx(found["gemm_efficiency"][0] * ratio, rel=1e-9)
    assert found["fa2_attention_efficiency"][0] == found["attention_efficiency"][0]
    # an entry whose 16-bit efficiency was set (calibrated) still scales by the MAMF ratio
    calibrated = profile_file.overrides(_doc(), HW.with_overrides({"gemm_efficiency": 0.5}))
    assert calibrated["fp8_gemm_efficiency"][0] == pytest.approx(found["fp8_gemm_efficiency"][0], rel=1e-12)


def test_the_planned_model_shapes_are_interpolated():
    """With a model, the efficiency is the planned GEMMs' FLOP-weighted rate. Llama-3-8B at seq
    1024, tp 1: q/k/v 2 x 1024 x 4096 x 6144, o x 4096, gate+up x 28672, down 2 x 1024 x 14336 x
    4096 FLOPs. Between the measured points the rate grows as the FLOPs (1e12 at 1e9, 1e14 at
    1e11: slope 1 in log-log), so q/k/v and o take 1 ms each; above 1e11 it stays 1e14."""
    model = ndplan.load_model("llama3-8b")
    eff = profile_file.gemm_efficiency(_doc(), HW.bf16_tflops * 1e12, model, 1024, 1)
    f = [2 * 1024 * 4096 * 6144, 2 * 1024 * 4096 * 4096, 2 * 1024 * 4096 * 28672, 2 * 1024 * 14336 * 4096]
    seconds = 1e-3 + 1e-3 + f[2] / 1e14 + f[3] / 1e14
    assert eff == pytest.approx(sum(f) / seconds / (HW.bf16_tflops * 1e12), rel=1e-12)


def test_moe_gemms_weigh_by_how_often_they_run():
    """Mixtral-8x7B at seq 1024, tp 1: q/k/v (1024 x 4096 x 6144) and o (x 4096) once per layer,
    each of the 8 experts' up (256 rows: 1024 tokens x top-2 / 8, x 4096 x 28672) and down
    (256 x 14336 x 4096). All lie where the rate grows as the FLOPs, so every GEMM takes 1 ms:
    the efficiency is the FLOPs of 1 + 1 + 8 + 8 products over 18 ms, not of 4 over 4 ms."""
    model = ndplan.load_model("mixtral-8x7b")
    peak = HW.bf16_tflops * 1e12
    f = [2 * 1024 * 4096 * 6144, 2 * 1024 * 4096 * 4096, 8 * 2 * 256 * 4096 * 28672, 8 * 2 * 256 * 14336 * 4096]
    eff = profile_file.gemm_efficiency(_doc(), peak, model, 1024, 1, 1)
    assert eff == pytest.approx(sum(f) / 18e-3 / peak, rel=1e-12)


def test_launch_environments():
    """torchrun's variables, an srun step's (block distribution) and the refusals."""
    from ndplan.profile_run import environment
    base = {"MASTER_ADDR": "h", "MASTER_PORT": "1"}
    d = environment(base | {"RANK": "9", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "1"})
    assert (d.rank, d.world, d.local_rank, d.local_world, d.nodes) == (9, 16, 1, 8, 2)
    d = environment(base | {"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_NUM_NODES": "2",
                            "SLURM_LOCALID": "1", "SLURM_NTASKS": "64"})
    assert (d.rank, d.world, d.local_rank, d.local_world, d.nodes) == (5, 8, 1, 4, 2)
    assert environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "64"}).world == 1  # a batch script, not a step
    with pytest.raises(ndplan.NdplanError, match="WORLD_SIZE"):
        environment(base | {"RANK": "0", "WORLD_SIZE": "12", "LOCAL_WORLD_SIZE": "8"})
    with pytest.raises(ndplan.NdplanError, match="MASTER_ADDR"):
        environment({"RANK": "0", "WORLD_SIZE": "2"})


def test_the_backend_follows_the_device():
    """NCCL on a CUDA GPU, HCCL on an Ascend NPU (torch_npu's torch.npu, the same calls as
    torch.cuda), gloo otherwise; a CUDA GPU wins when both are present."""
    from types import SimpleNamespace as NS

    from ndplan.profile_run import accelerator
    gpu, npu, none = NS(is_available=lambda: True), NS(is_available=lambda: True), NS(is_available=lambda: False)
    assert (accelerator(NS(cuda=gpu, npu=npu)).backend, accelerator(NS(cuda=gpu, npu=npu)).module) == ("nccl", gpu)
    acc = accelerator(NS(cuda=none, npu=npu))
    assert (acc.kind, acc.backend, acc.module) == ("npu", "hccl", npu)
    assert accelerator(NS(cuda=none, npu=none)).backend == "gloo"


@pytest.mark.parametrize("edit,field", [
    ({"ndplan_profile": 2}, "ndplan_profile"),
    ({"gemm": []}, "gemm"),
    ({"hbm": [{"bytes": 1, "seconds": -1}]}, "hbm[0].seconds"),
    ({"collectives": "fast"}, "collectives"),
    ({"meta": "x"}, "meta"),
    ({"meta": {"nodes": "two"}}, "meta.nodes"),
    ({"collectives": [{"op": "broadcast", "group": "world", "ranks": 2, "bytes": 8, "seconds": 1}]},
     "collectives[0].op"),
    ({"collectives": [{"op": "all_gather", "group": "world", "ranks": 1.5, "bytes": 8, "seconds": 1}]},
     "collectives[0].ranks"),
])
def test_bad_profiles_are_one_line(tmp_path, edit, field):
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(_doc(**edit)))
    r = CliRunner().invoke(main, ["estimate", "-m", "llama3-8b", "--dp", "8", "--gbs", "64", "--profile", str(p)])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and field in r.output, r.output


def test_the_shipped_cpu_profile_reaches_estimate_and_explain(monkeypatch):
    args = ["-m", "llama3-8b", "-H", "h100-sxm", "--dp", "8", "--gbs", "64", "--profile",
            "examples/profile/cpu_gloo_2ranks.yaml"]
    monkeypatch.chdir(__import__("pathlib").Path(__file__).resolve().parents[1])
    base = ndplan.estimate(ndplan.load_model("llama3-8b"), HW, ndplan.Strategy(dp=8, gbs=64), 8).step_s
    est = CliRunner().invoke(main, ["estimate", *args, "--json"])
    import json
    assert json.loads(est.output)["time"]["step_s"] > 100 * base  # a CPU is far slower than an H100
    out = CliRunner().invoke(main, ["explain", *args, "--term", "time.compute"]).output
    assert "profile examples/profile/cpu_gloo_2ranks.yaml (cpu, gloo, float32" in out


def test_torchrun_two_gloo_ranks_write_a_profile(tmp_path):
    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun", path=str(__import__("pathlib").Path(sys.executable).parent))
    assert torchrun, "torch installs torchrun beside python"
    out = tmp_path / "p.yaml"
    cmd = [torchrun, "--nproc_per_node", "2", "-m", "ndplan", "profile", "-m", "llama3-8b", "-H", "h100-sxm",
           "--seq", "128", "--iters", "1", "--warmup", "0", "--max-mib", "1", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = profile_file.load(str(out))
    assert doc["meta"]["world"] == 2 and doc["meta"]["backend"] == "gloo"
    ops = {(c["op"], c["ranks"]) for c in doc["collectives"]}
    assert ops == {("all_reduce", 2), ("all_gather", 2), ("reduce_scatter", 2), ("all_to_all", 2), ("send_recv", 2)}
    assert all(c["seconds"] > 0 for c in doc["collectives"])
    found = profile_file.overrides(doc, HW)
    assert set(found) >= {"gemm_efficiency", "attention_efficiency", "hbm_efficiency", "intra_node_efficiency"}
    assert all(0 < v <= 1 for k, (v, _) in found.items() if k.endswith("efficiency"))
    assert math.isfinite(found["intra_node_latency_us"][0])


def test_a_profile_of_other_hardware_is_refused(tmp_path):
    """A profile names the -H it was measured for; another -H, or a rate above the entry's
    nominal peak, is a one-line error instead of a silent constant."""
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(_doc(meta=_doc()["meta"] | {"hardware": "h100-sxm"})))
    r = CliRunner().invoke(main, ["estimate", "-m", "llama3-8b", "-H", "a100-80gb", "--dp", "8", "--gbs", "64",
                                  "--profile", str(p)])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "h100-sxm" in r.output, r.output
    fast = _doc(hbm=[{"bytes": 2 ** 30, "seconds": 1e-4}])  # 21 TB/s
    with pytest.raises(ndplan.NdplanError, match="hbm_efficiency"):
        profile_file.overrides(fast, HW)


def test_profile_refuses_a_tp_the_model_cannot_run(tmp_path):
    r = CliRunner().invoke(main, ["profile", "-m", "llama3-8b", "-H", "h100-sxm", "--tp", "3", "-o",
                                  str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
