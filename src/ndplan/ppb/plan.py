"""A pipeline plan: contiguous layer ranges per virtual stage and a recompute mode per
layer, with its per-stage time and memory in float units.

Virtual stage v (0..pp*vpp-1) is the v-th model slice in layer order; it runs on
(stage, chunk) given by ``layouts.virtual_stage`` (interleaved: v = chunk*pp + stage;
zbv, dualpipev: chunk 0 of stage i is v = i, chunk 1 is v = 2*pp-1-i; dualpipe: pp slices, each on
two stages, stage_slices and copies).

Memory of stage i (the model's constraint): static_i + max over the stage's held
vectors h (schedules.held_profiles) of sum_c h_c * sum_{l in (i, c)} act_l[mode_l]; with
equal chunks this is the memory model's in-flight table (schedules.inflight).
"""

from __future__ import annotations

from dataclasses import dataclass

from ndplan.errors import NdplanError
from ndplan.formulas.schedules import held_profiles, virtual_stage
from ndplan.ppb.instance import Instance, Pipeline
from ndplan.vocab import BIDIRECTIONAL_SCHEDULES


@dataclass(frozen=True)
class Plan:
    bounds: tuple[int, ...]
    """pp*vpp + 1 layer indices: virtual stage v holds layers bounds[v] .. bounds[v+1]-1."""
    recompute: tuple[str, ...]
    """Recompute mode of every layer."""

    def layers(self, v: int) -> range:
        return range(self.bounds[v], self.bounds[v + 1])

    def check(self, inst: Instance) -> None:
        """Order, contiguity (by construction), every slice non-empty, modes offered."""
        L, V = len(inst.layers), inst.pipeline.chunks
        b = self.bounds
        if len(b) != V + 1 or b[0] != 0 or b[-1] != L or any(b[v + 1] <= b[v] for v in range(V)):
            raise NdplanError("plan.bounds", list(b), "not a layer split",
                              f"give {V + 1} strictly increasing indices from 0 to {L}")
        if len(self.recompute) != L:
            raise NdplanError("plan.recompute", len(self.recompute), f"not one mode per layer ({L})", "give one per layer")
        for i, (layer, mode) in enumerate(zip(inst.layers, self.recompute)):
            if mode not in layer.modes:
                raise NdplanError(f"plan.recompute[{i}]", mode, f"not offered by layer {layer.name}",
                                  f"choose from {', '.join(layer.modes)}")


def offers_both_selects(inst: Instance) -> bool:
    """Some layer offers ``selective`` and some ``comm`` (then ``one_select_list`` restricts plans)."""
    return any("selective" in x.modes for x in inst.layers) and any("comm" in x.modes for x in inst.layers)


def one_select_list(plan: Plan) -> bool:
    """No slice holds both selective-only and comm-only layers: MindFormers recomputes a slice's
    first ``select_recompute`` and first ``select_comm_recompute`` layers, so one of the two
    prefixes contains the other and only one kind can stand alone (ppb/model.py adds the same)."""
    for v in range(len(plan.bounds) - 1):
        modes = {plan.recompute[i] for i in plan.layers(v)}
        if "selective" in modes and "comm" in modes:
            return False
    return True


def slot(p: Pipeline, v: int) -> tuple[int, int]:
    """(stage, chunk) running virtual stage v (the first of two under dualpipe)."""
    for s in range(p.pp):
        for c in range(p.vpp):
            if virtual_stage(p.schedule, s, c, p.pp) == v:
                return s, c
    raise ValueError(v)


def stage_slices(p: Pipeline, s: int) -> list[tuple[int, int]]:
    """(chunk, virtual stage) of every chunk of stage ``s``."""
    return [(c, virtual_stage(p.schedule, s, c, p.pp)) for c in range(p.vpp)]


def copies(p: Pipeline) -> int:
    """Stages holding each slice: 2 under a bidirectional schedule (each runs it for half the
    micro-batches), else 1."""
    return 2 if p.schedule in BIDIRECTIONAL_SCHEDULES else 1


def chunk_time_s(inst: Instance, plan: Plan, v: int) -> dict[str, float]:
    """F, B (+ recompute), W seconds of one micro-batch on virtual stage v."""
    ls = [(inst.layers[i], plan.recompute[i]) for i in plan.layers(v)]
    return {"F": sum(x.forward_s for x, _ in ls),
            "B": sum(x.backward_input_s + x.recompute_s.get(m, 0.0) for x, m in ls),
            "W": sum(x.backward_weight_s for x, _ in ls),
            "R": sum(x.recompute_s.get(m, 0.0) for x, m in ls)}


def stage_time_s(inst: Instance, plan: Plan) -> list[float]:
    """Per-micro-batch seconds of every stage (all its chunks): F + B + W + recompute; under
    dualpipe a micro-batch runs one of the stage's two chunks, half of them each."""
    p = inst.pipeline
    out = [0.0] * p.pp
    for s in range(p.pp):
        for _, v in stage_slices(p, s):
            t = chunk_time_s(inst, plan, v)
            out[s] += (t["F"] + t["B"] + t["W"]) / copies(p)
    return out


def stage_memory_bytes(inst: Instance, plan: Plan) -> list[float]:
    """Static + peak in-flight activations of every stage."""
    p = inst.pipeline
    static, act = [0.0] * p.pp, [[0.0] * p.vpp for _ in range(p.pp)]
    for s, c, v in ((s, c, v) for s in range(p.pp) for c, v in stage_slices(p, s)):
        for i in plan.layers(v):
            layer = inst.layers[i]
            static[s] += layer.static_bytes
            act[s][c] += layer.activation_bytes[plan.recompute[i]]
    return [static[s] + max(sum(h_c * a_c for h_c, a_c in zip(h, act[s]))
                            for h in held_profiles(p.schedule, s, p.pp, p.vpp, p.m)) for s in range(p.pp)]


def even_bounds(L: int, V: int) -> tuple[int, ...]:
    """Even split: the first L mod V slices get one extra layer (Megatron-style)."""
    q, r = divmod(L, V)
    b = [0]
    for v in range(V):
        b.append(b[-1] + q + (v < r))
    return tuple(b)


def uniform_plan(inst: Instance, mode: str, bounds: tuple[int, ...] | None = None) -> Plan:
    """Every layer at ``mode`` where it offers it, else at the offered mode nearest below it in the
    partial order of the modes (``Layer.at_most``)."""
    rec = tuple(layer.at_most(mode) for layer in inst.layers)
    return Plan(bounds=bounds or even_bounds(len(inst.layers), inst.pipeline.chunks), recompute=rec)
