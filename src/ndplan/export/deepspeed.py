"""DeepSpeed config JSON (``--emit deepspeed``).

Key names are those of deepspeedai/DeepSpeed:deepspeed/runtime/config.py and
deepspeed/runtime/constants.py (``train_batch_size``, ``train_micro_batch_size_per_gpu``,
``gradient_accumulation_steps``, ``bf16.enabled``, ``pipeline`` with ``stages`` and
``activation_checkpoint_interval`` from ``get_pipeline_config``),
deepspeed/runtime/zero/config.py (``zero_optimization.stage``, ``offload_optimizer``
with ``device``/``pin_memory``), deepspeed/runtime/activation_checkpointing/config.py
(``activation_checkpointing.partition_activations``, ``contiguous_memory_optimization``,
``cpu_checkpointing``) and deepspeed/runtime/tensor_parallel/config.py
(``tensor_parallel.autotp_size``, AutoTP training); the deepspeed engine's settings are written
as the keys interop/deepspeed_memory.py reads them from (``_engine_keys``), the ZeRO-3
coordinator's budgets as ``stage3_prefetch_bucket_size`` / ``stage3_max_live_parameters`` /
``stage3_max_reuse_distance`` where they differ from DeepSpeed's defaults and ZeRO++ qwZ as
``zero_quantized_weights``.

train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x dp
= mbs x m x dp = gbs; cp -> ``sequence_parallel_size`` (DeepSpeed-Ulysses: DeepSpeedConfig
takes dp = world / sequence_parallel_size, runtime/config.py L709-727 at deepspeedai/
DeepSpeed@edaa7221); ep -> AutoEP's ``expert_parallel`` block (``enabled``, ``autoep_size``,
``preset_model``; DeepSpeed 0.19.8 runtime/config.py:171-176, 588, runtime/engine.py:816-913) where
AutoEP runs it (``AUTOEP_RULES``, ``_expert_parallel``). Not expressible in the JSON (NdplanError, with
the fix): expert parallelism AutoEP refuses or cannot find (etp > 1, a model type without an AutoEP
preset, pipeline stages; DeepSpeed's native ``deepspeed.moe.layer.MoE(ep_size=...)`` is set in
code), interleaving (vpp > 1) and
schedules other than 1F1B (the pipeline engine's TrainSchedule), ZeRO 2/3 with pp > 1
(the pipeline engine allows stage 0 or 1), uneven layers (``PipelineModule
(partition_method=...)`` in code), selective or partial recompute (the JSON only tunes
the checkpointing that the model code calls on whole layers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ndplan import rules
from ndplan.autoep import (AUTOEP_PRESETS, AUTOEP_RULES, KEY as AUTOEP_KEY, AutoEPLayout,  # noqa: F401 (re-exported)
                           autoep_preset, autoep_refusal, autoep_refused, autoep_why)
from ndplan.catalog.model import ModelSpec
from ndplan.export.common import cannot, layers_per_chunk, nest, recompute_counts, refuse_engine_rules
from ndplan.strategy import Strategy

TARGET = "DeepSpeed config JSON"
KEY = {"cp": AUTOEP_KEY["cp"], "gbs": "train_batch_size", "mbs": "train_micro_batch_size_per_gpu", "m": "gradient_accumulation_steps",
       "bf16": "bf16.enabled", "zero": "zero_optimization.stage",
       "offload_device": "zero_optimization.offload_optimizer.device",
       "offload_pin": "zero_optimization.offload_optimizer.pin_memory", "tp": AUTOEP_KEY["tp"],
       "pp": "pipeline.stages", "ckpt_interval": "pipeline.activation_checkpoint_interval",
       "ckpt_partition": "activation_checkpointing.partition_activations",
       "ckpt_contiguous": "activation_checkpointing.contiguous_memory_optimization",
       "ckpt_cpu": "activation_checkpointing.cpu_checkpointing", "ep_enabled": "expert_parallel.enabled",
       "ep": AUTOEP_KEY["ep"], "etp": AUTOEP_KEY["etp"],
       "ep_preset": "expert_parallel.preset_model"}
"""Strategy knob -> dotted JSON key: the one table the exporter and the reader
(interop/deepspeed.py) use."""


def _expert_parallel(model: ModelSpec, s: Strategy) -> dict:
    """ep -> AutoEP's block where DeepSpeed 0.19.8 runs it: the model type has a preset (else AutoEP
    finds nothing to replace), one pipeline stage (the presets' module path model.layers.N.mlp is not
    a PipelineModule's, whose layers are named by index: runtime/pipe/module.py:250-255), AUTOEP_RULES
    (``autoep_why``, which rules.py's deepspeed AutoEP rule reads too)."""
    if s.ep == 1 and s.etp == 1:
        return {}
    c = rules.WithModel(s, model)
    if bool(autoep_refused(c)):
        problem, fix = autoep_why(c)
        field = "etp" if s.etp != 1 else "ep"
        raise cannot(TARGET, field, getattr(s, field), f"{problem}; {fix}")
    return {KEY["ep_enabled"]: True, KEY["ep"]: s.ep, KEY["ep_preset"]: autoep_preset(model.model_type)}


def _check(model: ModelSpec, s: Strategy, layers, full, sel) -> dict:
    """Refuse what the JSON cannot say (NdplanError); the expert-parallel keys."""
    ep_doc = _expert_parallel(model, s)
    c = rules.WithModel(s, model, engine="deepspeed")  # what DeepSpeed runs
    refuse_engine_rules(TARGET, c, ("schedule", "zero"))
    if s.pp > 1 and len(set(layers)) > 1:
        raise cannot(TARGET, "layers_per_stage", list(layers),
                     "give PipelineModule(partition_method=...) in code; an even split here")
    if s.offload_optimizer and s.zero == 0:
        raise cannot(TARGET, "offload_optimizer", True, "ZeRO-Offload needs zero_optimization.stage >= 1")
    if max(sel):
        raise cannot(TARGET, "recompute", "selective", "DeepSpeed checkpoints whole layers; use none or full")
    if max(full) and any(f < n for f, n in zip(full, layers)):
        raise cannot(TARGET, "recompute_layers", list(full), "the JSON cannot pick layers; recompute all or none")
    refuse_engine_rules(TARGET, c, ("sp",))  # the reader takes sp off at tp > 1 (interop/deepspeed.py)
    return ep_doc


def fields(model: ModelSpec, strat: Strategy, *, balance=None) -> tuple[dict, list[str]]:
    """(dotted key -> value; notes) expressing ``strat``."""
    s = strat
    layers = layers_per_chunk(model, s, balance)
    full, sel = recompute_counts(model, s, balance)
    ep_doc = _check(model, s, layers, full, sel)
    doc = {KEY["gbs"]: s.gbs, KEY["mbs"]: s.mbs, KEY["m"]: s.m, KEY["bf16"]: True, KEY["zero"]: s.zero}
    if s.offload_optimizer:
        doc |= {KEY["offload_device"]: "cpu", KEY["offload_pin"]: True}
    notes = []
    if s.tp > 1:
        doc[KEY["tp"]] = s.tp
    doc |= ep_doc
    if s.cp > 1:
        doc[KEY["cp"]] = s.cp
        notes.append("sequence_parallel_size: DeepSpeed divides the world by it (runtime/config.py, world_size); "
                     "the model's attention must also be wrapped for Ulysses (runtime/sequence_parallel/"
                     "ulysses_sp.py UlyssesSPAttentionHF.register_with_transformers)")
    if s.pp > 1:
        doc |= {KEY["pp"]: s.pp, KEY["ckpt_interval"]: 1 if max(full) else 0}
        doc, pipe_notes = _pipeline_precision(s, doc)
        notes += pipe_notes
    if max(full):
        doc |= {KEY["ckpt_partition"]: s.tp > 1, KEY["ckpt_contiguous"]: False, KEY["ckpt_cpu"]: False}
    engine_doc, engine_notes = _engine_keys(s)
    return doc | engine_doc, notes + engine_notes


def _pipeline_bf16(s: Strategy) -> bool:
    """The BF16_Optimizer with bf16 gradient accumulation that DeepSpeed's pipeline engine builds at
    stage 0 with bf16 (interop.deepspeed_memory.pipeline_bf16): ZeRO-1 with a bf16 gradient buffer."""
    from ndplan.engines import profile
    return s.pp > 1 and s.zero == 1 and s.grad_dtype == "bf16" and profile(s.engine).fp32_grad_accumulation


def _pipeline_precision(s: Strategy, doc: dict) -> tuple[dict, list[str]]:
    """Under the pipeline engine a bf16 model at stage 0 gets BF16_Optimizer, which shards the
    optimizer states (runtime/engine.py:582, 2313-2320): that optimizer is written as stage 0 with
    bf16 (``_pipeline_bf16``), and ZeRO-0 itself as fp16, whose FP16_Optimizer keeps them whole
    (engine.py:2321, 2360-2362)."""
    if _pipeline_bf16(s):
        return doc | {KEY["zero"]: 0}, []
    if s.zero == 0:
        return {k: v for k, v in doc.items() if k != KEY["bf16"]} | {"fp16.enabled": True}, [
            "fp16: with pipeline stages DeepSpeed runs a bf16 model at ZeRO stage 0 with BF16_Optimizer, which shards "
            "the optimizer states (runtime/engine.py:2313-2320); fp16's FP16_Optimizer keeps them whole as zero=0 "
            "does (for bf16 use zero=1)"]
    return doc, []


def _engine_keys(s: Strategy) -> tuple[dict, list[str]]:
    """The deepspeed engine's settings as the keys interop.deepspeed_memory reads them from."""
    from ndplan.engines import DEEPSPEED, profile
    from ndplan.interop import deepspeed_memory as DM
    eng, doc, notes = profile(s.engine), {}, []
    if eng.master_bytes == 2:
        doc[DM.BF16_MASTER] = True
        if eng.optimizer_bytes * 2 == DEEPSPEED.optimizer_bytes:
            doc[DM.BF16_STATES] = True
    elif (eng.optimizer_bytes, eng.non_matrix_optimizer_bytes) == (4, 8):
        doc["optimizer.type"] = "Muon"
    elif eng.optimizer_bytes == 4:
        doc["optimizer.type"] = "Lion"
        notes.append("one optimizer state per parameter is written as Lion (Adagrad and SGD with momentum keep the same)")
    elif eng.optimizer_bytes == 0:
        doc["optimizer.type"] = "SGD"
    if eng.secondary_weight_shard > 1:
        doc[DM.HPZ] = eng.secondary_weight_shard
    if eng.weights_offloaded:
        doc |= {DM.OFFLOAD_PARAM: "cpu", "zero_optimization.offload_param.pin_memory": True}
    if s.zero == 3 and eng.zero3_param_coordinator:
        for key, (setting, default) in DM.ZERO3_BUDGETS.items():
            if getattr(eng, setting) != default:
                doc[key] = getattr(eng, setting)
        if eng.zero3_quantized_weights:
            doc[DM.QWZ] = True
    if eng.fp32_grad_accumulation and s.zero == 1:
        if not _pipeline_bf16(s):  # the pipeline's BF16_Optimizer accumulates in the model dtype
            doc[DM.GRAD_ACCUM] = "fp32"
        doc[DM.IMMEDIATE] = eng.lp_grad_bytes == 0
    if s.zero >= 1 and not _pipeline_bf16(s):  # BF16_Optimizer allocates no reduce bucket
        doc[DM.BUCKET] = eng.reduce_bucket_elements or DEEPSPEED.reduce_bucket_elements
        doc[DM.OVERLAP] = bool(eng.reduce_bucket_double or eng.overlap_grad_reduce) if s.zero in (1, 2) else True
    if eng.grad_comm_bytes == 4:  # bf16 training reduces in bf16 unless told (interop.deepspeed_memory.comm_settings)
        doc[DM.COMM_DTYPE] = "fp32"
    return doc, notes


def emit(model: ModelSpec, strat: Strategy, *, balance=None) -> str:
    doc, _ = fields(model, strat, balance=balance)
    return json.dumps(nest(doc), indent=2) + "\n"
