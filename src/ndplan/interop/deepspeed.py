"""DeepSpeed config JSON -> Strategy (the inverse of export/deepspeed.py, with its key
table ``KEY``). The JSON carries neither the model, the device count nor the sequence
length: ``-m``, ``--gpus`` and ``--seq`` give them.

Mapping (DeepSpeed defaults where a key is absent): tp <- ``tensor_parallel.autotp_size``
(1), pp <- ``pipeline.stages`` (1), cp <- ``sequence_parallel_size`` (1; DeepSpeed-Ulysses:
DeepSpeedConfig's data-parallel world is world / sequence_parallel_size, runtime/config.py
L709-727 at deepspeedai/DeepSpeed@edaa7221), dp = gpus / (tp pp cp); ``"auto"`` batch
keys resolved as the Hugging Face Trainer does (``_auto``); batch: train_batch_size =
train_micro_batch_size_per_gpu x gradient_accumulation_steps x dp, any two give the
third (DeepSpeed's rule; gas defaults to 1); zero <- ``zero_optimization.stage`` (0);
offload <- ``zero_optimization.offload_optimizer.device`` cpu or nvme; recompute full
when ``activation_checkpointing`` is present or ``pipeline.activation_checkpoint_interval``
> 0 (the JSON tunes the checkpointing the model code calls, assumed on every layer),
else none; sp off (AutoTP has no sequence parallelism); engine deepspeed, with the
optimizer type, bf16 master weights / gradients / optimizer states, the BF16_Optimizer of
ZeRO-1 with fp32 gradient accumulation, the reduce bucket, ZeRO++ hpZ and ZeRO-3
``offload_param`` as its settings (interop.deepspeed_memory).
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


def _lines(text: str, flat: dict) -> dict[str, int]:
    """Dotted key -> 1-based line; a key inside an object written on one line
    (``"zero_optimization": {"stage": 2}``) takes that object's line."""
    raw = json_locate(text) or {}
    loc = {k: v[0] + 1 for k, v in raw.items()}
    for key in flat:
        parent = key
        while key not in loc and "." in parent:
            parent = parent.rsplit(".", 1)[0]
            if parent in raw and raw[parent][2] == -1:
                loc[key] = raw[parent][0] + 1
    return loc


def read(path: Path, text: str, *, model=None, gpus=None, seq=None, gbs=None) -> CheckInput:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise NdplanError("FILE", path.name, f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}",
                          "fix the syntax") from None
    if not isinstance(doc, dict):
        raise NdplanError("FILE", path.name, f"holds a JSON {type(doc).__name__}, not an object",
                          "a DeepSpeed config is a JSON object {...}")
    flat = flatten(doc)
    spec, origin = resolve_model(model, None, "", f"{path.name} (DeepSpeed JSON) carries no architecture")
    if seq is None:
        raise NdplanError("--seq", None, f"{path.name} (DeepSpeed JSON) has no sequence length", "give --seq N")
    tp = positive(KEY["tp"], flat.get(KEY["tp"], 1), path.name)
    pp = positive(KEY["pp"], flat.get(KEY["pp"], 1), path.name)
    cp = positive(KEY["cp"], flat.get(KEY["cp"], 1), path.name)
    gpus, dp = world_dp(gpus, tp, pp, cp, "autotp_size x pipeline.stages x sequence_parallel_size", path.name)
    notes: list[str] = []
    mbs, gbs_, _ = _batch(_auto(flat, dp, gbs, path.name, notes), dp, path.name)
    zero = flat.get(KEY["zero"], 0)
    if zero not in (0, 1, 2, 3):
        raise NdplanError(KEY["zero"], zero, "not a ZeRO stage", "give 0, 1, 2 or 3")
    ckpt = any(k.startswith("activation_checkpointing.") or k == "activation_checkpointing" for k in flat) \
        or (flat.get(KEY["ckpt_interval"]) or 0) > 0
    if ckpt:
        notes.append("activation checkpointing assumed on every layer (the model code decides)")
    if cp > 1:
        notes.append(f"{KEY['cp']} {cp}: DeepSpeed-Ulysses, estimated as cp={cp} (activations split over the "
                     "sequence; attention's all-to-all over heads is costed as CP's exchange)")
    offload = str(flat.get(KEY["offload_device"], "none")) in ("cpu", "nvme")
    strat = Strategy(dp=dp, tp=tp, pp=pp, cp=cp, mbs=mbs, gbs=gbs or gbs_, seq=seq, zero=zero, sp=tp == 1,
                     recompute="full" if ckpt else "none", engine=DM.engine(flat, zero, offload, spec.hidden_size, notes),
                     offload_optimizer=offload)
    strat.check(spec, gpus)
    loc = _lines(text, flat)
    org = {f: (f"line {loc[KEY[k]]}: {KEY[k]}" if KEY[k] in loc else "DeepSpeed default")
           for f, k in (("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("zero", "zero"), ("mbs", "mbs"), ("gbs", "gbs"),
                        ("m", "m"))}
    derived = "train_batch_size = micro batch x gradient_accumulation_steps x dp (DeepSpeed's rule)"
    for f in ("mbs", "gbs", "m"):
        if KEY[f] not in loc or flat.get(KEY[f]) == "auto":
            org[f] = "--gbs" if f == "gbs" and gbs is not None else derived
    org |= {"gpus": "--gpus", "seq": "--seq", "dp": "gpus / (tp*pp*sequence_parallel_size)",
            "recompute": "activation_checkpointing"}
    return CheckInput(path=path, fmt="deepspeed", text=text, model=spec, model_origin=origin, strategy=strat,
                      gpus=gpus, origin=org, lines=loc, notes=tuple(notes))


fields = X.fields
edit = json_edit
