"""Solve a PPB instance: Config / Solution, the greedy hint, explicit status handling,
plan evaluation under the same model, baselines and infeasibility diagnosis.

A solve first runs the continuous relaxation (relax.py) and its branch and bound on integer layer
counts (branch.py, BRANCH_SHARE of the budget): its bound is kept beside CP-SAT's (the tighter one is
reported, with its source), its paths are CP-SAT's first cuts, its LP points rounded to plans
(rounding.py) give the first plan (``_start``), and an instance it finds infeasible has no plan.
Then CP-SAT passes over path cuts and local search (``_solve_paths``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np
from ortools.sat.python import cp_model

from ndplan.ppb import dag
from ndplan.ppb.instance import MODES, Instance
from ndplan.ppb.local import WorkCap, polish, unit_durations, unit_memory_fits
from ndplan.ppb.rounding import round_point
from ndplan.ppb.model import PPBModel
from ndplan.ppb.branch import WORK_PER_UNIT as BRANCH_WORK_PER_UNIT
from ndplan.ppb.relax import WORK_PER_UNIT, relax
from ndplan.ppb.plan import Plan, offers_both_selects, one_select_list, stage_memory_bytes, stage_slices, uniform_plan
from ndplan.ppb.config import DEFAULT_DETERMINISTIC_TIME, DEFAULT_TIME_LIMIT_S, DEFAULT_WORKERS, Config  # noqa: F401 (re-exported)
from ndplan.ppb.scale import Scaled, scale_instance

@dataclass(frozen=True, kw_only=True)
class Solution:
    status: str
    """OPTIMAL, FEASIBLE (time limit hit with a plan), INFEASIBLE, or UNKNOWN (no plan yet)."""
    plan: Plan | None
    objective_s: float | None
    """The model's step time of ``plan``, seconds (scale.time_s resolution)."""
    bound_s: float | None
    """Proven lower bound on the optimal step time, seconds."""
    bound_source: str = "CP-SAT"
    """Which proof gives ``bound_s``: "CP-SAT" (its best objective bound), "relaxation" (relax.py's
    continuous relaxation, when tighter) or "branch-and-bound" (branch.py's integer layer counts
    over that relaxation, when they raised it)."""
    wall_s: float
    """Solver wall time, seconds."""

    @property
    def gap(self) -> float | None:
        if self.objective_s is None or not self.objective_s:
            return None
        return (self.objective_s - self.bound_s) / self.objective_s


@dataclass(frozen=True, kw_only=True)
class Diagnosis:
    """Why no plan fits: the best plan's tightest stage still needs ``overflow_bytes``."""
    stage: int
    """Stage of the least-memory plan that sets its peak."""
    overflow_bytes: int
    """Its memory minus the budget."""
    min_budget_bytes: int
    """Smallest budget under which some plan fits (memory resolution, rounded up)."""

    def message(self) -> str:
        from ndplan.units import fmt_bytes
        return (f"no plan fits: even the least-memory plan needs {fmt_bytes(self.overflow_bytes)} more on "
                f"stage {self.stage}; the smallest budget that fits is {fmt_bytes(self.min_budget_bytes)} "
                f"({self.min_budget_bytes} bytes)")


STATUS = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE", cp_model.INFEASIBLE: "INFEASIBLE",
          cp_model.UNKNOWN: "UNKNOWN"}


class _Budget:
    """What one solve may spend: wall-clock seconds, or CP-SAT deterministic time
    (``Config.deterministic_time``; then only the passes spend it and local search has
    no deadline)."""

    def __init__(self, cfg: Config, total: float | None = None):
        self.cfg = cfg
        self.deterministic = cfg.deterministic
        whole = cfg.deterministic_time if self.deterministic else cfg.time_limit_s
        self.total = max(whole if total is None else total, MIN_PASS)
        self.t0 = time.perf_counter()
        self.passes = 0.0
        """Deterministic time spent by CP-SAT passes so far."""
        self.cap = WorkCap(LOCAL_WORK_PER_UNIT * self.total if self.deterministic else float("inf"))
        """Local search's share in deterministic mode, where it has no deadline."""

    def spent(self) -> float:
        return self.passes if self.deterministic else time.perf_counter() - self.t0

    def left(self) -> float:
        return self.total - self.spent()

    def deadline(self, share: float, keep: float = 0.0) -> float:
        """perf_counter() deadline for local search taking ``share`` of the budget and
        leaving ``keep`` of it (none in deterministic mode)."""
        if self.deterministic:
            return math.inf
        return min(time.perf_counter() + share * self.total, self.t0 + (1 - keep) * self.total)

    def part(self, total: float) -> _Budget:
        """A budget of ``total`` for one phase, its local search within what this one has left
        (``settle`` charges it back)."""
        sub = _Budget(self.cfg, total)
        sub.cap = WorkCap(min(sub.cap.left, self.cap.left))
        sub.given = sub.cap.left
        return sub

    def settle(self, sub: _Budget) -> None:
        """Charge a phase's CP-SAT passes and local search (``part``) to this budget."""
        self.passes += sub.passes
        self.cap.spend(sub.given - sub.cap.left)

    def run(self, pm: PPBModel, limit: float) -> tuple[str, cp_model.CpSolver]:
        """One CP-SAT pass of at most ``limit`` budget units."""
        status, solver = _run(pm, self.cfg, max(limit, MIN_PASS))
        self.passes += solver.deterministic_time
        return status, solver


LOCAL_WORK_PER_UNIT = 2.4e8
"""Local search allowed per deterministic unit, (shift x DAG node) steps (local.WorkCap), which it
has no deadline to stop it otherwise. At the default 3 units, 7.2e8 (2026-12-07, 2 cores): 96
layers x 16 stages x vpp 2 x 32 micro-batches interleaved at 60 GiB used 3.0e8 (3.2685 s in
13.5 s; uncapped 3.61e8, 3.201 s), 128 x 32 stages x zbv x 64 at 40 GiB is stopped at 5.9e8
(5.153 s in 20 s; uncapped 3.7e9, 4.786 s in 51 s)."""
MIN_PASS = 0.01
"""Smallest limit of one CP-SAT pass (seconds or deterministic units)."""


def _solver(cfg: Config, limit: float) -> cp_model.CpSolver:
    s = cp_model.CpSolver()
    if not cfg.deterministic:
        s.parameters.max_time_in_seconds = limit
    else:
        s.parameters.max_deterministic_time = limit
        s.parameters.interleave_search = cfg.workers > 1
    s.parameters.num_workers = cfg.workers
    s.parameters.random_seed = cfg.seed
    return s


def _run(pm: PPBModel, cfg: Config, limit: float) -> tuple[str, cp_model.CpSolver]:
    solver = _solver(cfg, limit)
    code = solver.Solve(pm.model)
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"PPB built an invalid CP-SAT model: {pm.model.Validate()}")
    return STATUS[code], solver


def expressible(inst: Instance, plan: Plan) -> bool:
    """The plan keeps MindFormers' one select list per slice where the instance offers both
    (plan.one_select_list; model.py and local.py keep it too)."""
    return not offers_both_selects(inst) or one_select_list(plan)


def rounded_plans(inst: Instance, sc: Scaled, points, deadline: float = math.inf) -> list[Plan]:
    """The distinct plans rounding.py makes of the relaxation's distinct LP points
    (relax.Relaxation.points), the ones MindFormers can express; until ``deadline``
    (time.perf_counter(), the wall-clock budget's)."""
    seen, plans = set(), {}
    for _, xs in points:
        key = np.round(xs, 6).tobytes()
        if key in seen:
            continue
        if time.perf_counter() >= deadline:
            break
        seen.add(key)
        plan = round_point(inst, sc, xs)
        if plan is not None and expressible(inst, plan):
            plans.setdefault(plan, None)
    return list(plans)


def _start(inst: Instance, sc: Scaled, pm: PPBModel, budget: _Budget, rounded: list[Plan]) -> Plan:
    """The search's first plan, after local search: the fastest rounded plan's, unless local search
    within GREEDY_POLISH_SHARE of the budget takes the greedy even split (``greedy_hint``) as fast
    or faster; then the greedy plan stays, and with it CP-SAT's search as it ran before rounding
    (CP-SAT's hint is this plan)."""
    greedy = greedy_hint(inst)
    if not rounded:
        return greedy
    p = inst.pipeline
    graph = dag.build(p.schedule, p.pp, p.vpp, p.m)

    def polished(plan: Plan, share: float, cap: WorkCap) -> tuple[int, Plan]:
        length = dag.longest_path(graph, unit_durations(inst, sc, plan))[0]
        return polish(inst, sc, graph, plan, length, budget.deadline(share, keep=FINAL_POLISH_SHARE), pm.add_path_cut,
                      cap=cap)

    timed = sorted((dag.longest_path(graph, unit_durations(inst, sc, plan))[0], i) for i, plan in enumerate(rounded))
    best = polished(rounded[timed[0][1]], LOCAL_SEARCH_SHARE, budget.cap)
    if unit_memory_fits(inst, sc, greedy) and expressible(inst, greedy):
        cap = WorkCap(min(budget.cap.left, GREEDY_POLISH_SHARE * LOCAL_WORK_PER_UNIT * budget.total)
                      if budget.deterministic else math.inf)  # on the wall clock the deadline limits it
        given = cap.left
        best = min(polished(greedy, GREEDY_POLISH_SHARE, cap), best, key=lambda lp: lp[0])  # the first on a tie
        budget.cap.spend(given - cap.left)
    return best[1]


GREEDY_POLISH_SHARE = 0.05
"""Share of the budget (local search's work, or the wall clock) in which local search from the greedy
even split may match the fastest rounded plan (``_start``). Measured 2026-12-07 (2 cores, default
budget: 3.6e7 steps): 96 layers x 16 stages 1f1b at 60 GiB took 2.2e7 to reach the rounded plan's
3.6885 s, the optimum, which CP-SAT then proved from the greedy plan and not from the rounded one;
96 x 16 x vpp 2 interleaved at 40 GiB took 1.2e8 (2.4 s) to reach 3.6685 s against the rounded plan's
3.5135 s."""


def greedy_hint(inst: Instance) -> Plan:
    """Even split at the least recompute mode under which every stage fits (else full)."""
    for mode in MODES:
        plan = uniform_plan(inst, mode)
        if max(stage_memory_bytes(inst, plan)) <= inst.pipeline.budget_bytes and expressible(inst, plan):
            return plan
    return uniform_plan(inst, "full")


BRANCH_SHARE = 0.2
"""Share of the budget for relax.py's branch and bound (branch.py), in its work count
(branch.WORK_PER_UNIT per deterministic unit) or on the wall clock. At 0.3, 96 layers x 16 stages
1f1b at 60 GiB ended unproven (0.76 %): CP-SAT's one pass needs about 2.8 units there."""
ROUNDING_SHARE = 0.3
"""On the wall clock, rounding LP points (``rounded_plans``) takes at most this share of the budget (the
tree BRANCH_SHARE); in the deterministic mode it rounds every distinct point the tree's work produced
(about 5 ms each: 1.0 s for 188 points on 96 layers x 16 stages x vpp 2 x 32 micro-batches)."""
BALANCED_PHASE_SHARE = 0.4
"""vpp > 1: share of the time limit for a first search among plans whose chunks on a
stage differ by at most CHUNK_SLACK layers (uneven chunks stall the steady state, so good
plans are there and the restricted relaxation is much tighter); its plan and path cuts
seed the unrestricted search, which alone gives the bound and the status."""
CHUNK_SLACK = 1


def solve(inst: Instance, cfg: Config = Config(), hint: Plan | None = None) -> Solution:
    """Minimise the step time (the longest path of the schedule's op DAG) under the
    memory budget, from ``hint`` or the fastest of the greedy even split and the relaxation's
    rounded LP points (``rounded_plans``), by ``_solve_paths``."""
    t0 = time.perf_counter()
    whole = _Budget(cfg)
    sc = scale_instance(inst, cfg.scale)
    share = BRANCH_SHARE * whole.total
    if cfg.deterministic:  # the tree's work counts against the budget; on the wall clock its time does
        rel = relax(inst, sc, work=WORK_PER_UNIT * cfg.deterministic_time, branch_work=BRANCH_WORK_PER_UNIT * share)
        whole.passes += rel.branch_work / BRANCH_WORK_PER_UNIT
    else:
        rel = relax(inst, sc, work=WORK_PER_UNIT * cfg.deterministic_time, branch_work=math.inf,
                    branch_deadline=whole.t0 + share)
    if rel.infeasible:  # not even integer layer counts fit the memory rows
        return Solution(status="INFEASIBLE", plan=None, objective_s=None, bound_s=None, wall_s=time.perf_counter() - t0)
    floor = integer_bound(rel.bound)
    pm = PPBModel(inst, sc)
    for c in rel.cuts:  # the relaxation's paths guide CP-SAT from its first pass
        pm.add_path_cut(c)
    if hint is None:
        rounded = rounded_plans(inst, sc, rel.points, whole.deadline(ROUNDING_SHARE))
        start = _start(inst, sc, pm, whole, rounded)
    else:
        start = hint
    if inst.pipeline.vpp > 1:
        first = PPBModel(inst, sc, chunk_slack=CHUNK_SLACK)
        first.add_path_cuts(pm.cuts)
        phase = whole.part(whole.total * BALANCED_PHASE_SHARE)
        sol = _solve_paths(inst, sc, first, phase, start)  # a restriction: its bound is not the problem's
        whole.settle(phase)
        pm.add_path_cuts(first.cuts)
        if sol.plan is not None and (not unit_memory_fits(inst, sc, start) or sol.objective_s <= evaluate(inst, start, cfg)):
            start = sol.plan
    rest = whole.part(whole.left())
    sol = _solve_paths(inst, sc, pm, rest, start, floor, "branch-and-bound" if rel.branched else "relaxation")
    return replace(sol, wall_s=time.perf_counter() - t0)


BOUND_TOLERANCE = 1e-6
"""CP-SAT reports the objective bound as a double (27999.999999999996 for a proven
28000); the objective Z is an integer (time units), so a bound within this of an integer
proves that integer."""


def integer_bound(bound: float) -> int:
    """The proven lower bound on the integer objective."""
    return math.ceil(bound - BOUND_TOLERANCE)


PASS_SHARE = 0.3
"""Share of the time limit one relaxation solve may take before its plan and bound are
used (an unproven relaxation still gives a valid bound and a plan to cut)."""
LOCAL_SEARCH_SHARE = 0.2
"""Share of the time limit spent on local search (local.py) from each solved plan."""
FINAL_POLISH_SHARE = 0.1
"""Share of the time limit kept for a last ``polish`` of the best plan, so even a plan
proven optimal by the relaxation drops recompute that does not change its step time."""


def _seed_cuts(inst: Instance, sc: Scaled, pm: PPBModel, graph, stages, start_plan: Plan) -> tuple[int, Plan] | None:
    """Cut the paths of the start plan and of the even plans; (its length, start_plan)
    as the first incumbent when it fits, else None."""
    for plan in dict.fromkeys([start_plan, *(uniform_plan(inst, mode) for mode in MODES)]):  # ordered: no hash order
        for c in dag.paths_through(graph, unit_durations(inst, sc, plan), stages):
            pm.add_path_cut(c)
    if not unit_memory_fits(inst, sc, start_plan) or not expressible(inst, start_plan):
        return None
    return dag.longest_path(graph, unit_durations(inst, sc, start_plan))[0], start_plan


def _solve_paths(inst: Instance, sc: Scaled, pm: PPBModel, budget: _Budget, start_plan: Plan,
                 floor: int = 0, floor_source: str = "relaxation") -> Solution:
    """Fixed-order schedules: minimise Z over path cuts (model.py), adding the critical
    paths of each solved plan until a solve's optimum is its own longest path. Every
    relaxation bound is a valid bound (it has a subset of the paths); the incumbent is
    the best plan by its longest path, the replayed step time; each solved plan is
    polished by local search (local.py) before the next solve. ``floor``: a bound proven
    otherwise (relax.py), in time units, by ``floor_source`` (Solution.bound_source)."""
    t0 = time.perf_counter()
    p = inst.pipeline
    graph = dag.build(p.schedule, p.pp, p.vpp, p.m)
    total = budget.total
    stages = {s: {v for _, v in stage_slices(p, s)} for s in range(p.pp)}
    best = _seed_cuts(inst, sc, pm, graph, stages, start_plan)
    bound = 0.0
    status = "UNKNOWN"
    if best is not None:
        best = polish(inst, sc, graph, best[1], best[0], budget.deadline(LOCAL_SEARCH_SHARE, keep=FINAL_POLISH_SHARE),
                      pm.add_path_cut, cap=budget.cap)
    while (left := budget.left() - FINAL_POLISH_SHARE * total) > 0 and not (best and floor >= best[0]):
        pm.model.ClearHints()
        pm.hint(best[1] if best else start_plan)
        status, solver = budget.run(pm, min(left, PASS_SHARE * total))
        if status == "INFEASIBLE":
            return Solution(status=status, plan=None, objective_s=None, bound_s=None, wall_s=time.perf_counter() - t0)
        if status == "UNKNOWN":
            if best is None and budget.left() > FINAL_POLISH_SHARE * total:
                continue
            break
        bound = max(bound, integer_bound(solver.BestObjectiveBound()))
        plan = pm.plan(solver)
        dur = unit_durations(inst, sc, plan)
        length, counts = dag.longest_path(graph, dur)
        new = pm.add_path_cut(counts)
        for c in dag.paths_through(graph, dur, stages):
            new |= pm.add_path_cut(c)
        if length > bound:
            deadline = budget.deadline(LOCAL_SEARCH_SHARE, keep=FINAL_POLISH_SHARE)
            length, plan = polish(inst, sc, graph, plan, length, deadline, pm.add_path_cut, cap=budget.cap)
        if best is None or length < best[0]:
            best = (length, plan)
        if max(bound, floor) >= best[0] or (status == "OPTIMAL" and not new):
            break  # proven (a relaxation optimum whose critical paths are all cuts is its longest path)
    unit = budget.cfg.scale.time_s
    if best is not None:
        best = polish(inst, sc, graph, best[1], best[0], budget.deadline(1.0), pm.add_path_cut,
                      cap=WorkCap(max(budget.cap.left, LOCAL_WORK_PER_UNIT * FINAL_POLISH_SHARE * budget.total)))
    wall = time.perf_counter() - t0
    if best is None:
        return Solution(status=status, plan=None, objective_s=None, bound_s=None, wall_s=wall)
    source = floor_source if floor > bound else "CP-SAT"
    bound = max(bound, floor)
    proven = bound >= best[0]
    return Solution(status="OPTIMAL" if proven else "FEASIBLE", plan=best[1], objective_s=best[0] * unit,
                    bound_s=min(bound, best[0]) * unit, wall_s=wall, bound_source=source)


def evaluate(inst: Instance, plan: Plan, cfg: Config = Config()) -> float:
    """The model's step time of a given plan, seconds (memory not enforced)."""
    plan.check(inst)
    sc = scale_instance(inst, cfg.scale)
    p = inst.pipeline
    graph = dag.build(p.schedule, p.pp, p.vpp, p.m)
    return dag.longest_path(graph, unit_durations(inst, sc, plan))[0] * cfg.scale.time_s


def diagnose(inst: Instance, cfg: Config = Config()) -> Diagnosis:
    """The least peak memory over all plans (ignoring time) and the stage that sets it."""
    sc = scale_instance(inst, cfg.scale)
    pm = PPBModel(inst, sc, objective="memory", enforce_memory=False)
    pm.hint(uniform_plan(inst, "full"))
    budget = _Budget(cfg)
    status, solver = budget.run(pm, budget.total)
    if status not in ("OPTIMAL", "FEASIBLE"):
        raise RuntimeError(f"the memory-minimising model returned {status}")
    mems = [max(solver.Value(e) for e in exprs) for exprs in pm.mem]
    stage = max(range(len(mems)), key=mems.__getitem__)
    need = mems[stage] * cfg.scale.memory_bytes
    return Diagnosis(stage=stage, overflow_bytes=need - inst.pipeline.budget_bytes, min_budget_bytes=need)
