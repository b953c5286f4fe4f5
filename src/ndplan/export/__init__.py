"""Framework forms of a strategy (``--emit FORMAT``): one module per target, each with
``emit(model, strategy, *, balance=None) -> str``; ``balance`` is a PPB result
(export/balance.py) for uneven layers and per-stage recompute.

A strategy a target cannot express raises NdplanError naming the field, the value and
the fix (CLI: one line, exit 2).
"""

from __future__ import annotations


from ndplan.export import deepspeed, devicemesh, megatron, mindformers, torchtitan, torchtitan03
from ndplan.export.balance import Balance
from ndplan.errors import NdplanError
from ndplan.paths import output_file

EMITTERS = {"megatron": megatron.emit, "torchtitan": torchtitan.emit, "torchtitan-0.3": torchtitan03.emit,
            "deepspeed": deepspeed.emit,
            "mindformers": mindformers.emit, "devicemesh": devicemesh.emit}
SUFFIX = {"megatron": ".sh", "torchtitan": ".toml", "torchtitan-0.3": ".titan.sh", "deepspeed": ".json", "mindformers": ".yaml",
          "devicemesh": ".py"}
"""File suffix of each form (``sweep --emit-all``)."""

__all__ = ["EMITTERS", "SUFFIX", "Balance", "emit", "write"]


def emit(fmt: str, model, strategy, *, balance=None) -> str:
    if fmt not in EMITTERS:
        raise NdplanError("--emit", fmt, "unknown format", f"choose one of {', '.join(EMITTERS)}")
    return EMITTERS[fmt](model, strategy, balance=balance)


def write(text: str, path: str | None) -> bool:
    """Write ``text`` to ``path``; False when there is no path (the caller prints it)."""
    if path is None:
        return False
    output_file("--emit-out", path).write_text(text)
    return True
