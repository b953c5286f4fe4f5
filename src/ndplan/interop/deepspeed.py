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
calls, assumed on every layer), else none; sp off (AutoTP has no sequence parallelism); ep 1
(DeepSpeed MoE sets ep_size in code: a note for MoE models); engine deepspeed, with the
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


def _auto(flat: dict, dp: int, gbs: int | None, name: str, notes: list) -> dict:
    """The batch keys with ``"auto"`` resolved as the Hugging Face Trainer resolves them
    (transformers integrations/deepspeed.py ``trainer_config_process``: micro batch <-
    per_device_train_batch_size, accumulation <- gradient_accumulation_steps, train_batch_size
    <- world x micro x accumulation): from ``--gbs`` and the keys that are numbers, with the
    Trainer's default accumulation of 1; the one value that stays unknown is asked for."""
    vals = {k: flat.get(KEY[k]) for k in ("gbs", "mbs", "m")}
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
        raise NdplanError(KEY["mbs"], None, f"{name} sets neither {KEY['mbs']} nor {KEY['gbs']}", "add one")
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


MOE_EP = ("the expert-parallel degree is set in the model code (deepspeed/moe/layer.py:42 MoE(ep_size=...), e.g. "
          "Megatron-DeepSpeed's --moe-expert-parallel-size), not in the JSON: estimated with ep 1, every expert on "
          "every rank")
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
    elif not any(flat.get(k) in (True, "auto") for k in ("fp16.enabled", "bf16.enabled", "bfloat16.enabled")):
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
    flat = _Reads(flatten(doc))
    spec, origin = resolve_model(model, None, "", f"{path.name} (DeepSpeed JSON) carries no architecture")
    if seq is None:
        raise NdplanError("--seq", None, f"{path.name} (DeepSpeed JSON) has no sequence length", "give --seq N")
    notes: list[str] = []
    tp = positive(KEY["tp"], flat.get(KEY["tp"], 1), path.name)
    pp = _pipeline(flat, path.name, notes)
    cp = positive(KEY["cp"], flat.get(KEY["cp"], 1), path.name)
    gpus, dp = world_dp(gpus, tp, pp, cp, "autotp_size x pipeline.stages x sequence_parallel_size", path.name)
    mbs, gbs_, _ = _batch(_auto(flat, dp, gbs, path.name, notes), dp, path.name)
    zero = flat.get(KEY["zero"], 0)
    section = flat.get("zero_optimization")
    if section is not None and not isinstance(section, (bool, dict)):
        raise NdplanError("zero_optimization", section, "neither an object nor true/false",
                          'write "zero_optimization": {"stage": N}')
    if isinstance(flat.get("zero_optimization"), bool):
        # the deprecated form: stage 1 when true (runtime/zero/config.py:60-78 read_zero_config_deprecated)
        zero = int(flat["zero_optimization"])
        notes.append(f"zero_optimization {str(bool(zero)).lower()}: DeepSpeed's deprecated form, stage {zero} "
                     "(runtime/zero/config.py:60-78)")
    if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
        raise NdplanError(KEY["zero"], zero, "not a ZeRO stage", "give 0, 1, 2 or 3")
    if pp > 1 and zero >= 2:
        raise NdplanError(KEY["zero"], zero, "with pipeline stages is refused by DeepSpeed's pipeline engine "
                          "(\"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism\", runtime/pipe/engine.py:"
                          "76-77)", "use stage 0 or 1, or pipeline.stages 1")
    loc = _lines(text)
    ckpt, ckpt_origin = _checkpointing(flat, tp, loc, notes)
    if cp > 1:
        notes.append(f"{KEY['cp']} {cp}: DeepSpeed-Ulysses, estimated as cp={cp} (activations split over the "
                     "sequence; attention's all-to-all over heads is costed as CP's exchange)")
    if spec.is_moe:
        notes.append(f"{spec.name} is a MoE model: {MOE_EP}")
    _precision_notes(flat, notes)
    _removed_notes(flat, notes)
    offload = str(flat.get(KEY["offload_device"], "none")) in ("cpu", "nvme")
    run_zero, grad_dtype = DM.pipeline_bf16(flat, zero, pp, notes)
    engine = DM.engine(flat, run_zero, offload, spec.hidden_size, notes, pipeline_bf16=run_zero != zero)
    if run_zero == 3:
        DM.persistence_note(flat, spec, tp, dp * cp, spec.hidden_size, notes)
    strat = Strategy(dp=dp, tp=tp, pp=pp, cp=cp, mbs=mbs, gbs=gbs or gbs_, seq=seq, zero=run_zero, sp=tp == 1,
                     recompute="full" if ckpt else "none", engine=engine, offload_optimizer=offload,
                     grad_dtype=grad_dtype)
    strat.check(spec, gpus)
    org = {f: (f"line {loc[KEY[k]]}: {KEY[k]}" if KEY[k] in loc else "DeepSpeed default")
           for f, k in (("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("zero", "zero"), ("mbs", "mbs"), ("gbs", "gbs"),
                        ("m", "m"))}
    if isinstance(dict.get(flat, "zero_optimization"), bool) and "zero_optimization" in loc:
        org["zero"] = f"line {loc['zero_optimization']}: zero_optimization (deprecated true/false form)"
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
