"""Megatron-LM and Megatron-DeepSpeed launch scripts read as the framework runs them: what
Megatron-LM's validate_args refuses for torch FSDP2, pretrain_gpt.py's default tokenizer, the
deepspeed launcher's device count, and Megatron-DeepSpeed's own flags. Each expectation is
derived here from the cited lines (NVIDIA/Megatron-LM@d98e8a64, microsoft/Megatron-DeepSpeed@
f4157bea, deepspeed 0.19.8); bash itself runs the edited scripts where the shell matters."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from ndplan.check import check
from ndplan.errors import NdplanError, NdplanWarning
from ndplan.interop import megatron as mg

ARCH = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
        "--max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 64")
"""A Llama-2-7B-shaped model (its vocabulary from the tokenizer or --vocab-size)."""


def _read(tmp_path: Path, text: str, **kw):
    path = tmp_path / "train.sh"
    path.write_text(text)
    return mg.read(path, text, **kw)


FSDP2 = f"torchrun --nproc_per_node 8 pretrain_gpt.py {ARCH} --vocab-size 32000 --use-torch-fsdp2 "


@pytest.mark.parametrize("extra,field,says", [
    ("--use-distributed-optimizer --no-gradient-accumulation-fusion", "--use-torch-fsdp2", "arguments.py:1038-1039"),
    ("", "--use-torch-fsdp2", "--no-gradient-accumulation-fusion"),
    ("--no-gradient-accumulation-fusion --pipeline-model-parallel-size 2", "--use-torch-fsdp2", "1034-1035"),
], ids=["distributed-optimizer", "grad-fusion-on-by-default", "pipeline"])
def test_fsdp2_is_refused_where_megatron_asserts(tmp_path, extra, field, says):
    """validate_args under --use-torch-fsdp2 (arguments.py:1031-1049): no distributed optimizer,
    no gradient accumulation fusion (its flag is --no-gradient-accumulation-fusion: on unless
    given), no pipeline parallelism."""
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, FSDP2 + extra + "\n")
    assert e.value.field == field and says in (e.value.problem + e.value.fix)


def test_fsdp2_under_max_connections_1_is_refused_unless_the_script_unsets_it(tmp_path, monkeypatch):
    """arguments.py:1048-1049 asserts CUDA_DEVICE_MAX_CONNECTIONS != "1" under FSDP2; NVIDIA's
    FSDP script runs `unset CUDA_DEVICE_MAX_CONNECTIONS` first (train_llama3_8b_fsdp_h100_fp8.sh)."""
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    run = FSDP2 + "--no-gradient-accumulation-fusion\n"
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, "export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}\n" + run)
    assert e.value.field == "CUDA_DEVICE_MAX_CONNECTIONS"
    ci = _read(tmp_path, "export CUDA_DEVICE_MAX_CONNECTIONS=1\nunset CUDA_DEVICE_MAX_CONNECTIONS\n" + run)
    assert ci.strategy.zero == 3


def test_fp8_param_gather_is_off_under_fsdp2(tmp_path, monkeypatch):
    """arguments.py:1051-1057: with Transformer Engine >= 2.0 Megatron sets fp8_param_gather
    False under FSDP2 (bf16 gather): the weights are not fp8."""
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    ci = _read(tmp_path, FSDP2 + "--no-gradient-accumulation-fusion --bf16 --fp8-format hybrid --fp8-param-gather\n")
    assert ci.strategy.weight_dtype != "fp8"
    assert any("Megatron turns it off" in n for n in ci.notes)


def _bash_env(text: str, name: str) -> str:
    """The value of ``name`` the launched program sees when bash runs ``text`` (torchrun is a
    function printing it; an unset variable prints <unset>)."""
    fn = f'torchrun() {{ printf "%s\\n" "${{{name}-<unset>}}"; }}\n'
    r = subprocess.run(["bash", "-c", fn + text], capture_output=True, text=True, timeout=10,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_fsdp2_proposal_unsets_max_connections_and_drops_the_distributed_optimizer(tmp_path, monkeypatch):
    """A proposal that turns FSDP2 on edits what Megatron would refuse: the distributed optimizer
    and --overlap-param-gather go (arguments.py:1025-1027, 1038-1039), gradient accumulation
    fusion goes off, and the script unsets CUDA_DEVICE_MAX_CONNECTIONS (1048-1049), as bash sees."""
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    text = ("#!/bin/bash\nexport CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}\n"
            "DDP=(\n  --use-distributed-optimizer\n  --overlap-grad-reduce\n  --overlap-param-gather\n)\n"
            f"torchrun --nproc_per_node 8 pretrain_gpt.py {ARCH.replace('1 --global', '4 --global')} "
            "--seq-length 8192 --vocab-size 32000 --untie-embeddings-and-output-weights --bf16 "
            '--tensor-model-parallel-size 1 "${DDP[@]}"\n')
    path = tmp_path / "train.sh"
    path.write_text(text)
    res = check(mg.read(path, text), "h100-sxm", top=6)
    fsdp = [p for p in res.proposals if p.strategy.zero == 3]
    assert fsdp, [p.changed for p in res.proposals]
    new = fsdp[0].text
    assert _bash_env(text, "CUDA_DEVICE_MAX_CONNECTIONS") == "1"
    assert _bash_env(new, "CUDA_DEVICE_MAX_CONNECTIONS") == "<unset>"
    words = [w for w, _ in mg.words(new)]
    assert "--use-distributed-optimizer" not in words and "--overlap-param-gather" not in words
    assert "--use-torch-fsdp2" in words and "--no-gradient-accumulation-fusion" in words


def test_pretrain_gpt_defaults_to_gpt2_bpe(tmp_path):
    """pretrain_gpt.py:527 passes args_defaults={'tokenizer_type': 'GPT2BPETokenizer'}: 50,257
    tokens, padded to a multiple of 128 x tp (vocab_size_with_padding): tp 8 -> 51,200."""
    ci = _read(tmp_path, f"torchrun --nproc_per_node 8 pretrain_gpt.py {ARCH} --tensor-model-parallel-size 8\n")
    assert ci.model.vocab_size == math.ceil(50257 / (128 * 8)) * 128 * 8 == 51200


def test_model_flag_that_replaces_the_files_architecture_warns(tmp_path):
    with pytest.warns(NdplanWarning, match="replaces the architecture .*num_hidden_layers 32 -> 80"):
        _read(tmp_path, f"torchrun --nproc_per_node 8 pretrain_gpt.py {ARCH} --vocab-size 32000\n",
              model="llama3-70b", gpus=64)


# --------------------------------------------------------------------------- Megatron-DeepSpeed

MDS = f"deepspeed --num_gpus 8 --num_nodes 2 pretrain_gpt.py {ARCH} --vocab-size 32000 --deepspeed "


def test_the_deepspeed_launcher_states_the_devices(tmp_path):
    """deepspeed launcher/runner.py:84-95: --num_nodes x --num_gpus (per node) processes."""
    ci = _read(tmp_path, MDS + "--zero-stage 1\n")
    assert ci.gpus == 16 and ci.strategy.dp == 16


@pytest.mark.parametrize("flags,zero", [("--zero-stage 2 --no-pipeline-parallel", 2), ("", 1)], ids=["flag", "default"])
def test_megatron_deepspeed_zero_stage_from_its_flag(tmp_path, flags, zero):
    """--zero-stage (megatron/arguments.py:1487, default 1) when the config file is not readable."""
    assert _read(tmp_path, MDS + flags + "\n").strategy.zero == zero


def test_megatron_deepspeed_zero_stage_from_the_config_the_script_writes(tmp_path):
    """The scripts write ds_config with a here-document; DeepSpeed's engine takes its
    zero_optimization.stage (training.py:501-506 hands the dict to deepspeed.initialize)."""
    text = ("Z=3\ncfg=ds_z$Z.json\ncat <<EOT > $cfg\n{\"train_batch_size\": 64, \"zero_optimization\": "
            "{\"stage\": $Z}}\nEOT\n" + MDS + "--zero-stage 1 --no-pipeline-parallel --deepspeed_config $cfg\n")
    ci = _read(tmp_path, text)
    assert ci.strategy.zero == 3
    assert any("--zero-stage 1 differs" in n for n in ci.notes)
    # no zero_optimization section: DeepSpeed's default stage 0 (runtime/zero/config.py:95)
    text = "cat <<EOT > ds.json\n{\"train_batch_size\": 64}\nEOT\n" + MDS + "--zero-stage 1 --deepspeed_config ds.json\n"
    assert _read(tmp_path, text).strategy.zero == 0


def test_megatron_deepspeed_checkpoint_activations_and_ulysses(tmp_path):
    """--checkpoint-activations: every layer chunk of --checkpoint-num-layers (1) checkpointed
    (model/transformer.py:2082-2088, 1888-1921): full recompute; --ds-sequence-parallel-size 4
    splits the sequence over 4 ranks, dp = 16 / 4 = 4."""
    ci = _read(tmp_path, MDS + "--checkpoint-activations --ds-sequence-parallel-size 4\n")
    assert ci.strategy.recompute == "full" and ci.strategy.cp == 4 and ci.strategy.dp == 4


@pytest.mark.parametrize("flag,flash", [("", False), ("--use-flash-attn-v2", True), ("--use-flash-attn", True),
                                        ("--use-flash-attn-triton", True)])
def test_megatron_deepspeed_attention_is_unfused_without_a_flash_flag(tmp_path, flag, flash):
    """megatron/arguments.py:433 (f4157bea): use_flash_attn is any of the four switches; without
    one CoreAttention materialises the s x s scores (69 of the 75 examples_deepspeed scripts)."""
    ci = _read(tmp_path, MDS + flag + "\n")
    assert ci.strategy.flash_attention is flash
    assert any("runs CoreAttention" in n for n in ci.notes) is not flash
    assert flag == "" or flag not in ci.unknown


def test_megatron_deepspeed_refusals(tmp_path):
    """DeepSpeed's pipeline engine refuses ZeRO-2/3 with stages (runtime/pipe/engine.py:76-77);
    --num-experts takes one count per layer group (arguments.py:608): a pyramid is not modelled."""
    for extra in ("--pipeline-model-parallel-size 2", ""):  # pretrain_gpt.py:51-52: the pipeline model at pp 1 too
        with pytest.raises(NdplanError) as e:
            _read(tmp_path, MDS + f"--zero-stage 2 {extra}\n")
        assert "engine.py:76-77" in e.value.problem
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, MDS + "--zero-stage 1 --num-experts 32 32 64 64\n")
    assert e.value.field == "--num-experts"


def test_megatron_deepspeed_expert_flags(tmp_path):
    """Megatron-DeepSpeed's MoE flags (megatron/arguments.py:608-615, 1159): --num-experts one
    count per layer group, [1] (its default) a dense model; --topk the experts per token
    (default 1); --moe-expert-parallel-size the expert-parallel degree."""
    ci = _read(tmp_path, MDS + "--zero-stage 1 --num-experts 8 8 --moe-expert-parallel-size 4\n")
    assert (ci.model.num_experts, ci.model.experts_per_token, ci.strategy.ep) == (8, 1, 4)
    ci = _read(tmp_path, MDS + "--zero-stage 1 --num-experts 8 --topk 2\n")
    assert ci.model.experts_per_token == 2
    assert not _read(tmp_path, MDS + "--zero-stage 1 --num-experts 1 --topk 2\n").model.is_moe


def test_megatron_deepspeed_stage_from_the_template_edit(tmp_path):
    """examples_deepspeed/MoE/ds_pretrain_gpt_1.3B_MoE128.sh writes its config with
    sed "s/ZERO_STAGE/0/" TEMPLATE > $config_json: DeepSpeed runs that stage, not --zero-stage's."""
    text = ('template_json="ds_config_gpt_TEMPLATE.json"\nconfig_json="ds_config.json"\n'
            'sed "s/CONFIG_BATCH_SIZE/64/" ${template_json} \\\n    | sed "s/ZERO_STAGE/0/" \\\n      > ${config_json}\n'
            + MDS + "--zero-stage 1 --deepspeed_config ${config_json}\n")
    ci = _read(tmp_path, text)
    assert ci.strategy.zero == 0 and any("s/ZERO_STAGE/0/" in n for n in ci.notes)


def test_megatron_lm_checkpoint_activations_is_full_recompute(tmp_path):
    """Megatron-LM v2.5 (examples/pretrain_gpt3_175B.sh): --checkpoint-activations checkpoints
    every --checkpoint-num-layers (1) layers (v2.5 arguments.py:393, model/transformer.py:661)."""
    ci = _read(tmp_path, f"torchrun --nproc_per_node 8 pretrain_gpt.py {ARCH} --vocab-size 32000 "
                         "--checkpoint-activations\n")
    assert ci.strategy.recompute == "full"


def test_a_hugging_face_trainer_launch_points_to_its_deepspeed_json(tmp_path):
    """DeepSpeedExamples training/tensor_parallel/hf_integration/run.sh: a Trainer script
    (TrainingArguments' --per_device_train_batch_size, --model_name_or_path) whose layout is the
    JSON it passes with --deepspeed; its --bf16 True is not a Megatron run."""
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, "deepspeed --num_gpus 4 train.py --model_name_or_path m --bf16 True "
                        "--per_device_train_batch_size 8 --deepspeed ./configs/ds_config.json\n", model="llama3-8b")
    assert "Hugging Face Trainer" in e.value.problem and "./configs/ds_config.json" in e.value.fix


@pytest.mark.parametrize("config", ['{"zero_optimization": {"stage": 5}}', '{"zero_optimization": [1]}'])
def test_megatron_deepspeed_config_stage_is_read_as_deepspeed_reads_it(tmp_path, config):
    """The config's stage goes through the DeepSpeed reader's own rule (one source): a stage
    DeepSpeed has not (0-3) or a section that is not an object is a one-line error, not the
    --zero-stage fallback; true is the deprecated stage 1 (runtime/zero/config.py:60-78)."""
    with pytest.raises(NdplanError):
        _read(tmp_path, f"cat <<EOT > ds.json\n{config}\nEOT\n" + MDS + "--deepspeed_config ds.json\n")
    ci = _read(tmp_path, 'cat <<EOT > ds.json\n{"zero_optimization": true}\nEOT\n' + MDS + "--deepspeed_config ds.json\n")
    assert ci.strategy.zero == 1
    with pytest.raises(NdplanError):
        _read(tmp_path, MDS + "--zero-stage inf\n")
