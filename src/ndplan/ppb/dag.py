"""The dependency DAG of a fixed-order pipeline schedule and its longest path.

Nodes are ops (kind, v, j): kind F (forward), B (backward: input gradient and the
layers' recompute, plus the weight gradient unless the schedule runs it apart) or W
(weight gradient, zb-h1 and zbv), v the virtual stage (model slice, layer order), j the
micro-batch. Edges:

* data: F(v, j) after F(v-1, j); B(v, j) after B(v+1, j); the last slice's B after its F;
  W(v, j) after B(v, j);
* device order: each stage runs its ops in ``schedules.op_order`` (gpipe, 1f1b,
  interleaved, zb-h1, zbv, dualpipe, dualpipev), one at a time;
* DualPipe and DualPipeV (``schedules.comm_plan``): an overlapped forward & backward starts
  when the inputs of both halves are there (its F waits for its B's input too), and an output
  is sent after the op DualPipe sends it after (a whole backward after its W, a pair after
  both halves), so those edges start at that op. The pair runs its F and its B in turn: one
  op's time is their sum (as
  torch's runtime runs OVERLAP_F_B's sub-actions, schedules.py:2632-2636, torch 2.13, and
  DualPipe without a custom ``overlapped_forward_backward``, dualpipe.py:125-128).

With every op started as soon as its predecessors end (what the schedule's runtime does,
and what simulate.py replays), the step time is the longest path, whose length is a
sum of op durations: sum_v nF_v F_v + nB_v B_v (+ nW_v W_v) with path counts n. For a
fixed pipeline configuration the DAG does not depend on the plan, so every path's count
vector gives a cut ``step >= sum_v n_v . dur_v`` valid for every plan;
model.py minimises over such cuts and solve.py adds the critical path of each plan it
meets until the plan's longest path equals the model's objective.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ndplan.formulas.schedules import comm_plan, op_order, virtual_stage
from ndplan.layouts import slices

from ndplan.vocab import SCHEDULES as FIXED_ORDER_SCHEDULES  # every schedule has one op order per stage


Op = tuple[str, int, int]


@dataclass(frozen=True)
class Dag:
    nodes: tuple[Op, ...]
    """Ops in a topological order."""
    preds: tuple[tuple[int, ...], ...]
    """preds[i]: indices (into ``nodes``) of the ops node i waits for."""
    orders: tuple[tuple[int, ...], ...]
    """orders[s]: indices of stage s's ops in the order it runs them."""
    succs: tuple[tuple[int, ...], ...]
    """succs[i]: the nodes that wait for node i, ascending (``preds`` inverted)."""
    of_slice: tuple[tuple[int, ...], ...]
    """of_slice[v]: the nodes of slice v, ascending."""


def data_need(op: Op, V: int) -> Op | None:
    """The op whose output ``op`` consumes (module docstring), None for a first forward."""
    kind, v, j = op
    if kind == "F":
        return ("F", v - 1, j) if v > 0 else None
    if kind == "B":
        return ("B", v + 1, j) if v < V - 1 else ("F", v, j)
    return ("B", v, j)


@lru_cache(maxsize=64)
def build(schedule: str, pp: int, vpp: int, m: int) -> Dag:
    if schedule not in FIXED_ORDER_SCHEDULES:
        raise ValueError(f"{schedule!r} has no fixed op order")
    V = slices(schedule, pp, vpp)
    orders, release = [], {}
    for s in range(pp):
        order = [(k, virtual_stage(schedule, s, c, pp), j) for k, c, j in op_order(schedule, s, pp, vpp, m)]
        _, sends = comm_plan(schedule, s, pp, vpp, m)
        release.update({op: order[i] for op, i in zip(order, sends)})
        orders.append(order)
    preds: dict[Op, list[Op]] = {}
    for s, order in enumerate(orders):
        waits, _ = comm_plan(schedule, s, pp, vpp, m)
        for i, op in enumerate(order):
            ps = [order[i - 1]] if i else []
            for kind, c, j in waits[i]:  # the inputs it waits for, each sent when its release op ends
                need = data_need((kind, virtual_stage(schedule, s, c, pp), j), V)
                if need is not None and release[need] not in ps:
                    ps.append(release[need])
            preds[op] = ps
    # Kahn's algorithm; a cycle would mean the op order deadlocks
    succ: dict[Op, list[Op]] = {op: [] for op in preds}
    waiting = {op: len(ps) for op, ps in preds.items()}
    for op, ps in preds.items():
        for q in ps:
            succ[q].append(op)
    ready = [op for op, n in waiting.items() if n == 0]
    topo: list[Op] = []
    while ready:
        op = ready.pop()
        topo.append(op)
        for nxt in succ[op]:
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                ready.append(nxt)
    if len(topo) != len(preds):
        raise RuntimeError(f"{schedule} op order with pp={pp} vpp={vpp} m={m} deadlocks")
    index = {op: i for i, op in enumerate(topo)}
    pred_ix = tuple(tuple(index[q] for q in preds[op]) for op in topo)
    succs: list[list[int]] = [[] for _ in topo]
    of_slice: list[list[int]] = [[] for _ in range(V)]
    for i, ps in enumerate(pred_ix):
        of_slice[topo[i][1]].append(i)
        for q in ps:
            succs[q].append(i)
    return Dag(nodes=tuple(topo), preds=pred_ix, orders=tuple(tuple(index[op] for op in order) for order in orders),
               succs=tuple(map(tuple, succs)), of_slice=tuple(map(tuple, of_slice)))


def _forward(dag: Dag, dur) -> tuple[list[float], list[int]]:
    """end[i]: longest path length ending with node i (inclusive); via[i]: its predecessor."""
    n = len(dag.nodes)
    end, via = [0.0] * n, [-1] * n
    for i, (kind, v, _) in enumerate(dag.nodes):
        start, arg = 0, -1
        for q in dag.preds[i]:
            if end[q] > start:
                start, arg = end[q], q
        end[i] = start + dur[kind, v]
        via[i] = arg
    return end, via


def _counts(dag: Dag, nodes) -> Counter:
    counts: Counter = Counter()
    for i in nodes:
        kind, v, _ = dag.nodes[i]
        counts[kind, v] += 1
    return counts


def longest_path(dag: Dag, dur: dict[tuple[str, int], float]) -> tuple[float, Counter]:
    """(length, counts): the longest path under durations ``dur[kind, v]`` and how many
    ops of each (kind, v) it runs."""
    end, via = _forward(dag, dur)
    i = max(range(len(end)), key=end.__getitem__)
    path = []
    while i >= 0:
        path.append(i)
        i = via[i]
    return max(end), _counts(dag, path)


KINDS = ("F", "B", "W")
"""Row order of the duration arrays of ``lengths``."""


def lengths(dag: Dag, dur: np.ndarray) -> np.ndarray:
    """Longest-path lengths of K plans at once: ``dur[k, KINDS.index(kind), v]`` is plan
    k's op duration (integers). The same recursion as ``longest_path``, one node at a time
    over all K plans (numpy), about 50x faster than K scalar calls at 2048 nodes."""
    K = dur.shape[0]
    rows = dur.reshape(K, -1).T.copy()  # rows[KINDS.index(kind) * V + v] = durations over plans
    V = dur.shape[2]
    end = np.empty((len(dag.nodes), K), dtype=dur.dtype)
    zero = np.zeros(K, dtype=dur.dtype)
    for i, (kind, v, _) in enumerate(dag.nodes):
        start = zero
        for q in dag.preds[i]:  # the stage's previous op and the data dependencies (two under a DualPipe pair)
            start = end[q] if start is zero else np.maximum(start, end[q])
        np.add(start, rows[KINDS.index(kind) * V + v], out=end[i])
    return end.max(axis=0)


def paths_through(dag: Dag, dur: dict[tuple[str, int], float], groups: dict) -> list[Counter]:
    """For every group of virtual stages (``groups[key]`` a set of v), the longest path
    through one of its ops: the critical path of the plan as seen from each stage."""
    end, via = _forward(dag, dur)
    n = len(dag.nodes)
    tail, nxt = [0.0] * n, [-1] * n  # tail[i]: longest path starting after node i
    for i in reversed(range(n)):
        for q in dag.succs[i]:
            kind, v, _ = dag.nodes[q]
            x = dur[kind, v] + tail[q]
            if x > tail[i]:
                tail[i], nxt[i] = x, q
    out = []
    for vs in groups.values():
        cands = sorted(i for v in vs for i in dag.of_slice[v])
        i = max(cands, key=lambda k: end[k] + tail[k])
        path, j = [], i
        while j >= 0:
            path.append(j)
            j = via[j]
        j = nxt[i]
        while j >= 0:
            path.append(j)
            j = nxt[j]
        out.append(_counts(dag, path))
    return out


def chain_counts(dag: Dag, stage: int) -> Counter:
    """Counts of a path through all of ``stage``'s ops: back from its first op along
    first predecessors to a source, its whole op chain, on from its last op along first
    successors to a sink. Its length is at least m x the stage's time per micro-batch plus
    a fill and a drain, for every plan."""
    order = dag.orders[stage]
    path = list(order)
    i = order[0]
    while dag.preds[i]:
        i = dag.preds[i][0]
        path.append(i)
    i = order[-1]
    while dag.succs[i]:
        i = dag.succs[i][0]
        path.append(i)
    return _counts(dag, path)

