"""Framework forms of a strategy (``--emit FORMAT``): one module per target, each with
``emit(model, strategy, *, balance=None) -> str``; ``balance`` is a PPB result
(export/balance.py) for uneven layers and per-stage recompute.

A strategy a target cannot express raises NdplanError naming the field, the value and
the fix (CLI: one line, exit 2).
"""

from __future__ import annotations


import importlib

from ndplan.errors import NdplanError
from ndplan.paths import output_file

MODULES = {"megatron": "megatron", "torchtitan": "torchtitan", "torchtitan-0.3": "torchtitan03",
           "deepspeed": "deepspeed", "mindformers": "mindformers", "devicemesh": "devicemesh"}
"""Each form's module (export/<module>.py), imported when the form is emitted."""
FORMATS = tuple(MODULES)
SUFFIX = {"megatron": ".sh", "torchtitan": ".toml", "torchtitan-0.3": ".titan.sh", "deepspeed": ".json", "mindformers": ".yaml",
          "devicemesh": ".py"}
"""File suffix of each form (``sweep --emit-all``)."""

__all__ = ["EMITTERS", "FORMATS", "SUFFIX", "Balance", "emit", "write"]


def _emitter(fmt: str):
    return importlib.import_module(f"ndplan.export.{MODULES[fmt]}").emit


def __getattr__(name: str):
    """``EMITTERS`` (format -> emit function; built once, ``emit`` then reads it) and
    ``Balance``, imported on first use."""
    if name == "EMITTERS":
        globals()["EMITTERS"] = {fmt: _emitter(fmt) for fmt in FORMATS}
        return globals()["EMITTERS"]
    if name == "Balance":
        from ndplan.export.balance import Balance
        return Balance
    raise AttributeError(f"module 'ndplan.export' has no attribute {name!r}")


def __dir__():
    return sorted(set(__all__) | {k for k in globals() if not k.startswith("_")})


def emit(fmt: str, model, strategy, *, balance=None) -> str:
    emitters = globals().get("EMITTERS", MODULES)
    if fmt not in emitters:
        raise NdplanError("--emit", fmt, "unknown format", f"choose one of {', '.join(emitters)}")
    return emitters[fmt](model, strategy, balance=balance) if emitters is not MODULES else _emitter(fmt)(
        model, strategy, balance=balance)


def write(text: str, path: str | None) -> bool:
    """Write ``text`` to ``path``; False when there is no path (the caller prints it)."""
    if path is None:
        return False
    output_file("--emit-out", path).write_text(text)
    return True
