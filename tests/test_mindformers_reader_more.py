"""MindFormers reader: the sequence length MindFormers builds the model for, MoE with tensor
parallelism and no sequence parallelism, and the sequence pipeline (seq_split_num / seqpipe).
Each expected value is what MindFormers does, read from its source (repository, commit, path,
lines in the docstrings), never from ndplan's own output.

Sources: mindspore-lab/mindformers@f52743ca27a5a8af5fbc77c5b2037c1147c7004c ("f52743ca"), tags
v1.5.0 (06e1af77), v1.6.0 (68fa8494) and v1.7.0 (8ccc49b3); MindSpore's parallel passes as held by
mindspore-ai/mindspore_test@a05ce588 (mindspore/ccsrc/frontend/parallel/...).
"""

from __future__ import annotations

import dataclasses
from collections import deque

import pytest
import yaml

from ndplan.check import file_diff
from ndplan.errors import NdplanError
from ndplan.interop import read_config
from ndplan.interop.mindformers import MCORE_SEQ_DEFAULT
from tests.test_recipes_mindformers import MC, QWEN3_MOE, RECIPES, _doc, _read, _set

MIXTRAL = "mindformers_mixtral_8x7b.yaml"
SEQPIPE = "mindformers_qwen25_72b_seqpipe.yaml"


# --- sequence length --------------------------------------------------------------------------

MEGATRON_DATA = "train_dataset.data_loader.config.seq_length"


@pytest.mark.parametrize("dataset", [None, 4096])
def test_mcore_seq_length_absent_is_mindformers_default(tmp_path, dataset):
    """configs/qwen3_moe/pretrain_qwen3_30b_a3b_4k.yaml (f52743ca, v1.7.0) gives no
    model_config.seq_length, only the GPTDataset's ``seq_length: 4096`` (line 54). MindFormers then
    builds the model at MFModelConfig.seq_length = 4096 (parallel_core/mf_model_config.py:349 at
    f52743ca, :361 at v1.7.0), merged under every mcore model config's keys by
    register_mf_model_parameter (models/model_config_utils.py:184-211); the GPTDataset returns
    samples of its config's seq_length (dataset/dataloader/blended_megatron_dataloader.py:185,
    222-232): one length, 4096."""
    doc = _set(_doc(QWEN3_MOE), {f"{MC}.seq_length": None, MEGATRON_DATA: dataset})
    ci = _read(tmp_path, doc)
    assert ci.strategy.seq == 4096 == MCORE_SEQ_DEFAULT
    assert any("mf_model_config.py:349" in n for n in ci.notes)
    assert "default" in ci.origin["seq"]


def test_mcore_seq_length_absent_and_dataset_disagrees_is_an_error(tmp_path):
    """Absent model seq_length with an 8192-token dataset: MindFormers builds the causal mask
    4096 x 4096 (parallel_core/training_graph/transformer/mask_generate.py:66-69 at f52743ca) and
    reshapes the MoE tokens by 4096 (moe/moe_layer.py:195, 230) while the data are 8192 long: no
    length to estimate; the error names the key, both values and --seq."""
    doc = _set(_doc(QWEN3_MOE), {f"{MC}.seq_length": None, MEGATRON_DATA: 8192})
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, doc)
    assert e.value.field == f"{MC}.seq_length"
    assert "8192" in str(e.value) and "4096" in str(e.value) and "--seq" in e.value.fix
    assert "\n" not in str(e.value)
    assert _read(tmp_path, doc, seq=8192).strategy.seq == 8192


def test_mcore_seq_length_from_hf_packing_handler(tmp_path):
    """configs/qwen3/finetune_qwen3.yaml (f52743ca) gives the length only in its HFDataLoader
    handlers (AlpacaInstructDataHandler and PackingHandler ``seq_length: 4096``, lines 64, 70); the
    last one packs the samples. A packing length that is not the model's default is named."""
    handlers = [{"type": "AlpacaInstructDataHandler", "seq_length": 8192},
                {"type": "PackingHandler", "seq_length": 8192, "pack_strategy": "pack"}]
    doc = _set(_doc(QWEN3_MOE), {f"{MC}.seq_length": None, "train_dataset.data_loader.type": "HFDataLoader",
                                 "train_dataset.data_loader.handler": handlers})
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, doc)
    assert "train_dataset.data_loader.handler[1].seq_length=8192" in str(e.value)
    for h in handlers:
        h["seq_length"] = 4096
    assert _read(tmp_path, doc).strategy.seq == 4096


def test_legacy_seq_length_absent_names_seq(tmp_path):
    """A legacy model class defaults seq_length its own way (LlamaConfig: 2048,
    models/llama/llama_config.py:133 at f52743ca): without the key the error names it and --seq."""
    doc = _set(_doc(MIXTRAL), {f"{MC}.seq_length": None})
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, doc)
    assert e.value.field == f"{MC}.seq_length" and "--seq" in e.value.fix
    ci = _read(tmp_path, doc, seq=8192)
    assert ci.strategy.seq == 8192 and ci.origin["seq"] == "--seq"


# --- MoE, tensor parallelism without sequence parallelism --------------------------------------

def test_legacy_moe_tp_without_sp_is_estimated_as_1_5_runs_it(tmp_path):
    """A legacy ``moe_config`` MoE (expert_num 8) with model_parallel 4 and use_seq_parallel False:
    MindFormers >= 1.6.0 refuses it before building the network, in check_rules
    ``_check_moe_parallel_valid`` (tools/check_rules.py:169-176 at f52743ca, :145-152 at v1.7.0;
    added by 8f4f03c1, 2025-06-19, first in v1.6.0), called from ``_check_parallel`` under
    semi_auto_parallel (:215) at train start (trainer/base_trainer.py:1217); the same release set
    use_seq_parallel True in research/mixtral/mixtral_8x7b/pretrain_mixtral-8x7b_32k.yaml (35461d95).
    v1.5.0 ran it (MoEV2 keeps ``_ffn_forward`` unless use_seq_parallel, modules/transformer/moe.py:680-699 at v1.5.0;
    v1.3.0's and v1.5.0's check_rules.py have no MoE check). The yaml names no version (research/deepseek2's
    236B recipe, 2024, runs so): estimated as 1.5.0 runs it, a note says 1.6.0 refuses it and how to
    fix it there; the experts split over model_parallel either way (etp = tp, ``mp_moe``, moe.py:680-690).
    The same strategy under the plain mindspore engine stays refused (rules.py)."""
    doc = _set(_doc(MIXTRAL), {"parallel_config.use_seq_parallel": False})
    ci = _read(tmp_path, doc)
    s = ci.strategy
    assert (s.tp, s.sp, s.ep, s.etp) == (4, False, 2, 4) and "moe_tp_without_sp=1" in s.engine
    assert any(">= 1.6.0 refuses it" in n and "use_seq_parallel: True" in n for n in ci.notes)
    with pytest.raises(NdplanError) as e:
        dataclasses.replace(s, engine="mindspore").check(ci.model, ci.gpus)
    assert e.value.field == "sp"
    s = _read(tmp_path, _doc(MIXTRAL)).strategy
    assert (s.tp, s.sp, s.ep, s.etp) == (4, True, 2, 4) and "moe_tp_without_sp" not in s.engine


def test_mcore_moe_tp_without_sp_is_refused(tmp_path):
    """mcore MoELayer raises for tp > 1 without sequence parallelism (parallel_core/training_graph/
    transformer/moe/moe_layer.py:142-147 at f52743ca)."""
    doc = _set(_doc(QWEN3_MOE), {"parallel_config.use_seq_parallel": False})
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, doc)
    assert e.value.field == "parallel_config.use_seq_parallel"


# --- sequence pipeline -------------------------------------------------------------------------

def _seqpipe_order(pp: int, stage: int, m: int, n: int) -> list[tuple[str, int, int]]:
    """MindSpore's SeqpipeScheduler execute order for one chunk per stage (vpp 1), transcribed from
    seqpipe_scheduler.cc (mindspore_test@a05ce588): ComputeCycleList (:97-111), ExecuteOrder
    (:178-200), MakeExecuteOrder (:135-176: a forward per index, then from index warm_up on the
    backward of the oldest micro-batch's newest slice), ExtractDataStruct (:290-315: bias 1,
    warm_up = (pp-1-stage) + n - 1, at most n*m - 1)."""
    cycles = [m] if m < pp else [pp] * (m // pp)
    for i in range(m - len(cycles) * pp if m >= pp else 0):
        cycles[i % len(cycles)] += 1
    micro = [sum(cycles[:c]) + mi for c, cl in enumerate(cycles) for mi in range(cl) for _ in range(n)]
    warm = min(pp - 1 - stage + n - 1, n * m - 1)
    order, queue, slices = [], deque(), {}
    for index in range(n * m):
        queue.append(micro[index])
        slices.setdefault(micro[index], []).append(index % n)
        order.append(("F", micro[index], index % n))
        if index >= warm and queue:
            b = queue.popleft()
            order.append(("B", b, slices[b].pop()))
    while queue:
        b = queue.popleft()
        order.append(("B", b, slices[b].pop()))
    return order


@pytest.mark.parametrize("pp,m,n", [(8, 32, 8), (8, 32, 1), (4, 16, 4), (8, 4, 8), (2, 8, 3)])
def test_seqpipe_holds_pp_minus_1_minus_i_plus_n_slices(pp, m, n):
    """The note's count: stage i of seqpipe holds min(n*m, pp-1-i+n) slices at its peak (n = 1:
    1F1B's pp-i); every slice's backward runs last slice first within its micro-batch."""
    for stage in range(pp):
        order = _seqpipe_order(pp, stage, m, n)
        live = peak = 0
        for kind, *_ in order:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        assert peak == min(n * m, pp - 1 - stage + n)
        backward = [(mb, s) for kind, mb, s in order if kind == "B"]
        assert backward == [(mb, s) for mb in range(m) for s in reversed(range(n))]


def test_seqpipe_note_says_the_held_slices_and_kv(tmp_path):
    """research/qwen2_5/finetune_qwen2.5_72B_32K.yaml (fd4deebc): seqpipe, seq_split_num 8, pp 8:
    estimated as 1f1b; the note gives the held slices and the K/V buffers (key_cache, value_cache
    and their _grad twins, models/llama/llama_transformer.py:206-215 at f52743ca, the latter
    written by MindSpore's _VirtualAssignKvCache, graph_util/pipeline_split_utils.cc:1161-1226)."""
    ci = read_config(RECIPES / SEQPIPE)
    assert ci.strategy.schedule == "1f1b"
    note = next(n for n in ci.notes if "seqpipe (seq_split_num=8)" in n)
    assert "not modelled" in note and "pp-1-i+8" in note and "key_cache" in note and "9 x A_kv" in note


@pytest.mark.parametrize("recompute", [True, [1, 0, 0, 0, 0, 0, 0, 0]])
def test_seq_split_refuses_full_recompute(tmp_path, recompute):
    """trainer/base_trainer.py:512-514 (f52743ca; v1.5.0 :499): seq_split_num > 1 with a pipeline
    and a true ``recompute`` (a per-stage list is true) raises "When using seq pipe, cannot apply full
    recompute"."""
    doc = _set(_doc(SEQPIPE), {"recompute_config.recompute": recompute})
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, doc)
    assert e.value.field == "recompute_config.recompute" and "seq_split_num" in e.value.fix


@pytest.mark.parametrize("edit,field", [
    ({"use_legacy": False}, "parallel_config.seq_split_num"),  # base_trainer.py:546-550 (mcore)
    ({f"{MC}.use_flash_attention": False}, f"{MC}.use_flash_attention"),  # llama_transformer.py:203-205
    ({"parallel_config.pipeline_stage": 1}, "parallel_config.seq_split_num"),
])
def test_seq_split_refusals(tmp_path, edit, field):
    """seq_split_num 8 where MindFormers does not run it: an mcore model (trainer/base_trainer.py:
    546-550 at f52743ca), no flash attention in LLaMA's attention (models/llama/llama_transformer.py:
    203-205), no pipeline (SequenceSplit only wraps pipeline_stage > 1, base_trainer.py:509-515, while
    the LLaMA model tiles K/V 8 times against one-sequence buffers, llama.py:117-140)."""
    doc = _set(_doc(SEQPIPE), edit)
    if edit.get("use_legacy") is False:
        mc = doc["model"]["model_config"]
        mc |= {"num_hidden_layers": mc.pop("num_layers"), "num_attention_heads": mc.pop("num_heads"),
               "num_key_value_heads": mc.pop("n_kv_heads"), "model_type": "qwen2"}
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, doc)
    assert e.value.field == field


def test_full_recompute_proposal_turns_seqpipe_off(tmp_path):
    """A proposal with full recompute, which MindFormers refuses beside seq_split_num > 1
    (base_trainer.py:512-514), is written with seq_split_num 1 and pipeline_scheduler 1f1b: the
    file then runs what ndplan estimated (1f1b over whole sequences)."""
    f = tmp_path / "mf.yaml"
    f.write_text((RECIPES / SEQPIPE).read_text())
    ci = read_config(f)
    strat = dataclasses.replace(ci.strategy, recompute="full")
    _, text = file_diff(ci, strat)
    doc = yaml.safe_load(text)
    assert doc["parallel_config"]["seq_split_num"] == 1
    assert doc["parallel"]["pipeline_config"]["pipeline_scheduler"] == "1f1b"
    assert doc["recompute_config"]["recompute"] is True
