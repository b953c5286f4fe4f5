"""Exported framework forms (``--emit``), each parsed back with its own loader
(Megatron-LM's argument definitions and validation rules transcribed below with their
source lines, tomllib, json, yaml, the DeviceMesh code executed under torch's fake
process group) and compared with the strategy.

Layer splits, MindFormers offsets and recompute lists are expected values written in the
test with their derivation, not ndplan's own ``layers_per_chunk`` / ``recompute_counts``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import tomllib

import pytest
import yaml
from click.testing import CliRunner

from ndplan.catalog import load_model
from ndplan.cli import main
from ndplan.errors import NdplanError
from ndplan.export import EMITTERS, Balance, emit
from ndplan.export.torchtitan import stage_count, titan_split
from ndplan.ppb.instance import Instance, Layer, Pipeline
from ndplan.ppb.plan import Plan
from ndplan.strategy import Strategy
from tests.helpers import validation_dir

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

LAYERS = {  # decoder layers per virtual stage, in virtual-stage order (chunk c of stage s at c*pp + s), by hand
    "dense-dp-zero0": [80],  # pp=1: all 80 layers on the one stage
    "dense-tp-pp-zero1-full": [20] * 4,  # 80 / pp=4
    "dense-vpp-selective": [10] * 8,  # 80 / (pp=4 * vpp=2)
    "dense-uneven-block": [19, 21, 21, 19],  # the layers_per_stage asked for (sum 80)
    "dense-uneven-middle": [20, 22, 18, 20],  # the layers_per_stage asked for (sum 80)
    "dense-zero3-cp": [80],  # pp=1
    "moe-ep-etp-zero1": [16, 16],  # mixtral 32 layers / pp=2
    "moe-zbv": [8] * 4,  # 32 / (pp=2 * 2 chunks)
}
def _cases(*names):
    return [pytest.param(*CASES[n], id=n) for n in names]


# ------------------------------------------------------------------ Megatron-LM

# Megatron-LM's definitions of every flag the exporter writes, transcribed from
# NVIDIA/Megatron-LM megatron/training/arguments.py at 000c4ac24f61159c138b0975def722c65245983c
# (2025-11-13), with the line of each add_argument. parse_args (not parse_known_args) below:
# a flag Megatron does not define fails the test, as Megatron's own parse_args does.
MEGATRON_INT_FLAGS = {  # flag: line (type=int)
    "--num-layers": 1574, "--tensor-model-parallel-size": 2613, "--pipeline-model-parallel-size": 2615,
    "--decoder-first-pipeline-num-layers": 2617, "--decoder-last-pipeline-num-layers": 2621,
    "--num-layers-per-virtual-pipeline-stage": 2636, "--num-virtual-stages-per-pipeline-rank": 2638,
    "--context-parallel-size": 2760, "--expert-model-parallel-size": 3103, "--expert-tensor-parallel-size": 3105,
    "--micro-batch-size": 2020, "--global-batch-size": 2027, "--seq-length": 2906, "--recompute-num-layers": 2086,
}
MEGATRON_CHOICE_FLAGS = {  # flag: (choices, line) (type=str)
    "--recompute-granularity": (["full", "selective"], 2056), "--recompute-method": (["uniform", "block"], 2077),
}
MEGATRON_SWITCHES = {  # flag: line (action="store_true")
    "--sequence-parallel": 2276, "--use-distributed-optimizer": 2714, "--use-torch-fsdp2": 2754,
    "--optimizer-cpu-offload": 2248,
}

# The precision / overlap flags, transcribed from arguments.py at d98e8a64ddf34856e74b24714e3bedb2f5a39553
# (--bf16 and --fp8-format are generated from ModelParallelConfig.bf16 / TransformerConfig.fp8 by
# ArgumentGroupFactory, argument_utils.py:95-107 and :312; fp8: Literal['e4m3', 'hybrid'],
# transformer_config.py:587-589).
MEGATRON_SWITCHES_D98 = {
    "--fp8-param-gather": 2016, "--untie-embeddings-and-output-weights": 2460,
    "--no-gradient-accumulation-fusion": 2944, "--grad-reduce-in-bf16": 3053, "--overlap-grad-reduce": 3121,
    "--overlap-param-gather": 3148, "--bf16": 0,
}


def megatron_parser() -> argparse.ArgumentParser:
    """The flags above as Megatron defines them (line 93: ``allow_abbrev=False``; defaults
    as there: parallel sizes 1, the rest None)."""
    p = argparse.ArgumentParser(allow_abbrev=False)
    ones = {"--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
            "--expert-model-parallel-size"}
    for f in MEGATRON_INT_FLAGS:
        p.add_argument(f, type=int, default=1 if f in ones else None)
    p.add_argument("--pipeline-model-parallel-layout", type=str, default=None)  # line 2625
    for f, (choices, _) in MEGATRON_CHOICE_FLAGS.items():
        p.add_argument(f, type=str, default=None, choices=choices)
    for f in MEGATRON_SWITCHES:
        p.add_argument(f, action="store_true")
    for f in MEGATRON_SWITCHES_D98:
        p.add_argument(f, action="store_true")
    p.add_argument("--fp8-format", type=str, default=None, choices=["e4m3", "hybrid"])
    # TransformerConfig.moe_token_dispatcher_type: Literal['allgather', 'alltoall', 'flex'], default
    # 'allgather' (transformer_config.py:891-903 at d98e8a64, generated by ArgumentGroupFactory)
    p.add_argument("--moe-token-dispatcher-type", type=str, default="allgather", choices=["allgather", "alltoall", "flex"])
    return p


def megatron_parse(text: str):
    return megatron_parser().parse_args(shlex.split(text, comments=True))


def megatron_layers(a) -> list[int]:
    """Decoder layers per virtual stage as Megatron-LM builds them, checking the rules it
    applies on the way (the assertion messages are Megatron's). Sources at 000c4ac2:
    arguments.py validate_args lines 532-590, megatron/core/transformer/transformer_block.py
    get_num_layers_to_build (line 75), pipeline_parallel_layer_layout.py (parse_str_to_list
    line 270, validate_layer_layout line 85, virtual stage vpp_rank*pp + pp_rank line 50)."""
    L, pp = a.num_layers, a.pipeline_model_parallel_size
    vflags = [a.num_layers_per_virtual_pipeline_stage, a.num_virtual_stages_per_pipeline_rank,
              a.pipeline_model_parallel_layout]
    assert sum(x is not None for x in vflags) <= 1, "No more than one of the following arguments can be set"
    first, last = a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers
    if a.pipeline_model_parallel_layout is not None:
        text = a.pipeline_model_parallel_layout.replace(",", "")
        text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
        text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
        stages = text.split("|")
        assert set(text) <= set("ELtm|"), "Invalid layer character"
        assert len(stages) % pp == 0, "The length of pipeline_model_parallel_layout must be divisible by pp"
        flat = "".join(stages)
        assert flat[0] == "E" and flat.count("E") == 1, "The first layer must be embedding"
        assert flat[-1] == "L" and flat.count("L") == 1, "The last layer must be loss"
        assert flat.count("t") == L, "Number of decoder layers must match num_layers"
        return [s.count("t") for s in stages]
    vp = None
    if a.num_layers_per_virtual_pipeline_stage is not None:
        assert first is None and last is None, \
            "please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline parallel degree"
        assert L % pp == 0, "number of layers of the model must be divisible pipeline model parallel size"
        assert (L // pp) % a.num_layers_per_virtual_pipeline_stage == 0, \
            "number of layers per pipeline stage must be divisible number of layers per virtual pipeline stage"
        vp = (L // pp) // a.num_layers_per_virtual_pipeline_stage
    elif a.num_virtual_stages_per_pipeline_rank is not None:
        vp = a.num_virtual_stages_per_pipeline_rank
    if vp == 1:
        vp = None
    if vp is not None:  # default overlap_p2p_comm (--no-overlap-p2p-communication not given): pp > 1
        assert pp > 1, "When interleaved schedule is used, pipeline-model-parallel size should be greater than 1"
    if first is not None or last is not None:
        rest, left = L - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
        if left > 0:
            assert rest % left == 0, "With uneven pipelineing the left over layers must be divisible by left over stages"
        per_rank = [rest // left if left else 0] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
    else:
        assert L % pp == 0, "Number of layers should be divisible by the pipeline-model-parallel size"
        per_rank = [L // pp] * pp
    v = vp or 1
    assert all(n % v == 0 for n in per_rank), "num_layers_per_pipeline_rank should be divisible by vp_size"
    return [per_rank[s] // v for _ in range(v) for s in range(pp)]


def megatron_validate(a):
    """The other validate_args rules the exported flags meet (arguments.py at 000c4ac2)."""
    if a.recompute_granularity == "selective":  # line 914
        assert a.recompute_method is None, "recompute method is not yet supported for selective recomputing granularity"
    if a.use_torch_fsdp2:  # lines 633-641
        assert a.pipeline_model_parallel_size == 1, "--use-torch-fsdp2 is not supported with pipeline parallelism"
        assert a.expert_model_parallel_size == 1, "--use-torch-fsdp2 is not supported with expert parallelism"
        assert not a.use_distributed_optimizer, "--use-torch-fsdp2 is not supported with MCore's distributed optimizer"
        # d98e8a64 lines 1031-1048 (gradient accumulation fusion is on unless --no-gradient-accumulation-fusion)
        assert a.no_gradient_accumulation_fusion, "--use-torch-fsdp2 is not supported with gradient accumulation fusion"
        assert a.untie_embeddings_and_output_weights, "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights"
    if a.overlap_param_gather:  # d98e8a64 lines 1024-1027
        assert a.use_distributed_optimizer or a.use_torch_fsdp2, "--overlap-param-gather only supported with distributed optimizer"
    if a.fp8_param_gather:  # d98e8a64 lines 1095-1097; fp8_param requires fp8 (transformer_config.py:1566-1567)
        assert a.use_distributed_optimizer or a.use_torch_fsdp2, "--fp8-param-gather only supported with distributed optimizer"
        assert a.fp8_format is not None


def test_megatron_layer_rules_reject_what_megatron_rejects():
    """The transcribed rules are live: forms Megatron refuses fail here too."""
    bad = ["--num-layers 80 --pipeline-model-parallel-size 3",  # 80 % 3
           "--num-layers 80 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 3",  # 20 % 3
           "--num-layers 80 --pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 19 "
           "--decoder-last-pipeline-num-layers 20",  # 41 over 2 stages
           "--num-layers 8 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Etttt|tttt'",  # no L
           "--num-layers 8 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 "
           "--pipeline-model-parallel-layout 'Etttt|ttttL'"]  # two virtual-stage flags
    for text in bad:
        with pytest.raises(AssertionError):
            megatron_layers(megatron_parse(text))
    # and reads a layout in the help text's notation: "E|(t|)*3,L" unrolls to E|t|t|t|L, 5 stages
    a = megatron_parse("--num-layers 3 --pipeline-model-parallel-size 5 --pipeline-model-parallel-layout 'E|(t|)*3,L'")
    assert megatron_layers(a) == [0, 1, 1, 1, 0]
    with pytest.raises(SystemExit):  # a flag Megatron-LM does not define (argparse exits)
        megatron_parse("--num-layers 8 --virtual-pipeline-model-parallel-size 2")


@pytest.mark.parametrize("name", [n for n in CASES if n != "moe-zbv"])
def test_megatron_parses_back(name):
    model, s = CASES[name]
    a = megatron_parse(emit("megatron", model, s))  # independent of ndplan: Megatron's flag definitions
    megatron_validate(a)  # independent of ndplan: Megatron's validate_args rules
    # the degrees, sizes and batch asked for (the test's input and the catalog), not the exporter's reading
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size) == (s.tp, s.pp, s.cp)
    assert a.num_layers == model.num_hidden_layers
    assert (a.micro_batch_size, a.global_batch_size, a.seq_length) == (s.mbs, s.gbs, s.seq)
    if model.is_moe:
        assert (a.expert_model_parallel_size, a.expert_tensor_parallel_size) == (s.ep, s.etp)
        assert a.moe_token_dispatcher_type == "alltoall"  # the dispatcher the megatron profile models
    assert a.sequence_parallel == (s.sp and s.tp > 1)  # Megatron turns SP off at tp=1 (arguments.py line 922)
    # ZeRO-1/2 = Megatron's distributed optimizer, ZeRO-3 = --use-torch-fsdp2 (by definition, not ndplan)
    assert a.use_distributed_optimizer == (s.zero in (1, 2)) and a.use_torch_fsdp2 == (s.zero == 3)
    # independent of ndplan's layers_per_chunk: Megatron's placement rule against the hand-derived split
    assert megatron_layers(a) == LAYERS[name]
    assert (a.recompute_granularity or "none") == s.recompute
    if s.recompute == "full":  # Megatron's help (lines 2077, 2086): uniform 1 = every layer; block n = n a stage
        assert (a.recompute_method, a.recompute_num_layers) == (("uniform", 1) if s.recompute_layers is None
                                                                else ("block", s.recompute_layers))


def test_megatron_rejects_zbv_and_pp_fsdp():
    with pytest.raises(NdplanError, match="schedule='zbv'"):
        emit("megatron", *CASES["moe-zbv"])
    with pytest.raises(NdplanError, match="zero=3"):
        emit("megatron", DENSE, Strategy(dp=2, tp=8, pp=4, gbs=64, zero=3))


# ------------------------------------------------------------------ torchtitan

@pytest.mark.parametrize("name", [n for n in CASES if n != "dense-dp-zero0"])
def test_torchtitan_parses_back(name):
    model, s = CASES[name]
    doc = tomllib.loads(emit("torchtitan", model, s))  # independent of ndplan: tomllib reads it
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
        # torchtitan (generate_llm_fqn_per_model_part): the embedding and the output weigh
        # first/last_stage_less_layers (default 1) in the split: (layers + both) // stages each,
        # the first remainder stages one more, the first and last stage less their weight
        first = p["pipeline_parallel_first_stage_less_layers"]
        last = p["pipeline_parallel_last_stage_less_layers"]
        if "module_fqns_per_model_part" in p:
            assert (first, last) == (0, 0)
            parts = p["module_fqns_per_model_part"]
            got = [sum(m.startswith("layers.") for m in part) for part in parts]
            assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
            names = [m for part in parts for m in part if m.startswith("layers.")]
            assert names == [f"layers.{i}" for i in range(model.num_hidden_layers)]
        else:
            stages = stage_count(model.num_hidden_layers, p["pipeline_parallel_layers_per_stage"], first, last)
            got = titan_split(model.num_hidden_layers, stages, first, last)
        assert got == LAYERS[name]  # independent of ndplan's layers_per_chunk: the hand-derived split
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
                                         id="dense-zero3-offload"),
                            pytest.param(DENSE, Strategy(dp=4, cp=2, gbs=16, zero=3, seq=8192), id="dense-ulysses")])
def test_deepspeed_parses_back(model, s):
    s = dataclasses.replace(s, sp=s.tp == 1)  # AutoTP has no sequence parallelism (refused: test below)
    doc = json.loads(emit("deepspeed", model, s))  # independent of ndplan: json reads it; values: the input
    assert doc["zero_optimization"]["stage"] == s.zero
    assert ("offload_optimizer" in doc["zero_optimization"]) == s.offload_optimizer
    assert (doc["train_micro_batch_size_per_gpu"], doc["gradient_accumulation_steps"]) == (s.mbs, s.m)
    # DeepSpeed's batch rule: train_batch_size = micro batch per GPU x accumulation steps x data-parallel size
    assert doc["train_batch_size"] == doc["train_micro_batch_size_per_gpu"] * doc["gradient_accumulation_steps"] * s.dp
    assert doc["bf16"]["enabled"] is True
    assert doc.get("tensor_parallel", {}).get("autotp_size", 1) == s.tp
    assert doc.get("pipeline", {}).get("stages", 1) == s.pp
    # DeepSpeed-Ulysses: DeepSpeedConfig's data-parallel world is world / sequence_parallel_size
    # (deepspeed/runtime/config.py L719-723 at edaa7221), so the batch rule above uses dp = world/(tp*pp*cp)
    assert doc.get("sequence_parallel_size", 1) == s.cp
    assert ("activation_checkpointing" in doc) == (s.recompute == "full")


@pytest.mark.parametrize("name,field", [("moe-ep-etp-zero1", "ep="),
                                        ("dense-vpp-selective", "schedule="), ("dense-uneven-block", "layers_per_stage="),
                                        ("dense-tp-pp-zero1-full", "sp=")])
def test_deepspeed_rejects_what_the_json_cannot_say(name, field):
    with pytest.raises(NdplanError, match=field):
        emit("deepspeed", *CASES[name])


# ------------------------------------------------------------------ MindFormers

# MindFormers LayerSetting (mindspore-lab/mindformers mindformers/models/utils.py at fd4deebc,
# lines 197-200; docs/feature_cards/Offset_Recompute.md): offset is broadcast to
# [pp_interleave_num][pipeline_stage] and chunk (v, s) holds num_layers // (pp * vpp) +
# offset[v][s] layers; _check_inputs (line 590) wants sum(offset) == num_layers % (pp * vpp).
# recompute: True = every layer, False = none, a per-stage list = that many layers a stage.
MINDFORMERS = {  # name: (offset, recompute, select_recompute), derived by hand
    "dense-tp-pp-zero1-full": (0, True, False),  # 80 // 4 = 20 = every stage; full recompute of every layer
    "dense-vpp-selective": (0, False, True),  # 80 // 8 = 10 = every chunk; selective on every layer
    "dense-uneven-block": ([-1, 1, 1, -1], [3, 3, 3, 3], False),  # 19,21,21,19 - 20; 3 full layers a stage
    "dense-uneven-middle": ([0, 2, -2, 0], False, False),  # 20,22,18,20 - 20; no recompute
    "moe-ep-etp-zero1": (0, True, False),  # 32 // 2 = 16 = every stage
    "dense-zero3-cp": (0, False, False),  # one stage of 80
}


def _mf_layers(offset, pp: int, vpp: int, L: int) -> list[int]:
    """LayerSetting's layer_list, flattened in virtual-stage order (v*pp + s)."""
    rows = [[offset] * pp] * vpp if isinstance(offset, int) else (offset if vpp > 1 and isinstance(offset[0], list)
                                                                  else [offset] * vpp)
    assert sum(map(sum, rows)) == L % (pp * vpp), "sum of offset != num_layers % (pp * pp_interleave_num)"
    return [L // (pp * vpp) + o for row in rows for o in row]


@pytest.mark.parametrize("name", list(MINDFORMERS))
def test_mindformers_parses_back(name):
    model, s = CASES[name]
    doc = yaml.safe_load(emit("mindformers", model, s))  # independent of ndplan: yaml reads it
    pc, rc, mc = doc["parallel_config"], doc["recompute_config"], doc["model"]["model_config"]
    assert (pc["data_parallel"], pc["model_parallel"], pc["pipeline_stage"], pc["context_parallel"]) == (s.dp, s.tp, s.pp, s.cp)
    assert pc["micro_batch_num"] == s.m and doc["runner_config"]["batch_size"] == s.mbs
    assert pc["use_seq_parallel"] == (s.sp and s.tp > 1)
    assert pc.get("expert_parallel", 1) == s.ep
    assert mc.get("pp_interleave_num", 1) == s.vpp and mc["seq_length"] == s.seq
    offset, recompute, select = MINDFORMERS[name]
    assert mc["offset"] == offset  # independent of ndplan: the hand-derived offsets
    # independent of ndplan's layers_per_chunk: MindFormers' own layer rule applied to the emitted offset
    assert _mf_layers(mc["offset"], s.pp, s.vpp, model.num_hidden_layers) == LAYERS[name]
    assert (rc["recompute"], rc["select_recompute"]) == (recompute, select)  # independent: hand-derived lists


def test_mindformers_keys_exist_in_the_validation_configs():
    """Every parallel_config key emitted is one the SAPP MindFormers yamls use (expert_parallel aside: llama only)."""
    files = sorted((validation_dir() / "mindformers" / "llama3").glob("*.yaml"))
    assert files, "no llama3 yamls in the validation data"
    known = set()
    for f in files:  # independent of ndplan: the upstream project's own configs
        known |= set((yaml.safe_load(f.read_text()) or {}).get("parallel_config", {}))
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
    # by hand from _balance's bounds and modes: decoder layers a stage 1 | 3 | 3 | 1 with modes
    # (full) | (selective, full, none) | (none, full, none) | (none)
    assert bal.decoder_layers() == (1, 3, 3, 1)
    assert bal.recompute_counts() == ((1, 1, 1, 0), (0, 1, 0, 0))  # full layers a stage, selective layers a stage
    model = load_model("llama3-8b").__class__(**{**vars(load_model("llama3-8b")), "num_hidden_layers": 8,
                                                 "layer_kinds": ("dense",) * 8})
    s = Strategy(dp=1, tp=1, pp=4, gbs=8, layers_per_stage=bal.decoder_layers(), recompute="full")
    mf = yaml.safe_load(emit("mindformers", model, s, balance=bal))
    assert mf["model"]["model_config"]["offset"] == [-1, 1, 1, -1]  # 1,3,3,1 minus 8 // 4 = 2 (LayerSetting)
    assert mf["recompute_config"]["recompute"] == [1, 1, 1, 0]  # the full counts above
    assert mf["recompute_config"]["select_recompute"] == [1, 2, 1, 0]  # full + selective counts above
    a = megatron_parse(emit("megatron", model, s, balance=bal))  # Megatron's flag definitions
    assert (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers) == (1, 1)
    assert megatron_layers(a) == [1, 3, 3, 1]  # Megatron's uneven rule: (8 - 1 - 1) / 2 in the middle
    assert (a.recompute_granularity, a.recompute_method, a.recompute_num_layers) == ("full", "block", 1)
    p = tomllib.loads(emit("torchtitan", model, s, balance=bal))["parallelism"]
    # torchtitan's own split gives 1, 3, 3, 1 with the embedding weighing 2 and the output 1:
    # 8 + 2 + 1 = 11 = 4 x 2 + 3, so the first three stages take 3 and the last 2; the first less 2
    # -> 1, the last less 1 -> 1; layers_per_stage 3 = ceil(11 / 4) keeps ceil(11 / 3) = 4 stages
    assert (p["pipeline_parallel_first_stage_less_layers"], p["pipeline_parallel_last_stage_less_layers"],
            p["pipeline_parallel_layers_per_stage"]) == (2, 1, 3)
    assert "module_fqns_per_model_part" not in p


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
        # gradients are reduced over dp x cp (torchtitan's dp_shard_cp): a cp rank's are partial
        assert ns["data_mesh"](mesh).size() == s.dp * s.cp
    finally:
        dist.destroy_process_group()
    assert torch.__version__


# ------------------------------------------------------------------ registry and CLI

def test_registry_and_unknown_format():
    assert set(EMITTERS) == {"megatron", "torchtitan", "torchtitan-0.3", "deepspeed", "mindformers", "devicemesh"}
    with pytest.raises(NdplanError, match="--emit='nemo'"):
        emit("nemo", *CASES["dense-dp-zero0"])


def test_cli_estimate_emit_stdout_and_file(tmp_path):
    args = ["estimate", "-m", "llama3-70b", "--tp", "8", "--pp", "4", "--dp", "2", "--gbs", "64"]
    r = CliRunner().invoke(main, args + ["--emit", "torchtitan"])
    assert r.exit_code == 0, r.output
    assert tomllib.loads(r.stdout)["parallelism"]["tensor_parallel_degree"] == 8
    out = tmp_path / "ds.json"
    r = CliRunner().invoke(main, args + ["--no-sp", "--emit", "deepspeed", "--emit-out", str(out)])
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


def test_cli_sweep_emits_the_best_candidate_the_format_can_express(tmp_path):
    """DeepSpeed's JSON cannot say sp at tp > 1, interleaved or zero-bubble schedules (the
    exporter refuses them): --emit writes the best-ranked feasible candidate it accepts, which
    a walk down the ranking with the exporter's own refusals finds, and says so on stderr."""
    from ndplan.catalog import load_hardware
    from ndplan.sweep import sweep
    space = {"tp": [1, 2], "pp": [1, 2], "cp": [1], "schedule": ["1f1b", "zb-h1"], "zero": [1]}
    res = sweep(load_model("llama3-8b"), load_hardware("h100-sxm"), 8, 4096, 32, space, top=1,
                base={"engine": "deepspeed"})
    first = next(i for i in range(res.feasible) if _expressible("deepspeed", res, i))
    out = tmp_path / "ds.json"
    r = CliRunner().invoke(main, ["sweep", "-m", "llama3-8b", "--gpus", "8", "--seq", "4096", "--gbs", "32",
                                  "--tp", "1,2", "--pp", "1,2", "--cp", "1", "--schedule", "1f1b,zb-h1", "--zero", "1",
                                  "--engine", "deepspeed", "--emit", "deepspeed", "--emit-out", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text()) == json.loads(emit("deepspeed", res.model, res.strategy(first)))
    assert (first > 0) == (f"the best that can is rank {first + 1}" in r.output)


def _expressible(form, res, i) -> bool:
    try:
        emit(form, res.model, res.strategy(i))
        return True
    except NdplanError:
        return False


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


def test_a_derived_engine_exports_as_its_base():
    """An engine made with --set (``megatron[overlap_tp_comm=1]``: a time-model setting)
    reaches the exporters and PPB's layer export by name (engines.profile), and changes
    neither the recompute counts nor the layers' memory."""
    import dataclasses

    from ndplan.catalog import load_hardware
    from ndplan.export.common import recompute_counts
    from ndplan.ppb.export import layers_from_model
    base = Strategy(pp=2, gbs=2, recompute="full", recompute_layers=2)
    derived = dataclasses.replace(base, engine="megatron[overlap_tp_comm=1]")
    # full recompute of the first 2 of each stage's 40 layers, no selective layer
    assert recompute_counts(DENSE, derived) == recompute_counts(DENSE, base) == ((2, 2), (0, 0))
    hw = load_hardware("h100-sxm")
    a, b = layers_from_model(DENSE, hw, base)[0], layers_from_model(DENSE, hw, derived)[0]
    assert [x.static_bytes for x in a] == [x.static_bytes for x in b]


@pytest.mark.parametrize("flags", [
    "--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 6 --decoder-last-pipeline-num-layers 6 "
    "--num-virtual-stages-per-pipeline-rank 2",
    "--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 5",
    "--pipeline-model-parallel-size 4 --decoder-last-pipeline-num-layers 2",
    "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 14 --decoder-last-pipeline-num-layers 18",
    "--pipeline-model-parallel-size 3 --decoder-first-pipeline-num-layers 8 --num-virtual-stages-per-pipeline-rank 4",
])
def test_megatron_reader_splits_first_last_counts_as_megatron_does(flags, tmp_path):
    """The reader's layers per virtual stage equal Megatron's own split (the transcription
    above, megatron_layers): a count given for one end only leaves the other end with the
    middle count, and under vpp > 1 each count is dealt over the rank's chunks."""
    from ndplan.interop import megatron as mg
    text = f"torchrun pretrain_gpt.py --num-layers 32 --micro-batch-size 1 --global-batch-size 48 --seq-length 4096 {flags}\n"
    ci = mg.read(tmp_path / "run.sh", text, model=load_model("llama3-8b"), gpus=48)
    assert list(ci.strategy.layers_per_stage) == megatron_layers(megatron_parse(text.split("pretrain_gpt.py")[1]))
