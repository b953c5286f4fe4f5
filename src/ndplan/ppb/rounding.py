"""Plans from the relaxation's fractional layer counts (branch.py's node points): round, then repair memory.

An LP point x[v][k][j] (layers of type k under mode j in slice v, fractional; relax.py's ``_LP.flat``
order) becomes a plan in three steps:

1. slice sizes: each slice's total rounded down (at least one layer), then the layers left over one
   at a time to the slices with the largest fractional parts whose stages still fit with every layer
   at its deepest mode; the boundaries are the running sums, so order and contiguity hold and the
   layers a slice gets follow from the sizes (not from the LP's per-type counts);
2. modes: in each slice, each type's layers split over its modes in the LP's proportions, counts of
   the deeper modes (fewer activation bytes) rounded up first (a slice may end with both selective
   and comm layers, which MindFormers cannot express: solve.py drops such plans);
3. repair: while a stage breaks model.py's memory rows (local.unit_memory_fits), one layer of the
   most loaded stage goes one mode deeper (``Layer.by_memory``): the one whose move costs the least
   recompute time per byte it frees.

The plans are starts for solve.py (the CP-SAT hint and local search); nothing here is a bound.
"""

from __future__ import annotations

import math

import numpy as np

from ndplan.ppb.instance import Instance
from ndplan.ppb.local import unit_memory_fits
from ndplan.ppb.plan import Plan, stage_memory_bytes, stage_slices
from ndplan.ppb.scale import Scaled

REPAIR_STEPS = 4
"""Repair rounds allowed per layer before a rounded point is given up: each round moves at least
one layer one mode deeper, and a layer has at most 4 deeper modes (the five of instance.MODES),
so a repair that can succeed does within this many."""


def _sizes(inst: Instance, totals: list[float]) -> list[int] | None:
    p, L, V = inst.pipeline, len(inst.layers), len(totals)
    sizes = [max(1, math.floor(t + 1e-6)) for t in totals]
    if sum(sizes) > L:
        return None
    deepest = tuple(layer.by_memory[-1] for layer in inst.layers)
    held = [{u for _, u in stage_slices(p, s)} for s in range(p.pp)]
    stages_of = {v: [s for s in range(p.pp) if v in held[s]] for v in range(V)}
    order = sorted(range(V), key=lambda v: (-(totals[v] - math.floor(totals[v] + 1e-6)), v))
    while sum(sizes) < L:
        grew = False
        for v in order:
            if sum(sizes) == L:
                break
            cand = sizes[:v] + [sizes[v] + 1] + sizes[v + 1:]
            plan = Plan(bounds=(0, *np.cumsum(cand).tolist()), recompute=deepest)
            memory = stage_memory_bytes(inst, plan)
            if all(memory[s] <= p.budget_bytes for s in stages_of[v]):
                sizes, grew = cand, True
        if not grew:  # no stage takes another layer even fully recomputed
            return None
    return sizes


def _modes(inst: Instance, sc: Scaled, bounds: list[int], x) -> tuple[str, ...]:
    rec = [None] * len(inst.layers)
    for v in range(len(bounds) - 1):
        for k, t in enumerate(sc.types):
            layers = [i for i in range(bounds[v], bounds[v + 1]) if sc.type_of[i] == k]
            if not layers:
                continue
            share = np.asarray(x[v][k], dtype=float)
            share = share / share.sum() * len(layers) if share.sum() > 1e-9 else np.eye(len(t.modes))[0] * len(layers)
            left, modes = len(layers), []
            for j in sorted(range(len(t.modes)), key=lambda j: (t.act[j], j)):  # deepest first
                n = min(left, math.ceil(share[j] - 1e-6))
                modes += [t.modes[j]] * n
                left -= n
            rec_modes = modes + [t.modes[0]] * left
            for i, mode in zip(layers, rec_modes):
                rec[i] = mode
    return tuple(rec)


def _cheapest_deeper(inst: Instance, plan: Plan, rec: list[str], s: int) -> tuple[int, str] | None:
    """(layer, mode): the layer of stage ``s`` whose next deeper mode costs the least recompute time
    per activation byte it frees; None when every layer there is at its deepest."""
    move = None
    for _, v in stage_slices(inst.pipeline, s):
        for i in plan.layers(v):
            layer = inst.layers[i]
            order = layer.by_memory
            at = order.index(rec[i])
            if at + 1 == len(order):
                continue
            deeper = order[at + 1]
            freed = layer.activation_bytes[rec[i]] - layer.activation_bytes[deeper]
            cost = layer.recompute_s.get(deeper, 0.0) - layer.recompute_s.get(rec[i], 0.0)
            if freed > 0 and (move is None or cost / freed < move[0]):
                move = (cost / freed, i, deeper)
    return None if move is None else move[1:]


def _repair(inst: Instance, sc: Scaled, plan: Plan) -> Plan | None:
    """Step 3 of the module docstring, one move on every stage over the budget at a time (on the most
    loaded stage when only the model's rounded-up units overflow); None when a stage cannot fit."""
    p = inst.pipeline
    rec = list(plan.recompute)
    for _ in range(REPAIR_STEPS * len(rec)):
        cand = Plan(bounds=plan.bounds, recompute=tuple(rec))
        if unit_memory_fits(inst, sc, cand):
            return cand
        mem = stage_memory_bytes(inst, cand)
        over = [s for s in range(p.pp) if mem[s] > p.budget_bytes] or [max(range(p.pp), key=lambda s: (mem[s], -s))]
        for s in over:
            move = _cheapest_deeper(inst, cand, rec, s)
            if move is None:
                return None
            rec[move[0]] = move[1]
    return None


def round_point(inst: Instance, sc: Scaled, flat) -> Plan | None:
    """The plan of LP point ``flat`` (x[v][k][j] in relax.py's ``_LP.flat`` order: v, then k, then j;
    module docstring), None when no rounding fits."""
    it = iter(np.asarray(flat, dtype=float).tolist())
    x = [[[next(it) for _ in t.modes] for t in sc.types] for _ in range(inst.pipeline.chunks)]
    sizes = _sizes(inst, [float(np.sum([np.sum(row) for row in xv])) for xv in x])
    if sizes is None:
        return None
    bounds = [0, *np.cumsum(sizes).tolist()]
    return _repair(inst, sc, Plan(bounds=tuple(bounds), recompute=_modes(inst, sc, bounds, x)))
