"""``ndplan check`` on recipes in the shape of the frameworks' own launch files.

Each fixture in tests/data/recipes/ names the upstream file it imitates (repository, path,
commit). The expected strategies are derived here from the frameworks' own rules, cited
next to each assertion; the architectures are checked against the exact parameter counts
Hugging Face transformers gives for the same models (tests/data/hf_param_counts.yaml),
which are independent of every reader.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest
import yaml

import ndplan
from ndplan.errors import NdplanError
from ndplan.export import emit
from ndplan.formulas.params import params_total
from ndplan.interop import megatron as mg
from ndplan.interop import megatron_model as mm
from ndplan.interop import read_config, shell
from ndplan.symbols import model_symbols

DATA = Path(__file__).parent / "data"
RECIPES = DATA / "recipes"
HF = {k: int(v["params"]) for k, v in yaml.safe_load((DATA / "hf_param_counts.yaml").read_text())["counts"].items()}


def params(spec) -> int:
    return int(params_total(spec, model_symbols(spec)))


@pytest.fixture
def clean_env(monkeypatch):
    """The variables the fixtures default; unset so that the defaults apply."""
    for name in ("MODULE", "CONFIG", "NGPU", "SLURM_NNODES", "SHARDING_STRATEGY", "NUM_NODES", "TP", "EP", "MBS", "GBS", "DTYPE", "RANK",
                 "MASTER_ADDR", "USE_MEGATRON_FSDP"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# --------------------------------------------------------------------------- Megatron-LM

def test_megatron_mixtral_moe_flags_define_the_model(clean_env):
    """examples/mixtral: ${SLURM_NNODES:-"1"} nodes of 8; --num-experts 8 --moe-router-topk 2
    on a Llama-like dense part. Megatron's parallel_state (world % (etp*ep*pp) == 0,
    parallel_state.py:871-884) refuses ep=8 x pp=4 on one node of 8, and so does ndplan."""
    with pytest.raises(NdplanError) as e:
        read_config(RECIPES / "megatron_mixtral_8x7b.sh")
    assert e.value.field == "ep"
    clean_env.setenv("SLURM_NNODES", "4")
    ci = read_config(RECIPES / "megatron_mixtral_8x7b.sh")
    s = ci.strategy
    assert ci.gpus == 32  # torchrun --nproc_per_node 8 x --nnodes 4
    # dp = world / (tp pp cp) (arguments.py:424-448); ETP defaults to TP (arguments.py:587-588)
    assert (s.dp, s.tp, s.pp, s.ep, s.etp, s.zero, s.mbs, s.gbs, s.m) == (8, 1, 4, 8, 1, 1, 1, 256, 32)
    assert params(ci.model) == HF["mixtral-8x7b"]  # 46,702,792,704: Mixtral's vocabulary is 32,000
    assert ci.model.num_experts == 8 and ci.model.experts_per_token == 2
    assert any("SLURM_NNODES=4 from the environment" in n for n in ci.notes)
    assert any("Llama2Tokenizer" in n for n in ci.notes)


def test_megatron_llama3_fp8_quoted_array_elements(clean_env):
    """examples/llama/train_llama3_8b_h100_fp8.sh: "--vocab-size 128256" is one array
    element, split again by the unquoted ${ARR[@]}; --fp8-param-gather keeps the weights in
    fp8 (arguments.py:2016-2018); --bf16 --grad-reduce-in-bf16 turns
    accumulate_allreduce_grads_in_fp32 off (arguments.py:1213-1217), so the gradient buffer
    takes the bf16 parameter dtype (param_and_grad_buffer.py:924)."""
    ci = read_config(RECIPES / "megatron_llama3_8b_fp8.sh")
    s = ci.strategy
    assert ci.gpus == 8 and (s.dp, s.tp, s.zero, s.seq, s.gbs) == (8, 1, 1, 8192, 128)
    assert (s.weight_dtype, s.grad_dtype) == ("fp8", "bf16")
    # 128256 = 1002 x 128: already a multiple of --make-vocab-size-divisible-by 128 x tp 1
    assert params(ci.model) == HF["llama3-8b"]


def test_megatron_script_words_equal_what_bash_passes(clean_env):
    """bash runs the fp8 recipe (its if-block, DTYPE's default fp8, the += arrays) with
    torchrun as a function printing its arguments: the reader's words are bash's."""
    text = (RECIPES / "megatron_llama3_8b_fp8.sh").read_text()
    r = subprocess.run(["bash", "-c", "torchrun() { printf '%s\\n' \"$@\"; }\n" + text], capture_output=True,
                       text=True, timeout=20, env={"PATH": os.environ.get("PATH", "")})
    assert r.returncode == 0, r.stderr
    ours, _ = mg.parser().parse_known_args([w.text for w in shell.read_words(text, {})])
    theirs, _ = mg.parser().parse_known_args(r.stdout.splitlines())
    assert vars(ours) == vars(theirs)


BASH = {  # the constructs of NVIDIA's scripts, each checked against bash itself
    "quoted-elements": 'A=(\n  "--tensor-model-parallel-size 2"\n  "--seq-length 8"\n)\ntorchrun x.py ${A[@]}\n',
    "append-array": "A=(--micro-batch-size 1)\nA+=(\n  --seq-length 16\n)\ntorchrun x.py ${A[@]}\n",
    "self-extended": 'A=(--micro-batch-size 2)\nA=(\n  "${A[@]}"\n  --seq-length 32\n)\ntorchrun x.py ${A[@]}\n',
    "default-unset": 'S=${S:-"optim"}\ntorchrun x.py --data-parallel-sharding-strategy ${S}\n',
    "default-positional": 'P=${1:-"2"}\ntorchrun x.py --pipeline-model-parallel-size $P\n',
    "default-empty": 'T=""\nT2=${T:-4}\ntorchrun x.py --tensor-model-parallel-size $T2\n',
}


@pytest.mark.parametrize("env", [{}, {"S": "optim_grads", "TP": "8"}], ids=["unset", "set"])
@pytest.mark.parametrize("name", sorted(BASH))
def test_megatron_shell_constructs_match_bash(name, env):
    text = BASH[name]
    r = subprocess.run(["bash", "-c", "torchrun() { printf '%s\\n' \"$@\"; }\n" + text], capture_output=True,
                       text=True, timeout=10, env={"PATH": os.environ.get("PATH", "")} | env)
    assert r.returncode == 0, r.stderr
    ours, _ = mg.parser().parse_known_args([w.text for w in shell.read_words(text, env)])
    theirs, _ = mg.parser().parse_known_args(r.stdout.splitlines())
    assert vars(ours) == vars(theirs)


def test_megatron_fsdp_sharding_strategy_is_the_zero_stage(clean_env):
    """--use-megatron-fsdp --data-parallel-sharding-strategy: ShardingStrategy NO_SHARD 0,
    OPTIM 1, OPTIM_GRADS 2, OPTIM_GRADS_PARAMS 3 (megatron_fsdp/fully_shard.py:43-60); the
    script's default is optim_grads_params. Its main gradients take the parameters' dtype
    (--megatron-fsdp-main-grads-dtype auto: distributed_data_parallel_config.py:195-198)."""
    ci = read_config(RECIPES / "megatron_llama3_8b_fsdp.sh")
    assert (ci.strategy.zero, ci.strategy.grad_dtype) == (3, "bf16")
    assert any("SHARDING_STRATEGY unset: its default 'optim_grads_params'" in n for n in ci.notes)
    for strategy, zero in (("no_shard", 0), ("optim", 1), ("optim_grads", 2)):
        clean_env.setenv("SHARDING_STRATEGY", strategy)
        ci = read_config(RECIPES / "megatron_llama3_8b_fsdp.sh")
        assert ci.strategy.zero == zero
        assert any(f"SHARDING_STRATEGY={strategy} from the environment" in n for n in ci.notes)
    clean_env.setenv("SHARDING_STRATEGY", "zero3")
    with pytest.raises(NdplanError, match="sharding strategy"):
        read_config(RECIPES / "megatron_llama3_8b_fsdp.sh")


def test_megatron_deepseek_v3_mla_moe_mtp(clean_env):
    """examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh: MLA ranks, --moe-layer-freq
    [0]*3+[1]*58 (3 dense layers), one shared expert of 2048, MTP 1, the vocabulary of the
    HuggingFaceTokenizer deepseek-ai/DeepSeek-V3 (129,280 = 40 x 3232, no padding)."""
    ci = read_config(RECIPES / "megatron_deepseek_v3.sh", gpus=256)
    s, m = ci.strategy, ci.model
    assert params(m) == HF["deepseek-v3"]  # 671,026,404,352 (main model, MTP not counted)
    assert m.mtp_layers == 1 and m.layer_kinds[:4] == ("dense", "dense", "dense", "moe")
    assert (s.dp, s.tp, s.ep, s.etp, s.zero, s.grad_dtype, s.mbs, s.gbs) == (256, 1, 8, 1, 3, "bf16", 4, 2048)
    assert s.recompute == "selective"
    # --recompute-modules mlp moe mla_up_proj layernorm, without core_attn (transformer_config.py:1943-1962);
    # --moe-token-dispatcher-type flex with the default backend deepep (transformer_config.py:898) on 20 SMs
    assert s.engine == ("megatron[deepep_sms=20,keep_core_attn=1,megatron_fsdp=1,recompute_layernorm=1,"
                        "recompute_mla_up_proj=1,recompute_mlp=1,recompute_moe=1]")  # megatron_fsdp: test_megatron_fsdp.py


def test_megatron_gpt3_vocab_padding_and_vpp(clean_env):
    """GPT-2 BPE (50,257 tokens) padded to a multiple of 128 x tp=8 = 1024: 51,200, the
    vocabulary of Narayanan et al. 2021 Table 1; vpp = 96 / (pp 16 x 3 layers per virtual
    stage) = 2; ${NUM_NODES:-16} x 8 = 128 GPUs, so dp = 128 / (8 x 16) = 1."""
    ci = read_config(RECIPES / "megatron_gpt3_175b.sh")
    s = ci.strategy
    assert ci.model.vocab_size == 51200 and ci.gpus == 128
    assert (s.dp, s.tp, s.pp, s.vpp, s.schedule, s.recompute, s.zero) == (1, 8, 16, 2, "interleaved", "selective", 1)
    assert ci.model.tie_word_embeddings and ci.model.num_hidden_layers == 96


@pytest.mark.parametrize("text,want", [
    ("1", [1] * 8), ("2", [1, 0] * 4), ("[0]*2+[1]*6", [0, 0] + [1] * 6), ("([0]*2+[1]*6)", [0, 0] + [1] * 6),
    ("[0,1]*4", [0, 1] * 4), ("[1,1,0,0,1,1,0,0]", [1, 1, 0, 0] * 2), ("([0]+[1]*3)*2", ([0] + [1] * 3) * 2)])
def test_moe_layer_freq_patterns(text, want):
    """The forms Megatron-LM's moe_freq_type accepts (arguments.py:245-253, 327-350),
    expected lists written out by hand."""
    assert mm.moe_pattern(text, 8) == want


@pytest.mark.parametrize("text", ["[0]*3", "__import__('os')", "[2]*8", "([0]*8", "0"])
def test_moe_layer_freq_bad_is_one_error(text):
    with pytest.raises(NdplanError, match="--moe-layer-freq"):
        mm.moe_pattern(text, 8)


def test_megatron_lacks_names_only_the_missing_flags(tmp_path):
    f = tmp_path / "run.sh"
    # (not pretrain_gpt.py, whose default GPT2BPETokenizer fixes the vocabulary: pretrain_gpt.py:527)
    f.write_text("torchrun train.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
                 "--tensor-model-parallel-size 2 --seq-length 4096\n")
    with pytest.raises(NdplanError) as e:
        read_config(f, gpus=8)
    assert "lacks --vocab-size" in e.value.problem and "--num-layers" not in e.value.problem


# --------------------------------------------------------------------------- MindFormers

def test_mindformers_mixtral_moe_config_and_expert_parallel():
    """Legacy MoE: experts of intermediate_size (llama_transformer.py L912-916), ep from
    parallel_config.expert_parallel carved from dp ((dp*cp) % ep == 0, moe.py L240-266),
    the experts split over model_parallel when moe_config has no expert_model_parallel."""
    ci = read_config(RECIPES / "mindformers_mixtral_8x7b.yaml")
    s = ci.strategy
    assert params(ci.model) == HF["mixtral-8x7b"]
    assert (s.dp, s.tp, s.pp, s.ep, s.etp, s.m, s.recompute) == (2, 4, 2, 2, 4, 16, "full")
    assert ci.mem_limit_bytes == 58 * 2 ** 30


def test_mindformers_mixtral_with_catalog_model_keeps_ep():
    ci = read_config(RECIPES / "mindformers_mixtral_8x7b.yaml", model="mixtral-8x7b")
    assert (ci.strategy.ep, ci.strategy.etp) == (2, 4)


def test_mindformers_deepseek3_offsets_count_the_mtp_layer(tmp_path):
    """LayerSetting(num_layers + mtp_depth) (deepseek2_model.py L1261-1265): 62 layers over
    16 stages = 3 each + offsets summing to 62 % 16 = 14: 4 on stages 0-14 and 2 on the last,
    which holds the MTP layer (L1311-1312): 1 decoder layer there."""
    ci = read_config(RECIPES / "mindformers_deepseek3_671b.yaml")
    s = ci.strategy
    assert s.layers_per_stage == (4,) * 15 + (1,)
    assert params(ci.model) == HF["deepseek-v3"] and ci.model.mtp_layers == 1
    assert ci.model.layer_kinds[:4] == ("dense", "dense", "dense", "moe")  # first_k_dense_replace 3
    assert (s.dp, s.tp, s.pp, s.ep, s.etp) == (16, 4, 16, 8, 1)
    assert s.recompute_layers == (3,) + (4,) * 12 + (3, 2, 0)
    bad = tmp_path / "ds.yaml"
    bad.write_text((RECIPES / "mindformers_deepseek3_671b.yaml").read_text().replace(
        "offset: [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1]", "offset: [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, -1]"))
    with pytest.raises(NdplanError, match="sum to 14"):
        read_config(bad)


def test_mindformers_mcore_model_config_is_an_hf_config():
    """mcore model_config (use_legacy: False) holds HF config.json keys."""
    ci = read_config(RECIPES / "mindformers_qwen3_32b_mcore.yaml")
    assert params(ci.model) == HF["qwen3-32b"] and ci.model.qk_norm
    # offset [-1, -1, 1, 1] on 64 // 4 = 16: LayerSetting
    assert ci.strategy.layers_per_stage == (15, 15, 17, 17)


def test_mindformers_mcore_qk_layernorm_on_a_model_type_without_it(tmp_path):
    """qk_layernorm: True on a model_type whose HF config has no q/k norm (TeleChat3's mcore
    recipes, configs/telechat3/*.yaml at c01149c4): the q and k norms are added (2 x head_dim
    weights per layer over qwen3-32b's llama-typed twin), no error."""
    f = tmp_path / "t.yaml"
    f.write_text((RECIPES / "mindformers_qwen3_32b_mcore.yaml").read_text().replace('model_type: "qwen3"',
                                                                                    'model_type: "llama"'))
    ci = read_config(f)
    assert ci.model.qk_norm and params(ci.model) == HF["qwen3-32b"]


def test_mindformers_mcore_moe_expert_parallel_spans_tp():
    """mcore: ep must divide dp x tp (parallel_core/.../moe/ffn.py L189-195); etp None -> 1
    (batched_layers.py L117)."""
    ci = read_config(RECIPES / "mindformers_qwen3_30b_a3b_mcore.yaml")
    s = ci.strategy
    assert params(ci.model) == HF["qwen3-30b-a3b"]
    assert (s.dp, s.tp, s.pp, s.ep, s.etp) == (1, 4, 4, 4, 1)


def test_mindformers_seqpipe_is_estimated_and_says_what_is_not():
    ci = read_config(RECIPES / "mindformers_qwen25_72b_seqpipe.yaml")
    assert params(ci.model) == HF["qwen2.5-72b"]
    assert (ci.strategy.tp, ci.strategy.pp, ci.strategy.schedule) == (8, 8, "1f1b")
    assert any("seqpipe (seq_split_num=8)" in n and "not modelled" in n for n in ci.notes)
    assert any("op-level recompute is not modelled" in n for n in ci.notes)


@pytest.mark.parametrize("etp", [1, 2])
def test_mindformers_emit_check_round_trip_keeps_ep(tmp_path, etp):
    model = ndplan.load_model("mixtral-8x7b")
    s = ndplan.Strategy(dp=4, tp=2, pp=2, ep=4, etp=etp, gbs=32, zero=1, engine="mindspore", flash_attention=False,
                        weight_dtype="bf16")
    f = tmp_path / "moe.yaml"
    f.write_text(emit("mindformers", model, s))
    assert read_config(f, model=model).strategy == s


def test_mindformers_emit_refuses_an_etp_it_cannot_say():
    model = ndplan.load_model("mixtral-8x7b")
    with pytest.raises(NdplanError, match="etp"):
        emit("mindformers", model, ndplan.Strategy(dp=4, tp=4, ep=2, etp=2, gbs=32, engine="mindspore"))


# --------------------------------------------------------------------------- DeepSpeed

def test_deepspeed_batch_rule_and_origins():
    """train_batch_size = micro x gas x dp (runtime/config.py _batch_assertion L937-940)."""
    ci = read_config(RECIPES / "deepspeed_zero2_gas3.json", model="llama3-8b", gpus=8, seq=2048)
    s = ci.strategy
    assert (s.mbs, s.m, s.gbs, s.zero, s.recompute) == (8, 3, 192, 2, "full")
    assert "DeepSpeed's rule" in ci.origin["gbs"] and ci.origin["zero"].startswith("line 7")


def test_deepspeed_origins_inside_one_line_objects():
    ci = read_config(RECIPES / "deepspeed_autotp_zero2.json", model="llama3-8b", gpus=16, seq=4096)
    assert ci.origin["tp"] == "line 7: tensor_parallel.autotp_size" and ci.origin["zero"].startswith("line 5")
    assert (ci.strategy.tp, ci.strategy.dp, ci.strategy.m) == (4, 4, 4)  # 32 = 2 x gas x 4


def test_deepspeed_ulysses_divides_the_world():
    """sequence_parallel_size 4 on 16 ranks: DeepSpeedConfig's world is 16 / 4 = 4
    (runtime/config.py L719-723), so train_batch_size = 1 x 1 x 4."""
    ci = read_config(RECIPES / "deepspeed_ulysses.json", model="llama3-8b", gpus=16, seq=8192)
    s = ci.strategy
    assert (s.dp, s.cp, s.gbs, s.zero) == (4, 4, 4, 3)


def test_deepspeed_hf_auto_resolved_or_asks_for_one_value():
    """The HF Trainer fills the batch 'auto's (integrations/deepspeed.py trainer_config_process
    L145-157): with the global batch given, micro = gbs / (dp x gas), gas = 1 by default."""
    with pytest.raises(NdplanError) as e:
        read_config(RECIPES / "deepspeed_hf_auto_zero3.json", model="llama3-8b", gpus=8, seq=4096)
    assert e.value.field == "train_micro_batch_size_per_gpu" and "--gbs" in e.value.fix
    ci = read_config(RECIPES / "deepspeed_hf_auto_zero3.json", model="llama3-8b", gpus=8, seq=4096, gbs=64)
    assert (ci.strategy.mbs, ci.strategy.m, ci.strategy.gbs, ci.strategy.zero) == (8, 1, 64, 3)


def test_deepspeed_offload_and_derived_accumulation():
    ci = read_config(RECIPES / "deepspeed_zero3_offload.json", model="llama3-8b", gpus=16, seq=4096)
    s = ci.strategy
    assert (s.zero, s.offload_optimizer, s.mbs, s.m) == (3, True, 2, 2)  # 64 = 2 x gas x 16


def test_deepspeed_emit_ulysses_reads_back(tmp_path):
    model = ndplan.load_model("llama3-8b")
    s = ndplan.Strategy(dp=4, cp=2, gbs=16, zero=3, seq=8192, sp=True, engine="deepspeed")
    f = tmp_path / "ds.json"
    f.write_text(emit("deepspeed", model, s))
    assert read_config(f, model=model, gpus=8, seq=8192).strategy == s


# --------------------------------------------------------------------------- torchtitan

def _titan_generate():
    pytest.importorskip("triton")
    pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    return pp._generate_llm_fqn_per_model_part


@pytest.mark.parametrize("layers", [3, 8, 27, 61, 80, 126])
def test_titan_split_is_torchtitans(layers):
    """export.torchtitan.titan_split against torchtitan 0.3.0's own module assignment, for
    every stage count and embedding/output weight it accepts."""
    from ndplan.export.torchtitan import titan_split
    generate = _titan_generate()
    for stages in range(1, min(layers, 33) + 1):
        for first, last in ((1, 1), (0, 0), (2, 1), (0, 1)):
            try:
                parts = generate(stages, layers, first, last)
            except ValueError:
                with pytest.raises(ValueError):
                    titan_split(layers, stages, first, last)
                continue
            assert titan_split(layers, stages, first, last) == [
                sum(m.startswith("layers.") for m in p) for p in parts], (stages, first, last)


def test_torchtitan_default_split_counts_embedding_and_output(tmp_path):
    """80 layers over pp=4 with 1F1B and no layers_per_stage: torchtitan weighs the embedding
    and the output as one layer each (82 // 4 = 20, the first 2 stages one more, less 1 on the
    first and last): 20, 21, 20, 19 -- not an even split."""
    f = tmp_path / "llama3_70b.toml"
    f.write_text('[model]\nname = "llama3"\nflavor = "70B"\n[parallelism]\ndata_parallel_shard_degree = -1\n'
                 'tensor_parallel_degree = 8\npipeline_parallel_degree = 4\n[training]\nlocal_batch_size = 8\n'
                 'seq_len = 8192\n')
    ci = read_config(f, model="llama3-70b", gpus=64)
    assert ci.strategy.layers_per_stage == (20, 21, 20, 19)
    f.write_text(f.read_text().replace("pipeline_parallel_degree = 4", "pipeline_parallel_degree = 4\n"
                                       "pipeline_parallel_layers_per_stage = 20"))
    with pytest.raises(NdplanError, match="ceil"):  # ceil(82 / 20) = 5 stages on 4 ranks: torchtitan raises
        read_config(f, model="llama3-70b", gpus=64)


# --------------------------------------------------------------------------- proposals on more devices

def test_check_proposes_the_smallest_device_count_that_fits(tmp_path, clean_env):
    """Llama-3-70B on 8 H100s cannot fit (16 bytes/parameter of weights, gradients and Adam
    states over 8 devices is 141 GB before activations). check proposes the smallest whole
    number of 8-device nodes where a strategy fits: brute force over every node count
    below it finds nothing (not only the powers of two), and the diff, applied by the
    test's own patcher, launches that count: read back without ``--gpus`` it is the
    proposal, torchrun's ``--nnodes`` written into the launch."""
    from ndplan.check import check, nearest
    from tests.test_check import apply_unified_diff
    f = tmp_path / "run.sh"
    f.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 8 "
                 "--use-distributed-optimizer --micro-batch-size 1 --global-batch-size 64 --seq-length 4096 --bf16\n")
    ci = read_config(f, model="llama3-70b")
    assert 16 * 70.55e9 / 8 > 80 * 2 ** 30
    res = check(ci, "h100-sxm", top=2)
    n = res.scaled_gpus
    assert not res.fits and n and res.proposals and n % 8 == 0
    assert all(not nearest(dataclasses.replace(ci, gpus=m), res.hardware, res.limit_bytes, 1) for m in range(16, n, 8))
    assert res.tried_gpus[0] == 16 and n in res.tried_gpus
    for p in res.proposals:
        assert p.changed["gpus"] == (8, n) and p.launch is None
        assert p.estimate.peak_bytes <= res.limit_bytes
        f.write_text(apply_unified_diff(ci.text, p.diff))
        back = read_config(f, model="llama3-70b")
        assert (back.gpus, back.strategy) == (n, p.strategy)
        words = shell.read_words(f.read_text(), {})
        assert mg.parser().parse_known_args([w.text for w in words])[0].nnodes == str(n // 8)


def test_check_on_more_devices_without_a_stated_count_says_how_to_launch(tmp_path, clean_env):
    """A DeepSpeed JSON does not state the device count (the launcher does): the proposal
    on more devices keeps its diff and says to launch it on that count."""
    from ndplan.check import check
    f = tmp_path / "ds.json"
    f.write_text('{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8, "bf16": {"enabled": true}, '
                 '"zero_optimization": {"stage": 1}}')
    ci = read_config(f, model="llama3-70b", gpus=8, seq=4096)
    res = check(ci, "h100-sxm", top=1)
    assert res.scaled_gpus and res.proposals
    assert res.proposals[0].launch and f"--gpus {res.scaled_gpus}" in res.proposals[0].launch


# the launch's torchrun count rewritten where the script sets it; bash itself runs each
# rewritten script with torchrun as a function printing its arguments
LAUNCHES = {
    "literal": ("torchrun --nproc_per_node 8 --nnodes 1 x.py\n", 32, "--nnodes 4"),
    "added-nnodes": ("torchrun --nproc-per-node=8 x.py\n", 24, "--nnodes 3"),
    "array-variables": ("G=8\nN=${N:-16}\nD=(\n  --nproc_per_node $G\n  --nnodes $N\n)\ntorchrun ${D[@]} x.py\n", 256,
                        "N=${N:-32}"),
    "quoted-default": ('N=${SLURM_NNODES:-"1"}\nD=(--nproc_per_node 8 --nnodes $N)\ntorchrun ${D[@]} x.py\n', 16,
                       'N=${SLURM_NNODES:-"2"}'),
    "fewer-per-node": ('NGPU=${NGPU:-"8"}\ntorchrun --nproc_per_node=${NGPU} x.py\n', 4, 'NGPU=${NGPU:-"4"}'),
    # --nnodes added inside the string, array or command that holds --nproc_per_node
    "string-variable": ('D="--nproc_per_node 8"\ntorchrun $D x.py\n', 24, 'D="--nnodes 3 --nproc_per_node 8"'),
    "one-line-array": ("D=(--nproc_per_node 8)\ntorchrun ${D[@]} x.py\n", 24, "D=(--nnodes 3 --nproc_per_node 8)"),
    "before-semicolon": ("torchrun --nproc_per_node 8; echo done\n", 24, "--nnodes 3 --nproc_per_node 8;"),
    "sbatch": ("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH -N 1\ntorchrun --nproc_per_node 8 --nnodes 1 x.py\n", 32,
               "#SBATCH --nodes=4\n#SBATCH -N 4"),
}


@pytest.mark.parametrize("name", sorted(LAUNCHES))
def test_launcher_device_count_rewritten_as_bash_runs_it(name):
    from ndplan.interop.launcher import set_devices
    text, n, written = LAUNCHES[name]
    out = set_devices(text, n, {})
    assert out is not None and written in out
    r = subprocess.run(["bash", "-c", "torchrun() { printf '%s\\n' \"$@\"; }\n" + out], capture_output=True, text=True,
                       timeout=10, env={"PATH": os.environ.get("PATH", "")})
    assert r.returncode == 0 and not r.stderr, r.stderr
    got = dict.fromkeys(("--nproc_per_node", "--nnodes"), "1")
    args = r.stdout.split()
    for k, a in enumerate(args):
        flag, eq, val = a.replace("--nproc-per-node", "--nproc_per_node").partition("=")
        if flag in got:
            got[flag] = val if eq else args[k + 1]
    assert int(got["--nproc_per_node"]) * int(got["--nnodes"]) == n


def test_launcher_count_from_the_environment_is_not_written(clean_env):
    """A count bash takes from the environment cannot be changed in the file: None."""
    from ndplan.interop.launcher import set_devices
    assert set_devices('N=${SLURM_NNODES:-"1"}\ntorchrun --nproc_per_node 8 --nnodes $N x.py\n', 16,
                       {"SLURM_NNODES": "1"}) is None


@pytest.mark.parametrize("key", sorted(__import__("ndplan.export.torchtitan", fromlist=["FLAVORS"]).FLAVORS))
def test_torchtitan_flavor_is_the_catalog_model(key):
    """torchtitan 0.3.0 builds each flavor (on the meta device): its parameter count equals the
    catalog model's, which equals the Hugging Face count (test_params.py). llama4 is 0.2.x's
    only (removed before 0.3.0): checked against the HF count of the catalog model."""
    from ndplan.export.torchtitan import FLAVORS
    module, flavor = key
    spec = ndplan.load_model(FLAVORS[key])
    assert params(spec) == HF[spec.name]
    if module == "llama4":
        return
    pytest.importorskip("triton")
    torch = pytest.importorskip("torch")
    registry = pytest.importorskip(f"torchtitan.models.{module}").model_registry
    with torch.device("meta"):
        model = registry(flavor).model.build()
    assert sum(p.numel() for p in model.parameters()) == params(spec)


def test_torchtitan_emit_records_the_model(tmp_path):
    """check reads an emitted file without -m: [model] name/flavor for torchtitan, the header
    for the others."""
    s = ndplan.Strategy(dp=4, tp=4, pp=4, gbs=64, zero=2, engine="fsdp", seq=8192)
    f = tmp_path / "job.toml"
    f.write_text(emit("torchtitan", ndplan.load_model("llama3.1-70b"), s))
    ci = read_config(f, gpus=64)
    assert ci.model.name == "llama3.1-70b" and ci.strategy == s
    doc = __import__("tomllib").loads(f.read_text())
    assert (doc["model"]["name"], doc["model"]["flavor"]) == ("llama3", "70B")
    m = tmp_path / "run.sh"
    m.write_text(emit("megatron", ndplan.load_model("qwen3-8b"), ndplan.Strategy(dp=2, tp=4, gbs=16)))
    assert read_config(m, gpus=8).model.name == "qwen3-8b"


# --------------------------------------------------------------------------- torchtitan 0.3 launches

def _config_manager():
    """torchtitan 0.3.0's own ConfigManager; its config registries import tensorboard, datasets
    and wandb too (installed by .ci/run)."""
    pytest.importorskip("triton")
    pytest.importorskip("torchtitan.models.llama3.config_registry")
    from torchtitan.config.manager import ConfigManager
    return ConfigManager()


def test_torchtitan03_base_values_are_the_registry_s():
    """export.torchtitan03.BASE against torchtitan 0.3.0's registered config functions."""
    import importlib
    from ndplan.export.torchtitan03 import BASE
    _config_manager()
    for (module, fn), want in BASE.items():
        c = getattr(importlib.import_module(f"torchtitan.models.{module}.config_registry"), fn)()
        ac = {"SelectiveAC.Config": "selective", "FullAC.Config": "full"}.get(
            type(c.activation_checkpoint).__qualname__, "none")
        got = {"flavor": c.model_spec.flavor, "activation_checkpoint.mode": ac, "training.seq_len": c.training.seq_len,
               "training.local_batch_size": c.training.local_batch_size,
               "parallelism.tensor_parallel_degree": c.parallelism.tensor_parallel_degree,
               "parallelism.expert_parallel_degree": c.parallelism.expert_parallel_degree,
               "loss_chunks": getattr(c.loss, "num_chunks", None)}
        assert {k: v for k, v in got.items() if k in want} == want, fn
        assert got["parallelism.expert_parallel_degree"] == want.get("parallelism.expert_parallel_degree", 1), fn


TITAN03 = {
    "fsdp-tp": ("llama3.1-8b", ndplan.Strategy(dp=4, tp=2, gbs=32, zero=3, seq=8192, engine="fsdp")),
    "pp-full": ("llama3.1-70b", ndplan.Strategy(dp=4, tp=4, pp=2, gbs=64, zero=2, seq=8192, recompute="full",
                                                 engine="fsdp")),
    "interleaved-op": ("qwen3-32b", ndplan.Strategy(dp=2, tp=4, pp=2, vpp=2, gbs=16, zero=2, seq=4096,
                                                     schedule="interleaved", recompute="selective", engine="fsdp")),
    "moe-ep": ("qwen3-30b-a3b", ndplan.Strategy(dp=8, ep=4, gbs=16, zero=3, seq=4096, engine="fsdp")),
    "replicate-tp": ("llama3.1-8b", ndplan.Strategy(dp=4, tp=2, gbs=32, zero=0, seq=8192, engine="fsdp")),
}


@pytest.mark.parametrize("name", sorted(TITAN03))
def test_torchtitan03_emit_parses_in_torchtitan_and_reads_back(name, tmp_path):
    """The emitted words through torchtitan 0.3.0's ConfigManager give the asked degrees,
    batch, sequence and policy; torchtitan's split of them (titan_split on its parsed
    values) is ndplan's; and check reads the launch back to the same strategy."""
    import dataclasses
    from ndplan.export import torchtitan03 as T3
    from ndplan.export.torchtitan import stage_count, titan_split
    name_, s = TITAN03[name]
    model = ndplan.load_model(name_)
    text = emit("torchtitan-0.3", model, s)
    f = tmp_path / "run.sh"
    f.write_text(text)
    back = read_config(f).strategy
    assert dataclasses.replace(back, engine="fsdp") == s
    words, _ = T3.fields(model, s)
    bash_words = subprocess.run(["bash", "-c", "torchrun() { printf '%s\\n' \"$@\"; }\n" + text], capture_output=True,
                                text=True, timeout=10).stdout.splitlines()
    assert bash_words[-len(words):] == words  # the words bash passes are the ones checked below
    c = _config_manager().parse_args(words)
    p, t = c.parallelism, c.training
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree) == (s.tp, s.pp, s.cp)
    assert p.data_parallel_replicate_degree * p.data_parallel_shard_degree == s.dp
    assert (t.global_batch_size, t.seq_len) == (s.gbs, s.seq)
    assert type(c.activation_checkpoint).__qualname__ == {"none": "NoneType", "full": "FullAC.Config",
                                                          "selective": "SelectiveAC.Config"}[s.recompute]
    assert c.model_spec.flavor == T3.BASE[T3.REGISTRY[name_]]["flavor"]
    if model.is_moe:
        assert p.expert_parallel_degree == s.ep
    if s.pp > 1:
        L = model.num_hidden_layers
        fl, ll = p.pipeline_parallel_first_stage_less_layers, p.pipeline_parallel_last_stage_less_layers
        stages = stage_count(L, p.pipeline_parallel_layers_per_stage, fl, ll)
        assert stages == s.pp * s.vpp and titan_split(L, stages, fl, ll) == [L // stages] * stages


def test_torchtitan03_has_no_ddp_path():
    """torchtitan 0.3.0 (the CI extra, read as text) replicates through fully_shard: every model's
    parallelize function calls apply_fsdp_to_decoder (DeepSeek-V3: its MTP variant) whatever the
    replicate degree, and none applies DDP, so the 0.3 emit
    writes zero 0 beside tp (TITAN03 "replicate-tp"), which the 0.2.x TOML form refuses (DDP alone)."""
    import importlib.util
    found = importlib.util.find_spec("torchtitan")
    if found is None:
        pytest.skip("torchtitan is not installed (a CI extra)")
    root = Path(found.origin).parent
    for name, call in (("llama3", "apply_fsdp_to_decoder("), ("qwen3", "apply_fsdp_to_decoder("),
                       ("deepseek_v3", "apply_fsdp_to_mtp_decoder(")):
        text = (root / "models" / name / "parallelize.py").read_text()
        assert call in text and "apply_ddp" not in text and "replicate(" not in text, name
    assert "Always run apply_fsdp_to_decoder" in (root / "models" / "llama3" / "parallelize.py").read_text()
    name, s = TITAN03["replicate-tp"]
    with pytest.raises(ndplan.NdplanError, match="zero=0"):
        emit("torchtitan", ndplan.load_model(name), s)


def test_torchtitan03_run_train_script(clean_env):
    """torchtitan's run_train.sh form: MODULE/CONFIG from their defaults, NGPU 8, the
    registered llama3_8b's values (seq 8192, local batch 1) under the overrides."""
    ci = read_config(RECIPES / "torchtitan03_run_train.sh")
    s = ci.strategy
    assert ci.fmt == "torchtitan-0.3" and ci.gpus == 8 and ci.model.name == "llama3.1-8b"
    assert (s.dp, s.tp, s.gbs, s.seq, s.mbs, s.m, s.recompute, s.zero) == (4, 2, 32, 8192, 1, 8, "full", 3)
    assert "loss_chunks=8" in s.engine and "fused_qkv=1" in s.engine
    clean_env.setenv("MODULE", "qwen3")
    clean_env.setenv("CONFIG", "qwen3_14b")
    assert read_config(RECIPES / "torchtitan03_run_train.sh").model.name == "qwen3-14b"
    clean_env.setenv("CONFIG", "llama3_405b_nvfp4")
    with pytest.raises(NdplanError, match="--config"):
        read_config(RECIPES / "torchtitan03_run_train.sh")


def test_torchtitan_toml_recipe_split_and_flavor():
    ci = read_config(RECIPES / "torchtitan_llama3_70b.toml", gpus=64)
    assert ci.model.name == "llama3.1-70b" and ci.strategy.layers_per_stage == (20, 21, 20, 19)
    assert (ci.strategy.dp, ci.strategy.tp, ci.strategy.pp, ci.strategy.recompute) == (2, 8, 4, "full")


# --------------------------------------------------------------------------- DeepSpeed's own config class

@pytest.mark.parametrize("s", [
    ndplan.Strategy(dp=8, gbs=64, mbs=2, zero=3, offload_optimizer=True, engine="deepspeed"),
    ndplan.Strategy(dp=16, gbs=256, mbs=4, zero=2, engine="deepspeed", recompute="full"),
    ndplan.Strategy(dp=4, cp=2, gbs=16, zero=3, seq=8192, engine="deepspeed"),
    ndplan.Strategy(dp=8, gbs=32, zero=0, engine="deepspeed"),
    ndplan.Strategy(dp=8, gbs=32, zero=3, engine="deepspeed[grad_bytes_fp32=2,master_bytes=2,optimizer_bytes=4,"
                                                 "secondary_weight_shard=4,weights_offloaded=1]"),
    ndplan.Strategy(dp=8, gbs=32, zero=1, engine="deepspeed[non_matrix_optimizer_bytes=8,optimizer_bytes=4]"),
    ndplan.Strategy(dp=8, gbs=32, zero=1, engine="deepspeed[fp32_grad_accumulation=1,lp_grad_bytes=2]")],
    ids=["zero3-offload", "zero2-ckpt", "ulysses", "ddp", "bf16-states-hpz-offload-param", "muon", "bf16-optimizer"])
def test_deepspeed_emit_passes_deepspeeds_config_class(s, monkeypatch):
    """deepspeed.runtime.config.DeepSpeedConfig parses the emitted JSON (its pydantic ZeRO and
    offload classes refuse unknown keys) and runs its batch assertion with the ranks the
    launch has: dist.get_world_size() = dp x cp, divided by sequence_parallel_size (config.py
    ``__init__``, HF zero.init branch without an mpu)."""
    import json
    C = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(C.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(C.dist, "get_world_size", lambda *a, **k: s.dp * s.cp)
    c = C.DeepSpeedConfig(json.loads(emit("deepspeed", ndplan.load_model("llama3-8b"), s)))
    assert c.world_size == s.dp
    assert (c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) == (s.gbs, s.mbs, s.m)
    assert c.zero_optimization_stage == s.zero
    assert (c.zero_config.offload_optimizer is not None) == s.offload_optimizer
    eng = ndplan.engines.profile(s.engine)
    assert c.zero_config.zero_hpz_partition_size == max(eng.secondary_weight_shard, 1)
    assert (c.zero_config.offload_param is not None) == eng.weights_offloaded
    assert c.bfloat16_config.bf16_optimizer_states == (eng.master_bytes == 2)
    # the dtypes engine.py:2294-2310 picks BF16_Optimizer from (bf16 model, fp32 accumulation, ZeRO-1)
    want = C.torch.float32 if eng.fp32_grad_accumulation else None
    assert (C.DtypeEnum(c.grad_accum_dtype).value if c.grad_accum_dtype else None) == want
    assert c.bfloat16_config.immediate_grad_update == (eng.fp32_grad_accumulation and not eng.lp_grad_bytes)


BAD_RECIPES = {  # name: (fixture, old text, new text, extra CLI args, field named)
    "moe-expert-num": ("mindformers_mixtral_8x7b.yaml", "expert_num: 8", 'expert_num: "abc"', [],
                       "moe_config.expert_num"),
    "mtp-depth": ("mindformers_deepseek3_671b.yaml", "mtp_depth: &mtp_depth 1", "mtp_depth: two", [],
                  "model.model_config.mtp_depth"),
    "moe-layer-freq": ("megatron_deepseek_v3.sh", "[0]*3+[1]*58", "[0]*3+[1]*57", ["--gpus", "256"],
                       "--moe-layer-freq"),
    "moe-layer-freq-nested": ("megatron_deepseek_v3.sh", "[0]*3+[1]*58", "(((([0]*61)*61)*61)*61)*61",
                              ["--gpus", "256"], "--moe-layer-freq"),
    "fsdp-grads-dtype": ("megatron_deepseek_v3.sh", "--megatron-fsdp-main-grads-dtype bf16",
                         "--megatron-fsdp-main-grads-dtype bf17", ["--gpus", "256"], "--megatron-fsdp-main-grads-dtype"),
    "fp8-format": ("megatron_llama3_8b_fp8.sh", '"--fp8-format hybrid"', '"--fp8-format e5m2"', [], "--fp8-format"),
    "model-config-not-mapping": ("mindformers_mixtral_8x7b.yaml", "  model_config:\n    type: LlamaConfig",
                                 "  model_config: 7\n  unused:\n    type: LlamaConfig", ["-m", "mixtral-8x7b"],
                                 "model.model_config"),
    "sharding": ("megatron_llama3_8b_fsdp.sh", '"optim_grads_params"', '"zero3"', [],
                 "--data-parallel-sharding-strategy"),
    "titan03-degree": ("torchtitan03_run_train.sh", "tensor_parallel_degree 2", "tensor_parallel_degree abc", [],
                       "parallelism.tensor_parallel_degree"),
    "titan03-policy": ("torchtitan03_run_train.sh", "activation_checkpoint:full", "activation_checkpoint:memory-budget",
                       [], "activation_checkpoint"),
    "ds-auto": ("deepspeed_hf_auto_zero3.json", '"stage": 3', '"stage": 3', ["-m", "llama3-8b", "--gpus", "8",
                                                                            "--seq", "4096"],
                "train_micro_batch_size_per_gpu"),
}


@pytest.mark.parametrize("name", sorted(BAD_RECIPES))
def test_bad_recipe_is_one_line_exit_2(name, tmp_path, clean_env):
    from click.testing import CliRunner
    from ndplan.cli import main
    fixture, old, new, extra, field = BAD_RECIPES[name]
    text = (RECIPES / fixture).read_text()
    assert old in text
    f = tmp_path / fixture
    f.write_text(text.replace(old, new))
    r = CliRunner().invoke(main, ["check", str(f)] + extra)
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and f"error: {field}=" in lines[0], r.output
    assert "Traceback" not in r.output


def test_torchtitan_toml_moe_recipes():
    """deepseek_v3 16B: EP 8 borrows from the 64 FSDP ranks (dp_shard = -1 fills the world),
    zero 3 ("default" reshard without a pipeline); llama4 17bx16e: ETP 8 = TP (torchtitan
    0.2 allows ETP 1 or TP), compile on for model and loss."""
    ci = read_config(RECIPES / "torchtitan_deepseek_v3_16b.toml", gpus=64)
    s = ci.strategy
    assert ci.model.name == "deepseek-v2-lite" and params(ci.model) == HF["deepseek-v2-lite"]
    assert (s.dp, s.ep, s.etp, s.zero, s.mbs, s.gbs, s.recompute) == (64, 8, 1, 3, 4, 256, "selective")
    ci = read_config(RECIPES / "torchtitan_llama4_17bx16e.toml", gpus=64)
    s = ci.strategy
    assert ci.model.name == "llama4-scout" and params(ci.model) == HF["llama4-scout"]
    assert (s.dp, s.tp, s.ep, s.etp, s.recompute) == (8, 8, 1, 8, "full")
    assert "compiled_blocks=1" in s.engine and "compiled_loss=1" in s.engine


@pytest.mark.parametrize("flags,grad,note", [
    ("--bf16", "fp32", None),
    ("--fp16", "bf16", None),
    ("--fp16 --accumulate-allreduce-grads-in-fp32", "fp32", None),
    ("", "fp32", "neither --bf16 nor --fp16"),
])
def test_megatron_main_gradient_dtype_follows_the_precision(tmp_path, flags, grad, note):
    """Megatron-LM@d98e8a64 arguments.py:1193-1219: params_dtype float unless --fp16 (half) or
    --bf16; only --bf16 (without --grad-reduce-in-bf16) or --accumulate-allreduce-grads-in-fp32
    makes the main gradients fp32 (param_and_grad_buffer.py:924: else the parameters' dtype, 2 B
    under --fp16, ndplan's 2-byte grad_dtype "bf16"). No precision flag: fp32 training, which
    ndplan does not model, said in a note."""
    f = tmp_path / "run.sh"
    f.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 8 --micro-batch-size 1 "
                 f"--global-batch-size 64 --seq-length 4096 {flags}\n")
    ci = read_config(f, model="llama3-8b")
    assert ci.strategy.grad_dtype == grad
    assert any(n.startswith(note) for n in ci.notes) if note else not any("nor --fp16" in n for n in ci.notes)


def test_megatron_deepspeed_moe_is_deepspeeds_moe_layer():
    """Megatron-DeepSpeed@f4157bea builds DeepSpeed's MoE in layer i (0-based) when (i + 1) %
    --expert-interval == 0 (default 2; model/transformer.py:1650-1658), its experts
    ParallelMLP(moe=True) (:1064-1083): the dense GeLU MLP (h -> 4h -> h, biases), not split over
    tp without --enable-expert-tensor-parallelism, and a bias-free gate Linear(h, experts)
    (deepspeed moe/sharded_moe.py TopKGate.wg). Hand count for the 350M x 128 recipe: GPT layers
    with LayerNorm and biases, learned positions, tied embedding of the padded GPT-2 vocabulary."""
    ci = read_config(RECIPES / "megatron_deepspeed_gpt_350m_moe128.sh")
    s, m = ci.strategy, ci.model
    h, f, L, E, V, P = 1024, 4096, 24, 128, 50304, 2048
    attn = 4 * h * h + 4 * h                       # fused qkv + dense, with biases
    mlp = 2 * h * f + f + h                        # h -> 4h -> h, with biases
    norms = 2 * 2 * h                              # two LayerNorms (weight, bias)
    dense_layer, moe_layer = attn + mlp + norms, attn + E * mlp + h * E + norms
    hand = 12 * dense_layer + 12 * moe_layer + V * h + P * h + 2 * h
    assert params(m) == hand  # about 13.2 B, not the 38.8 B of gated experts in all 24 layers
    assert (s.dp, s.tp, s.ep, s.etp, s.zero, s.recompute) == (64, 1, 64, 1, 0, "full")
    assert m.experts_per_token == 1 and not m.gated_mlp
    assert any(n.startswith("Megatron-DeepSpeed MoE (DeepSpeed's gating") for n in ci.notes)
    assert not any("allgather" in n for n in ci.notes)


def test_megatron_deepspeed_knowledge_distillation_says_the_teacher_is_not_modelled(tmp_path):
    """Megatron-DeepSpeed --kd loads a teacher beside the student (training.py:218-219,
    pretrain_gpt.py:235-262): a note says its memory is not in the estimate."""
    f = tmp_path / "kd.sh"
    f.write_text((RECIPES / "megatron_deepspeed_gpt_350m_moe128.sh").read_text().replace(
        "--create-moe-param-group", "--create-moe-param-group --kd --num-layers-teacher 24"))
    assert any(n.startswith("--kd: knowledge distillation; not modelled") for n in read_config(f).notes)


def test_torchtitan_cpu_offload_moves_parameters_gradients_and_optimizer_to_host(tmp_path):
    """training.enable_cpu_offload is FSDP2's CPUOffloadPolicy (torchtitan v0.2.2 job_config.py:270-273,
    parallelize.py:315-317; torch _fsdp_collectives.py:711-738 copies each sharded gradient to the
    host): the fsdp profile's 4 B fp32 sharded weights, 4 B gradients and 8 B AdamW moments per
    parameter leave the device, 16 B x params / dp on the host at tp = pp = 1; without the key
    they stay. The emit writes the key back only for that estimate. mixed_precision_param float32
    is named in a note (not modelled)."""
    from ndplan.catalog import load_hardware
    from ndplan.estimate import estimate
    text = (RECIPES / "torchtitan_llama3_70b.toml").read_text().replace(
        "tensor_parallel_degree = 8", "tensor_parallel_degree = 1").replace(
        "pipeline_parallel_degree = 4", "pipeline_parallel_degree = 1")
    f = tmp_path / "t.toml"
    f.write_text(text.replace("steps = 1000", 'steps = 1000\nenable_cpu_offload = true\nmixed_precision_param = "float32"'))
    ci = read_config(f, gpus=64)
    s = ci.strategy
    assert s.offload_optimizer and "grads_offloaded=1" in s.engine and "weights_offloaded=1" in s.engine
    assert any(n.startswith("training.mixed_precision_param float32") for n in ci.notes)
    e = estimate(ci.model, load_hardware("h100-sxm"), s, 64)
    terms = e.per_stage[0]["terms"]
    assert all(terms[k] == 0 for k in ("mem.weights", "mem.grads", "mem.master", "mem.optimizer"))
    assert e.host_bytes == pytest.approx(16 * params(ci.model) / s.dp, rel=1e-9, abs=1)
    plain = estimate(ci.model, load_hardware("h100-sxm"), dataclasses.replace(s, engine="fsdp", offload_optimizer=False), 64)
    t0 = plain.per_stage[0]["terms"]
    assert plain.host_bytes == 0  # (its gradients are built in backward: mem.grads is the part above the dynamic Terms)
    assert t0["mem.weights"] + t0["mem.optimizer"] == pytest.approx(12 * params(ci.model) / s.dp, rel=1e-9, abs=2)
    assert "enable_cpu_offload = true" in emit("torchtitan", ci.model, s)
    with pytest.raises(NdplanError, match="weights_offloaded=1"):
        emit("torchtitan", ci.model, dataclasses.replace(s, engine="fsdp"))


def test_megatron_v1_1_5_flags_are_read_as_that_version_ran_them(tmp_path):
    """DeepSpeedExamples@1bee84f6 Megatron-LM-v1.1.5-3D_parallelism/examples/ds_pretrain_gpt2_pipe.sh:
    --model-parallel-size (tp), --pipe-parallel-size (pp), --batch-size (micro-batch) and --gas
    (accumulation steps: the fork's arguments.py:225-230, 378-381), pretrain_gpt2.py's GPT2BPE
    tokenizer (pretrain_gpt2.py:158); today's Megatron-LM refuses the first and the third
    (arguments.py:591-599 at d98e8a64)."""
    f = tmp_path / "run.sh"
    f.write_text("deepspeed --num_nodes 2 --num_gpus 8 pretrain_gpt2.py --model-parallel-size 2 --pipe-parallel-size 2 "
                 "--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 1024 "
                 "--max-position-embeddings 1024 --batch-size 4 --gas 16 --vocab-file v.json --merge-file m.txt "
                 "--fp16 --deepspeed --deepspeed_config ds.json\n")
    ci = read_config(f)
    s = ci.strategy
    assert (s.tp, s.pp, s.dp, s.mbs, s.gbs, s.m) == (2, 2, 4, 4, 4 * 4 * 16, 16)
    assert ci.origin["tp"] == "--model-parallel-size"
    assert ci.model.vocab_size == 50432  # GPT-2 50257 padded to a multiple of 128 x tp 2 = 256


def test_megatron_v1_1_5_zero3_runs_without_a_pipeline_module(tmp_path):
    """DeepSpeedExamples@068e6561 Megatron-LM-v1.1.5-ZeRO3/examples/ds_pretrain_gpt2-zero3.sh: that
    fork's pretrain_gpt2.py builds no PipelineModule, so ZeRO-3 runs (Megatron-DeepSpeed's
    pretrain_gpt.py does, pretrain_gpt.py:51-52, and is refused without --no-pipeline-parallel)."""
    f = tmp_path / "run.sh"
    text = ("deepspeed --num_nodes 2 --num_gpus 8 {prog} --model-parallel-size 1 --num-layers 24 --hidden-size 2048 "
            "--num-attention-heads 16 --seq-length 1024 --max-position-embeddings 1024 --batch-size 4 "
            "--vocab-file v.json --merge-file m.txt --fp16 --deepspeed --zero-stage 3\n")
    f.write_text(text.format(prog="pretrain_gpt2.py"))
    assert read_config(f).strategy.zero == 3
    f.write_text(text.format(prog="pretrain_gpt2.py --pipe-parallel-size 0"))  # the fork's default: no pipeline
    assert read_config(f).strategy.zero == 3
    f.write_text(text.format(prog="pretrain_gpt2.py --pipe-parallel-size 1"))  # GPT2ModelPipe even at one stage
    with pytest.raises(NdplanError):
        read_config(f)
    f.write_text(text.format(prog="pretrain_gpt.py").replace("--merge-file m.txt", "--merge-file m.txt "))
    with pytest.raises(NdplanError) as e:
        read_config(f)
    assert e.value.field == "zero stage"


def test_megatron_encoder_seq_length_is_the_sequence(tmp_path):
    """Megatron-LM@d98e8a64 arguments.py:1346-1351: without --seq-length the sequence is
    --encoder-seq-length (NVIDIA's examples/mimo run_avlm_train.sh); both given, it asserts."""
    base = ("torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 8 --micro-batch-size 1 "
            "--global-batch-size 64 --bf16 --encoder-seq-length 4096")
    f = tmp_path / "run.sh"
    f.write_text(base + "\n")
    ci = read_config(f, model="llama3-8b")
    assert ci.strategy.seq == 4096 and ci.origin["seq"] == "line 1: --encoder-seq-length"
    f.write_text(base + " --seq-length 2048\n")
    with pytest.raises(NdplanError) as e:
        read_config(f, model="llama3-8b")
    assert e.value.field == "--encoder-seq-length"


def test_megatron_moe_layer_recompute_is_selective_moe(tmp_path):
    """--moe-layer-recompute (NVIDIA's modelopt Qwen3-235B-A22B.sh / DeepSeek-R1.sh): TransformerConfig
    (transformer_config.py:2014-2027 at d98e8a64) makes granularity selective and adds "moe" to the
    modules (default core_attn); with --recompute-granularity full it raises."""
    base = ("torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 1 --expert-model-parallel-size 8 "
            "--micro-batch-size 1 --global-batch-size 64 --seq-length 4096 --bf16 --moe-layer-recompute")
    f = tmp_path / "run.sh"
    f.write_text(base + "\n")
    ci = read_config(f, model="mixtral-8x7b")
    assert ci.strategy.recompute == "selective" and "recompute_moe=1" in ci.strategy.engine
    assert "keep_core_attn" not in ci.strategy.engine  # core_attn stays in the list
    assert "--moe-layer-recompute" not in ci.unknown
    f.write_text(base + " --recompute-granularity full\n")
    with pytest.raises(NdplanError) as e:
        read_config(f, model="mixtral-8x7b")
    assert e.value.field == "--moe-layer-recompute"


def test_fsdp_gradients_accumulated_over_micro_batches_sit_beside_the_activations():
    """torchtitan zeroes the gradients once per step and then runs every micro-batch (v0.2.2
    train.py:550-561): from the second micro-batch on, FSDP2's sharded fp32 gradients (4 B per
    parameter over dp, reduce_dtype fp32) are all held beside that micro-batch's activations, so
    mem.grads is 4 x params / dp at m = 2, where at m = 1 they replace the freed activations (only
    the part above the dynamic memory counts), and the peak grows by about them."""
    from ndplan.catalog import load_hardware
    from ndplan.estimate import estimate
    from ndplan.strategy import Strategy
    model, hw = ndplan.load_model("llama3-8b"), load_hardware("h100-sxm")
    one, two = (estimate(model, hw, Strategy(dp=8, gbs=8 * m, mbs=1, zero=3, seq=8192, engine="fsdp",
                                             recompute="full"), 8) for m in (1, 2))
    g1, g2 = one.per_stage[0]["terms"]["mem.grads"], two.per_stage[0]["terms"]["mem.grads"]
    assert g2 == pytest.approx(4 * params(model) / 8, rel=1e-9)
    assert g1 < g2 and two.peak_bytes - one.peak_bytes > 0.5 * (g2 - g1)
    # the Hugging Face Trainer runs the micro-batches before the last under accelerator.no_sync (transformers 5.17
    # trainer.py:1832-1840): FSDP accumulates the gradients unsharded in fp32 (4 B per parameter, every rank)
    hf = estimate(model, hw, Strategy(dp=8, gbs=16, mbs=1, zero=3, seq=8192, engine="hf", recompute="full"), 8)
    assert hf.per_stage[0]["terms"]["mem.grads"] == pytest.approx(4 * params(model), rel=1e-9)


def test_encoder_models_are_refused():
    """A BERT or T5 config.json (bidirectional or cross attention) is not read as a decoder."""
    from ndplan.catalog.model import model_from_config
    for mt in ("bert", "t5"):
        with pytest.raises(NdplanError) as e:
            model_from_config({"model_type": mt, "hidden_size": 768, "num_hidden_layers": 12,
                               "num_attention_heads": 12, "vocab_size": 30522}, "x", "config.json")
        assert (e.value.field, e.value.value) == ("model_type", mt)


def test_megatron_multimodal_reads_the_language_model_sequence():
    """examples/multimodal/model.py (Megatron-LM@d98e8a64) sets --seq-length to the image
    embeddings (:48-70) and builds the language model at --decoder-seq-length (:81-87, 234);
    --freeze-LM / --freeze-ViT set requires_grad False (:276-279): the LM is estimated at 1024
    tokens, and one note says what is not modelled (the vision side, the frozen parameters)."""
    ci = read_config(RECIPES / "megatron_llava_mistral_clip.sh", model="llama3-8b")
    assert (ci.strategy.seq, ci.strategy.tp, ci.strategy.dp, ci.strategy.gbs) == (1024, 4, 2, 256)
    assert ci.origin["seq"] == "line 21: --decoder-seq-length"
    [note] = [n for n in ci.notes if n.startswith("multimodal")]
    assert "vision encoder" in note and "--freeze-LM --freeze-ViT" in note
    assert not {"--decoder-seq-length", "--freeze-LM", "--freeze-ViT"} & set(ci.unknown)


def test_torchtitan_builds_no_mtp_layer():
    """torchtitan's deepseek_v3 flavors take num_mtp_layers=0 (0.3.0 models/deepseek_v3/__init__.py:323-628;
    only config_registry's debugmodel_mtp passes 1; 0.2.x has no MTP): the catalog DeepSeek-V3's
    MTP layer is left out, with a note."""
    ci = read_config(RECIPES / "torchtitan_deepseek_v3_16b.toml", model="deepseek-v3", gpus=256)
    assert ndplan.load_model("deepseek-v3").mtp_layers == 1 and ci.model.mtp_layers == 0
    assert any("MTP layer(s) left out" in n for n in ci.notes)


def test_torchtitan_experts_over_tp_when_ep_is_1(tmp_path):
    """torchtitan with ep 1 splits the routed experts over tp whatever etp says (v0.2.0
    models/llama4/infra/parallelize.py:489-490: ``if ep_mesh is None: experts_mesh = tp_mesh``,
    TensorParallel; v0.1.0 has no etp option and shards them over tp, parallelize.py:173): the
    llama4 recipe without its etp line is read as etp = tp = 8, with a note; its emit with
    etp 1 is refused by the rule, and the fsdp sweep's ep-1 rows carry etp = tp."""
    text = (RECIPES / "torchtitan_llama4_17bx16e.toml").read_text().replace("expert_tensor_parallel_degree = 8\n", "")
    f = tmp_path / "llama4.toml"
    f.write_text(text)
    ci = read_config(f, gpus=64)
    assert (ci.strategy.tp, ci.strategy.ep, ci.strategy.etp) == (8, 1, 8)
    assert any("routed experts over tp=8" in n for n in ci.notes)
    with pytest.raises(NdplanError) as e:
        emit("torchtitan", ci.model, dataclasses.replace(ci.strategy, etp=1))
    assert e.value.field == "etp"
    from ndplan.space import generate
    cands = generate(ci.model, 64, 4096, 64, {"tp": [1, 2, 8], "zero": 3, "recompute": "full", "pp": 1}, engine="fsdp")
    rows = [(t, e_, et) for g in cands.groups for t, e_, et in zip(g.grid["tp"], g.grid["ep"], g.grid["etp"])]
    assert rows and all(et == (t if e_ == 1 else 1) for t, e_, et in rows)
    assert {t for t, e_, _ in rows if e_ == 1} == {1, 2, 8}


def test_torchtitan_toml_interleaved_layers_per_stage():
    """126 layers + the embedding and output weights (1 + 1) over 8 layers per stage:
    ceil(128 / 8) = 16 stages on pp 8 (vpp 2); each stage 8, the first and last 8 - 1 = 7
    decoder layers (generate_llm_fqn_per_model_part); local batch 16 in microbatches of 1."""
    ci = read_config(RECIPES / "torchtitan_llama3_405b_pp.toml", gpus=512)
    s = ci.strategy
    assert (s.dp, s.tp, s.pp, s.vpp, s.schedule) == (8, 8, 8, 2, "interleaved")
    assert s.layers_per_stage == (7,) + (8,) * 14 + (7,)
    assert (s.mbs, s.m, s.gbs) == (1, 16, 128)


RUN = ("torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 8 --micro-batch-size 1 "
       "--global-batch-size 64 --seq-length 4096 --bf16")
BAD_FILES = {  # file name, text, extra arguments, the field the one-line error names
    "nan-json": ("ds.json", '{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": NaN}',
                 ["-m", "llama3-8b", "--gpus", "8", "--seq", "4096"], "gradient_accumulation_steps"),
    "zero-string": ("ds.json", '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": "3"}',
                    ["-m", "llama3-8b", "--gpus", "8", "--seq", "4096"], "zero_optimization"),
    "optimizer-string": ("mf.yaml", "optimizer: AdamW\nmodel:\n  model_config:\n    seq_length: 4096\n"
                         "parallel_config:\n  data_parallel: 8\n", ["-m", "llama3-8b"], "optimizer"),
    "outer-strategy": ("run.sh", RUN + " --use-megatron-fsdp --outer-dp-sharding-strategy banana\n", ["-m", "llama3-8b"],
                       "--outer-dp-sharding-strategy"),
    "nproc-gpu": ("run.sh", RUN.replace("--nproc_per_node 8", "--nproc_per_node gpu") + "\n", ["-m", "llama3-8b"],
                  "--nproc_per_node"),
    # torchtitan before v0.1.0 (57387af0 train_configs/llama3_405b.toml): degrees under [training]
    "titan-old-schema": ("old.toml", "[training]\nbatch_size = 2\ntensor_parallel_degree = 8\n"
                         "[experimental]\npipeline_parallel_degree = 1\n", ["-m", "llama3-8b", "--gpus", "8"], "FILE"),
    # DeepSpeedExamples benchmarks/deepcompile/run_bench_offload.sh: a value of a loop
    "loop-value": ("run.sh", "for S in 1024 2048; do\n  " + RUN.replace("--seq-length 4096", "--seq-length ${S}")
                   + "\ndone\n", ["-m", "llama3-8b"], "--seq-length"),
    # NVIDIA's examples/mamba/train.sh: a hybrid Mamba model (its pattern sets the layers too)
    "hybrid-mamba": ("run.sh", RUN + " --hybrid-layer-pattern M-M-*-\n", ["-m", "llama3-8b"], "--hybrid-layer-pattern"),
    "moe-layer-recompute-full": ("run.sh", RUN + " --moe-layer-recompute --recompute-granularity full\n",
                                 ["-m", "mixtral-8x7b"], "--moe-layer-recompute"),
    "encoder-and-seq": ("run.sh", RUN + " --encoder-seq-length 4096\n", ["-m", "llama3-8b"], "--encoder-seq-length"),
    # NVIDIA's examples/t5/train_t5_220m_distributed.sh: an encoder-decoder model
    "t5": ("run.sh", RUN.replace("--seq-length 4096", "--encoder-seq-length 512 --decoder-seq-length 128") + "\n",
           ["-m", "llama3-8b"], "--encoder-seq-length"),
    # NVIDIA's examples/rl scripts keep every flag in a sourced file: the error names it
    "sourced-only": ("run.sh", "source ./CONFIG.sh\ntorchrun pretrain_gpt.py $ARGS\n", ["-m", "llama3-8b"], "FILE"),
    # Megatron-LM examples/bert, tools/run_text_generation_server.py, tasks/main.py: not GPT training
    "bert": ("run.sh", RUN.replace("pretrain_gpt.py", "pretrain_bert.py") + "\n", ["-m", "llama3-8b"], "FILE"),
    "server": ("run.sh", RUN.replace("pretrain_gpt.py", "tools/run_text_generation_server.py") + "\n",
               ["-m", "llama3-8b"], "FILE"),
    # preprocessing with tools/ before the training program is no refusal (its error is the -m one here)
    "tools-then-train": ("run.sh", "python tools/preprocess_data.py --input x.json\n" + RUN.replace(
        " --seq-length 4096", "") + "\n", ["-m", "llama3-8b"], "--seq-length"),
    "pipe-parallel-negative": ("run.sh", RUN + " --pipe-parallel-size -1\n", ["-m", "llama3-8b"], "--pipe-parallel-size"),
    "ds-cpu-offload-maybe": ("ds.json", '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, '
                             '"cpu_offload": "maybe"}}', ["-m", "llama3-8b", "--gpus", "8", "--seq", "4096"],
                             "zero_optimization.cpu_offload"),
    "pet-config-number": ("mf.yaml", "model:\n  model_config:\n    seq_length: 4096\n    pet_config: 3\n"
                          "parallel_config:\n  data_parallel: 8\n", ["-m", "llama3-8b"], "model.model_config.pet_config"),
    "titan-param-dtype": ("t.toml", '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nmixed_precision_param = '
                          '"float17"\n[parallelism]\ndata_parallel_shard_degree = -1\n', ["--gpus", "8"],
                          "training.mixed_precision_param"),
    "mds-ep-over-dp": ("run.sh", RUN.replace("torchrun --nproc_per_node 8", "deepspeed --num_gpus 8")
                       + " --deepspeed --no-pipeline-parallel --num-experts 8 --moe-expert-parallel-size 2\n",
                       ["-m", "mixtral-8x7b"], "--moe-expert-parallel-size"),  # dp 1 (DeepSpeed groups.py:634)
    "mds-capacity": ("run.sh", RUN.replace("torchrun --nproc_per_node 8", "deepspeed --num_gpus 8")
                     + " --deepspeed --no-pipeline-parallel --num-experts 8 --moe-train-capacity-factor abc\n",
                     ["-m", "mixtral-8x7b"], "--moe-train-capacity-factor"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_check_bad_recipe_values_are_one_line(tmp_path, name, clean_env):
    from click.testing import CliRunner
    from ndplan.cli import main
    fname, text, extra, field = BAD_FILES[name]
    f = tmp_path / fname
    f.write_text(text)
    r = CliRunner().invoke(main, ["check", str(f), *extra])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}="), r.output

