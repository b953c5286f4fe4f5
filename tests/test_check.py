"""``ndplan check``: the framework-config readers, the OOM verdict and its causes, and
the nearest fitting strategies as diffs of the user's file.

Expected values come from outside the code under test: the MindFormers degrees from the
normalised table someone else built (shared/validation/mindformers/memory_cases.yaml,
an excerpt in tests/data/mindformers/cases.yaml) and the measured MindSpore peaks in it,
judged apart on the cases the mindspore engine profile was tuned on and on held-out ones;
the 7B OOM from Korthikanti et al.'s activation formula worked by hand below; the
torchtitan / DeepSpeed degrees from the hand-written files; round trips from the
exporters (export/), which are tested against the frameworks' own parsers in
tests/test_export.py.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import ndplan
from ndplan.check import check, distance, file_diff
from ndplan.cli import main
from ndplan.errors import NdplanError, NdplanWarning
from ndplan.export import emit
from ndplan.interop import read_config
from tests.helpers import validation_dir

DATA = Path(__file__).parent / "data" / "mindformers"
GIB, MIB = 2 ** 30, 2 ** 20
LLAMA3_8B = ndplan.load_model("llama3-8b")  # 32 layers, 32 heads, 8 kv heads


def apply_unified_diff(text: str, diff: str) -> str:
    """Apply a unified diff (difflib's output) to ``text``, checking every context and
    removed line; written here so the test does not trust check's own rewritten text."""
    old = text.splitlines(True)
    out, pos = [], 0
    lines = diff.splitlines(True)
    i = 0
    while i < len(lines):
        m = re.match(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", lines[i])
        i += 1
        if not m:
            continue
        start = int(m.group(1)) - (0 if m.group(2) == "0" else 1)
        out += old[pos:start]
        pos = start
        while i < len(lines) and not lines[i].startswith("@@"):
            tag, body = lines[i][0], lines[i][1:]
            if tag in " -":
                assert old[pos] == body, f"diff does not apply at line {pos + 1}"
                pos += 1
            if tag in " +":
                out.append(body)
            i += 1
    return "".join(out + old[pos:])


def assert_proposals_apply(res, fmt: str, tmp_path: Path, **read_kw):
    """Every proposal's diff applies to the user's file and the patched file reads back
    as the proposed strategy, whose estimate fits the limit."""
    assert res.proposals, "expected fitting proposals"
    for k, p in enumerate(res.proposals):
        patched = apply_unified_diff(res.input.text, p.diff)
        f = tmp_path / f"p{k}{res.input.path.suffix}"
        f.write_text(patched)
        back = read_config(f, fmt, **read_kw)
        assert back.strategy == p.strategy
        est = ndplan.estimate(back.model, res.hardware, back.strategy, back.gpus)
        assert est.peak_bytes <= res.limit_bytes
        assert distance(res.input.strategy, p.strategy) == p.distance >= 1
    assert [p.distance for p in res.proposals] == sorted(p.distance for p in res.proposals)


# --------------------------------------------------------------------------- MindFormers

def _cases(table: Path, root: Path):
    return [pytest.param(c, root, id=c["id"]) for c in yaml.safe_load(table.read_text())["cases"]]


def _expected_m(c) -> int:
    """Micro-batches per step by the README's rule (section 2): micro_batch_num with a
    pipeline, gradient_accumulation_steps (default 1) without."""
    b = c["batch"]
    return b["micro_batch_num"] if c["parallel"]["pp"] > 1 else (b["gradient_accumulation_steps"] or 1)


def _check_degrees(c, root: Path):
    ci = read_config(root / (c["config"] if "config" in c else c["local_copy"]["config"]))
    s, p, b = ci.strategy, c["parallel"], c["batch"]
    assert (s.dp, s.tp, s.pp, s.cp, s.vpp) == (p["dp"], p["tp"], p["pp"], p["cp"], p["vpp"] or 1)
    assert (s.mbs, s.m) == (b["micro_batch_size"], _expected_m(c))
    assert s.sp == (bool(p["sp"]) or p["tp"] == 1)
    r = c["recompute"]
    full, sel = r["full"], r["selective"]
    if full is True or (isinstance(full, list) and any(full)):
        assert s.recompute == "full"
    elif sel is True or (isinstance(sel, list) and any(sel)):
        assert s.recompute == "selective"
    else:
        assert s.recompute == "none"
    counts = full if isinstance(full, list) else sel if isinstance(sel, list) and full is not True else None
    if counts is not None and any(counts):
        want = tuple(min(int(x), ci.model.num_hidden_layers) for x in counts)  # MindFormers clamps
        got = s.recompute_layers if isinstance(s.recompute_layers, tuple) else (s.recompute_layers,) * s.pp
        assert got == want
    return ci


def _ape(ci, measured_mb: float) -> float:
    res = check(ci, top=0)  # library check; no proposals needed for the error
    return abs(res.estimate.peak_bytes / MIB - measured_mb) / measured_mb * 100


# Which measured cases the mindspore engine profile (src/ndplan/engines.py, MINDSPORE) was
# tuned on. engines.py names its evidence in MINDSPORE.sources and in the docstrings of the
# settings only it uses; the commits that set them (git log -p src/ndplan/engines.py:
# d97415d, 60362ba, 9d95918, ee81515, ed9ae38, 8923811, 3af5478, 0c6c049, 5338096, 421db69)
# name the same cases. A case is "tuning" when a constant was read off its measurement or
# checked against it while being set; the rest are "held out". Two caveats make the held-out
# set weaker than a blind one: every one of those commits reported the 37-case MAPE, so a
# change that hurt a held-out case would have been seen; and two blanket static readings
# cover every case (graph_constants: the 36-39 / 137-140 MiB of Static beyond the states of
# every llama2 / llama3 stage; grads_without_accumulation: the 0 MiB accu_grad of every
# pp=1 case). The dynamic (activation, workspace, loss) constants were fitted on tuning
# cases only.
TUNING = {
    "llama2/70b": "sources states/static/logits/backward_workspace/cast_once: stage-0 params, optimizer, "
                  "accu_grad, embedding 125 MiB, AllGather 4080 MiB, last-stage loss 449 MiB",
    "llama2/balanced": "ed9ae38: the norm/rope activation constants checked on the tour/balanced slopes",
    "llama2/tour1": "ed9ae38: the tour/balanced slopes (llama2-7B no SP tp2 b8)",
    "llama2/tour2": "ed9ae38: the tour/balanced slopes (llama2-7B no SP tp2 b8)",
    "llama3/cp2_colai": "sources static: input-embedding accu_grad split over cp (stage 0: 4331 MiB)",
    "llama3/cp2_colai_fullrec": "sources activations/cast_once: full-recompute input 70.8 MiB, optimizer floor",
    "llama3/cp2_colai_norec": "cp_implies_sp docstring: 305.6 MiB per layer per micro-batch",
    "llama3/cp8_colai_no_tp_norec": "sources static: embedding accu_grad 33141 MiB",
    "llama3/default": "sources comm_recompute/cast_once: default vs norec stage 0, the flat 3.4-3.7 GB",
    "llama3/norec": "sources comm_recompute/cast_once",
    "llama3/n_kv_heads_64": "sources cast_once",
    "llama3/no_op": "sources cast_once: no_op adds 204 MiB per layer per micro-batch",
    "llama3/fullrec": "sources optimizer_step/activations: stages 1-6 flat at 8465 MiB",
    "llama3/dp": "sources activations/backward_workspace/selective_needs_tp: tp=1 layer 2738 MiB (2759)",
    "llama3/pp8_rank8": "sources activations/backward_workspace/selective_needs_tp: tp=1 layer",
    "llama3/no_sp": "sources selective_needs_tp: identical to no_sp_norec",
    "llama3/no_sp_norec": "sources activations/backward_workspace: norm 263 MiB, rope 184 vs 164 MiB, layer 790",
    "llama3/no_sp_fullrec": "sources activations: full-recompute input 135 MiB per layer per micro-batch",
    "llama3/no_fa": "selective_score_global docstring: the selective list ending in zeros",
    "llama3/no_sp_no_fa": "score_bytes=6 / selective_score_bytes=2 (no flash attention): with no_fa and "
                          "no_sp_norec_no_fa the only cases the s^2 constants can come from (not named)",
    "llama3/no_sp_norec_no_fa": "score_bytes=6 (no flash attention): see no_sp_no_fa",
    "llama3/vp10": "sources recompute_counts and graph_constants: 1372 MiB at pp_interleave_num 10",
    "llama3/vp5": "sources graph_constants: 686 MiB at pp_interleave_num 5",
    "llama3/vp2": "sources graph_constants: 274 MiB at pp_interleave_num 2",
    "llama3/vp2_norec": "sources graph_constants: pp_interleave_num 2 (vp2 or vp2_norec; counted for both)",
}
HELD_OUT = {  # named nowhere in engines.py or the tuning commits
    "llama3/cp2_ulysses", "llama3/norec_cp64_colai", "llama3/norec_cp64_ulysses", "llama3/norec_dp64",
    "llama3/norec_pp2", "llama3/norec_pp4", "llama3/norec_tp64", "llama3/num_layers_8", "llama3/num_layers_8_pp1",
    "llama3/per_batch_48", "llama3/tp8_rank8",
    "llama3/vp10_less",  # vp10.yaml run in a "VPP less-memory" mode ndplan does not model: vp10's estimate
}

# Bounds: the measured MAPE of each set (max-over-stages peak, the upstream metric) plus
# about 1.5 points, so a regression of one bad case shows. Measured on this commit's
# engine profile: tuning 25 cases 5.6 %, held-out 12 cases 9.1 % (37 cases 6.7 %).
MAPE_TUNING_PCT = 7.0
MAPE_HELD_OUT_PCT = 10.5
# Per-case bound for the committed fixtures (an excerpt of 6 cases, 5 tuning + norec_tp64):
# the benchmark gives them APEs of 0.2-5.2 %; 10 % leaves room without hiding a regression.
FIXTURE_APE_PCT = 10.0


def _mapes(apes: dict[str, float]) -> tuple[float, float]:
    """MAPE over the tuning cases and over the held-out cases among ``apes`` (held-out: nan if none)."""
    tun = [a for k, a in apes.items() if k in TUNING]
    held = [a for k, a in apes.items() if k in HELD_OUT]
    assert len(tun) + len(held) == len(apes), set(apes) - set(TUNING) - HELD_OUT
    return sum(tun) / len(tun), (sum(held) / len(held) if held else float("nan"))


@pytest.mark.parametrize("c,root", _cases(DATA / "cases.yaml", DATA))
def test_mindformers_fixture_degrees_and_peak(c, root):
    ci = _check_degrees(c, root)
    assert _ape(ci, c["peak_mb"]) <= FIXTURE_APE_PCT


def test_mindformers_fixture_mape(record_property):
    """The committed excerpt (runs without ../shared): tuning MAPE under the tuning bound;
    its one held-out case, norec_tp64, under the held-out bound."""
    cases = yaml.safe_load((DATA / "cases.yaml").read_text())["cases"]
    apes = {c["id"]: _ape(read_config(DATA / c["config"]), c["peak_mb"]) for c in cases}
    tun, held = _mapes(apes)
    record_property("mape_tuning_pct", tun)
    record_property("mape_held_out_pct", held)
    print(f"MindFormers fixture MAPE: tuning {tun:.2f} % ({len(apes) - 1} cases), held-out {held:.2f} % (1 case)")
    assert tun <= MAPE_TUNING_PCT and held <= MAPE_HELD_OUT_PCT, (tun, held)


def test_mindformers_every_measured_yaml(record_property):
    """All 37 measured cases (vp10_less reads vp10.yaml): degrees equal the normalised table;
    the MAPE of the max-over-stages peak (upstream metric) over the tuning cases and over the
    held-out cases each within its bound."""
    shared = validation_dir() / "mindformers"
    cases = yaml.safe_load((shared / "memory_cases.yaml").read_text())["cases"]
    assert {c["id"] for c in cases} == set(TUNING) | HELD_OUT and not set(TUNING) & HELD_OUT
    apes = {c["id"]: _ape(_check_degrees(c, shared), c["measured"]["peak_mb"]) for c in cases}
    tun, held = _mapes(apes)
    record_property("mape_tuning_pct", tun)
    record_property("mape_held_out_pct", held)
    print(f"MindFormers MAPE: tuning {tun:.2f} % ({len(TUNING)} cases), held-out {held:.2f} % ({len(HELD_OUT)} cases)")
    assert tun <= MAPE_TUNING_PCT, f"tuning MAPE {tun:.2f} % > {MAPE_TUNING_PCT} %"
    assert held <= MAPE_HELD_OUT_PCT, f"held-out MAPE {held:.2f} % > {MAPE_HELD_OUT_PCT} %"


@pytest.fixture(scope="module")
def vp2_check(tmp_path_factory):
    """``check`` of a copy of llama3/vp2.yaml with 6 proposals (one sweep, shared by the
    tests below)."""
    f = tmp_path_factory.mktemp("vp2") / "vp2.yaml"
    f.write_text((DATA / "llama3" / "vp2.yaml").read_text())
    return check(read_config(f), top=6)


def test_mindformers_limit_is_max_device_memory_and_proposals_apply(vp2_check, tmp_path):
    """llama3/vp2 measures 58,397 MiB > its max_device_memory 52.5GB: check must use the
    yaml's cap, say so, and propose edits of the yaml that fit it."""
    res = vp2_check
    assert res.limit_bytes == int(52.5 * GIB) and "max_device_memory" in res.limit_source
    assert not res.fits
    assert_proposals_apply(res, "mindformers", tmp_path)


# --------------------------------------------------------------------------- Megatron 7B

MEGATRON_7B = r"""#!/bin/bash
# Llama-2 7B pretraining, 2 nodes x 8 GPUs, DP=8 x TP=2, 32k context
GPUS_PER_NODE=8
NNODES=2
TP=2
SEQ_LEN=32768

DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank ${NODE_RANK:-0}"

MODEL_ARGS=(
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32
    --ffn-hidden-size 11008 --swiglu --untie-embeddings-and-output-weights
    --vocab-size 32000
)

torchrun $DISTRIBUTED_ARGS pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    --tensor-model-parallel-size $TP \
    --pipeline-model-parallel-size=1 \
    --sequence-parallel \
    --use-distributed-optimizer \
    --micro-batch-size 1 \
    --global-batch-size 64 \
    --seq-length ${SEQ_LEN} \
    --lr 3.0e-4 --bf16   # the rest is not read
"""


def test_megatron_script_parsed(tmp_path):
    f = tmp_path / "pretrain_llama2_7b.sh"
    f.write_text(MEGATRON_7B)
    ci = read_config(f)
    s = ci.strategy
    assert (ci.gpus, s.dp, s.tp, s.pp, s.cp, s.mbs, s.gbs, s.seq, s.zero, s.sp) == (16, 8, 2, 1, 1, 1, 64, 32768, 1, True)
    assert s.recompute == "none" and s.engine == "megatron"
    ref = ndplan.load_model("llama2-7b")  # the architecture the flags spell out
    for f_ in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "vocab_size", "tie_word_embeddings", "gated_mlp"):
        assert getattr(ci.model, f_) == getattr(ref, f_), f_
    assert {"--lr", "--node_rank"} <= set(ci.unknown) and "--bf16" not in ci.unknown  # --bf16 sets the grad dtype
    assert ci.lines["--tensor-model-parallel-size"] == 18


def test_megatron_7b_dp8_seq32k_is_oom_by_activations(tmp_path):
    """Hand bound (Korthikanti et al. 2022, arXiv 2205.05198, Table 2): with TP + SP each
    layer keeps s*b*h*(34/t + 5*a*s/(h*t)) bytes of activations; FlashAttention keeps no
    a*s*s scores, leaving 34*s*b*h/t. For s = 32768, b = 1, h = 4096, t = 2, L = 32:
    34*32768*4096/2 * 32 = 73.0e9 B = 68.0 GiB. Add bf16 weights and fp32 gradients,
    6 B per parameter over tp = 2: 6 * 6.74e9 / 2 = 20.2e9 B = 18.8 GiB. That is
    86.8 GiB > 80 GiB whatever the optimizer sharding and the other terms: OOM, and the
    activations alone are most of it."""
    s_, b, h, t, L = 32768, 1, 4096, 2, 32
    acts = 34 * s_ * b * h / t * L
    params = ndplan.estimate(ndplan.load_model("llama2-7b"), ndplan.load_hardware("h100-sxm"),
                             ndplan.Strategy(gbs=1)).params_total
    lower_bound = acts + 6 * params / t
    assert acts / GIB == pytest.approx(68.0, abs=0.1) and lower_bound > 80 * GIB

    f = tmp_path / "pretrain_llama2_7b.sh"
    f.write_text(MEGATRON_7B)
    res = check(read_config(f, model="llama2-7b"), "h100-sxm", top=3)
    assert not res.fits and res.limit_bytes == 80 * GIB
    assert res.estimate.peak_bytes >= lower_bound
    assert res.causes[0]["key"] == "mem.activations"
    assert res.causes[0]["bytes"] >= 0.9 * acts  # ndplan's term holds at least the hand formula's bulk
    assert_proposals_apply(res, "megatron", tmp_path, model="llama2-7b")


def test_megatron_cli_exit_1_and_json(tmp_path):
    f = tmp_path / "pretrain_llama2_7b.sh"
    f.write_text(MEGATRON_7B)
    r = CliRunner().invoke(main, ["check", str(f), "-m", "llama2-7b", "--top", "1"])
    assert r.exit_code == 1, r.output
    assert "DOES NOT FIT" in r.output and "mem.activations" in r.output and "+++ b/pretrain_llama2_7b.sh" in r.output
    r = CliRunner().invoke(main, ["check", str(f), "-m", "llama2-7b", "--top", "0", "--json"])
    assert r.exit_code == 1
    import json
    doc = json.loads(r.stdout)
    assert doc["fits"] is False and doc["oom_causes"][0]["key"] == "mem.activations"


# --------------------------------------------------------------------------- torchtitan, DeepSpeed

TORCHTITAN_8B = """# torchtitan llama3 8B on 16 GPUs
[model]
name = "llama3"
flavor = "8B"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 2   # inside a node
pipeline_parallel_degree = 1
context_parallel_degree = 1

[training]
local_batch_size = 2
seq_len = 8192

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
"""

DEEPSPEED = """{
  "train_batch_size": 64,
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 4,
  "bf16": {
    "enabled": true
  },
  "zero_optimization": {
    "stage": 2
  }
}
"""


def test_torchtitan_parsed_and_fits(tmp_path):
    f = tmp_path / "llama3_8b.toml"
    f.write_text(TORCHTITAN_8B)
    ci = read_config(f, gpus=16)
    s = ci.strategy
    assert ci.model.name == "llama3.1-8b"  # [model] name/flavor -> catalog (torchtitan 8B is Llama 3.1 8B)
    assert (s.dp, s.tp, s.pp, s.cp, s.mbs, s.gbs, s.seq, s.recompute, s.zero, s.engine) == \
        (8, 2, 1, 1, 2, 16, 8192, "selective", 3, "fsdp")
    r = CliRunner().invoke(main, ["check", str(f), "--gpus", "16"])
    assert r.exit_code == 0, r.output
    assert ": fits" in r.output


def _titan_toml(model: str = "", training: str = "", tables: str = "", shard: int = -1, replicate: int = 1) -> str:
    return (f'[model]\nname = "llama3"\nflavor = "8B"\n{model}\n'
            f"[parallelism]\ndata_parallel_replicate_degree = {replicate}\ndata_parallel_shard_degree = {shard}\n"
            f"tensor_parallel_degree = 2\n\n[training]\nlocal_batch_size = 2\nseq_len = 8192\n{training}\n{tables}")


F8 = 'converters = ["float8"]'


@pytest.mark.parametrize("model, training, tables, settings", [
    ("", "", "[compile]\nenable = true\n", {"compiled_blocks", "compiled_loss"}),  # Compile default: model, loss
    ("", "", '[compile]\nenable = true\ncomponents = ["model"]\n', {"compiled_blocks"}),
    ("", "compile = true", "", {"compiled_blocks", "compiled_loss"}),  # 2025: one switch, both (bbb1b616)
    (F8, "", "[float8]\nenable_fsdp_float8_all_gather = true\n", {"float8_all_gather", "fp8_gemm_compute"}),
    (F8, "", "[quantize.linear.float8]\nenable_fsdp_float8_all_gather = true\n",
     {"float8_all_gather", "fp8_gemm_compute"}),
    (F8, "", "", {"fp8_gemm_compute"}),  # float8 GEMMs with the bf16 all-gather: memory as bf16
    ('converters = ["quantize.grouped_mm.float8"]', "", "", set()),  # MoE grouped GEMMs: not the linears
    ("", "", "[float8]\nenable_fsdp_float8_all_gather = true\n", set()),  # no float8 converter
])
def test_torchtitan_compile_and_float8_keys_set_engine_settings(tmp_path, model, training, tables, settings):
    """torchtitan's job_config: [compile] enable / components (default ["model", "loss"]), the older
    training.compile, and the float8 all-gather only with a float8 converter and FSDP sharding
    (float8.py: enable_fsdp_float8_all_gather is taken when parallel_dims.dp_shard_enabled); the
    float8 linear converter (torchao Float8Linear: fp8 GEMMs on bf16 weights) sets fp8_gemm_compute,
    which times the GEMMs at the FP8 peak (engines.fp8_gemms)."""
    f = tmp_path / "llama3_8b.toml"
    f.write_text(_titan_toml(model, training, tables))
    engine = read_config(f, gpus=16).strategy.engine
    got = {kv.split("=")[0] for kv in engine[engine.index("[") + 1:-1].split(",")} if "[" in engine else set()
    assert got == settings, engine
    f.write_text(_titan_toml(model, training, tables, shard=1, replicate=8))  # DDP: no FSDP all-gather
    assert "float8_all_gather" not in read_config(f, gpus=16).strategy.engine
    from ndplan.engines import fp8_gemms, profile
    assert fp8_gemms("auto", profile(engine)) == ("fp8_gemm_compute" in settings)


def test_torchtitan_oom_proposals_apply(tmp_path):
    f = tmp_path / "llama3_8b.toml"
    f.write_text(TORCHTITAN_8B.replace("local_batch_size = 2", "local_batch_size = 8")
                 .replace('mode = "selective"', 'mode = "none"').replace("seq_len = 8192", "seq_len = 16384"))
    res = check(read_config(f, gpus=16), top=3)
    assert not res.fits
    assert_proposals_apply(res, "torchtitan", tmp_path, gpus=16)


def test_deepspeed_parsed_and_fits(tmp_path):
    f = tmp_path / "ds_config.json"
    f.write_text(DEEPSPEED)
    ci = read_config(f, model="llama3-8b", gpus=8, seq=4096)
    s = ci.strategy
    assert (s.dp, s.tp, s.pp, s.mbs, s.m, s.gbs, s.zero, s.recompute, s.engine) == \
        (8, 1, 1, 2, 4, 64, 2, "none", "deepspeed")
    # at seq 4096 the activations (34 GiB) and DeepSpeed's allocator slack (engines.DEEPSPEED) exceed 80 GiB
    r = CliRunner().invoke(main, ["check", str(f), "-m", "llama3-8b", "--gpus", "8", "--seq", "2048"])
    assert r.exit_code == 0, r.output


def test_deepspeed_oom_proposals_apply(tmp_path):
    f = tmp_path / "ds_config.json"
    f.write_text(DEEPSPEED.replace('"train_micro_batch_size_per_gpu": 2', '"train_micro_batch_size_per_gpu": 8')
                 .replace('"gradient_accumulation_steps": 4', '"gradient_accumulation_steps": 1'))
    kw = dict(model="llama3-8b", gpus=8, seq=8192)
    res = check(read_config(f, **kw), top=3)
    assert not res.fits
    assert_proposals_apply(res, "deepspeed", tmp_path, **kw)


# --------------------------------------------------------------------------- round trips

def _shape(draw, pp_max=4, cp=True, vpp=True) -> dict:
    """Degrees, batch and schedule of a random valid strategy for llama3-8b."""
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([p for p in (1, 2, 4) if p <= pp_max]))
    dp, mbs = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2]))
    v = draw(st.sampled_from([1, 2])) if vpp and pp > 1 else 1
    m = pp * draw(st.integers(1, 8 // pp)) if v > 1 else draw(st.integers(1, 8))  # interleaved: pp | m
    return dict(dp=dp, tp=tp, pp=pp, cp=draw(st.sampled_from([1, 2])) if cp else 1, vpp=v, mbs=mbs,
                gbs=dp * mbs * m, schedule="interleaved" if v > 1 else "1f1b")


@st.composite
def megatron_strategies(draw):
    s = _shape(draw)
    rec = draw(st.sampled_from(["none", "selective", "full"]))
    return ndplan.Strategy(**s, seq=4096 * s["cp"], zero=draw(st.sampled_from([0, 1] + ([3] if s["pp"] == 1 else []))),
                           sp=True if s["tp"] == 1 else draw(st.booleans()), recompute=rec,
                           recompute_layers=draw(st.sampled_from([None, 1, 2])) if rec == "full" else None,
                           engine="megatron")


@st.composite
def torchtitan_strategies(draw):
    s = _shape(draw, cp=False)
    zero = draw(st.sampled_from([2, 3] + ([0] if s["tp"] == s["pp"] == 1 else [])))
    return ndplan.Strategy(**s, seq=8192, zero=zero, sp=True,
                           recompute=draw(st.sampled_from(["none", "selective", "full"])), engine="fsdp")


@st.composite
def deepspeed_strategies(draw):
    s = _shape(draw, pp_max=2, cp=False, vpp=False)
    zero = draw(st.sampled_from([0, 1] + ([2, 3] if s["pp"] == 1 else [])))
    return ndplan.Strategy(**s, seq=2048, zero=zero, sp=s["tp"] == 1,
                           recompute=draw(st.sampled_from(["none", "full"])), engine="deepspeed")


@st.composite
def mindformers_strategies(draw):
    s = _shape(draw)
    rec = draw(st.sampled_from(["none", "selective", "full"]))
    per_chunk = 32 // (s["pp"] * s["vpp"])
    # per-stage counts below the layers of a stage (MindFormers deals a stage's count over
    # its chunks; the exporter writes the dealt per-chunk lists)
    rl = draw(st.sampled_from([None] + list(range(1, per_chunk * s["vpp"])))) if rec != "none" else None
    return ndplan.Strategy(**s, seq=4096, zero=draw(st.sampled_from([0, 1])),
                           sp=True if s["tp"] == 1 else draw(st.booleans()), recompute=rec, recompute_layers=rl,
                           engine="mindspore", flash_attention=False,  # the emitted yaml has no use_flash_attention
                           weight_dtype="bf16")  # nor param_init_type (MindFormers defaults: off, bf16)


SUFFIX = {"megatron": ".sh", "torchtitan": ".toml", "deepspeed": ".json", "mindformers": ".yaml"}
ROUND_TRIP_SETTINGS = settings(max_examples=40, deadline=None)


def _round_trip(fmt: str, s: ndplan.Strategy, tmp_path_factory) -> ndplan.Strategy:
    f = tmp_path_factory.mktemp(fmt) / f"emitted{SUFFIX[fmt]}"
    f.write_text(emit(fmt, LLAMA3_8B, s))
    return read_config(f, model=LLAMA3_8B, gpus=s.world, seq=s.seq if fmt == "deepspeed" else None).strategy


GENERATORS = {"megatron": megatron_strategies, "torchtitan": torchtitan_strategies,
              "deepspeed": deepspeed_strategies, "mindformers": mindformers_strategies}


@pytest.mark.parametrize("fmt", list(GENERATORS))
@ROUND_TRIP_SETTINGS
@given(data=st.data())
def test_round_trip_emit_then_read(fmt, data, tmp_path_factory):
    """export.emit -> interop reader gives the same Strategy (the fields each format carries)."""
    s = data.draw(GENERATORS[fmt]())
    assert _round_trip(fmt, s, tmp_path_factory) == s


def test_file_diff_of_same_strategy_is_empty(tmp_path):
    f = tmp_path / "pretrain.sh"
    f.write_text(MEGATRON_7B)
    ci = read_config(f, model="llama2-7b")
    assert file_diff(ci, ci.strategy) == ("", MEGATRON_7B)
    other = dataclasses.replace(ci.strategy, recompute="selective")
    diff, _ = file_diff(ci, other)
    assert re.search(r"^\+.*--recompute-granularity selective", diff, re.M)  # on an added line


# --------------------------------------------------------------------------- bad input

BAD = {  # name: (file name, text, extra CLI args, field named in the message)
    "malformed-toml": ("a.toml", "[parallelism\ntensor_parallel_degree = 2\n", ["--gpus", "8"], "FILE"),
    "malformed-json": ("a.json", '{"train_batch_size": 8,,}', ["-m", "llama3-8b", "--gpus", "8", "--seq", "4096"],
                       "FILE"),
    "malformed-yaml": ("a.yaml", "parallel_config:\n  data_parallel: [1,\n", [], "FILE"),
    "yaml-not-mindformers": ("a.yaml", "foo: 1\n", [], "FILE"),
    "deepspeed-no-model": ("a.json", DEEPSPEED, ["--gpus", "8", "--seq", "4096"], "--model"),
    "deepspeed-no-seq": ("a.json", DEEPSPEED, ["-m", "llama3-8b", "--gpus", "8"], "--seq"),
    "torchtitan-unknown-flavor": ("a.toml", TORCHTITAN_8B.replace('"8B"', '"9B"'), ["--gpus", "16"], "--model"),
    "megatron-no-model": ("a.sh", "torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 "
                                  "--seq-length 4096\n", [], "--model"),
    "megatron-degrees-do-not-divide": ("a.sh", MEGATRON_7B.replace("TP=2", "TP=3"), ["-m", "llama2-7b"], "gpus"),
    "deepspeed-degrees-do-not-divide": ("a.json", DEEPSPEED.replace('"bf16"', '"tensor_parallel": {"autotp_size": 3}, '
                                                                   '"bf16"'),
                                        ["-m", "llama3-8b", "--gpus", "8", "--seq", "4096"], "gpus"),
    "mindformers-gpus-disagree": ("a.yaml", (DATA / "llama3" / "default.yaml").read_text(), ["--gpus", "8"], "gpus"),
    "unknown-content": ("a.cfg", "hello\n", [], "--format"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_one_line_exit_2(name, tmp_path):
    fname, text, args, field = BAD[name]
    f = tmp_path / fname
    f.write_text(text)
    r = CliRunner().invoke(main, ["check", str(f)] + args)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}="), r.output


def test_missing_file_exit_2(tmp_path):
    r = CliRunner().invoke(main, ["check", str(tmp_path / "nope.sh")])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1


def test_megatron_removed_flag_keeps_indentation():
    """Removing a switch from a continued line leaves the line's indentation as written."""
    from ndplan.interop import megatron as mg
    text = "torchrun pretrain_gpt.py \\\n    --sequence-parallel --use-distributed-optimizer --bf16 \\\n    --seq-length 8\n"
    out = mg.edit(text, {"--use-distributed-optimizer": mg.REMOVE})
    assert out.splitlines()[1] == "    --sequence-parallel --bf16 \\"


def _bash_args(text: str) -> list[str]:
    """The words bash passes to torchrun when it runs ``text`` (torchrun is a function
    printing its arguments): bash is the oracle for continuations, comments and arrays."""
    import subprocess
    r = subprocess.run(["bash", "-c", "torchrun() { printf '%s\\n' \"$@\"; }\n" + text], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


@pytest.mark.parametrize("script", [
    "torchrun pretrain_gpt.py \\\n    --tensor-model-parallel-size 2 \\\n    --seq-length 8  # the context\n",
    "torchrun pretrain_gpt.py --seq-length 8 # one line, a comment\n",
    "ARGS=(\n    --seq-length 8  # in an array\n)\ntorchrun pretrain_gpt.py ${ARGS[@]}\n",
    "torchrun pretrain_gpt.py \\\n    --seq-length 8 \\\n    --bf16\n",
    # NVIDIA's sbatch_mfsdp_deepseek_v3.sh: a quoted command over lines that expands an array
    'ARGS=(\n    --seq-length 8\n)\nCMD="pretrain_gpt.py \\\n    ${ARGS[@]}"\ntorchrun $CMD\n',
    'A=(\n    --micro-batch-size 1\n    --seq-length $((2*2048))\n)\ntorchrun pretrain_gpt.py ${A[@]}\n',
    # NVIDIA's train_llama3_8b_h100_fp8.sh: arrays of one flag per line beside continued commands
    'A=(\n    --seq-length 8\n    --bf16\n)\ntorchrun pretrain_gpt.py \\\n    ${A[@]}\n',
])
def test_megatron_added_flag_reaches_the_command(script):
    """A flag added by a proposal's edit is an argument of the command as bash runs it,
    also when the line it is added to ends in a comment (it used to land inside it)."""
    from ndplan.interop import megatron as mg
    out = mg.edit(script, {"--recompute-granularity": "full", "--use-distributed-optimizer": True})
    args = _bash_args(out)
    assert args[args.index("--recompute-granularity") + 1] == "full" and "--use-distributed-optimizer" in args
    assert [w for w in _bash_args(script) if w not in args] == []  # nothing lost
    assert [w for w, _ in mg.words(out)].count("--recompute-granularity") == 1  # the reader agrees


def test_megatron_added_flag_lands_outside_a_branch():
    """NVIDIA's train_llama3_8b_h100_fp8.sh ends its arguments in an if on the data source: a flag
    a proposal adds goes after the last known flag that bash passes in every branch, so it reaches
    the command whichever branch runs (bash is the oracle, with the branch not taken by the reader)."""
    from ndplan.interop import megatron as mg
    script = ('ARGS=(\n    --micro-batch-size 1\n    --seq-length 4096\n)\nif [[ "$DATA" == "MOCK" ]]; then\n'
              '  ARGS+=(\n    --mock-data --bf16\n  )\nelse\n  ARGS+=(\n    --data-path /x --bf16\n  )\nfi\n'
              'torchrun pretrain_gpt.py ${ARGS[@]}\n')
    out = mg.edit(script, {"--recompute-granularity": "full"})
    for data in ("MOCK", "real"):
        args = _bash_args(f"DATA={data}\n" + out)
        assert args[args.index("--recompute-granularity") + 1] == "full", data


BASH_SCRIPTS = {
    "spaces-in-arithmetic": "G=8\nGBS=$(( 16 * G ))\ntorchrun pretrain_gpt.py --global-batch-size $GBS --seq-length 8\n",
    "defaults": "TP=${TP:-2}\ntorchrun pretrain_gpt.py --tensor-model-parallel-size $TP --seq-length ${SEQ:=4096}\n",
    "semicolons": "G=8; TP=$((G/4)); PP=2;\ntorchrun pretrain_gpt.py --tensor-model-parallel-size $TP "
                  "--pipeline-model-parallel-size $PP\n",
    "if-then-fi": "if [ -z \"$PP\" ]; then PP=2; fi\ntorchrun pretrain_gpt.py --pipeline-model-parallel-size $PP\n",
    "one-line-array": "A=(--tensor-model-parallel-size 2 --micro-batch-size 1)\ntorchrun pretrain_gpt.py \"${A[@]}\"\n",
    "multi-line-array": "A=(\n  --tensor-model-parallel-size 2\n  --seq-length $((2*2048))\n)\n"
                        "torchrun pretrain_gpt.py ${A[@]} --micro-batch-size 1\n",
    "continued-with-comment": "torchrun pretrain_gpt.py \\\n  --micro-batch-size 2 \\\n  --seq-length 8  # short\n",
    # Megatron-DeepSpeed's examples_deepspeed scripts: one quoted string over several lines
    "quote-over-lines": 'PP=2\nopts=" \\\n  --tensor-model-parallel-size 2 \\\n  --seq-length 4096 \\\n'
                        '  --pipeline-model-parallel-size ${PP}"\ntorchrun pretrain_gpt.py ${opts}\n',
    # NVIDIA's train_llama3_8b_h100_fp8.sh: arrays filled in decided branches
    "if-taken": 'DTYPE="fp8"\nX=()\nif [[ "$DTYPE" == "fp8" ]]; then\n  X+=(\n    "--fp8-format hybrid"\n  )\nfi\n'
                'torchrun pretrain_gpt.py ${X[@]} --seq-length 8\n',
    "if-not-taken": 'DTYPE="bf16"\nX=()\nif [[ "$DTYPE" == "fp8" ]]; then\n  X+=(\n    "--fp8-format hybrid"\n  )\nfi\n'
                    'torchrun pretrain_gpt.py ${X[@]} --seq-length 8\n',
    "elif-else-or": 'T=${T:-MOCK}\nif [[ "$T" == "X" ]] || [[ -z "$T" ]]; then\n  A="--seq-length 1"\n'
                    'elif [ "$T" != "MOCK" ]; then\n  A="--seq-length 2"\nelse\n  A="--seq-length 3"\nfi\n'
                    'torchrun pretrain_gpt.py $A\n',
    "nested-numeric": 'N=4\nif [ $N -ge 2 ]; then\n  if [ "$N" -lt 4 ]; then TP=2; else TP=4; fi\nelse\n  TP=1\nfi\n'
                      'torchrun pretrain_gpt.py --tensor-model-parallel-size $TP\n',
    "then-if-on-one-line": 'A=1\nif [ $A = 2 ]; then\n  for i in 1; do if [ $i = 1 ]; then Y=1; fi; done\n'
                           '  X="--seq-length 5"\nfi\ntorchrun pretrain_gpt.py $X --micro-batch-size 1\n',
    "else-if-on-one-line": 'A=3\nif [ $A = 1 ]; then X="--seq-length 1"\nelse if [ $A = 3 ]; then X="--seq-length 3"; '
                           'else X="--seq-length 2"; fi\nfi\ntorchrun pretrain_gpt.py $X\n',
    "quoted-pattern-is-literal": 'M=llama3\nif [[ $M == "llama*" ]]; then X="--seq-length 1"; else X="--seq-length 2"; fi\n'
                                 'torchrun pretrain_gpt.py $X\n',
    "unquoted-pattern-is-a-glob": 'M=llama3\nif [[ $M == llama* ]]; then X="--seq-length 1"; else X="--seq-length 2"; fi\n'
                                  'torchrun pretrain_gpt.py $X\n',
    "value-array-where-used": 'S=4096\nB=($S)\ntorchrun pretrain_gpt.py --seq-length ${B[@]}\n',
    "heredoc-redirect-first-and-shift": 'cat > /dev/null <<EOT\n{"x": 1}\nEOT\nN=$(( 1 << 2 ))\n'
                                        'torchrun pretrain_gpt.py --seq-length 8\n',
    "unset-array-of-flags": 'A=(--seq-length 4)\nunset A\ntorchrun pretrain_gpt.py ${A[@]} --micro-batch-size 1\n',
    # NVIDIA's examples/mamba/train.sh (core_v0.17.0): MODEL_SCALE picks the sizes in a case block
    "case-literal": 'MODEL_SCALE="800M"\ncase "${MODEL_SCALE}" in\n    "800M")\n        TP=1\n        GBS=32\n        ;;\n'
                    '    "8B")\n        TP=4\n        GBS=8\n        ;;\n    *)\n        echo bad; exit 1\n        ;;\nesac\n'
                    'torchrun pretrain_gpt.py --tensor-model-parallel-size $TP --global-batch-size $GBS\n',
    "case-glob-alternatives-one-line": 'M=qwen3-8b\ncase $M in llama*|mistral) A="--seq-length 1";; qwen3-*) A="--seq-length 2";; '
                                       '*) A="--seq-length 3";; esac\ntorchrun pretrain_gpt.py $A\n',
    "case-default-branch": 'M=${M:-other}\ncase $M in\n  a) A="--seq-length 1" ;;\n  *) A="--seq-length 3" ;;\nesac\n'
                           'torchrun pretrain_gpt.py $A --micro-batch-size 1\n',
    "case-one-line-first-branch": 'M=llama3; case $M in llama*|mistral) A="--seq-length 1";; *) A="--seq-length 3";; esac\n'
                                  'torchrun pretrain_gpt.py $A\n',
    "case-partly-quoted-and-negated-patterns": 'M=abc\ncase $M in\n  [^a]*) X=1 ;;\n  "a"*) X=2 ;;\n  *) X=3 ;;\nesac\n'
                                               'torchrun pretrain_gpt.py --seq-length $X\n',
    "case-unset-word": 'case $UNSET_FOR_NDPLAN in\n  "") X=1 ;;\n  *) X=2 ;;\nesac\ntorchrun pretrain_gpt.py --seq-length $X\n',
    "case-pattern-from-variable": 'Y=b\nM=b\ncase $M in\n  "$Y") X=1 ;;\n  *) X=2 ;;\nesac\n'
                                  'torchrun pretrain_gpt.py --seq-length $X\n',
    "case-fallthrough-and-test-on": 'M=a\ncase $M in\n  a) X=1 ;&\n  b) Y="--micro-batch-size 2" ;;\n'
                                    '  *) Y="--micro-batch-size 3" ;;\nesac\ncase $M in\n  a) Z=1 ;;&\n  c) Z=2 ;;\n'
                                    '  *) W="--global-batch-size 8" ;;\nesac\ntorchrun pretrain_gpt.py --seq-length $X $Y $W\n',
    # NVIDIA's tests/functional_tests/.../pretrain_gpt3_distributed_test.sh (core_v0.7.0): [[ $USE_FP8 -eq 1 ]] unset
    "double-bracket-unset-is-zero": 'if [[ $UNSET_FOR_NDPLAN -eq 1 ]]; then X="--seq-length 1"; else X="--seq-length 2"; fi\n'
                                    'torchrun pretrain_gpt.py $X\n',
    "case-first-match-wins": 'M=ab\ncase $M in\n  a*) X=1 ;;\n  ab) X=2 ;;\nesac\ntorchrun pretrain_gpt.py --seq-length $X\n',
    # Megatron-DeepSpeed universal_checkpointing/megatron_gpt/run_fp16.sh: an argument parser the
    # script never enters when run without arguments (bash's $# is 0)
    "while-args-never-entered": 'Z=1\nwhile [[ $# -gt 0 ]]\ndo\nkey="$1"\ncase $key in\n  -z|--zero-stage)\n  Z=$2;\n'
                                '  shift\n  ;;\n  *)\n  exit 1\n  ;;\nesac\nfor i in 1; do Y=2; done\ndone\n'
                                'torchrun pretrain_gpt.py --seq-length $Z\n',
    # Megatron-DeepSpeed ds_pretrain_bert_336M_base_script.sh: a command's options are not the launch's
    "command-substitution-options": 'N=$(echo --query-gpu=name --format=csv)\nM=`echo --x 1`\n'
                                    'K="$(echo --list-gpus | wc -l)"\nO="$(true) --seq-length 4096"\n'
                                    'torchrun pretrain_gpt.py $O --micro-batch-size 1\n',
    "escaped-dollar-paren": 'X="\\$(echo a) --seq-length 8"\ntorchrun pretrain_gpt.py $X\n',
    "until-and-for-after": 'N=3\nuntil [ $N -ge 2 ]; do N=9; done\nfor i in a; do\n  :\ndone\n'
                           'torchrun pretrain_gpt.py --seq-length $N\n',
    "heredoc-and-loop-arithmetic": 'Z=1\ncat <<EOT > /dev/null\n{"train_batch_size": 8, "zero_optimization": {"stage": $Z}}\n'
                                   'EOT\nfor i in 1 2; do\n  x=$(( i > 1 ? 1 : 0 ))\ndone\n'
                                   'torchrun pretrain_gpt.py --seq-length 8 --deepspeed_config ds.json\n',
}


@pytest.mark.parametrize("name", sorted(BASH_SCRIPTS))
def test_megatron_reader_reads_what_bash_passes(name):
    """The flags the reader finds equal those bash hands to the launcher (bash runs the
    script with torchrun as a function printing its arguments)."""
    from ndplan.interop import megatron as mg
    text = BASH_SCRIPTS[name]
    ours, _ = mg.parser().parse_known_args([w for w, _ in mg.words(text)])
    theirs, _ = mg.parser().parse_known_args(_bash_args(text))
    assert vars(ours) == vars(theirs)


def test_shell_leaves_undecided_what_bash_decides_at_run_time():
    """Values made when the script runs (a loop's variable, read, $( )) and operands bash splits
    ([ $X ] with X unset or holding spaces) are not decided: every branch is read, with a
    warning, instead of a branch bash might not run (the variable keeps its last value)."""
    from ndplan.interop import shell
    for script in ('for m in a; do\n  if [ "$m" = a ]; then X="--seq-length 1"; else X="--seq-length 2"; fi\ndone\n',
                   'm=$(echo a)\nif [ "$m" = a ]; then X="--seq-length 1"; else X="--seq-length 2"; fi\n',
                   'if [ -n $UNSET_FOR_NDPLAN ]; then X="--seq-length 1"; else X="--seq-length 2"; fi\n',
                   'case $(hostname) in\n  a*) X="--seq-length 1" ;;\n  *) X="--seq-length 2" ;;\nesac\n'):
        with pytest.warns(NdplanWarning, match="does not decide"):
            words = [w.text for w in shell.read_words(script + "torchrun pretrain_gpt.py $X\n", {})]
        assert words[words.index("--seq-length") + 1] == "2" and words.count("--seq-length") == 1, script


def test_shell_command_substitutions_pass_no_options():
    """A command substitution's options are its command's (Megatron-DeepSpeed ds_pretrain_bert_336M_base
    _script.sh: num_gpus=$(... nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)): no word
    of it reaches the launch (bash: the command's output, known at run time), quoted or not."""
    from ndplan.interop import shell
    for script in ('N=$(nvidia-smi --query-gpu=name --format=csv)\n', 'N="$(nvidia-smi --query-gpu=name)"\n',
                   'N=`nvidia-smi --query-gpu=name`\n'):
        words = [w.text for w in shell.read_words(script + "torchrun pretrain_gpt.py --seq-length 8\n", {})]
        assert not any(w.startswith("--query") or w.startswith("--format") for w in words), (script, words)


def test_shell_warns_that_a_sourced_file_is_not_read():
    """NVIDIA's examples/rl/model_configs/*.sh source common.sh for TP and --bf16: a warning says
    that file is not read (its values are missing), instead of silent defaults."""
    from ndplan.interop import shell
    with pytest.warns(NdplanWarning, match=r"line 2='source \$DIR/common.sh': is not read"):
        words = [w.text for w in shell.read_words('DIR=.\nsource $DIR/common.sh\ntorchrun pretrain_gpt.py $X\n', {})]
    assert "source" not in words and words[:2] == ["torchrun", "pretrain_gpt.py"]


@pytest.mark.parametrize("script", [
    'O="--seq-length 1"\nif [ 1 = 1 ]; then O="--seq-length 2"; fi\ntorchrun pretrain_gpt.py $O\n',
    'A=(--seq-length 1)\nA=(--seq-length 2)\ntorchrun pretrain_gpt.py ${A[@]}\n',
    'A=(--seq-length 1)\ntorchrun pretrain_gpt.py ${A[@]}\nunset A\n',
    'G=(0 1)\ntorchrun --nproc_per_node ${#G[@]} pretrain_gpt.py --run-id job#3 --seq-length 8\n',
    'D=/data/x--y\ntorchrun pretrain_gpt.py --data-path $D --seq-length 8\n',
], ids=["flags-reassigned-in-a-branch", "array-reassigned", "unset-after-use", "hash-inside-words",
        "double-dash-inside-a-value"])
def test_shell_passes_the_flags_bash_passes(script):
    """The flags (with repeats) and their values, as bash passes them."""
    from collections import Counter
    from ndplan.interop import shell
    ours = [w.text for w in shell.read_words(script, {})]
    theirs = _bash_args(script)
    assert Counter(w for w in ours if w.startswith("--")) == Counter(w for w in theirs if w.startswith("--"))
    for k, w in enumerate(theirs):
        if w.startswith("--") and k + 1 < len(theirs) and w != "--nproc_per_node":
            assert ours[ours.index(w) + 1] == theirs[k + 1], w


def test_shell_leaves_conditions_on_loop_values_and_continued_lists_undecided():
    """V set in a loop and a condition continued on the next line are decided only by the
    running script: every branch is read, with a warning."""
    from ndplan.interop import shell
    for script in ('V=0\nfor i in 1 2; do V=$((V+1)); done\nif [ $V -eq 2 ]; then X="--seq-length 1"; '
                   'else X="--seq-length 2"; fi\n',
                   'if [ 1 = 1 ] && \\\n   [ 1 = 2 ]; then X="--seq-length 1"; else X="--seq-length 2"; fi\n'):
        with pytest.warns(NdplanWarning, match="does not decide"):
            shell.read_words(script + "torchrun pretrain_gpt.py $X\n", {})


def test_shell_warns_on_an_if_without_fi_and_an_open_quote():
    from ndplan.interop import shell
    with pytest.warns(NdplanWarning, match="has no fi"):
        shell.read_words('if [ 1 = 1 ]; then\n  X="--seq-length 1"\ntorchrun pretrain_gpt.py $X\n', {})
    with pytest.warns(NdplanWarning, match="never closes"):
        shell.read_words('X="--seq-length 1\n' + "A=1\n" * 3000, {})


def test_shell_notes_the_environment_values_a_decision_used():
    """DTYPE from the environment picks the branch: the decision says so."""
    from ndplan.interop import shell
    got = shell.read_script('DTYPE=${DTYPE:-fp8}\nX=()\nif [[ "$DTYPE" == "fp8" ]]; then\n  X+=(--fp8-format hybrid)\nfi\n'
                            'torchrun pretrain_gpt.py ${X[@]}\n', {"DTYPE": "bf16"})
    assert "--fp8-format" not in [w.text for w in got.words]
    assert any("DTYPE=bf16 from the environment" in d for d in got.decisions)
    got = shell.read_script('DTYPE=${DTYPE:-fp8}\nif [[ "$DTYPE" == "fp8" ]]; then\n  X=(--fp8-format hybrid)\nelse\n'
                            '  X=(--bf16)\nfi\ntorchrun pretrain_gpt.py ${X[@]}\n', {"DTYPE": "bf16"})
    assert any(d.endswith("else (DTYPE=bf16 from the environment)") for d in got.decisions)


def test_shell_keeps_here_documents_by_their_file_and_warns_on_undecided_conditions():
    """A here-document is the file's text, not commands (Megatron-DeepSpeed writes its
    ds_config this way: cat <<EOT > $config_json); an unquoted delimiter expands variables, a
    quoted one does not (bash manual, Here Documents). A file test is not decided: every
    branch is read, with a warning naming the line."""
    from ndplan.interop import shell
    text = 'Z=2\ncfg=ds_$Z.json\ncat <<EOT > $cfg\n{"stage": $Z}\nEOT\ncat <<\'END\' > raw.json\n{"stage": $Z}\nEND\n'
    got = shell.read_script(text, {})
    assert got.heredocs == {"ds_2.json": '{"stage": 2}', "raw.json": '{"stage": $Z}'}
    assert [w.text for w in got.words if w.text.startswith("{")] == []
    with pytest.warns(NdplanWarning, match="line 1=.*the flags of every branch of this if are read"):
        words = shell.read_words('if [ -f x.sh ]; then\n  A="--seq-length 1"\nelse\n  A="--seq-length 2"\nfi\n', {})
    assert [w.text for w in words] == ["--seq-length", "2"]  # both read, the last value kept


def test_mindformers_pp_change_switches_off_stale_comm_recompute_list(vp2_check):
    """vp2.yaml has select_comm_recompute: [10,8,6,4,2,0,0,0], one entry per stage of
    pipeline_stage 8. A proposal with another pp must not leave that 8-entry list."""
    res = vp2_check
    moved = [p for p in res.proposals if p.strategy.pp != 8]
    assert moved, "expected a proposal that changes pp"
    for p in moved:
        assert yaml.safe_load(p.text)["recompute_config"]["select_comm_recompute"] is False
    for p in res.proposals:
        if p.strategy.pp == 8:
            assert yaml.safe_load(p.text)["recompute_config"]["select_comm_recompute"] == [10, 8, 6, 4, 2, 0, 0, 0]


def test_proposals_do_not_add_changes_to_an_earlier_one_without_being_faster(vp2_check):
    """A proposal that makes every change of an earlier one and more must be faster."""
    ps = vp2_check.proposals
    for i, later in enumerate(ps):
        for earlier in ps[:i]:
            more = len(later.changed) > len(earlier.changed) and all(
                later.changed.get(k, (None, None))[1] == v for k, (_, v) in earlier.changed.items())
            assert not more or later.estimate.step_s < earlier.estimate.step_s


@pytest.mark.parametrize("option, pp, want", [
    ("2", 1, ("full", 16)), ("3", 1, ("full", 10)), ("1", 1, ("full", None)), ("0", 1, ("full", None)),
    ("op", 1, ("selective", None)), ("3", 2, ("full", 5)), ("40", 1, ("none", None)),
])
def test_torchtitan_per_layer_sac_reads_as_full_recompute_of_every_nth_block(tmp_path, option, pp, want):
    """torchtitan's per-layer SAC (models/llama3/infra/parallelize.py, 6fc499f6 lines 323-331): a counter
    over a rank's blocks, incremented first, wraps a block when count % N == 0: floor(32 / N) of Llama-3-8B's
    32 layers (16 per rank with pp 2), every block for N = 0 or 1, none when N exceeds the rank's layers."""
    f = tmp_path / "llama3_8b.toml"
    text = _titan_toml(tables=f'[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "{option}"\n')
    if pp > 1:
        text = text.replace("tensor_parallel_degree = 2", 'tensor_parallel_degree = 2\npipeline_parallel_degree = 2\n'
                            'pipeline_parallel_schedule = "1F1B"\npipeline_parallel_microbatch_size = 1')
    f.write_text(text)
    s = read_config(f, gpus=16).strategy
    assert (s.recompute, s.recompute_layers) == want


@pytest.mark.parametrize("layers, option", [(16, "2"), (10, "3"), (8, "4"), (12, None)])
def test_torchtitan_export_writes_per_layer_sac_when_it_is_exact(layers, option):
    """Full recompute of k of 32 layers is torchtitan's per-layer SAC every N = 32 // k blocks when
    floor(32 / N) = k (16 -> "2", 10 -> "3", 8 -> "4"); 12 is no such count and stays mode "full"."""
    from ndplan.export import torchtitan as X
    spec = ndplan.load_model("llama3-8b")
    doc, _ = X.fields(spec, ndplan.Strategy(dp=8, mbs=1, gbs=8, seq=8192, zero=3, recompute="full",
                                            recompute_layers=layers, engine="fsdp"))
    if option is None:
        assert doc[X.KEY["ac_mode"]] == "full" and X.KEY["ac_option"] not in doc
    else:
        assert (doc[X.KEY["ac_mode"]], doc[X.KEY["ac_option"]]) == ("selective", option)


@pytest.mark.parametrize("model, tables, field", [
    ("", '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "two"\n',
     "activation_checkpoint.selective_ac_option"),
    ("converters = 5", "", "model.converters"),
    ("", "[compile]\nenable = true\ncomponents = [1, 2]\n", "compile.components"),
])
def test_torchtitan_bad_ac_option_converters_or_components_is_one_line(tmp_path, model, tables, field):
    """torchtitan itself refuses an AC option that is neither "op" nor a number; lists of names
    that are not strings cannot be read: one line naming the key, exit code 2."""
    f = tmp_path / "llama3_8b.toml"
    f.write_text(_titan_toml(model=model, tables=tables))
    r = CliRunner().invoke(main, ["check", str(f), "--gpus", "16"])
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: {field}=") and len(r.output.strip().splitlines()) == 1, r.output


def test_torchrun_node_count_that_is_no_count_names_its_flag(tmp_path):
    """--nnodes 0 is named as --nnodes (it was reported inside --nproc_per_node's value)."""
    f = tmp_path / "run.sh"
    f.write_text("torchrun --nproc_per_node 8 --nnodes 0 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
                 "--num-attention-heads 32 --seq-length 4096 --vocab-size 128256 --ffn-hidden-size 14336 "
                 "--max-position-embeddings 8192\n")
    with pytest.raises(NdplanError) as e:
        read_config(f)
    assert e.value.field == "--nnodes" and e.value.value == "0"
