"""Discrete-event replay of a plan under its schedule, written apart from the CP-SAT
model: it knows each device's op order (or, for zbv, its greedy rule) and the data
dependencies, and runs every op as soon as its device is free and its inputs exist.

Ops per virtual stage v and micro-batch j (durations from the plan, per micro-batch):
F (forward), B (input gradient + the layers' recompute) and W (weight gradient; fused
into B except under zbv). Dependencies: F(v, j) after F(v-1, j); B(v, j) after
B(v+1, j), the last virtual stage's B after its F; W(v, j) after B(v, j).

Device orders: every schedule runs ``schedules.op_order`` (the schedule's definition,
shared with the CP-SAT model as the in-flight table is), and the data dependencies are
``dag.data_need`` (one rule for both); the replay's timing and memory accounting are its own. DualPipe/V: an op waits for the ops that send its inputs
(``schedules.comm_plan``: an overlapped pair's F for its B's input too; a whole backward's
output leaves after its W, a pair's after both halves); a DualPipe slice runs on two stages.

Memory: a chunk's activations for micro-batch j are alive from the start of F(v, j)
to the end of B(v, j) (as in the memory model, which frees at B).

The replay alone gives step_s, busy_s, idle_s (= step - busy), the memory series and
peak_bytes; nothing of formulas/ enters them, so tests can hold the closed forms of
formulas/step.py to them.

Idle split per stage s (an attribution, not part of the replay; ``_idle_split``):
recompute_s = m x its recompute seconds; bubble_s = the schedule's bubble for a
perfectly balanced pipeline of the same total work, (pp-1) tbar x the schedule's bubble
factor of formulas/step.py (``bubble_factor`` at t = tbar, W = Wbar, F = Fbar, the stage
means: 1f1b/gpipe 1, interleaved 1/vpp, zb-h1 max(t - 2W, 0)/t, zbv max(F, t - 3W)/(2t),
dualpipe(v) the paths of step.py's docstring);
bubble_s is at most the stage's idle time (a stage busier than the mean idles less than a
balanced pipeline would), imbalance_s = idle_s - bubble_s >= 0.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from ndplan.formulas.schedules import comm_plan, op_order, virtual_stage
from ndplan.ppb.dag import data_need
from ndplan.ppb.instance import Instance
from ndplan.ppb.plan import Plan, chunk_time_s, copies, stage_slices
from ndplan.vocab import SPLIT_W_SCHEDULES


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
    times = [chunk_time_s(inst, plan, v) for v in range(p.chunks)]
    runs, mem = _replay(p, _op_seconds(p, times), _chunk_activation_bytes(inst, plan), _static_bytes(inst, plan))
    step = max(r.end_s for r in runs)
    busy = [sum(r.end_s - r.start_s for r in runs if r.stage == s) for s in range(p.pp)]
    idle = [step - b for b in busy]
    bubbles, recompute = _idle_split(p, times, busy, idle)
    return SimResult(step_s=step, busy_s=busy, idle_s=idle, bubble_s=bubbles,
                     imbalance_s=[i - b for i, b in zip(idle, bubbles)], recompute_s=recompute,
                     peak_bytes=[max(b for _, b in series) for series in mem], memory=mem, ops=runs)


def _op_seconds(p, times: list[dict]) -> dict[tuple[str, int], float]:
    """Seconds of op kind F, B, W on virtual stage v (B includes W unless it runs apart)."""
    split_w = p.schedule in SPLIT_W_SCHEDULES
    dur = {}
    for v, t in enumerate(times):
        dur["F", v] = t["F"]
        dur["B", v] = t["B"] + (0.0 if split_w else t["W"])
        dur["W", v] = t["W"]
    return dur


def _chunk_activation_bytes(inst: Instance, plan: Plan) -> list[float]:
    """Bytes one micro-batch keeps on each virtual stage from its F to its B."""
    return [sum(inst.layers[i].activation_bytes[plan.recompute[i]] for i in plan.layers(v))
            for v in range(inst.pipeline.chunks)]


def _static_bytes(inst: Instance, plan: Plan) -> list[float]:
    p = inst.pipeline
    return [sum(inst.layers[i].static_bytes for _, v in stage_slices(p, s) for i in plan.layers(v))
            for s in range(p.pp)]


def _waits(p, orders) -> list[dict[int, list]]:
    """Per stage, position -> the ops whose end the op there waits for: the ops that send its
    inputs (schedules.comm_plan: DualPipe waits for every receive posted since its previous op
    and sends some outputs after a later op); else its input's op."""
    V = p.chunks
    release = {}
    for s, order in enumerate(orders):
        _, sends = comm_plan(p.schedule, s, p.pp, p.vpp, p.m)
        release.update({op: order[i] for op, i in zip(order, sends)})
    out = []
    for s, order in enumerate(orders):
        waits, _ = comm_plan(p.schedule, s, p.pp, p.vpp, p.m)
        out.append({i: [release[n] for k, c, j in waits[i]
                        if (n := data_need((k, virtual_stage(p.schedule, s, c, p.pp), j), V)) is not None]
                    for i in range(len(order))})
    return out


def _replay(p, dur, act, static) -> tuple[list[OpRun], list[list[tuple[float, float]]]]:
    """Run every stage's op order, each op as soon as its stage is idle and its input
    exists: (ops run, per-stage (time, bytes) series)."""
    V = p.chunks
    orders = [[(k, virtual_stage(p.schedule, s, c, p.pp), j) for k, c, j in op_order(p.schedule, s, p.pp, p.vpp, p.m)]
              for s in range(p.pp)]
    n_ops = V * p.m * (3 if p.schedule in SPLIT_W_SCHEDULES else 2)
    waits = _waits(p, orders)
    pos, done, runs = [0] * p.pp, {}, []
    events: list[tuple[float, int, tuple]] = []  # (end time, stage, op)
    mem, cur = [[(0.0, static[s])] for s in range(p.pp)], list(static)
    now, idle = 0.0, set(range(p.pp))
    while len(done) < n_ops:
        for s in sorted(idle):
            op = orders[s][pos[s]] if pos[s] < len(orders[s]) else None
            if op is None or not all(n in done and done[n] <= now for n in waits[s].get(pos[s], ())):
                continue
            pos[s] += 1
            kind, v, j = op
            if kind == "F":
                cur[s] += act[v]
                mem[s].append((now, cur[s]))
            heapq.heappush(events, (now + dur[kind, v], s, op))
            runs.append(OpRun(stage=s, kind=kind, v=v, mb=j, start_s=now, end_s=now + dur[kind, v]))
            idle.discard(s)
        if not events:
            raise RuntimeError(f"{p.schedule} replay deadlocked at t={now} with {n_ops - len(done)} ops left")
        now = events[0][0]
        while events and events[0][0] <= now:
            end, s, op = heapq.heappop(events)
            done[op] = end
            if op[0] == "B":
                cur[s] -= act[op[1]]
                mem[s].append((end, cur[s]))
            idle.add(s)
    return runs, mem


def _idle_split(p, times: list[dict], busy: list[float], idle: list[float]) -> tuple[list[float], list[float]]:
    """(bubble_s, recompute_s) per stage: the attribution of the module docstring, from
    formulas/step.py's bubble factor (the replay's numbers do not depend on it)."""
    rec, w_stage, f_stage = [0.0] * p.pp, [0.0] * p.pp, [0.0] * p.pp
    for s in range(p.pp):
        for _, v in stage_slices(p, s):  # under dualpipe each of the two slices runs half the micro-batches
            t = times[v]
            rec[s] += p.m * t["R"] / copies(p)
            w_stage[s] += t["W"] / copies(p)
            f_stage[s] += t["F"] / copies(p)
    tbar = sum(busy) / p.m / p.pp
    from ndplan.formulas.step import bubble_factor  # SymPy: loaded when a replay is compared
    factor = bubble_factor(p.schedule, p.vpp, tbar, sum(w_stage) / p.pp, sum(f_stage) / p.pp, p.pp) if tbar else 0
    bubble = (p.pp - 1) * tbar * float(factor)
    return [min(bubble, i) for i in idle], rec
