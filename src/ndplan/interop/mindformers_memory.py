"""MindFormers yaml keys that change memory without changing the parallel degrees, read
into engine settings (engines.derive on the mindspore profile): the optimizer type (its states
and step temporaries, interop.mindformers_optim), the optimizer shard group
(``optimizer_weight_shard_size``) and the MoE capacity (the legacy ``moe_config`` and the mcore
``model_config`` keys); and the sequence pipeline (``seq_split_num``), checked and described
(``seq_split``). Sources are at mindspore-lab/mindformers@fd4deebc (legacy MoE, shard
size) and @f52743ca (mcore, seq_split_num).
"""

from __future__ import annotations

from ndplan.errors import NdplanError
from ndplan.interop import mindformers_optim as MFO
from ndplan.interop.base import positive
# mindformers imports this module inside read_doc
from ndplan.interop.mindformers import KEY
from ndplan.interop.mindformers_model import MC, get, is_deepseek, is_mcore, model_config

SHARD_SIZE = MFO.SHARD_SIZE
OPTIMIZER = MFO.OPTIMIZER
MOE = "moe_config"
FP32_ADAM = MFO.FP32_ADAM
optimizer_settings = MFO.optimizer_settings
GRAD_SHARD = "parallel.parallel_optimizer_config.gradient_accumulation_shard"

MCORE_CAPACITY = ("moe_expert_capacity_factor", "capacity_factor")
"""The two model_config names of TransformerConfig.moe_expert_capacity_factor
(parallel_core/transformer_config_utils.py:353 at f52743ca)."""
CAPACITY_BALANCING = ("sub_seq_aux_loss", "seq_aux_loss", "gbs_aux_loss")
"""Load-balancing types TransformerConfig accepts beside a capacity factor (transformer_config.py:
536-543); its default is sub_seq_aux_loss (:234)."""
PAD_TO_CAPACITY = "moe_pad_expert_input_to_capacity"
"""Megatron-LM's padding switch: not a key MindFormers' mcore model_config maps (transformer_config_utils.py
COMMON_CONFIG_MAPPING, :198-423), so convert_to_transformer_config refuses it (:500-518)."""


def shard_settings(doc: dict, dp: int, cp: int, zero: int, notes: list) -> dict:
    """optimizer_shard_size from optimizer_weight_shard_size: (0, devices], -1 the whole data-
    parallel group; a size that does not divide the group is not applied (trainer/
    training_args.py:173-181)."""
    k = get(doc, SHARD_SIZE)
    if k is None or k == -1:
        return {}
    if not isinstance(k, int) or isinstance(k, bool) or k == 0 or k < -1 or k > 2**20:
        raise NdplanError(SHARD_SIZE, k, "not a shard group size", "give a power of 2 that divides data_parallel, or -1")
    if not zero:
        notes.append(f"{SHARD_SIZE.rsplit('.', 1)[1]}={k}: effective only with enable_parallel_optimizer")
        return {}
    group = dp * cp
    if group % k:
        notes.append(f"{SHARD_SIZE.rsplit('.', 1)[1]}={k} does not divide the data-parallel group {group}: "
                     "MindSpore shards over the whole group")
        return {}
    return {} if k >= group else {"optimizer_shard_size": k}


def capacity_settings(doc: dict, spec, mcore: bool, notes: list) -> dict:
    """moe_capacity_permille of the legacy MoE (moe_config): without use_gmm the llama MoE layer
    is MoEV2 (models/llama/llama_transformer.py:939-953; llama_layer.py:802), which dispatches
    every expert a (capacity, h) block, capacity = ceil(k x tokens x capacity_factor / E) capped
    at the tokens (modules/transformer/moe.py:276-283, 880-889): cf x tokens x k rows, at most
    E x tokens; capacity_factor <= 0 is dynamic (moe.py:1630-1636), and use_gmm's MoEV3 runs a
    grouped matmul over the routed tokens only (moev3.py:497-521): both dropless. The mcore
    model: ``mcore_capacity``."""
    if mcore:
        return mcore_capacity(doc, notes)
    if not spec.is_moe:
        return {}
    cf = get(doc, f"{MOE}.capacity_factor", 1.1)  # MoEConfig default (moe.py:131)
    if not isinstance(cf, (int, float)) or isinstance(cf, bool) or cf != cf or abs(cf) > 1e6:
        raise NdplanError(f"{MOE}.capacity_factor", cf, "not a number", "give e.g. 1.1, or -1 for dropless")
    if cf <= 0 or get(doc, f"{MOE}.use_gmm", False):
        return {}
    rows = min(float(cf), spec.num_experts / spec.experts_per_token)
    notes.append(f"capacity_factor {cf:g}: every expert padded to capacity (MoEV2), {rows:g} x tokens x top-k rows")
    permille = round(rows * 1000)
    return {} if permille == 1000 else {"moe_capacity_permille": permille}


def mcore_capacity(doc: dict, notes: list) -> dict:
    """The mcore model's capacity keys, as MindFormers@f52743ca applies them: none. Its
    TransformerConfig takes ``moe_expert_capacity_factor`` (alias ``capacity_factor``), turns a
    negative one into None and refuses any with a load-balancing type outside
    ``CAPACITY_BALANCING`` (transformer_config.py:536-543), but no module of its mcore MoE reads it
    (parallel_core/training_graph/transformer/moe/: router.py, token_dispatcher.py, moe_layer.py and
    ffn.py name no capacity): every routed token reaches its experts, dropless, the profile's
    moe_capacity_permille 0. ``moe_pad_expert_input_to_capacity`` is refused (``PAD_TO_CAPACITY``);
    a top-level ``moe_config`` is skipped for mcore models (tools/register/template.py:699-700)."""
    mc = model_config(doc)
    if PAD_TO_CAPACITY in mc:
        raise NdplanError(f"{MC}.{PAD_TO_CAPACITY}", mc[PAD_TO_CAPACITY], "is not a MindFormers mcore key: "
                          "convert_to_transformer_config refuses unexpected keys (parallel_core/"
                          "transformer_config_utils.py:500-518 at f52743ca), and its mcore MoE pads no expert",
                          "drop the key (MindFormers' mcore MoE routes dropless)")
    moe = doc.get(MOE)
    if isinstance(moe, dict) and moe:
        notes.append(f"{MOE} ({', '.join(map(str, moe))}): skipped for mcore models (tools/register/template.py:"
                     "699-700); the MoE is defined by model_config")
    given = [k for k in MCORE_CAPACITY if k in mc]
    if len(given) == 2:
        raise NdplanError(f"{MC}.capacity_factor", mc["capacity_factor"], "sets moe_expert_capacity_factor a second "
                          "time, which convert_to_transformer_config refuses (transformer_config_utils.py:480-485, "
                          "518)", "keep one of the two keys")
    if not given or mc[given[0]] is None:
        return {}
    key = f"{MC}.{given[0]}"
    cf = mc[given[0]]
    if isinstance(cf, bool) or not isinstance(cf, (int, float)) or cf != cf or abs(cf) > 1e6:
        raise NdplanError(key, cf, "not a number", "give e.g. 1.5, or drop it (MindFormers' mcore MoE is dropless)")
    balancing = mc.get("moe_router_load_balancing_type", "sub_seq_aux_loss")
    if balancing not in CAPACITY_BALANCING:
        raise NdplanError(f"{MC}.moe_router_load_balancing_type", balancing, f"MindFormers refuses "
                          f"{given[0]} with it (transformer_config.py:536-543)",
                          f"use one of {', '.join(CAPACITY_BALANCING)}, or drop {given[0]}")
    if cf >= 0:
        notes.append(f"{given[0]} {cf:g}: accepted by MindFormers' TransformerConfig but read by no module of its "
                     "mcore MoE (parallel_core/training_graph/transformer/moe at f52743ca): routing stays dropless, "
                     "and is estimated so")
    return {}


def grad_shard_note(doc: dict, notes: list) -> None:
    """``gradient_accumulation_shard`` (default False, trainer/training_args.py:670-671 at f52743ca)
    shards the accumulated gradients over data_parallel; the mindspore profile keeps them whole."""
    if MFO.flag(doc, GRAD_SHARD):
        notes.append(f"{GRAD_SHARD.rsplit('.', 1)[1]}: the accumulated gradients sharded over data_parallel are "
                     "counted whole (not modelled)")


def engine(doc: dict, spec, *, dp: int, cp: int, zero: int, weight_bytes: int, mcore: bool, notes: list,
           moe_tp_without_sp: bool = False) -> str:
    """The mindspore engine with the settings above (settings equal to the profile's left out);
    ``moe_tp_without_sp``: a legacy moe_config recipe with tp > 1 and no sequence parallelism,
    which MindFormers runs up to 1.5.0 and refuses from 1.6.0 (engine_fields.py)."""
    from ndplan.engines import MINDSPORE, derive
    if moe_tp_without_sp:
        notes.append("MoE with model_parallel > 1 and use_seq_parallel off: estimated as MindFormers <= 1.5.0 runs "
                     "it (the legacy MoE's non-SP path); MindFormers >= 1.6.0 refuses it (tools/check_rules.py "
                     "_check_moe_parallel_valid): there, set use_seq_parallel: True")
    settings = (optimizer_settings(doc, spec, weight_bytes, mcore=mcore, dp=dp, zero=zero, notes=notes)
                | shard_settings(doc, dp, cp, zero, notes) | capacity_settings(doc, spec, mcore, notes)
                | {"moe_tp_without_sp": moe_tp_without_sp})
    grad_shard_note(doc, notes)
    return derive("mindspore", {k: v for k, v in settings.items() if getattr(MINDSPORE, k) != v})


def seq_split(doc: dict, pp: int, notes: list) -> None:
    """``parallel_config.seq_split_num`` n > 1 with a pipeline, as MindFormers@f52743ca takes it: the
    trainer wraps the network in SequenceSplit, which feeds each micro-batch as n slices of the
    sequence (trainer/base_trainer.py:510-515, modules/seq_pipe.py:64-118), and refuses it with full
    recompute (:512-514) and for mcore models (:546-550); LLaMA's attention refuses it without flash
    attention (models/llama/llama_transformer.py:203-205; GLM2's too, glm2/glm2_transformer.py:191-192),
    the legacy DeepSeek attention does not (research/deepseek3/deepseek2_model.py:665-695). Without a
    pipeline there is no SequenceSplit but the LLaMA model still tiles K/V n times against buffers
    of one sequence (llama.py:117-140, llama_transformer.py:522-526): refused too. Under
    ``pipeline_scheduler: seqpipe`` the estimate is 1f1b over whole sequences, with a note of what
    that leaves out (the held slices are checked against MindSpore's execute order in
    tests/test_mindformers_reader_more.py)."""
    n = positive(KEY["seq_split"], get(doc, KEY["seq_split"], 1), "parallel_config")
    if n == 1:
        return
    if pp == 1:
        raise NdplanError(KEY["seq_split"], n, "slices the sequence only with a pipeline (the trainer wraps "
                          "SequenceSplit when pipeline_stage > 1, trainer/base_trainer.py:509-515 at f52743ca), while "
                          "the LLaMA model sizes its K/V slice buffers by it anyway (models/llama/llama.py:117-140)",
                          f"set {KEY['seq_split']}: 1 with pipeline_stage 1")
    if is_mcore(doc):
        raise NdplanError(KEY["seq_split"], n, "MindFormers refuses seq_split_num > 1 for mcore models "
                          "(trainer/base_trainer.py:546-550 at f52743ca)", f"set {KEY['seq_split']}: 1")
    full = get(doc, KEY["full"], False)
    if full:  # a per-stage list is true too: the trainer tests the key's truth
        raise NdplanError(KEY["full"], full, f"MindFormers refuses full recompute with seq_split_num={n} "
                          "(trainer/base_trainer.py:512-514 at f52743ca)",
                          f"set {KEY['full']}: False, or {KEY['seq_split']}: 1")
    if not model_config(doc).get("use_flash_attention") and not is_deepseek(doc):
        raise NdplanError(f"{MC}.use_flash_attention", model_config(doc).get("use_flash_attention"),
                          f"seq_split_num={n} needs flash attention (MindFormers' LLaMA attention, "
                          "models/llama/llama_transformer.py:203-205 at f52743ca)",
                          f"set use_flash_attention: True, or {KEY['seq_split']}: 1")
    sched = str(get(doc, KEY["scheduler"], "1f1b"))
    if sched != "seqpipe":
        notes.append(f"seq_split_num={n} with pipeline_scheduler {sched}: the sequence slices are not modelled "
                     "(estimated over whole sequences)")
        return
    notes.append(
        f"pipeline_scheduler seqpipe (seq_split_num={n}) estimated as 1f1b over whole sequences; not modelled: "
        f"each micro-batch runs as {n} slices of seq/{n} tokens, backward last slice first, so stage i holds "
        f"pp-1-i+{n} slices, not pp-i sequences (MindSpore seqpipe_scheduler.cc:135-176, 306-315); every "
        "slice's flash attention keeps the whole sequence's K and V, and every attention layer keeps key_cache, "
        "value_cache and their gradient buffers (llama_transformer.py:206-215, 522-543). With m >= pp, the "
        f"estimate of stage i minus what it holds, per layer: (pp-1-i) x {n - 1}/{n} x A_tok - {n + 1} x A_kv "
        "(A_tok: a sequence's token-proportional activations; A_kv = 2 x mbs x seq/cp x n_kv_heads x head_dim/tp "
        "x 2 B), an upper bound where that is >= 0 (every stage but the last when K/V are a small share, as with "
        f"grouped-query heads); the last stage is under by {n + 1} x A_kv per layer and its logits are held "
        f"1/{n} at a time; also uncounted, one A_kv/2 kv_mask per held slice (llama.py:373-376)")
