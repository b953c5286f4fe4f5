"""What a reader returns (``CheckInput``) and the small helpers the readers share."""

from __future__ import annotations

import re

from dataclasses import dataclass, field
from pathlib import Path

from ndplan import limits
from ndplan.catalog.model import ModelSpec, load_model
from ndplan.errors import NdplanError, warn
from ndplan.points import data_parallel
from ndplan.strategy import Strategy


@dataclass(frozen=True, kw_only=True)
class CheckInput:
    path: Path
    """The file read."""
    fmt: str
    """megatron | torchtitan | deepspeed | mindformers."""
    text: str
    """The file's text (proposals are diffs against it)."""
    model: ModelSpec
    model_origin: str
    """Where the architecture came from (``-m NAME`` or the file's keys)."""
    strategy: Strategy
    gpus: int
    origin: dict[str, str] = field(default_factory=dict)
    """Strategy field (and ``gpus``) -> where its value came from: ``line N: key = value``,
    a command-line flag, or the framework's default."""
    lines: dict[str, int] = field(default_factory=dict)
    """File key (flag or dotted key) -> 1-based line number."""
    unknown: tuple[str, ...] = ()
    """Flags / keys the reader does not use (listed, not errors)."""
    notes: tuple[str, ...] = ()
    """What the file says that the estimate does not model, and defaults taken."""
    mem_limit_bytes: int | None = None
    """A device-memory cap the file sets (MindFormers ``context.max_device_memory``)."""
    mem_limit_origin: str | None = None
    overrides: dict = field(default_factory=dict)
    """``seq`` / ``gbs`` given on top of the file (re-reading an edited file uses them too)."""


ARCHITECTURE_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                       "intermediate_size", "num_experts")
"""What ``-m`` must agree on with a file's own architecture, or be said to replace it."""


def resolve_model(model, file_model: ModelSpec | None, where: str, missing: str) -> tuple[ModelSpec, str]:
    """``-m`` (a ModelSpec or a catalog name / YAML / HF config path) wins over the
    architecture the file carries; one of them is required (``missing`` says what the
    file lacks)."""
    if model is not None:
        spec = model if isinstance(model, ModelSpec) else load_model(str(model))
        if file_model is not None:
            differ = [f"{k} {getattr(file_model, k)} -> {getattr(spec, k)}" for k in ARCHITECTURE_FIELDS
                      if getattr(file_model, k) != getattr(spec, k)]
            if differ:
                warn("--model", spec.name, f"replaces the architecture {where} define ({', '.join(differ)})",
                     "drop -m to estimate the file's own model")
        return spec, f"-m {spec.name}"
    if file_model is not None:
        return file_model, where
    raise NdplanError("--model", None, missing, "give -m MODEL (a catalog name, model YAML or HF config.json)")


def positive(field_: str, value, where: str) -> int:
    """An integer in 1..limits.MAX_SEQ (the largest count a config holds: tokens) read
    from a file, or NdplanError naming the key; Strategy applies the tighter bounds."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise NdplanError(field_, value, f"not a positive integer (in {where})", "give a whole number >= 1")
    try:
        return limits.count(field_, value, 1, limits.MAX_SEQ)
    except NdplanError as e:
        raise NdplanError(e.field, e.value, f"{e.problem} (in {where})", e.fix) from None


def world_dp(gpus: int | None, tp: int, pp: int, cp: int, field_: str, where: str) -> tuple[int, int]:
    """(gpus, dp) when dp fills the devices the other degrees leave (points.data_parallel)."""
    if gpus is None:
        raise NdplanError("gpus", None, f"{where} does not say the device count; give --gpus N")
    if gpus <= 0:
        raise NdplanError("gpus", gpus, "not a positive device count", "give --gpus N with N >= 1")
    return gpus, data_parallel(gpus, tp, pp, cp, "gpus", f" ({field_})")


def make_strategy(kw: dict, notes: list[str]) -> Strategy:
    """Strategy(**kw); falls back to bf16 weights if the fp32 weight dtype is rejected."""
    try:
        return Strategy(**kw)
    except NdplanError as e:
        if kw.get("weight_dtype") == "fp32" and e.field == "weight_dtype":
            notes.append("param_dtype float32 but Strategy rejects weight_dtype='fp32' "
                         f"({e.fix}); fell back to bf16 (weights/accu_grad under-counted 2x)")
            return Strategy(**(kw | {"weight_dtype": "bf16"}))
        raise


def int_arg(args, name: str, flag: str, default=None, lo: int = 1, most: int | None = None):
    """The integer value of argparse dest ``name`` (``flag`` in messages), ``default`` when the
    script does not give it; at least 1 (or 0 when ``lo`` is 0), at most ``most`` (default: the
    bound of ``positive``)."""
    v = getattr(args, name)
    if v is None:
        return default
    try:
        n = int(v)
    except ValueError:
        made = re.search(r"\$\(runtime:(\w+)\)", str(v))  # interop.shell RUNTIME_VALUE, COMMAND_VALUE
        if made:
            what = "the output of a command, $( )" if made.group(1) == "command" else f"${made.group(1)} of a loop or read"
            raise NdplanError(flag, v, f"set when the script runs ({what})",
                              "write the value you launch with in the script, or give it on ndplan's command "
                              "line where it has an option") from None
        raise NdplanError(flag, v, "not an integer", "set the variable it uses in the script, or write the number") from None
    if lo == 0 and n == 0:
        return 0
    if most is not None:
        return limits.count(flag, n, 1, most, "a positive count")
    return positive(flag, n, "the Megatron-LM arguments")


def choice_arg(args, name: str, flag: str, choices, default: str) -> str:
    """The value of argparse dest ``name`` (``default`` when absent), one of ``choices`` (the
    framework's own argparse choices), else a one-line error naming ``flag``."""
    v = getattr(args, name) or default
    if v not in choices:
        raise NdplanError(flag, v, "not a value Megatron-LM accepts", f"give one of {', '.join(choices)}")
    return v
