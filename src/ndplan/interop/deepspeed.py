"""DeepSpeed config JSON -> Strategy (the inverse of export/deepspeed.py, with its key
table ``KEY``). The JSON carries neither the model, the device count nor the sequence
length: ``-m``, ``--gpus`` and ``--seq`` give them.

Mapping (DeepSpeed defaults where a key is absent): tp <- ``tensor_parallel.autotp_size``
(1), pp <- ``pipeline.stages`` (1; DeepSpeed itself takes the stages from
PipelineModule(num_stages=...) in the script, so the key is read as the record of that count,
with a note; ``"auto"`` asks for it), cp <- ``sequence_parallel_size`` (1; DeepSpeed-Ulysses:
DeepSpeedConfig's data-parallel world is world / sequence_parallel_size, runtime/config.py
L709-727 at deepspeedai/DeepSpeed@edaa7221), dp = gpus / (tp pp cp); ``"auto"`` batch
keys resolved as the Hugging Face Trainer does (``_auto``); batch: train_batch_size =
train_micro_batch_size_per_gpu x gradient_accumulation_steps x dp, any two give the
third (DeepSpeed's rule, runtime/config.py:590-645 at 0.19.8; gas defaults to 1); zero <-
``zero_optimization.stage`` (0; ZeRO-2/3 with pipeline stages are refused as the pipeline engine
refuses them, and stage 0 with bf16 under pipeline stages is the BF16_Optimizer's ZeRO-1,
deepspeed_memory.pipeline_bf16); offload <- ``zero_optimization.offload_optimizer.device`` cpu
or nvme; recompute full when ``activation_checkpointing`` is present or
``pipeline.activation_checkpoint_interval`` > 0 (the JSON tunes the checkpointing the model code
calls, assumed on every layer), else none; sp off (AutoTP has no sequence parallelism); ep <-
``expert_parallel.autoep_size`` where AutoEP is enabled and finds MoE blocks to replace (``_autoep``;
runtime/config.py:171-176, 588, runtime/engine.py:816-913), else 1 (DeepSpeed's native MoE sets ep_size
in code: a note for MoE models); ``"auto"`` bf16 / fp16 switches false as the Hugging Face Trainer fills
them by default (deepspeed_memory.precision_auto); with no batch key, ``--gbs`` is the
train_batch_size; engine deepspeed, with the
optimizer type, bf16 master weights / gradients / optimizer states, the BF16_Optimizer of
ZeRO-1 with fp32 gradient accumulation, the reduce bucket (none without contiguous_gradients),
ZeRO++ hpZ and qwZ, ZeRO-3 ``offload_param`` and the ZeRO-3 coordinator's prefetch, live and
reuse budgets as its settings (interop.deepspeed_memory).

Every key is either read (into the strategy, the engine, or a note saying what the estimate
does not model: qgZ, the persistence thresholds, partial offload, fp32 / amp training, ...) or
listed as not used (``CheckInput.unknown``), so no key is silently ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

from ndplan.errors import NdplanError
from ndplan.export import deepspeed as X
from ndplan.export.common import flatten
from ndplan.interop import deepspeed_memory as DM
from ndplan.interop.base import CheckInput, positive, resolve_model, world_dp
from ndplan.interop.textedit import json_edit, json_locate
from ndplan.strategy import Strategy

KEY = X.KEY


HF_GAS_DEFAULT = 1
"""transformers TrainingArguments.gradient_accumulation_steps default."""


def zero_stage(flat: dict, notes: list) -> int:
    """``zero_optimization.stage`` of a flattened config as DeepSpeed reads it: 0 without the
    section (runtime/zero/config.py:95), the deprecated true/false form as stage 1/0
    (config.py:60-78 read_zero_config_deprecated); anything else not a stage is a one-line error."""
    zero = flat.get(KEY["zero"], 0)
    section = flat.get("zero_optimization")
    if section is not None and not isinstance(section, (bool, dict)):
        raise NdplanError("zero_optimization", section, "neither an object nor true/false",
                          'write "zero_optimization": {"stage": N}')
    if isinstance(section, bool):
        zero = int(section)
        notes.append(f"zero_optimization {str(bool(zero)).lower()}: DeepSpeed's deprecated form, stage {zero} "
                     "(runtime/zero/config.py:60-78)")
    if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
        raise NdplanError(KEY["zero"], zero, "not a ZeRO stage", "give 0, 1, 2 or 3")
    return zero


def _auto(flat: dict, dp: int, gbs: int | None, name: str, notes: list) -> dict:
    """The batch keys with ``"auto"`` resolved as the Hugging Face Trainer resolves them
    (transformers integrations/deepspeed.py ``trainer_config_process``: micro batch <-
    per_device_train_batch_size, accumulation <- gradient_accumulation_steps, train_batch_size
    <- world x micro x accumulation): from ``--gbs`` and the keys that are numbers, with the
    Trainer's default accumulation of 1; the one value that stays unknown is asked for."""
    vals = {k: flat.get(KEY[k]) for k in ("gbs", "mbs", "m")}
    if gbs is not None and vals["gbs"] is None and vals["mbs"] is None:
        vals["gbs"] = gbs  # DeepSpeed's rule then derives the rest as from train_batch_size alone
        rule = ("with train_batch_size alone, gradient_accumulation_steps 1 and micro batch = train_batch_size / dp, "
                "runtime/config.py:637-640" if vals["m"] is None else
                "micro batch = train_batch_size / (gradient_accumulation_steps x dp), runtime/config.py:625-629")
        notes.append(f"{name} sets neither {KEY['gbs']} nor {KEY['mbs']}: --gbs {gbs} taken as {KEY['gbs']} "
                     f"(DeepSpeed's rule {rule})")
    autos = [k for k, v in vals.items() if v == "auto"]
    if not autos:
        return vals
    if vals["gbs"] == "auto":
        vals["gbs"] = gbs
    if vals["m"] == "auto":
        if vals["mbs"] not in (None, "auto") and vals["gbs"] is not None and isinstance(vals["gbs"], int):
            vals["m"] = None  # the rule below derives it
        else:
            vals["m"] = HF_GAS_DEFAULT
            notes.append(f"{KEY['m']} 'auto': the Trainer's default {HF_GAS_DEFAULT} "
                         "(pass --gbs if your --gradient_accumulation_steps differs)")
    if vals["mbs"] == "auto":
        if vals["gbs"] is None and gbs is not None:  # no train_batch_size key: DeepSpeed derives it
            vals["gbs"] = gbs
        if vals["gbs"] is None:
            raise NdplanError(KEY["mbs"], "auto", f"is filled in by the Hugging Face Trainer from "
                              f"--per_device_train_batch_size (in {name})",
                              "give --gbs N (= per-device batch x accumulation steps x data-parallel ranks)")
        vals["mbs"] = None  # derived from the global batch below
    notes.append(f"'auto' {', '.join(KEY[k] for k in autos)} resolved as the Hugging Face Trainer does "
                 "(train_batch_size = world x micro batch x accumulation steps)")
    return vals


def _batch(vals: dict, dp: int, name: str) -> tuple[int, int, int]:
    """(mbs, gbs, m) from any two of train_batch_size, micro batch, accumulation steps."""
    for k, v in vals.items():
        if v is not None:
            positive(KEY[k], v, name)
    gbs, mbs, m = vals["gbs"], vals["mbs"], vals["m"]
    if mbs is None and gbs is None:
        raise NdplanError(KEY["mbs"], None, f"{name} sets neither {KEY['mbs']} nor {KEY['gbs']} (DeepSpeed asserts "
                          "one, runtime/config.py:646-650)", "add one, or give --gbs N")
    if mbs is None:
        m = m or 1
        if gbs % (m * dp):
            raise NdplanError(KEY["gbs"], gbs, f"not a multiple of gradient_accumulation_steps*dp = {m * dp}",
                              "fix the batch keys")
        mbs = gbs // (m * dp)
    if m is None and gbs is not None:
        if gbs % (mbs * dp):
            raise NdplanError(KEY["gbs"], gbs, f"not a multiple of micro batch x dp = {mbs * dp}", "fix the batch keys")
        m = gbs // (mbs * dp)
    m = m or 1
    if gbs is None:
        gbs = mbs * m * dp
    if gbs != mbs * m * dp:
        raise NdplanError(KEY["gbs"], gbs, f"differs from micro batch x accumulation steps x dp = {mbs}*{m}*{dp}",
                          "make the batch keys agree (DeepSpeed refuses them too)")
    return mbs, gbs, m


def _lines(text: str) -> dict[str, int]:
    """Dotted key -> 1-based line of the key, in any JSON layout (textedit.json_locate)."""
    return {k: v[0] + 1 for k, v in (json_locate(text) or {}).items()}


LEGACY_OFFLOAD = {"zero_optimization.cpu_offload": "zero_optimization.offload_optimizer.device",
                  "zero_optimization.cpu_offload_param": "zero_optimization.offload_param.device"}
"""DeepSpeed's deprecated offload switches -> the keys its config builds from them (0.19.8
runtime/zero/config.py:188-219: ``new_param_fn`` gives the offload section device cpu when true)."""


TRUE_WORDS = (True, 1, "true", "True", "1", "yes", "on")
FALSE_WORDS = (False, 0, "false", "False", "0", "no", "off")
"""What pydantic's bool takes as true and as false (DeepSpeed's config models)."""


def _legacy_offload(flat: dict, notes: list) -> dict:
    """The flattened config with a deprecated offload switch read as DeepSpeed reads it; given with
    its replacement, refused as DeepSpeed refuses it (runtime/config_utils.py:89-91)."""
    out = dict(flat)
    for old, new in LEGACY_OFFLOAD.items():
        if old not in out:
            continue
        section = new.rsplit(".", 1)[0]
        if any(k.startswith(section + ".") or k == section for k in out if k != old):
            raise NdplanError(old, out[old], f"given with {section}: DeepSpeed refuses the deprecated key beside the "
                              "one that replaces it (runtime/config_utils.py:89-91)", f"drop {old}")
        value = out.pop(old)
        if value not in TRUE_WORDS + FALSE_WORDS or isinstance(value, float):
            raise NdplanError(old, value, "not a boolean (DeepSpeed's config refuses it)", "give true or false")
        if value in TRUE_WORDS:
            out[new] = "cpu"
            notes.append(f"{old} {value} (deprecated): DeepSpeed reads it as {new} cpu (runtime/zero/config.py:188-219)")
    return out


class _Reads(dict):
    """The flattened config; records every key the reader asks for (``get``, ``[]``, ``in``), so
    that the keys it never asks for are listed as not used (``_not_used``)."""

    def __init__(self, flat: dict):
        super().__init__(flat)
        self.used: set[str] = set()

    def get(self, key, default=None):
        self.used.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.used.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.used.add(key)
        return super().__contains__(key)


def _not_used(flat: _Reads) -> tuple[str, ...]:
    """Keys the reader did not read, a top-level section none of whose keys it read as
    ``section.*``; keys starting with "_" are comments (DeepSpeedConfig reads named keys only)."""
    keys = list(dict.keys(flat))
    unread = [k for k in keys if k not in flat.used and not k.startswith("_")]
    out: list[str] = []
    for k in unread:
        top = k.split(".")[0]
        section = [x for x in keys if x.split(".")[0] == top]
        item = f"{top}.*" if "." in k and len(section) > 1 and all(x in unread for x in section) else k
        if item not in out:
            out.append(item)
    return tuple(out)


MOE_EP = ("no expert_parallel block, so AutoEP is off (runtime/config.py:171-176, module_inject/auto_ep_config.py:"
          "48); DeepSpeed's native MoE sets its degree in the model code (deepspeed/moe/layer.py:42 MoE(ep_size=...), "
          "e.g. Megatron-DeepSpeed's --moe-expert-parallel-size): estimated with ep 1, every expert on every rank "
          "(for AutoEP add \"expert_parallel\": {\"enabled\": true, \"autoep_size\": N})")
AUTOEP = "expert_parallel"
AUTOEP_ROUTING = ("top_k", "score_func", "score_apply", "route_norm", "route_scale", "routed_scaling_factor",
                  "num_expert_groups", "num_limited_groups", "load_balance_coeff")
AUTOEP_DETECTION = ("preset_model", "moe_layer_pattern", "expert_pattern", "router_pattern", "expert_w1", "expert_w2",
                    "expert_w3", "num_experts_attr", "top_k_attr", "has_shared_experts", "shared_experts_pattern",
                    "shared_experts_gate_pattern", "expert_activation")
AUTOEP_KERNELS = ("use_grouped_mm", "disable_triton_grouped_mm", "gate_up_impl", "combine_impl", "row_weighting_impl",
                  "async_split_plan", "validate_folding_routing")
AUTOEP_COMM = ("comm_backend", "comm_num_sm", "comm_qp_margin", "comm_max_tokens_per_rank")
AUTOEP_KEYS = ("enabled", "autoep_size", "expert_tensor_parallel_size", *AUTOEP_ROUTING, *AUTOEP_DETECTION,
               *AUTOEP_KERNELS, *AUTOEP_COMM)
"""The keys of the ``expert_parallel`` block DeepSpeed 0.19.8 reads (module_inject/auto_ep_config.py:42-97
parse_autoep_config); others in the block are listed as not used."""


def _autoep_count(flat: dict, name: str, default: int) -> int:
    key = f"{AUTOEP}.{name}"
    v = flat.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise NdplanError(key, v, "not a positive integer (module_inject/auto_ep_folding.py:76-78)",
                          "give a whole number >= 1")
    return v


def _autoep_finds(spec, pp: int, preset, pattern) -> tuple[bool | None, str]:
    """(whether AutoEP finds MoE blocks to replace: True, False (it warns and replaces none) or None
    (it raises), why), from the model type, the preset or pattern named and the pipeline stages
    (module_inject/auto_ep.py:417-629 ep_parser; registry.py:156-185 resolve_preset_candidates)."""
    auto = X.autoep_preset(spec.model_type)
    named = preset is not None or pattern is not None
    if not spec.is_moe:
        if named:
            return None, f"{spec.name} has no MoE blocks, so AutoEP finds none and raises (auto_ep.py:622-624)"
        return False, f"{spec.name} has no MoE blocks: AutoEP warns and replaces none (auto_ep.py:622-625)"
    if pp > 1 and pattern is None:
        where = ("the pipeline engine's PipelineModule names its layers by index (runtime/pipe/module.py:250-255), "
                 "not model.layers.N.mlp as AutoEP's presets expect")
        if named:
            return None, f"{where}: AutoEP finds no MoE block and raises (auto_ep.py:622-624)"
        return False, (f"{where}: AutoEP warns and replaces none (auto_ep.py:622-625); name the blocks with "
                       "moe_layer_pattern")
    if pattern is not None:
        return True, f"moe_layer_pattern {pattern!r}, assumed to name {spec.name}'s MoE blocks"
    if preset is not None:
        extra = "" if auto == preset else f", applied to model_type {spec.model_type} (registry.py:162-165)"
        return True, f"its {preset} preset{extra}"
    if auto is not None:
        return True, f"its {auto} preset for model_type {spec.model_type}, registry.py:167-172"
    return False, (f"AutoEP has no preset for model_type {spec.model_type} (presets: {', '.join(X.AUTOEP_PRESETS)}) "
                   "and tries each preset's model.layers.N.mlp blocks with gate and experts children "
                   "(registry.py:182-185, auto_ep.py:622-625); set moe_layer_pattern (router_pattern, expert_pattern) "
                   "to the model's MoE blocks for AutoEP to replace them")


def _autoep_notes(flat: dict, spec, ep: int, notes: list) -> None:
    """The block's keys that change routing, detection, kernels or DeepEP's buffers, stated."""
    def set_(names):
        return [k for k in names if f"{AUTOEP}.{k}" in dict.keys(flat)]
    top_k = dict.get(flat, f"{AUTOEP}.top_k", "auto")
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k != spec.experts_per_token:
        notes.append(f"{AUTOEP}.top_k {top_k}: read, not modelled: AutoEP routes each token to {top_k} experts "
                     f"(auto_ep.py:492-494); the estimate to {spec.name}'s {spec.experts_per_token}")
    if dict.get(flat, f"{AUTOEP}.comm_backend") == "deepep" and ep > 1:
        notes.append(f"{AUTOEP}.comm_backend deepep: read, not modelled: DeepEP's dispatch buffers (sized by "
                     "comm_max_tokens_per_rank) are not counted; the all-to-all is costed as DeepSpeed's own")
    rest = [k for k in set_(AUTOEP_ROUTING + AUTOEP_DETECTION + AUTOEP_KERNELS + AUTOEP_COMM)
            if k not in ("top_k", "comm_backend", "preset_model", "moe_layer_pattern")]
    if rest:
        notes.append(f"{AUTOEP}.{{{', '.join(rest)}}}: read, not modelled: which modules AutoEP replaces, how it "
                     "routes and which kernels it runs (module_inject/auto_ep_config.py:42-97); the estimate takes "
                     f"the experts and routing of {spec.name}")


def _autoep(flat: dict, spec, tp: int, pp: int, cp: int, dp: int, zero: int, notes: list) -> int:
    """ep from AutoEP's ``expert_parallel`` block, as DeepSpeed 0.19.8 runs it (runtime/engine.py:816-913):
    nothing unless ``enabled`` (default false); ep = ``autoep_size`` where AutoEP finds MoE blocks to
    replace: with ``preset_model`` or ``moe_layer_pattern``, or a model type one of its presets names
    (export.deepspeed.AUTOEP_PRESETS), and one pipeline stage (the presets' model.layers.N.mlp is not a
    PipelineModule's layer name, runtime/pipe/module.py:250-255); the layouts it refuses raise
    (export.deepspeed.AUTOEP_RULES); the routing, detection, kernel and DeepEP keys are stated in notes."""
    block = dict.get(flat, AUTOEP)
    present = [k for k in dict.keys(flat) if k.startswith(AUTOEP + ".")]
    if block is not None and not present and block not in ({}, False, None):
        raise NdplanError(AUTOEP, block, "not an object (module_inject/auto_ep_config.py:42-46 reads its keys)",
                          'write "expert_parallel": {"enabled": true, "autoep_size": N}')
    if block is not None:
        flat.used.add(AUTOEP)
    if not present:
        if spec.is_moe:
            notes.append(f"{spec.name} is a MoE model: {MOE_EP}")
        return 1
    for k in AUTOEP_KEYS:
        flat.get(f"{AUTOEP}.{k}")
    lbc = dict.get(flat, f"{AUTOEP}.load_balance_coeff")
    if lbc is not None:  # raised as the config is parsed, even with AutoEP off
        raise NdplanError(f"{AUTOEP}.load_balance_coeff", lbc, "is refused by DeepSpeed's AutoEP "
                          "(module_inject/auto_ep_config.py:73-76)", "set it to null or drop the key")
    enabled = flat.get(KEY["ep_enabled"], False)
    if not isinstance(enabled, bool):
        raise NdplanError(KEY["ep_enabled"], enabled, "not true or false (DeepSpeed tests its truth, "
                          "runtime/engine.py:820-822)", 'write "enabled": true')
    if not enabled:
        notes.append(f"{AUTOEP}.enabled false (its default, module_inject/auto_ep_config.py:48): AutoEP is off, the "
                     f"block's other keys have no effect (runtime/engine.py:820-822); estimated with ep 1")
        return 1
    size = _autoep_count(flat, "autoep_size", 1)
    etp = _autoep_count(flat, "expert_tensor_parallel_size", 1)
    preset, pattern = flat.get(KEY["ep_preset"]), flat.get(f"{AUTOEP}.moe_layer_pattern")
    if preset is not None and preset not in X.AUTOEP_PRESETS:
        raise NdplanError(KEY["ep_preset"], preset, "not an AutoEP preset (module_inject/auto_ep_config.py:176-179)",
                          f"give one of {', '.join(X.AUTOEP_PRESETS)}")
    tp_preset = flat.get("tensor_parallel.preset_model")
    if preset is not None and tp_preset is not None and tp_preset != preset:
        raise NdplanError(KEY["ep_preset"], preset, f"differs from tensor_parallel.preset_model {tp_preset!r}, which "
                          "AutoEP refuses (module_inject/auto_ep_folding.py:235-238)", "make the two presets match")
    off = any(k.startswith(("zero_optimization.offload_optimizer", "zero_optimization.offload_param"))
              for k in dict.keys(flat))  # a section set at all (engine.py:862-863 tests `is not None`)
    layout = dict(tp=tp, pp=pp, cp=cp, ep=size, etp=etp, zero=zero, offload=off,
                  hpz=dict.get(flat, DM.HPZ, 1), qgz=dict.get(flat, DM.QGZ) is True)
    for key, bad, refused, where in ((f"{AUTOEP}.async_split_plan", True, size > 1, "133-135"),
                                     (f"{AUTOEP}.combine_impl", "fused_weighted_sum", True, "138-143")):
        if tp > 1 and refused and dict.get(flat, key) == bad:
            raise NdplanError(key, bad, f"is refused with AutoEP+AutoTP folding (autotp_size {tp}; "
                              f"module_inject/auto_ep_config.py:{where})", "drop it, or use autotp_size 1")
    stage = dp * tp * cp  # the ranks of a pipeline stage, which the expert groups tile
    if stage % (size * etp):
        raise NdplanError(KEY["ep"], size, f"autoep_size x expert_tensor_parallel_size = {size * etp} does not divide "
                          f"the {stage} ranks of a stage (module_inject/auto_ep_folding.py:111-115)",
                          "choose a divisor of gpus / pipeline stages")
    found, why = _autoep_finds(spec, pp, preset, pattern)
    rule = X.autoep_refusal(X.AutoEPLayout(**layout, moe=bool(found)))
    if rule is not None:
        _, key, problem, fix = rule
        value = {KEY["tp"]: tp, KEY["cp"]: cp, KEY["ep"]: size, KEY["etp"]: etp}.get(key)
        value = dict.get(flat, key, True) if value is None else value
        raise NdplanError(key, value, f"with {KEY['ep_enabled']} true: {problem}", fix)
    if found and (size > spec.num_experts or spec.num_experts % size):
        raise NdplanError(KEY["ep"], size, f"does not divide the {spec.num_experts} experts of {spec.name} "
                          "(module_inject/auto_ep_config.py:369-383)", "choose a divisor of the expert count")
    if found is None:
        raise NdplanError(KEY["ep_preset"] if preset is not None else f"{AUTOEP}.moe_layer_pattern",
                          preset if preset is not None else pattern, why, "drop it, or the expert_parallel block")
    if not found:
        notes.append(f"{KEY['ep']} {size}: {why}; estimated with ep 1, every expert on every rank")
        return 1
    _autoep_notes(flat, spec, size, notes)
    notes.append(f"{KEY['ep']} {size}: DeepSpeed AutoEP ({why}) replaces each MoE block, lays the experts over groups "
                 f"of {size} consecutive ranks of a stage and shards their ZeRO states over the {stage // size} "
                 "expert-data-parallel ranks (runtime/engine.py:816-913, utils/groups.py:370-534)")
    return size


PIPE_STAGES = ("DeepSpeed does not read it: the stage count is PipelineModule(num_stages=...) in the script "
               "(runtime/pipe/module.py:127-142; DeepSpeedConfig keeps pipeline.stages at its default \"auto\", "
               "runtime/config.py:272-285)")


def _pipeline(flat: dict, name: str, notes: list) -> int:
    """pp from ``pipeline.stages``: DeepSpeed itself never reads the key (PIPE_STAGES), so it is taken
    as the record of the script's stage count, and a ``pipeline`` section without it is estimated at
    pp 1 with a note."""
    v = flat.get(KEY["pp"])
    if v == "auto":
        raise NdplanError(KEY["pp"], "auto", f"({name}): {PIPE_STAGES}", "write the script's stage count, e.g. "
                          '"pipeline": {"stages": 2}')
    if v is None:
        if any(k.startswith("pipeline.") for k in dict.keys(flat)):
            notes.append(f"pipeline section without stages: {PIPE_STAGES}; estimated with pp 1 (add \"stages\": N "
                         "for the script's count)")
        return 1
    pp = positive(KEY["pp"], v, name)
    if pp > 1:
        notes.append(f"{KEY['pp']} {pp}: {PIPE_STAGES}; taken as the script's stage count")
    return pp


def _checkpointing(flat: dict, tp: int, loc: dict, notes: list) -> tuple[bool, str]:
    """(full recompute?, origin): the ``activation_checkpointing`` section or a pipeline checkpoint
    interval > 0 (runtime/pipe/engine.py:217-218), with notes for its keys that move or split the
    checkpoints (runtime/activation_checkpointing/config.py)."""
    section = [k for k in dict.keys(flat)
               if k == "activation_checkpointing" or k.startswith("activation_checkpointing.")]
    interval = flat.get(KEY["ckpt_interval"], 0)
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 0:
        raise NdplanError(KEY["ckpt_interval"], interval, "not a layer count (runtime/pipe/engine.py:217-218 "
                          "compares it with 0)", "give 0 (off) or a whole number of layers such as 1")
    if not section and interval <= 0:
        return False, ("DeepSpeed default none (no activation_checkpointing section; a script that checkpoints in "
                       "code, e.g. Megatron-DeepSpeed's --checkpoint-activations, is not visible in the JSON)")
    notes.append("activation checkpointing assumed on every layer (the model code decides)")
    if flat.get(KEY["ckpt_partition"]) is True and tp > 1:
        notes.append(f"{KEY['ckpt_partition']}: read, not modelled: each checkpointed layer input is split over the "
                     f"{tp} tensor-parallel ranks (runtime/activation_checkpointing/checkpointing.py "
                     "partition_activations); the estimate keeps it whole")
    if flat.get(KEY["ckpt_cpu"]) is True:
        notes.append(f"{KEY['ckpt_cpu']}: read, not modelled: the checkpointed layer inputs are moved to host "
                     "memory; the estimate keeps them on the device")
    key = KEY["ckpt_interval"] if interval > 0 else section[0]
    return True, (f"line {loc[key]}: {key}" if key in loc else key)


REMOVED_KEYS = ("nebula", "compression_training", "amp", "quantize_training", "sparse_gradients", "eigenvalue",
                "sparse_attention", "elasticity", "graph_harvesting", "curriculum_learning", "progressive_layer_drop",
                "zero_optimization.mics_shard_size", "zero_optimization.mics_hierarchical_params_gather",
                "zero_optimization.zeropp_loco_param")
"""Keys DeepSpeed 0.19.8 refuses as removed features (runtime/config.py:81-131
_REMOVED_TOP_LEVEL_CONFIG_KEYS and _REMOVED_ZERO_CONFIG_KEYS, raised by
_reject_removed_config_keys, :133-141): files written for older DeepSpeed versions."""


def _removed_notes(flat: dict, notes: list) -> None:
    present = [k for k in REMOVED_KEYS if k in flat or any(x.startswith(k + ".") for x in dict.keys(flat))]
    for k in present:
        flat.used.update(x for x in dict.keys(flat) if x == k or x.startswith(k + "."))
    if present:
        notes.append(f"{', '.join(present)}: removed from DeepSpeed, whose 0.19.8 config refuses the file "
                     "(runtime/config.py:81-141, DeepSpeedConfigError); older versions ran it; the estimate ignores "
                     f"{'it' if len(present) == 1 else 'them'}")


def _precision_notes(flat: dict, notes: list) -> None:
    """fp32 training and the torch_autocast section, read and stated: the estimate keeps
    16-bit weights beside an fp32 master (DeepSpeed's model dtype: runtime/engine.py:1799-1810)."""
    if flat.get("torch_autocast.enabled") is True:
        notes.append("torch_autocast.enabled: read, not modelled: the weights stay fp32 and only the autocast ops "
                     "compute in 16 bits; estimated as 16-bit weights with an fp32 master")
    elif not (DM.flag(flat.get("fp16.enabled", False)) or DM.bf16_enabled(flat)):
        notes.append("neither fp16 nor bf16 is enabled: DeepSpeed trains in fp32 (runtime/engine.py:1799-1810: 4-byte "
                     "weights and gradients, no master copy); estimated as 16-bit weights with an fp32 master "
                     "(not modelled)")


def read(path: Path, text: str, *, model=None, gpus=None, seq=None, gbs=None) -> CheckInput:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise NdplanError("FILE", path.name, f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}",
                          "fix the syntax") from None
    if not isinstance(doc, dict):
        raise NdplanError("FILE", path.name, f"holds a JSON {type(doc).__name__}, not an object",
                          "a DeepSpeed config is a JSON object {...}")
    notes: list[str] = []
    flat = _Reads(_legacy_offload(flatten(doc), notes))
    spec, origin = resolve_model(model, None, "", f"{path.name} (DeepSpeed JSON) carries no architecture")
    if seq is None:
        raise NdplanError("--seq", None, f"{path.name} (DeepSpeed JSON) has no sequence length", "give --seq N")
    tp = positive(KEY["tp"], flat.get(KEY["tp"], 1), path.name)
    pp = _pipeline(flat, path.name, notes)
    cp = positive(KEY["cp"], flat.get(KEY["cp"], 1), path.name)
    gpus, dp = world_dp(gpus, tp, pp, cp, "autotp_size x pipeline.stages x sequence_parallel_size", path.name)
    mbs, gbs_, _ = _batch(_auto(flat, dp, gbs, path.name, notes), dp, path.name)
    zero = zero_stage(flat, notes)
    if pp > 1 and zero >= 2:
        raise NdplanError(KEY["zero"], zero, "with pipeline stages is refused by DeepSpeed's pipeline engine "
                          "(\"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism\", runtime/pipe/engine.py:"
                          "76-77)", "use stage 0 or 1, or pipeline.stages 1")
    loc = _lines(text)
    ckpt, ckpt_origin = _checkpointing(flat, tp, loc, notes)
    if cp > 1:
        notes.append(f"{KEY['cp']} {cp}: DeepSpeed-Ulysses, estimated as cp={cp} (activations split over the "
                     "sequence; attention's all-to-all over heads is costed as CP's exchange)")
    DM.precision_auto(flat, notes)
    _precision_notes(flat, notes)
    _removed_notes(flat, notes)
    offload = str(flat.get(KEY["offload_device"], "none")) in ("cpu", "nvme")
    run_zero, grad_dtype = DM.pipeline_bf16(flat, zero, pp, notes)
    engine = DM.engine(flat, run_zero, offload, spec.hidden_size, notes, pipeline_bf16=run_zero != zero)
    ep = _autoep(flat, spec, tp, pp, cp, dp, run_zero, notes)
    if run_zero == 3:
        DM.persistence_note(flat, spec, tp, dp * cp, spec.hidden_size, notes)
    strat = Strategy(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, mbs=mbs, gbs=gbs or gbs_, seq=seq, zero=run_zero, sp=tp == 1,
                     recompute="full" if ckpt else "none", engine=engine, offload_optimizer=offload,
                     grad_dtype=grad_dtype)
    strat.check(spec, gpus)
    org = {f: (f"line {loc[KEY[k]]}: {KEY[k]}" if KEY[k] in loc else "DeepSpeed default")
           for f, k in (("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("zero", "zero"), ("mbs", "mbs"), ("gbs", "gbs"),
                        ("m", "m"))}
    if isinstance(dict.get(flat, "zero_optimization"), bool) and "zero_optimization" in loc:
        org["zero"] = f"line {loc['zero_optimization']}: zero_optimization (deprecated true/false form)"
    org["ep"] = f"line {loc[KEY['ep']]}: {KEY['ep']}" if ep > 1 and KEY["ep"] in loc else "DeepSpeed default"
    if run_zero != zero:
        org["zero"] += " with bf16 and pipeline stages: BF16_Optimizer (runtime/engine.py:582, 2313-2320, 2363-2364)"
    derived = "train_batch_size = micro batch x gradient_accumulation_steps x dp (DeepSpeed's rule)"
    for f in ("mbs", "gbs", "m"):
        if KEY[f] not in loc or flat.get(KEY[f]) == "auto":
            org[f] = "--gbs" if f == "gbs" and gbs is not None else derived
    org |= {"gpus": "--gpus", "seq": "--seq", "dp": "gpus / (tp*pp*sequence_parallel_size)",
            "recompute": ckpt_origin}
    return CheckInput(path=path, fmt="deepspeed", text=text, model=spec, model_origin=origin, strategy=strat,
                      gpus=gpus, origin=org, lines=loc, unknown=_not_used(flat), notes=tuple(notes))


fields = X.fields
edit = json_edit
