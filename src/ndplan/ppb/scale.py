"""Integer scaling of a PPB instance: the one place where seconds and bytes become the
integers CP-SAT needs.

* Time: one unit is ``time_s`` seconds (default 1 us); every per-layer time (F, B, W,
  each mode's recompute) is rounded to the nearest unit, so a stage's time per
  micro-batch is off by at most n_layers x time_s / 2 from its float value.
* Memory: one unit is ``memory_bytes`` (default 1 MiB); per-layer static and
  activation bytes round UP and the budget rounds DOWN, so a plan the solver accepts
  fits the float budget.

Layers whose scaled numbers are identical form one *type*; the model counts layers per
(type, chunk, mode) instead of deciding every layer alone (identical layers are
interchangeable, so the optimum is the same).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ndplan.ppb.instance import MODES, Instance, Layer
from ndplan.units import MIB

TIME_UNIT_S = 1e-6
"""Default time resolution: 1 microsecond."""
MEMORY_UNIT_BYTES = MIB
"""Default memory resolution: 1 MiB, rounded up per layer."""


@dataclass(frozen=True, kw_only=True)
class Scale:
    time_s: float = TIME_UNIT_S
    """Seconds per time unit; times round to the nearest unit."""
    memory_bytes: int = MEMORY_UNIT_BYTES
    """Bytes per memory unit; layer memory rounds up, the budget down."""

    def t(self, seconds: float) -> int:
        return int(round(seconds / self.time_s))

    def mem_up(self, n: float) -> int:
        return int(math.ceil(n / self.memory_bytes - 1e-9))

    def mem_down(self, n: float) -> int:
        return int(math.floor(n / self.memory_bytes + 1e-9))


@dataclass(frozen=True)
class LayerType:
    """Scaled numbers shared by identical layers (time units, memory units)."""
    F: int
    B: int
    W: int
    static: int
    act: tuple[int, ...]
    """Activation units per mode, aligned with ``modes``."""
    rec: tuple[int, ...]
    """Recompute time units per mode, aligned with ``modes``."""
    modes: tuple[str, ...]


def layer_type(layer: Layer, sc: Scale) -> LayerType:
    modes = layer.modes
    return LayerType(F=sc.t(layer.forward_s), B=sc.t(layer.backward_input_s), W=sc.t(layer.backward_weight_s),
                     static=sc.mem_up(layer.static_bytes),
                     act=tuple(sc.mem_up(layer.activation_bytes[m]) for m in modes),
                     rec=tuple(sc.t(layer.recompute_s.get(m, 0.0)) for m in modes), modes=modes)


@dataclass(frozen=True)
class Scaled:
    """An instance in integers: ``types[k]`` and ``type_of[l]`` (layer l -> type index)."""
    types: tuple[LayerType, ...]
    type_of: tuple[int, ...]
    budget: int
    scale: Scale

    def prefix(self, k: int) -> list[int]:
        """prefix[b] = layers of type k among layers 0..b-1 (b = 0..L)."""
        out = [0]
        for t in self.type_of:
            out.append(out[-1] + (t == k))
        return out


def scale_instance(inst: Instance, sc: Scale) -> Scaled:
    types: list[LayerType] = []
    index: dict[LayerType, int] = {}
    type_of = []
    for layer in inst.layers:
        lt = layer_type(layer, sc)
        if lt not in index:
            index[lt] = len(types)
            types.append(lt)
        type_of.append(index[lt])
    return Scaled(types=tuple(types), type_of=tuple(type_of), budget=sc.mem_down(inst.pipeline.budget_bytes), scale=sc)


__all__ = ["MODES", "Scale", "Scaled", "LayerType", "scale_instance"]
