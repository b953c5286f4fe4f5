"""Discrete-event replay of a plan under its schedule, written apart from the CP-SAT
model: it knows each device's op order (or, for zbv, its greedy rule) and the data
dependencies, and runs every op as soon as its device is free and its inputs exist.

Ops per virtual stage v and micro-batch j (durations from the plan, per micro-batch):
F (forward), B (input gradient + the layers' recompute) and W (weight gradient; fused
into B except under zbv). Dependencies: F(v, j) after F(v-1, j); B(v, j) after
B(v+1, j), the last virtual stage's B after its F; W(v, j) after B(v, j).

Device orders: every schedule runs ``schedules.op_order`` (the schedule's definition,
shared with the CP-SAT model as the in-flight table is); the replay's timing and memory
accounting are its own.

Memory: a chunk's activations for micro-batch j are alive from the start of F(v, j)
to the end of B(v, j) (as in the memory model, which frees at B).

Idle split per stage s (busy = m t_s incl. recompute; idle = step - busy):
recompute_s = m x its recompute seconds; bubble_s = the schedule's bubble for a
perfectly balanced pipeline of the same total work (1f1b/gpipe (pp-1) tbar,
interleaved (pp-1) tbar/vpp, zb-h1 (pp-1) max(tbar - 2 Wbar, 0), zbv (pp-1)
max(Fbar, tbar - 3 Wbar)/2 (formulas/step.py),
tbar, Fbar, Wbar = stage means);
bubble_s is at most the stage's idle time (a stage busier than the mean idles less than a
balanced pipeline would), imbalance_s = idle_s - bubble_s >= 0.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from ndplan.formulas.schedules import op_order, virtual_stage
from ndplan.ppb.dag import SPLIT_W_SCHEDULES
from ndplan.ppb.instance import Instance
from ndplan.ppb.plan import Plan, chunk_time_s, slot


@dataclass(frozen=True)
class OpRun:
    stage: int
    kind: str
    """F, B (incl. recompute; incl. W unless zbv) or W."""
    v: int
    mb: int
    start_s: float
    end_s: float


@dataclass
class SimResult:
    step_s: float
    busy_s: list[float]
    idle_s: list[float]
    bubble_s: list[float]
    imbalance_s: list[float]
    recompute_s: list[float]
    peak_bytes: list[float]
    memory: list[list[tuple[float, float]]] = field(repr=False)
    """Per stage: (time, bytes) after every change."""
    ops: list[OpRun] = field(repr=False)


def simulate(inst: Instance, plan: Plan) -> SimResult:
    p = inst.pipeline
    pp, vpp, m, V = p.pp, p.vpp, p.m, p.chunks
    zb = p.schedule in SPLIT_W_SCHEDULES
    times = [chunk_time_s(inst, plan, v) for v in range(V)]
    dur = {}
    for v, t in enumerate(times):
        dur["F", v] = t["F"]
        dur["B", v] = t["B"] + (0.0 if zb else t["W"])
        dur["W", v] = t["W"]
    act = [sum(inst.layers[i].activation_bytes[plan.recompute[i]] for i in plan.layers(v)) for v in range(V)]
    static = [0.0] * pp
    for v in range(V):
        static[slot(p, v)[0]] += sum(inst.layers[i].static_bytes for i in plan.layers(v))
    vs = lambda s, c: virtual_stage(p.schedule, s, c, pp)  # noqa: E731

    done: dict[tuple[str, int, int], float] = {}

    def ready(kind, v, j, now) -> bool:
        if kind == "F":
            need = ("F", v - 1, j) if v > 0 else None
        elif kind == "B":
            need = ("B", v + 1, j) if v < V - 1 else ("F", v, j)
        else:
            need = ("B", v, j)
        return need is None or (need in done and done[need] <= now)

    orders = [[(k, vs(s, c), j) for k, c, j in op_order(p.schedule, s, pp, vpp, m)] for s in range(pp)]
    pos = [0] * pp

    def pick(s, now):
        if pos[s] < len(orders[s]) and ready(*orders[s][pos[s]], now):
            pos[s] += 1
            return orders[s][pos[s] - 1]
        return None

    n_ops = V * m * (3 if zb else 2)
    busy_until = [0.0] * pp
    events: list[tuple[float, int, tuple]] = []  # (end time, stage, op)
    mem = [[(0.0, static[s])] for s in range(pp)]
    cur = list(static)
    runs: list[OpRun] = []
    now = 0.0
    idle = set(range(pp))
    while len(done) < n_ops:
        for s in sorted(idle):
            op = pick(s, now)
            if op is None:
                continue
            kind, v, j = op
            end = now + dur[kind, v]
            if kind == "F":
                cur[s] += act[v]
                mem[s].append((now, cur[s]))
            heapq.heappush(events, (end, s, op))
            runs.append(OpRun(stage=s, kind=kind, v=v, mb=j, start_s=now, end_s=end))
            idle.discard(s)
            busy_until[s] = end
        if not events:
            raise RuntimeError(f"{p.schedule} replay deadlocked at t={now} with {n_ops - len(done)} ops left")
        now = events[0][0]
        while events and events[0][0] <= now:
            end, s, op = heapq.heappop(events)
            done[op] = end
            kind, v, j = op
            if kind == "B":
                cur[s] -= act[v]
                mem[s].append((end, cur[s]))
            idle.add(s)
    step = max(r.end_s for r in runs)
    busy = [sum(r.end_s - r.start_s for r in runs if r.stage == s) for s in range(pp)]
    rec = [0.0] * pp
    w_stage, f_stage = [0.0] * pp, [0.0] * pp
    for v, t in enumerate(times):
        rec[slot(p, v)[0]] += m * t["R"]
        w_stage[slot(p, v)[0]] += t["W"]
        f_stage[slot(p, v)[0]] += t["F"]
    tbar = sum(busy) / m / pp
    wbar, fbar = sum(w_stage) / pp, sum(f_stage) / pp
    factor = {"gpipe": tbar, "1f1b": tbar, "interleaved": tbar / vpp, "zb-h1": max(tbar - 2 * wbar, 0.0),
              "zbv": max(fbar, tbar - 3 * wbar) / 2}
    bubble = (pp - 1) * factor[p.schedule]
    idle_s = [step - b for b in busy]
    bubbles = [min(bubble, i) for i in idle_s]
    return SimResult(step_s=step, busy_s=busy, idle_s=idle_s, bubble_s=bubbles,
                     imbalance_s=[i - b for i, b in zip(idle_s, bubbles)], recompute_s=rec,
                     peak_bytes=[max(b for _, b in series) for series in mem], memory=mem, ops=runs)
