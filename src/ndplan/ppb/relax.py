"""A continuous relaxation of PPB's model (model.py), solved by Kelley's cutting planes: a lower
bound on the step time, and the schedule paths it meets, which then seed CP-SAT as cuts.

For a fixed op order the step time is the longest path of the schedule's DAG (dag.py), a max of
linear functions of the slices' op durations: convex in them, and the durations are linear in
the layers each slice holds. So with fractional layer counts x[v][k][j] >= 0 (slice v, layer type
k, recompute mode j; contiguity dropped, every type's count kept, every slice non-empty, the
first and last layers in the first and last slices) and model.py's memory rows (static +
held vector x chunk activations <= budget for every held profile of every stage), the
problem min Z s.t. Z >= every path's length is a linear program, a relaxation of the integer
model: its optimum bounds every plan's step time from below. Kelley (1960): solve it over the
paths found so far (at first one chain per stage, as model.py starts), find the longest path at
the solution's durations, add it while it is longer than Z. Every LP value on the way is a valid
bound (a relaxation of fewer rows); when no path exceeds Z it is the relaxation's optimum.

Time and memory are model.py's units (scale.py), so the bound is a bound on CP-SAT's objective.
Deterministic: a simplex (CLP through OR-Tools) and a fixed round cap, no clock. Then, given work,
branch.py branches on the integer layer counts every plan has, on this LP and its rows.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from ortools.linear_solver import pywraplp

from ndplan.formulas.schedules import held_profiles
from ndplan.ppb import branch, dag
from ndplan.ppb.instance import Instance
from ndplan.ppb.plan import stage_slices
from ndplan.ppb.scale import Scaled
from ndplan.vocab import SPLIT_W_SCHEDULES

LP_SOLVER = "CLP"
"""The LP solver (OR-Tools' pywraplp): COIN-OR CLP. GLOP stopped ABNORMAL after about 85 rounds on
96 layers x 16 stages x zbv at 40 GiB (the cut rows grow dense and nearly parallel)."""
MAX_ROUNDS = 400
"""Kelley rounds at most (each an LP solve and a longest path; about 10 ms each on 96 layers x
32 slices x 32 micro-batches)."""
SAFETY = 1e-4
"""Relative margin taken off the LP value before it is used as a bound: a simplex's OPTIMAL holds
within its tolerances, and on instances whose numbers span 1e-6 to 1e4 s the primal value of GLOP
exceeded the brute-force optimum by up to 9.4e-5 (an independent review, 2026-12-07)."""
WORK_PER_UNIT = 500_000
"""Relaxation work allowed per unit of the solve's deterministic budget, in (round x DAG node)
steps: 1.5 million at the default 3 units is about 8 s on 2 cores for 128 layers x 32 stages x
zbv x 64 micro-batches (12,288 nodes, 122 rounds), and leaves 96 x 16 x vpp 2 x 32 (3,072
nodes) its full MAX_ROUNDS. A count, not a clock: the bound is the same on every machine."""


@dataclass
class Relaxation:
    bound: float
    """Lower bound on the step time, time units (scale.py); 0 when infeasible is False and no LP solved."""
    infeasible: bool = False
    """The memory rows alone admit no fractional plan, or (branch.py) no whole layer counts: no plan fits."""
    cuts: list[Counter] = field(default_factory=list)
    """The paths met (counts[kind, v]), for CP-SAT (PPBModel.add_path_cut)."""
    rounds: int = 0
    converged: bool = False
    nodes: int = 0
    """Branch-and-bound nodes solved (branch.py); 0 when the root bound stands alone."""
    branched: bool = False
    """The bound is branch.py's (integer layer counts), above the root LP's."""
    points: list = field(default_factory=list)
    """(LP value, layer counts) of the root and of every branch-and-bound node (branch.Result.points)."""
    branch_work: float = 0.0
    """Work the branch and bound spent (branch.Result.work)."""


class _LP:
    def __init__(self, inst: Instance, sc: Scaled):
        self.inst, self.sc, self.p = inst, sc, inst.pipeline
        # rows scaled to order one (GLOP reports ABNORMAL on microsecond path sums beside
        # memory units): times over the largest layer's, memory over the budget
        self.t0 = max(1, max(t.F + t.B + t.W + max(t.rec) for t in sc.types))
        self.m0 = max(1, sc.budget)
        self.lp = pywraplp.Solver.CreateSolver(LP_SOLVER)
        self.V = self.p.chunks
        types, L = sc.types, len(sc.type_of)
        count = Counter(sc.type_of)
        self.x = [[[self.lp.NumVar(0, count[k], f"x{v}_{k}_{j}") for j in range(len(t.modes))]
                   for k, t in enumerate(types)] for v in range(self.V)]
        for k in range(len(types)):
            self.lp.Add(sum(sum(self.x[v][k]) for v in range(self.V)) == count[k])
        for v in range(self.V):
            self.lp.Add(sum(sum(row) for row in self.x[v]) >= 1)
        self.lp.Add(sum(self.x[0][sc.type_of[0]]) >= 1)  # layer 0 opens the first slice
        self.lp.Add(sum(self.x[self.V - 1][sc.type_of[L - 1]]) >= 1)  # the last layer closes the last
        self._memory()
        self._durations()
        self.Z = self.lp.NumVar(0, self.lp.infinity(), "Z")
        self.lp.Minimize(self.Z)

    def _sum(self, v: int, value) -> object:
        return sum(x * value(t, j) for k, t in enumerate(self.sc.types) for j, x in enumerate(self.x[v][k]))

    def _memory(self) -> None:
        p = self.p
        for s in range(p.pp):
            cvs = stage_slices(p, s)
            static = sum(self._sum(v, lambda t, j: t.static / self.m0) for _, v in cvs)
            act = {c: self._sum(v, lambda t, j: t.act[j] / self.m0) for c, v in cvs}
            for h in held_profiles(p.schedule, s, p.pp, p.vpp, p.m):
                self.lp.Add(static + sum(h_c * act[c] for c, h_c in enumerate(h)) <= 1)

    def _durations(self) -> None:
        split_w = self.p.schedule in SPLIT_W_SCHEDULES
        per = {"F": lambda t, j: t.F, "B": lambda t, j: t.B + t.rec[j] + (0 if split_w else t.W), "W": lambda t, j: t.W}
        self.flat = [x for xv in self.x for row in xv for x in row]
        self.dur, rows = {}, []
        for v in range(self.V):
            for kind, f in per.items():
                self.dur[kind, v] = self._sum(v, lambda t, j: f(t, j) / self.t0)
                rows.append([f(t, j) if w == v else 0 for w in range(self.V) for t in self.sc.types for j in range(len(t.modes))])
        self.dur_matrix = np.array(rows, dtype=float)
        """dur_matrix @ (x values, ``flat`` order): op durations in time units, ``dur``'s order."""

    def cut(self, counts: Counter) -> None:
        self.lp.Add(self.Z >= sum(n * self.dur[kv] for kv, n in counts.items()))

    def solve(self) -> bool:
        self.status = self.lp.Solve()
        return self.status == pywraplp.Solver.OPTIMAL

    def values(self, xs: np.ndarray | None = None) -> dict:
        """Op durations at the LP's solution (or at layer counts ``xs``, ``flat`` order), time units."""
        return dict(zip(self.dur, (self.dur_matrix @ (self.x_values() if xs is None else xs)).tolist()))

    def x_values(self) -> np.ndarray:
        """The layer counts at the LP's solution, ``flat`` order."""
        return np.array([x.solution_value() for x in self.flat])

    def z(self) -> float:
        return self.Z.solution_value() * self.t0


def relax(inst: Instance, sc: Scaled, graph: dag.Dag | None = None, rounds: int = MAX_ROUNDS,
          work: float | None = None, branch_work: float = 0.0, branch_deadline: float = math.inf) -> Relaxation:
    """Kelley's cutting planes on the relaxation (module docstring), at most ``rounds`` LP solves and
    ``work`` round x node steps (WORK_PER_UNIT); then branch.py's branch and bound on the integer
    layer counts for at most ``branch_work`` steps (branch.WORK_PER_UNIT) and until
    ``branch_deadline`` (time.perf_counter(); opt-in, not deterministic)."""
    p = inst.pipeline
    graph = graph or dag.build(p.schedule, p.pp, p.vpp, p.m)
    if work is not None:
        rounds = max(1, min(rounds, int(work // len(graph.nodes))))
    lp = _LP(inst, sc)
    stages = {s: {v for _, v in stage_slices(p, s)} for s in range(p.pp)}
    seen, cuts = set(), []

    def add(counts: Counter) -> bool:
        key = tuple(sorted(counts.items()))
        if key in seen:
            return False
        seen.add(key)
        cuts.append(counts)
        lp.cut(counts)
        return True

    for s in range(p.pp):
        add(dag.chain_counts(graph, s))
    out = Relaxation(bound=0.0, cuts=cuts)
    raw = 0.0  # the largest LP value, before SAFETY
    for r in range(rounds):
        out.rounds = r + 1
        if not lp.solve():
            # only the first LP can be infeasible (later rows bound Z, which is free above): a
            # later failure is numerical (GLOP ABNORMAL), and the bound so far stands
            out.infeasible = r == 0 and lp.status == pywraplp.Solver.INFEASIBLE
            return out
        z = lp.z()
        raw = max(raw, z)
        out.bound = raw * (1 - SAFETY)
        xs = lp.x_values()
        out.points[:] = [(z, xs)]
        dur = lp.values(xs)
        length, counts = dag.longest_path(graph, dur)
        if length <= z * (1 + branch.CONVERGED) + branch.CONVERGED:
            out.converged = True
            break
        new = add(counts)
        for c in dag.paths_through(graph, dur, stages):
            new |= add(c)
        if not new:
            break
    if branch_work > 0 and out.bound > 0:
        tree = branch.branch_and_bound(lp, graph, stages, add, branch.quantities(lp, stages), branch_work,
                                       root=raw, deadline=branch_deadline)
        out.nodes, out.branch_work = tree.nodes, tree.work
        out.points += tree.points
        if tree.infeasible:
            out.infeasible = True
        elif tree.bound * (1 - SAFETY) > out.bound:
            out.bound, out.branched = tree.bound * (1 - SAFETY), True
    return out
