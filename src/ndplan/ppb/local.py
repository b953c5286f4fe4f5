"""A plan under the model's units (durations and the memory constraint, rounded as
model.py rounds them) and local search over plans, scored by the exact longest path.

The CP-SAT relaxation (model.py) is proven only on small pipelines; on large ones its
plans are improved here between solves (solve.py). Moves:

* shift: one layer from slice a to slice c (every boundary between them moves by one;
  layers keep their modes). If the shift is faster but overflows memory, it is repaired
  by recomputing one layer of the receiving stage one mode deeper (the fastest repair
  that fits);
* lighter: one layer recomputed one or more modes less, taken also at an equal step time,
  so a plan never recomputes what does not buy memory it needs.

Identical layers of a slice are interchangeable, so recompute moves try one
representative per (slice, layer type, mode).
"""

from __future__ import annotations

import time
from dataclasses import replace

from ndplan.formulas.schedules import held_profiles, virtual_stage
from ndplan.ppb import dag
from ndplan.ppb.instance import Instance
from ndplan.ppb.plan import Plan, slot
from ndplan.ppb.scale import Scaled


def unit_durations(inst: Instance, sc: Scaled, plan: Plan) -> dict[tuple[str, int], int]:
    """dur[kind, v] of one micro-batch in time units (rounded per layer, as the model);
    B includes recompute, and W unless the schedule runs W apart (dag.SPLIT_W_SCHEDULES)."""
    split_w = inst.pipeline.schedule in dag.SPLIT_W_SCHEDULES
    out = {}
    for v in range(inst.pipeline.chunks):
        F = B = W = 0
        for i in plan.layers(v):
            t = sc.types[sc.type_of[i]]
            F += t.F
            B += t.B + t.rec[t.modes.index(plan.recompute[i])]
            W += t.W
        out["F", v], out["B", v], out["W", v] = F, B + (0 if split_w else W), W
    return out


def unit_memory_fits(inst: Instance, sc: Scaled, plan: Plan) -> bool:
    """The model's memory constraint (memory units, layers rounded up) for a given plan."""
    p = inst.pipeline
    for s in range(p.pp):
        static, act = 0, [0] * p.vpp
        for c in range(p.vpp):
            for i in plan.layers(virtual_stage(p.schedule, s, c, p.pp)):
                t = sc.types[sc.type_of[i]]
                static += t.static
                act[c] += t.act[t.modes.index(plan.recompute[i])]
        if any(static + sum(h * a for h, a in zip(hv, act)) > sc.budget
               for hv in held_profiles(p.schedule, s, p.pp, p.vpp, p.m)):
            return False
    return True


def _shifts(plan: Plan, V: int):
    """(plan, c): one layer moved from slice a to slice c, nearest pairs first."""
    b = plan.bounds
    for dist in range(1, V):
        for a in range(V):
            for c in (a - dist, a + dist):
                if not 0 <= c < V:
                    continue
                nb = list(b)
                if a < c:  # the layers' first boundaries a+1..c move one layer left
                    for v in range(a + 1, c + 1):
                        nb[v] -= 1
                else:
                    for v in range(c + 1, a + 1):
                        nb[v] += 1
                if all(nb[v + 1] > nb[v] for v in range(V)):
                    yield replace(plan, bounds=tuple(nb)), c


def _recomputed(inst: Instance, sc: Scaled, plan: Plan, slices, deeper: bool):
    """Plans with one layer (one per slice, type and mode) of ``slices`` recomputed one
    mode deeper (``deeper``) or any mode lighter."""
    for v in slices:
        seen = set()
        for i in plan.layers(v):
            modes, mode = inst.layers[i].modes, plan.recompute[i]
            if (sc.type_of[i], mode) in seen:
                continue
            seen.add((sc.type_of[i], mode))
            k = modes.index(mode)
            for other in (modes[k + 1:k + 2] if deeper else modes[:k]):
                yield replace(plan, recompute=plan.recompute[:i] + (other,) + plan.recompute[i + 1:])


def polish(inst: Instance, sc: Scaled, graph: dag.Dag, plan: Plan, length: int, deadline: float,
           on_path) -> tuple[int, Plan]:
    """First-improvement descent (module docstring) until no move improves or the
    deadline; every move lowers (step time, recompute) lexicographically, so it ends.
    ``on_path(counts)`` receives the critical path of every plan taken (a valid cut for
    the relaxation; cutting every evaluated plan floods the relaxation and slows it)."""
    p = inst.pipeline

    def score(cand: Plan):
        return dag.longest_path(graph, unit_durations(inst, sc, cand))

    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for cand, c in _shifts(plan, p.chunks):
            if time.perf_counter() >= deadline:
                return length, plan
            x, counts = score(cand)
            if x >= length:
                continue
            if unit_memory_fits(inst, sc, cand):
                on_path(counts)
                plan, length, improved = cand, x, True
                break
            stage = slot(p, c)[0]
            repairs = []
            for fix in _recomputed(inst, sc, cand, [v for v in range(p.chunks) if slot(p, v)[0] == stage], True):
                if unit_memory_fits(inst, sc, fix):
                    repairs.append((*score(fix), fix))
            if repairs and min(r[0] for r in repairs) < length:
                length, counts, plan = min(repairs, key=lambda r: r[0])
                on_path(counts)
                improved = True
                break
        if improved:
            continue
        for cand in _recomputed(inst, sc, plan, range(p.chunks), False):
            if time.perf_counter() >= deadline:
                return length, plan
            if not unit_memory_fits(inst, sc, cand):
                continue
            x, counts = score(cand)
            if x <= length:
                on_path(counts)
                plan, length, improved = cand, x, True
                break
    return length, plan
