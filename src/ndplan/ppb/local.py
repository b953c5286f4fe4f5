"""A plan under the model's units (durations and the memory constraint, rounded as
model.py rounds them) and local search over plans, scored by the exact longest path.

The CP-SAT relaxation (model.py) is proven only on small pipelines; on large ones its
plans are improved here between solves (solve.py). Moves:

* shift: one layer from slice a to slice c (every boundary between them moves by one;
  layers keep their modes). If the shift is faster but overflows memory, it is repaired
  by recomputing one layer of the receiving stage one mode deeper (the fastest repair
  that fits);
* lighter: one layer recomputed one or more modes less, taken also at an equal step time,
  (modes ordered per layer by the activation bytes they keep, ``Layer.by_memory``: they are only
  partially ordered; plans keep ``plan.one_select_list`` where it applies),
  so a plan never recomputes what does not buy memory it needs.

Identical layers of a slice are interchangeable, so recompute moves try one
representative per (slice, layer type, mode).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from ndplan.formulas.schedules import held_profiles, virtual_stage
from ndplan.ppb import dag
from ndplan.vocab import SPLIT_W_SCHEDULES
from ndplan.ppb.instance import Instance
from ndplan.ppb.plan import Plan, offers_both_selects, one_select_list, stage_slices
from ndplan.vocab import RECOMPUTE_BELOW
from ndplan.ppb.scale import Scaled


COLUMNS = ("F", "B", "W", "static", "act")
"""Per-layer columns of ``_layer_table`` (time units, memory units); B includes the
layer's recompute."""


def _layer_table(sc: Scaled, recompute: tuple[str, ...]) -> np.ndarray:
    rows = []
    for i, mode in enumerate(recompute):
        t = sc.types[sc.type_of[i]]
        j = t.modes.index(mode)
        rows.append((t.F, t.B + t.rec[j], t.W, t.static, t.act[j]))
    return np.array(rows, dtype=np.int64)


def evaluate_bounds(inst: Instance, sc: Scaled, recompute: tuple[str, ...],
                    bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Durations and the memory verdict of K plans that share ``recompute`` and differ in
    ``bounds`` (K x V+1): (dur[k, dag.KINDS.index(kind), v] in time units, as model.py
    rounds them: B includes recompute, and W unless the schedule runs W apart;
    fits[k]: model.py's memory constraint, static + held vector . chunk activations
    <= budget on every stage and every held vector)."""
    p = inst.pipeline
    table = np.vstack([np.zeros((1, len(COLUMNS)), dtype=np.int64), np.cumsum(_layer_table(sc, recompute), axis=0)])
    sums = table[bounds[:, 1:]] - table[bounds[:, :-1]]  # (K, V, column)
    F, B, W, static, act = (sums[:, :, COLUMNS.index(c)] for c in COLUMNS)
    split_w = p.schedule in SPLIT_W_SCHEDULES
    dur = np.stack([F, B + (0 if split_w else W), W], axis=1)
    fits = np.ones(len(bounds), dtype=bool)
    for s in range(p.pp):
        vs = [virtual_stage(p.schedule, s, c, p.pp) for c in range(p.vpp)]
        base = static[:, vs].sum(axis=1)
        for h in held_profiles(p.schedule, s, p.pp, p.vpp, p.m):
            fits &= base + sum(h_c * act[:, v] for h_c, v in zip(h, vs)) <= sc.budget
    return dur, fits


def unit_durations(inst: Instance, sc: Scaled, plan: Plan) -> dict[tuple[str, int], int]:
    """dur[kind, v] of one micro-batch of ``plan`` in time units (``evaluate_bounds``)."""
    dur, _ = evaluate_bounds(inst, sc, plan.recompute, np.array([plan.bounds]))
    return {(k, v): int(dur[0, j, v]) for j, k in enumerate(dag.KINDS) for v in range(inst.pipeline.chunks)}


def unit_memory_fits(inst: Instance, sc: Scaled, plan: Plan) -> bool:
    """model.py's memory constraint (memory units, layers rounded up) for ``plan``."""
    return bool(evaluate_bounds(inst, sc, plan.recompute, np.array([plan.bounds]))[1][0])


BATCH_CELLS = 4_000_000
"""Batched longest paths keep at most this many (node, plan) lengths at once (32 MiB)."""


def _shift_scores(inst: Instance, sc: Scaled, graph: dag.Dag, plan: Plan, shifts, deadline: float):
    """(lengths, fits) of the shifted plans (all share the plan's per-layer modes), in
    batches of BATCH_CELLS; the first ones only if the deadline passes between batches."""
    bounds = np.array([c.bounds for c, _ in shifts], dtype=np.int64)
    dur, fits = evaluate_bounds(inst, sc, plan.recompute, bounds)
    step = max(1, BATCH_CELLS // len(graph.nodes))
    parts = []
    for i in range(0, len(dur), step):
        if parts and time.perf_counter() >= deadline:
            break
        parts.append(dag.lengths(graph, dur[i:i + step]))
    lengths = np.concatenate(parts)
    return lengths, fits[:len(lengths)]


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
    """Plans with one layer (one per slice, type and mode) of ``slices`` recomputed one mode
    deeper (``deeper``: the offered mode keeping the most activation bytes below the current
    one's, ``Layer.by_memory``) or lighter (``lighter_modes``, cheapest first).
    The modes are only partially ordered (vocab.PPB_RECOMPUTE_MODES): memory orders the repairs,
    recompute time the relief."""
    for v in slices:
        seen = set()
        for i in plan.layers(v):
            layer, mode = inst.layers[i], plan.recompute[i]
            if (sc.type_of[i], mode) in seen:
                continue
            seen.add((sc.type_of[i], mode))
            for other in (_deeper(layer, mode) if deeper else _lighter(layer, mode)):
                yield replace(plan, recompute=plan.recompute[:i] + (other,) + plan.recompute[i + 1:])


def _deeper(layer, mode: str) -> list[str]:
    act = layer.activation_bytes
    return [m for m in layer.by_memory if act[m] < act[mode]][:1]


def _lighter(layer, mode: str) -> list[str]:
    return sorted(lighter_modes(layer, mode), key=lambda m: (layer.recompute_s.get(m, 0.0), -layer.activation_bytes[m]))


def lighter_modes(layer, mode: str) -> list[str]:
    """The layer's modes that recompute less than ``mode``: less recompute time, or as much while
    recomputing a subset of what it does (vocab.RECOMPUTE_BELOW); the search's tie-break."""
    rec = layer.recompute_s
    r = rec.get(mode, 0.0)
    return [m for m in layer.modes
            if rec.get(m, 0.0) < r or (m in RECOMPUTE_BELOW[mode] and rec.get(m, 0.0) <= r)]


class WorkCap:
    """A deterministic limit on local search (the deterministic budget's counterpart of a deadline):
    (shift x DAG node) steps of the shift scoring, which dominates its time."""

    def __init__(self, total: float = float("inf")):
        self.left = total

    def spend(self, n: float) -> bool:
        """Spend ``n``; False once the cap is used up."""
        self.left -= n
        return self.left > 0


def polish(inst: Instance, sc: Scaled, graph: dag.Dag, plan: Plan, length: int, deadline: float,
           on_path, repairs_tried: int = 32, cap: WorkCap | None = None) -> tuple[int, Plan]:
    """Descent (module docstring) until no move improves or the deadline: the fastest
    shift that fits (all shifts scored at once, ``_shift_scores``); else the fastest
    memory repair of the ``repairs_tried`` fastest shifts that do not fit; else the first
    lighter recompute at no slower step time. Every move lowers (step time, recompute)
    lexicographically, so it ends. ``on_path(counts)`` receives the critical path of
    every plan taken (a valid cut for the relaxation)."""
    p = inst.pipeline
    restricted = offers_both_selects(inst)

    def allowed(cand: Plan) -> bool:
        return not restricted or one_select_list(cand)

    def take(cand: Plan) -> tuple[int, Plan]:
        x, counts = dag.longest_path(graph, unit_durations(inst, sc, cand))
        on_path(counts)
        return x, cand

    while time.perf_counter() < deadline:
        shifts = list(_shifts(plan, p.chunks))
        if cap is not None and not cap.spend(max(1, len(shifts)) * len(graph.nodes)):
            break
        if shifts:
            lengths, fits = _shift_scores(inst, sc, graph, plan, shifts, deadline)
            if restricted:
                fits = fits & np.array([allowed(c) for c, _ in shifts[:len(fits)]])
            faster = lengths < length
            if (faster & fits).any():
                k = int(np.argmin(np.where(fits, lengths, np.iinfo(np.int64).max)))
                length, plan = take(shifts[k][0])
                continue
            repairs = []
            for k in [k for k in np.argsort(lengths, kind="stable") if faster[k]][:repairs_tried]:
                cand, c = shifts[k]
                near = sorted({v for s in range(p.pp) if c in {u for _, u in stage_slices(p, s)}
                               for _, v in stage_slices(p, s)})  # the slices sharing a stage with c
                for fix in _recomputed(inst, sc, cand, near, True):
                    if allowed(fix) and unit_memory_fits(inst, sc, fix):
                        repairs.append((dag.longest_path(graph, unit_durations(inst, sc, fix))[0], fix))
            if repairs and min(r[0] for r in repairs) < length:
                length, plan = take(min(repairs, key=lambda r: r[0])[1])
                continue
        for cand in _recomputed(inst, sc, plan, range(p.chunks), False):
            if time.perf_counter() >= deadline:
                return length, plan
            if allowed(cand) and unit_memory_fits(inst, sc, cand) and \
                    dag.longest_path(graph, unit_durations(inst, sc, cand))[0] <= length:
                length, plan = take(cand)
                break
        else:
            break
    return length, plan
