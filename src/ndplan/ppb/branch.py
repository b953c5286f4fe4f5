"""Branch and bound on relax.py's LP: the integer layer counts every plan has give a tighter bound.

relax.py's relaxation lets a stage hold a fraction of a layer. On 96 identical decoders over 16
stages with an embedding on the first and a head on the last, the fractional plan gives every
stage the same 73.3 ms per micro-batch (benchmarks/ppb_solve.py's layers: a decoder 12 ms,
embedding 2.5 ms, head 18 ms: (96 x 12 + 2.5 + 18) / 16); with whole layers some stage holds 7
decoders (84 ms) or the head's stage 6 (90 ms), since 16 stages of at most 6 decoders, the
head's at most 5, hold only 95. On that instance at 200 GiB (32 micro-batches) the LP bounds the
step at 2.7398 s, the tree at the default budget at 2.8255 s, and the best plan known takes 2.8945 s.

Every plan holds a whole number of layers on each stage, in each slice, of each type in a slice and
of each type under each recompute mode in a slice. So the tree branches on those quantities
(``Quantity``), in that order, the most fractional first: one child has the quantity <= floor,
the other >= ceil. A node's LP is relax.py's LP with the node's bounds on them; its value after at
most NODE_ROUNDS Kelley rounds is a lower bound on every plan in the node (any subset of the path
rows is a relaxation), and a path found at any node is valid everywhere, so the cuts are shared.
Best first: the open node with the least bound goes next, and the least bound over the open nodes
(and the closed leaves) bounds every plan. A leaf whose quantities are all integral is closed once
its LP value is its own longest path: its counts are then an optimal point of the node.

The counts drop contiguity (which layers, not how many), and MindFormers' one select list, so the
bound is a relaxation's: with an embedding, identical layers and a head (layer order fixed by the
counts), an exhausted tree is the optimum (tests/test_ppb_branch.py against brute force).

Deterministic: node order by (bound, creation), CLP, and a work count in place of a clock.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field

import numpy as np
from ortools.linear_solver import pywraplp

from ndplan.ppb import dag

NODE_ROUNDS = 2
"""Kelley rounds per node before it branches. A first version of this tree, started from the chain
cuts alone, on 96 layers x 16 stages x vpp 2 x 32 micro-batches (interleaved, 200 GiB, 2026-12-07)
bounded the step after about 9 s at 2.8427 s with 3 rounds, 2.8491 with 2, 2.8403 with 1 (7 s, 400
nodes) and 2.8166 with 50 (converging every node): a node's children re-solve its LP anyway, so
rounds beyond the first few are spent twice."""
ROW_STEPS = 15
"""Work of one LP row in one solve, in DAG-node steps: a CLP solve took about 30 us per row
and a round's longest paths about 2 us per DAG node (the same runs)."""
WORK_PER_UNIT = 3_750_000
"""Work allowed per unit of the solve's deterministic budget, in DAG-node steps (ROW_STEPS). At the
default budget solve.py gives the tree 0.6 units, 2.25e6 steps: about 2.3 s and 95 nodes on 96 layers x
16 stages x vpp 2 x 32 micro-batches (2 cores, 2026-12-07), bounds 3.2887 / 3.0396 / 2.8255 s at
40 / 60 / 200 GiB against the root LP's 3.1263 / 2.9142 / 2.7398 s."""
CONVERGED = 1e-7
"""A longest path within this share of the LP value adds no row: the LP is the optimum over the
node's counts (an integral leaf closes). relax.py's root uses the same."""
INTEGRAL = 1e-7
"""A quantity within this of an integer is integral: CLP's default primal feasibility tolerance
(1e-7). Validity does not rest on it: a sum off an integer by a few tolerances only branches once
more (children <= floor and >= ceil still cover every integer)."""


@dataclass(frozen=True)
class Quantity:
    """An integer quantity of every plan, a sum of the LP's layer counts: ``kind`` is "stage",
    "slice", "type" or "mode" (branching order), ``key`` the stage, slice, (slice, type) or
    (slice, type, mode)."""
    kind: str
    key: object
    index: tuple[int, ...]
    """Its layer counts, positions in relax.py's ``_LP.flat``."""


KIND_ORDER = ("stage", "slice", "type", "mode")


@dataclass
class Result:
    bound: float
    """Lower bound on every plan's step time, time units (``root`` when no node raised it)."""
    nodes: int = 0
    infeasible: bool = False
    """Every node's LP was infeasible: no integer counts fit the memory rows."""
    points: list = field(default_factory=list)
    """(LP value, layer counts in relax.py's ``_LP.flat`` order) of every LP solved at a node, in
    order: starts for rounding.py's plans."""
    work: float = 0.0
    """DAG-node steps spent (ROW_STEPS)."""


class _Tree:
    """The LP with one bounded variable per quantity (its bounds are the node's), the node solves and
    the branching choice."""

    def __init__(self, lp, graph: dag.Dag, stages: dict, add, quantities: list[Quantity]):
        self.lp, self.graph, self.stages, self.add = lp, graph, stages, add
        self.q = quantities
        self.vars = self._bounded(lp)
        self.check = None
        """A second LP without path rows, built at the first infeasible node (``_infeasible``)."""
        flat = [i for qt in quantities for i in qt.index]
        self.gather = np.array(flat, dtype=np.int64)
        self.starts = np.cumsum([0] + [len(qt.index) for qt in quantities[:-1]], dtype=np.int64)
        """np.add.reduceat(x[gather], starts): the quantities' values at layer counts x."""
        self.work = 0.0
        self.points: list = []

    def _bounded(self, lp) -> list:
        out = []
        for r, qt in enumerate(self.q):
            y = lp.lp.NumVar(0, lp.lp.infinity(), f"q{r}")
            lp.lp.Add(y == sum(lp.flat[i] for i in qt.index))
            out.append(y)
        return out

    def _round_work(self) -> float:
        return len(self.graph.nodes) + ROW_STEPS * self.lp.lp.NumConstraints()

    @staticmethod
    def _set(variables: list, bounds: dict, inf: float) -> None:
        for i, y in enumerate(variables):
            lo, hi = bounds.get(i, (0, math.inf))
            y.SetBounds(lo, inf if hi == math.inf else hi)

    def _infeasible(self, bounds: dict) -> bool:
        """The node's bounds and the memory rows admit no counts, confirmed on an LP without the
        path rows (which cannot cut counts off, Z being free above: a simplex's INFEASIBLE among
        hundreds of dense, nearly parallel path rows is not trusted alone, relax.LP_SOLVER)."""
        if self.check is None:
            self.check = type(self.lp)(self.lp.inst, self.lp.sc)
            self.check_vars = self._bounded(self.check)
        self._set(self.check_vars, bounds, self.check.lp.infinity())
        self.check.solve()
        return self.check.status == pywraplp.Solver.INFEASIBLE

    def solve(self, bounds: dict) -> tuple[float, np.ndarray, bool] | str:
        """(LP value, quantity values, converged) of the node with ``bounds`` {index: (lo, hi)};
        "infeasible", or "failed" when its first LP stopped otherwise (numerically, or an
        INFEASIBLE ``_infeasible`` does not confirm). Every LP point goes to ``points``."""
        self._set(self.vars, bounds, self.lp.lp.infinity())
        z, vals = None, None
        for _ in range(NODE_ROUNDS):
            self.work += self._round_work()
            if not self.lp.solve():
                if z is not None:
                    return z, vals, False
                infeasible = self.lp.status == pywraplp.Solver.INFEASIBLE and self._infeasible(bounds)
                return "infeasible" if infeasible else "failed"
            z = self.lp.z()
            xs = self.lp.x_values()
            self.points.append((z, xs))
            vals = np.add.reduceat(xs[self.gather], self.starts)
            dur = self.lp.values(xs)
            length, counts = dag.longest_path(self.graph, dur)
            if length <= z * (1 + CONVERGED) + CONVERGED:
                return z, vals, True
            new = self.add(counts)
            for c in dag.paths_through(self.graph, dur, self.stages):
                new |= self.add(c)
            if not new:  # the path is a row already: z is its length within the LP's tolerance
                return z, vals, True
        return z, vals, False

    def pick(self, vals: np.ndarray, bounds: dict) -> int | None:
        """The most fractional quantity of the first kind (KIND_ORDER) that has one, its value taken
        within the node's bounds; None if all are integral."""
        for kind in KIND_ORDER:
            best, arg = INTEGRAL, None
            for i, qt in enumerate(self.q):
                if qt.kind != kind:
                    continue
                x = _within(vals[i], bounds.get(i, (0, math.inf)))
                frac = abs(x - round(x))
                if frac > best:
                    best, arg = frac, i
            if arg is not None:
                return arg
        return None


def _within(x: float, bounds: tuple) -> float:
    """``x`` clamped to ``bounds`` (a sum of LP values may leave them by the LP's tolerance)."""
    return min(max(x, bounds[0]), bounds[1])


def branch_and_bound(lp, graph: dag.Dag, stages: dict, add, quantities: list[Quantity], work: float,
                     root: float = 0.0, deadline: float = math.inf) -> Result:
    """Best-first branch and bound (module docstring) with at most ``work`` DAG-node steps and until
    ``deadline`` (time.perf_counter(): a wall-clock budget, opt-in); ``root`` a bound already proven
    (the root LP's value). ``add(counts)`` adds a path row to ``lp`` (False when known). It stops
    early once no open node is below the least closed leaf: the bound cannot move."""
    tree = _Tree(lp, graph, stages, add, quantities)
    heap = [(root, 0, {})]
    made, out = 1, Result(bound=root)
    leaf = math.inf  # the least closed leaf
    while heap and heap[0][0] < leaf and tree.work < work and time.perf_counter() < deadline:
        lb, _, bounds = heapq.heappop(heap)
        res = tree.solve(bounds)
        out.nodes += 1
        if res == "infeasible":
            continue
        if res == "failed":  # keep what the parent proved
            leaf = min(leaf, lb)
            continue
        z, vals, converged = res
        z = max(z, lb)
        i = tree.pick(vals, bounds)
        if i is None:
            if converged:
                leaf = min(leaf, z)
            else:  # integral but not yet its own longest path: solve it again with the new rows
                heapq.heappush(heap, (z, made, bounds))
                made += 1
            continue
        lo, hi = bounds.get(i, (0, math.inf))
        x = _within(vals[i], (lo, hi))
        for child in ((lo, math.floor(x)), (math.ceil(x), hi)):
            if child[0] <= child[1]:
                heapq.heappush(heap, (z, made, {**bounds, i: child}))
                made += 1
    best = min(heap[0][0] if heap else math.inf, leaf)
    out.points, out.work = tree.points, tree.work
    out.infeasible = best == math.inf  # every node infeasible: no integer counts fit
    out.bound = max(root, best) if best < math.inf else root
    return out


def quantities(lp, stages: dict) -> list[Quantity]:
    """The integer quantities of relax.py's LP ``lp`` (x[v][k][j] layers of type k, mode j in slice v,
    positions in ``lp.flat``): layers per stage (``stages[s]`` its slices), per slice, per type in a
    slice (when there is more than one type), per mode of a type in a slice (types with more than one
    mode); a quantity with the same positions as an earlier one (a stage of one slice, DualPipe's
    mirror stages), with none or with all (a constant) is left out."""
    types = lp.sc.types
    width = sum(len(t.modes) for t in types)
    first = [sum(len(t.modes) for t in types[:k]) for k in range(len(types))]

    def of(v: int, k: int | None = None, j: int | None = None) -> tuple[int, ...]:
        if k is None:
            return tuple(range(v * width, (v + 1) * width))
        base = v * width + first[k]
        return tuple(range(base, base + len(types[k].modes))) if j is None else (base + j,)

    cands = [Quantity("stage", s, tuple(sorted(i for v in vs for i in of(v)))) for s, vs in stages.items()]
    cands += [Quantity("slice", v, of(v)) for v in range(lp.V)]
    if len(types) > 1:
        cands += [Quantity("type", (v, k), of(v, k)) for v in range(lp.V) for k in range(len(types))]
    cands += [Quantity("mode", (v, k, j), of(v, k, j)) for v in range(lp.V) for k, t in enumerate(types)
              if len(t.modes) > 1 for j in range(len(t.modes))]
    seen, out = set(), []
    for qt in cands:
        if 0 < len(qt.index) < len(lp.flat) and qt.index not in seen:
            seen.add(qt.index)
            out.append(qt)
    return out
