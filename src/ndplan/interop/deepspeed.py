"""DeepSpeed config JSON -> Strategy (the inverse of export/deepspeed.py, with its key
table ``KEY``). The JSON carries neither the model, the device count nor the sequence
length: ``-m``, ``--gpus`` and ``--seq`` give them.

Mapping (DeepSpeed defaults where a key is absent): tp <- ``tensor_parallel.autotp_size``
(1), pp <- ``pipeline.stages`` (1), cp 1, dp = gpus / (tp pp); batch: train_batch_size =
train_micro_batch_size_per_gpu x gradient_accumulation_steps x dp, any two give the
third (DeepSpeed's rule; gas defaults to 1); zero <- ``zero_optimization.stage`` (0);
offload <- ``zero_optimization.offload_optimizer.device`` cpu or nvme; recompute full
when ``activation_checkpointing`` is present or ``pipeline.activation_checkpoint_interval``
> 0 (the JSON tunes the checkpointing the model code calls, assumed on every layer),
else none; sp off (AutoTP has no sequence parallelism); engine deepspeed.
"""

from __future__ import annotations

import json
from pathlib import Path

from ndplan.errors import NdplanError
from ndplan.export import deepspeed as X
from ndplan.export.common import flatten
from ndplan.interop.base import CheckInput, positive, resolve_model, world_dp
from ndplan.interop.textedit import json_edit, json_locate
from ndplan.strategy import Strategy

KEY = X.KEY


def _batch(flat: dict, dp: int, name: str) -> tuple[int, int]:
    """(mbs, gbs) from any two of train_batch_size, micro batch, accumulation steps."""
    vals = {k: flat.get(KEY[k]) for k in ("gbs", "mbs", "m")}
    for k, v in vals.items():
        if v == "auto":
            raise NdplanError(KEY[k], v, f"is filled in by the Hugging Face Trainer at launch (in {name})",
                              "write the number the Trainer will use (per-device batch, accumulation steps)")
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
    if gbs is None:
        gbs = mbs * (m or 1) * dp
    if m is not None and gbs != mbs * m * dp:
        raise NdplanError(KEY["gbs"], gbs, f"differs from micro batch x accumulation steps x dp = {mbs}*{m}*{dp}",
                          "make the batch keys agree (DeepSpeed refuses them too)")
    return mbs, gbs


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
    gpus, dp = world_dp(gpus, tp, pp, 1, "autotp_size x pipeline.stages", path.name)
    mbs, gbs_ = _batch(flat, dp, path.name)
    zero = flat.get(KEY["zero"], 0)
    if zero not in (0, 1, 2, 3):
        raise NdplanError(KEY["zero"], zero, "not a ZeRO stage", "give 0, 1, 2 or 3")
    ckpt = any(k.startswith("activation_checkpointing.") or k == "activation_checkpointing" for k in flat) \
        or (flat.get(KEY["ckpt_interval"]) or 0) > 0
    notes = ["activation checkpointing assumed on every layer (the model code decides)"] if ckpt else []
    strat = Strategy(dp=dp, tp=tp, pp=pp, mbs=mbs, gbs=gbs or gbs_, seq=seq, zero=zero, sp=tp == 1,
                     recompute="full" if ckpt else "none", engine="deepspeed",
                     offload_optimizer=str(flat.get(KEY["offload_device"], "none")) in ("cpu", "nvme"))
    strat.check(spec, gpus)
    loc = {k: v[0] + 1 for k, v in (json_locate(text) or {}).items()}
    org = {f: (f"line {loc[KEY[k]]}: {KEY[k]}" if KEY[k] in loc else "DeepSpeed default")
           for f, k in (("tp", "tp"), ("pp", "pp"), ("zero", "zero"), ("mbs", "mbs"), ("gbs", "gbs"))}
    org |= {"gpus": "--gpus", "seq": "--seq", "dp": "gpus / (tp*pp)", "recompute": "activation_checkpointing"}
    return CheckInput(path=path, fmt="deepspeed", text=text, model=spec, model_origin=origin, strategy=strat,
                      gpus=gpus, origin=org, lines=loc, notes=tuple(notes))


fields = X.fields
edit = json_edit
