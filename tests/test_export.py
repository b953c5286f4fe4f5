"""Exported framework forms (``--emit``), each parsed back with its own loader
(argparse for Megatron-LM flags, tomllib, json, yaml, the DeviceMesh code executed
under torch's fake process group) and compared with the strategy."""

from __future__ import annotations

import argparse
import json
import shlex
import tomllib

import pytest
import yaml
from click.testing import CliRunner

from ndplan.catalog import load_model
from ndplan.cli import main
from ndplan.errors import NdplanError
from ndplan.export import EMITTERS, Balance, emit
from ndplan.export.common import layers_per_chunk, recompute_counts
from ndplan.ppb.instance import Instance, Layer, Pipeline
from ndplan.ppb.plan import Plan
from ndplan.strategy import Strategy

DENSE, MOE = load_model("llama3-70b"), load_model("mixtral-8x7b")  # 80 and 32 layers

CASES = {  # name: (model, strategy)
    "dense-dp-zero0": (DENSE, Strategy(dp=8, gbs=16, zero=0)),
    "dense-tp-pp-zero1-full": (DENSE, Strategy(dp=2, tp=8, pp=4, gbs=64, recompute="full")),
    "dense-vpp-selective": (DENSE, Strategy(dp=2, tp=8, pp=4, vpp=2, gbs=64, schedule="interleaved",
                                            recompute="selective")),
    "dense-uneven-block": (DENSE, Strategy(dp=2, tp=8, pp=4, gbs=64, layers_per_stage=(19, 21, 21, 19),
                                           recompute="full", recompute_layers=3)),
    "dense-uneven-middle": (DENSE, Strategy(dp=2, tp=8, pp=4, gbs=64, layers_per_stage=(20, 22, 18, 20))),
    "dense-zero3-cp": (DENSE, Strategy(dp=8, tp=4, cp=2, gbs=16, zero=3, seq=8192)),
    "moe-ep-etp-zero1": (MOE, Strategy(dp=8, tp=2, pp=2, ep=8, etp=1, gbs=64, recompute="full")),
    "moe-zbv": (MOE, Strategy(dp=4, tp=2, pp=2, vpp=2, ep=4, etp=2, gbs=32, schedule="zbv", zero=1)),
}


def _cases(*names):
    return [pytest.param(*CASES[n], id=n) for n in names]


# ------------------------------------------------------------------ Megatron-LM

def megatron_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False)
    for f in ("num-layers", "tensor-model-parallel-size", "pipeline-model-parallel-size", "context-parallel-size",
              "expert-model-parallel-size", "expert-tensor-parallel-size", "num-layers-per-virtual-pipeline-stage",
              "num-virtual-stages-per-pipeline-rank", "decoder-first-pipeline-num-layers",
              "decoder-last-pipeline-num-layers", "micro-batch-size", "global-batch-size", "seq-length",
              "recompute-num-layers"):
        p.add_argument(f"--{f}", type=int)
    p.add_argument("--pipeline-model-parallel-layout")
    p.add_argument("--recompute-granularity", choices=["full", "selective"])
    p.add_argument("--recompute-method", choices=["uniform", "block"])
    for f in ("sequence-parallel", "use-distributed-optimizer", "use-torch-fsdp2", "optimizer-cpu-offload"):
        p.add_argument(f"--{f}", action="store_true")
    return p


def megatron_layers(a, L: int, pp: int, vpp: int) -> list[int]:
    """Decoder layers per virtual stage as Megatron-LM would place them."""
    if a.pipeline_model_parallel_layout:
        return [g.count("t") for g in a.pipeline_model_parallel_layout.split("|")]
    if a.decoder_first_pipeline_num_layers is not None:
        first, last = a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers
        mid = (L - first - last) // (pp - 2) if pp > 2 else 0
        return [first] + [mid] * (pp - 2) + [last]
    per = a.num_layers_per_virtual_pipeline_stage or L // pp
    return [per] * (L // per)


@pytest.mark.parametrize("model,s", _cases(*(n for n in CASES if n != "moe-zbv")))
def test_megatron_parses_back(model, s):
    a = megatron_parser().parse_args(shlex.split(emit("megatron", model, s), comments=True))
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size) == (s.tp, s.pp, s.cp)
    assert a.num_layers == model.num_hidden_layers
    assert (a.micro_batch_size, a.global_batch_size, a.seq_length) == (s.mbs, s.gbs, s.seq)
    if model.is_moe:
        assert (a.expert_model_parallel_size, a.expert_tensor_parallel_size) == (s.ep, s.etp)
    assert a.sequence_parallel == (s.sp and s.tp > 1)
    assert a.use_distributed_optimizer == (s.zero in (1, 2)) and a.use_torch_fsdp2 == (s.zero == 3)
    assert megatron_layers(a, model.num_hidden_layers, s.pp, s.vpp) == list(layers_per_chunk(model, s))
    assert (a.recompute_granularity or "none") == s.recompute
    if s.recompute == "full":
        assert (a.recompute_method, a.recompute_num_layers) == (("uniform", 1) if s.recompute_layers is None
                                                                else ("block", s.recompute_layers))


def test_megatron_rejects_zbv_and_pp_fsdp():
    with pytest.raises(NdplanError, match="schedule='zbv'"):
        emit("megatron", *CASES["moe-zbv"])
    with pytest.raises(NdplanError, match="zero=3"):
        emit("megatron", DENSE, Strategy(dp=2, tp=8, pp=4, gbs=64, zero=3))


# ------------------------------------------------------------------ torchtitan

@pytest.mark.parametrize("model,s", _cases(*(n for n in CASES if n != "dense-dp-zero0")))
def test_torchtitan_parses_back(model, s):
    doc = tomllib.loads(emit("torchtitan", model, s))
    p, t = doc["parallelism"], doc["training"]
    assert p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"] == s.dp
    assert p["data_parallel_shard_degree"] == (s.dp if s.zero else 1)
    assert (p["tensor_parallel_degree"], p["context_parallel_degree"], p["pipeline_parallel_degree"]) == (s.tp, s.cp, s.pp)
    assert (t["global_batch_size"], t["seq_len"]) == (s.gbs, s.seq)
    dp = p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"]
    if s.pp > 1:
        # torchtitan: local batch split into pipeline micro-batches of pipeline_parallel_microbatch_size
        assert t["local_batch_size"] // p["pipeline_parallel_microbatch_size"] == s.m
        assert p["pipeline_parallel_schedule"] == {"1f1b": "1F1B", "interleaved": "Interleaved1F1B",
                                                   "zbv": "ZBVZeroBubble"}[s.schedule]
        if "pipeline_parallel_split_points" in p:
            cuts = [0] + [int(x.split(".")[1]) for x in p["pipeline_parallel_split_points"]] + [model.num_hidden_layers]
            assert [b - a for a, b in zip(cuts, cuts[1:])] == list(layers_per_chunk(model, s))
        else:
            assert p["pipeline_parallel_layers_per_stage"] * s.pp * s.vpp == model.num_hidden_layers
    else:  # gradient accumulation: global / (local * dp) micro-batches
        assert t["global_batch_size"] // (t["local_batch_size"] * dp) == s.m
    if model.is_moe:
        assert (p["expert_parallel_degree"], p["expert_tensor_parallel_degree"]) == (s.ep, s.etp)
    assert doc["activation_checkpoint"]["mode"] == s.recompute


def test_torchtitan_ddp_only_alone_and_zero0_replicates():
    doc = tomllib.loads(emit("torchtitan", *CASES["dense-dp-zero0"]))
    assert doc["parallelism"]["data_parallel_replicate_degree"] == 8
    with pytest.raises(NdplanError, match="zero=0"):
        emit("torchtitan", DENSE, Strategy(dp=2, tp=8, gbs=16, zero=0))
    with pytest.raises(NdplanError, match="schedule='zb-h1'"):
        emit("torchtitan", DENSE, Strategy(dp=2, tp=8, pp=4, gbs=64, schedule="zb-h1"))


# ------------------------------------------------------------------ DeepSpeed

@pytest.mark.parametrize("model,s", _cases("dense-dp-zero0", "dense-tp-pp-zero1-full")
                         + [pytest.param(DENSE, Strategy(dp=8, gbs=64, mbs=2, zero=3, offload_optimizer=True),
                                         id="dense-zero3-offload")])
def test_deepspeed_parses_back(model, s):
    doc = json.loads(emit("deepspeed", model, s))
    assert doc["zero_optimization"]["stage"] == s.zero
    assert ("offload_optimizer" in doc["zero_optimization"]) == s.offload_optimizer
    assert (doc["train_micro_batch_size_per_gpu"], doc["gradient_accumulation_steps"]) == (s.mbs, s.m)
    assert doc["train_batch_size"] == doc["train_micro_batch_size_per_gpu"] * doc["gradient_accumulation_steps"] * s.dp
    assert doc["bf16"]["enabled"] is True
    assert doc.get("tensor_parallel", {}).get("autotp_size", 1) == s.tp
    assert doc.get("pipeline", {}).get("stages", 1) == s.pp
    assert ("activation_checkpointing" in doc) == (s.recompute == "full")


@pytest.mark.parametrize("name,field", [("dense-zero3-cp", "cp="), ("moe-ep-etp-zero1", "ep="),
                                        ("dense-vpp-selective", "schedule="), ("dense-uneven-block", "layers_per_stage=")])
def test_deepspeed_rejects_what_the_json_cannot_say(name, field):
    with pytest.raises(NdplanError, match=field):
        emit("deepspeed", *CASES[name])


# ------------------------------------------------------------------ MindFormers

def _flat(strat, v):
    """per-stage form back to per-virtual-stage values (interleaved: v = chunk*pp + stage)."""
    rows = v if strat.vpp > 1 else [v]
    return [x for row in rows for x in row]


@pytest.mark.parametrize("model,s", _cases("dense-tp-pp-zero1-full", "dense-vpp-selective", "dense-uneven-block",
                                           "dense-uneven-middle", "moe-ep-etp-zero1", "dense-zero3-cp"))
def test_mindformers_parses_back(model, s):
    doc = yaml.safe_load(emit("mindformers", model, s))
    pc, rc, mc = doc["parallel_config"], doc["recompute_config"], doc["model"]["model_config"]
    assert (pc["data_parallel"], pc["model_parallel"], pc["pipeline_stage"], pc["context_parallel"]) == (s.dp, s.tp, s.pp, s.cp)
    assert pc["micro_batch_num"] == s.m and doc["runner_config"]["batch_size"] == s.mbs
    assert pc["use_seq_parallel"] == (s.sp and s.tp > 1)
    assert pc.get("expert_parallel", 1) == s.ep
    assert mc.get("pp_interleave_num", 1) == s.vpp and mc["seq_length"] == s.seq
    base = model.num_hidden_layers // (s.pp * s.vpp)
    offset = [0] * (s.pp * s.vpp) if mc["offset"] == 0 else _flat(s, mc["offset"])
    assert [base + o for o in offset] == list(layers_per_chunk(model, s))
    full, sel = recompute_counts(model, s)
    layers = layers_per_chunk(model, s)
    want_full = True if full == layers else (False if not max(full) else None)
    if want_full is None:
        assert _flat(s, rc["recompute"]) == list(full)
    else:
        assert rc["recompute"] is want_full
    assert rc["select_recompute"] is (s.recompute == "selective")


def test_mindformers_keys_exist_in_the_validation_configs():
    """Every parallel_config key emitted is one the SAPP MindFormers yamls use (expert_parallel aside: llama only)."""
    import glob
    import os
    files = glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "validation", "mindformers",
                                   "llama3", "*.yaml"))
    if not files:
        pytest.skip("shared/validation not present")
    known = set()
    for f in files:
        known |= set((yaml.safe_load(open(f)) or {}).get("parallel_config", {}))
    emitted = set(yaml.safe_load(emit("mindformers", *CASES["dense-vpp-selective"]))["parallel_config"])
    assert emitted <= known, emitted - known


# ------------------------------------------------------------------ PPB result

def _balance(pp=4, counts=(1, 3, 3, 1), modes=None):
    """A plan over embedding + 8 decoder layers + head, layers per virtual stage ``counts``."""
    mk = lambda name, kind: Layer(name=name, kind=kind, forward_s=1e-3, backward_input_s=1e-3, backward_weight_s=1e-3,
                                  static_bytes=1, activation_bytes={"none": 3, "selective": 2, "full": 1},
                                  recompute_s={"selective": 1e-4, "full": 1e-3})
    layers = (mk("embedding", "embedding"),) + tuple(mk("decoder", "dense") for _ in range(8)) + (mk("head", "head"),)
    inst = Instance(layers=layers, pipeline=Pipeline(pp=pp, m=8, budget_bytes=10**9))
    bounds = [0, counts[0] + 1]
    for c in counts[1:-1]:
        bounds.append(bounds[-1] + c)
    bounds.append(len(layers))
    rec = modes or ("none",) + ("full", "selective", "full", "none", "none", "full", "none", "none") + ("none",)
    return Balance(inst, Plan(bounds=tuple(bounds), recompute=tuple(rec)))


def test_balance_gives_offsets_and_per_stage_recompute():
    bal = _balance()
    assert bal.decoder_layers() == (1, 3, 3, 1)
    assert bal.recompute_counts() == ((1, 1, 1, 0), (0, 1, 0, 0))
    model = load_model("llama3-8b").__class__(**{**vars(load_model("llama3-8b")), "num_hidden_layers": 8,
                                                 "layer_kinds": ("dense",) * 8})
    s = Strategy(dp=1, tp=1, pp=4, gbs=8, layers_per_stage=bal.decoder_layers(), recompute="full")
    mf = yaml.safe_load(emit("mindformers", model, s, balance=bal))
    assert mf["model"]["model_config"]["offset"] == [-1, 1, 1, -1]
    assert mf["recompute_config"]["recompute"] == [1, 1, 1, 0]
    assert mf["recompute_config"]["select_recompute"] == [1, 2, 1, 0]
    a = megatron_parser().parse_args(shlex.split(emit("megatron", model, s, balance=bal), comments=True))
    assert (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers) == (1, 1)
    assert (a.recompute_granularity, a.recompute_method, a.recompute_num_layers) == ("full", "block", 1)
    tt = tomllib.loads(emit("torchtitan", model, s, balance=bal))
    assert tt["parallelism"]["pipeline_parallel_split_points"] == ["layers.1", "layers.4", "layers.7"]


# ------------------------------------------------------------------ DeviceMesh

@pytest.mark.parametrize("model,s", _cases("dense-tp-pp-zero1-full", "dense-zero3-cp", "dense-dp-zero0"))
def test_devicemesh_code_compiles_and_names_every_dim(model, s):
    code = emit("devicemesh", model, s)
    ns: dict = {}
    exec(compile(code.replace("from torch.distributed.device_mesh import init_device_mesh", ""), "<emit>", "exec"), ns)
    names, shape = ns["MESH_DIM_NAMES"], ns["MESH_SHAPE"]
    assert names == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    size = dict(zip(names, shape))
    assert (size["pp"], size["cp"], size["tp"], size["dp_replicate"] * size["dp_shard"]) == (s.pp, s.cp, s.tp, s.dp)


@pytest.mark.parametrize("model,s", _cases("dense-tp-pp-zero1-full", "dense-zero3-cp"))
def test_devicemesh_builds_under_fake_process_group(model, s):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    ns: dict = {}
    exec(compile(emit("devicemesh", model, s), "<emit>", "exec"), ns)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=s.world)
    try:
        mesh = ns["build_mesh"]("cpu")
        assert tuple(mesh.shape) == ns["MESH_SHAPE"] and mesh.mesh_dim_names == ns["MESH_DIM_NAMES"]
        assert (mesh["tp"].size(), mesh["pp"].size(), mesh["cp"].size()) == (s.tp, s.pp, s.cp)
    finally:
        dist.destroy_process_group()
    assert torch.__version__


# ------------------------------------------------------------------ registry and CLI

def test_registry_and_unknown_format():
    assert set(EMITTERS) == {"megatron", "torchtitan", "deepspeed", "mindformers", "devicemesh"}
    with pytest.raises(NdplanError, match="--emit='nemo'"):
        emit("nemo", *CASES["dense-dp-zero0"])


def test_cli_estimate_emit_stdout_and_file(tmp_path):
    args = ["estimate", "-m", "llama3-70b", "--tp", "8", "--pp", "4", "--dp", "2", "--gbs", "64"]
    r = CliRunner().invoke(main, args + ["--emit", "torchtitan"])
    assert r.exit_code == 0, r.output
    assert tomllib.loads(r.stdout)["parallelism"]["tensor_parallel_degree"] == 8
    out = tmp_path / "ds.json"
    r = CliRunner().invoke(main, args + ["--emit", "deepspeed", "--emit-out", str(out)])
    assert r.exit_code == 0 and "peak" in r.output
    assert json.loads(out.read_text())["pipeline"]["stages"] == 4


def test_cli_emit_inexpressible_is_one_line_exit_2():
    r = CliRunner().invoke(main, ["estimate", "-m", "llama3-70b", "--tp", "8", "--pp", "4", "--dp", "2",
                                  "--gbs", "64", "--schedule", "gpipe", "--emit", "megatron"])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: schedule='gpipe'")


def test_cli_sweep_emit_all(tmp_path):
    r = CliRunner().invoke(main, ["sweep", "-m", "llama3-8b", "--gpus", "8", "--gbs", "32", "--tp", "1,2",
                                  "--pp", "1", "--cp", "1", "--top", "2", "--emit", "mindformers", "--emit-all",
                                  "--emit-out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["rank1.yaml", "rank2.yaml"]
    assert yaml.safe_load((tmp_path / "rank1.yaml").read_text())["parallel_config"]["pipeline_stage"] == 1


def test_mindformers_deals_a_stage_count_over_chunks():
    """MindFormers deals a stage's recompute count over its chunks one layer at a time
    (chunk 0, 1, 0, ...): llama3-70b, pp=4, vpp=2 (10 layers a chunk), 3 selective layers
    a stage under the mindspore engine -> chunk 0 gets 2, chunk 1 gets 1. The megatron
    engine's count is per chunk: 3 and 3."""
    import yaml as _yaml
    kw = dict(dp=1, tp=8, pp=4, vpp=2, mbs=1, gbs=16, seq=4096, recompute="selective", recompute_layers=3,
              schedule="interleaved")
    ms = _yaml.safe_load(emit("mindformers", DENSE, Strategy(**kw, engine="mindspore")))
    assert ms["recompute_config"]["select_recompute"] == [[2, 2, 2, 2], [1, 1, 1, 1]]
    mg = _yaml.safe_load(emit("mindformers", DENSE, Strategy(**kw, engine="megatron")))
    assert mg["recompute_config"]["select_recompute"] == [[3, 3, 3, 3], [3, 3, 3, 3]]
