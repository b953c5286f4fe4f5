"""Solve a PPB instance: Config / Solution, the greedy hint, explicit status handling,
plan evaluation under the same model, baselines and infeasibility diagnosis."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from ortools.sat.python import cp_model

from ndplan.ppb.instance import MODES, Instance
from ndplan.ppb.model import PPBModel
from ndplan.ppb.plan import Plan, stage_memory_bytes, uniform_plan
from ndplan.ppb.scale import DEFAULT_TIME_LIMIT_S, DEFAULT_WORKERS, Scale, scale_instance



@dataclass(frozen=True, kw_only=True)
class Config:
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    """CP-SAT wall-clock limit per solve, seconds."""
    workers: int = DEFAULT_WORKERS
    """CP-SAT search workers."""
    scale: Scale = field(default_factory=Scale)
    """Time resolution and memory unit (scale.py)."""
    seed: int = 0
    """CP-SAT random seed (results are reproducible for a given seed and worker count)."""
    exact: bool = False
    """Interleaved: minimise the exact DAG makespan instead of the closed form (model.py)."""


@dataclass(frozen=True, kw_only=True)
class Solution:
    status: str
    """OPTIMAL, FEASIBLE (time limit hit with a plan), INFEASIBLE, or UNKNOWN (no plan yet)."""
    plan: Plan | None
    objective_s: float | None
    """The model's step time of ``plan``, seconds (scale.time_s resolution)."""
    bound_s: float | None
    """Proven lower bound on the optimal step time, seconds."""
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


def _solver(cfg: Config) -> cp_model.CpSolver:
    s = cp_model.CpSolver()
    s.parameters.max_time_in_seconds = cfg.time_limit_s
    s.parameters.num_workers = cfg.workers
    s.parameters.random_seed = cfg.seed
    return s


def _run(pm: PPBModel, cfg: Config) -> tuple[str, cp_model.CpSolver, float]:
    solver = _solver(cfg)
    t0 = time.perf_counter()
    code = solver.Solve(pm.model)
    wall = time.perf_counter() - t0
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"PPB built an invalid CP-SAT model: {pm.model.Validate()}")
    return STATUS[code], solver, wall


def greedy_hint(inst: Instance) -> Plan:
    """Even split at the least recompute mode under which every stage fits (else full)."""
    for mode in MODES:
        plan = uniform_plan(inst, mode)
        if max(stage_memory_bytes(inst, plan)) <= inst.pipeline.budget_bytes:
            return plan
    return uniform_plan(inst, "full")


FIRST_PASS_SHARE = 0.3
"""Share of the time limit for the first optimisation pass; the rest goes to proving
the least bottleneck time and to the final pass (see ``solve``)."""


def _min_bottleneck(inst, sc, lo: int, hi: int, cfg: Config, deadline: float) -> int:
    """Largest T' <= the least feasible max stage time that was proven, by bisection on
    feasibility models (every t_s <= T): with T fixed, linear propagation of the layer
    counts refutes a too-small T at once, which the LP of the optimisation model cannot."""
    while lo < hi and time.perf_counter() < deadline:
        mid = (lo + hi) // 2
        pm = PPBModel(inst, sc, exact=cfg.exact)
        pm.cap_stage_time(mid)
        left = deadline - time.perf_counter()
        status, solver, _ = _run(pm, replace(cfg, time_limit_s=max(left, 0.01)))
        if status == "INFEASIBLE":
            lo = mid + 1
        elif status in ("OPTIMAL", "FEASIBLE"):
            hi = max(solver.Value(x) for x in pm.t)
        else:
            break
    return lo


def solve(inst: Instance, cfg: Config = Config(), hint: Plan | None = None) -> Solution:
    """Minimise the step time under the memory budget.

    Three passes within ``cfg.time_limit_s``: (1) optimise from the greedy hint for
    FIRST_PASS_SHARE of the time; if not proven optimal, (2) bisect the least feasible
    bottleneck stage time T* with feasibility models, (3) re-optimise with the valid cut
    max_s t_s >= T* and the incumbent as hint. The cut closes the gap the LP relaxation
    leaves (layers are indivisible: a pigeonhole argument LP bounds do not see)."""
    t0 = time.perf_counter()
    deadline = t0 + cfg.time_limit_s
    sc = scale_instance(inst, cfg.scale)
    pm = PPBModel(inst, sc, exact=cfg.exact)
    start_plan = hint or greedy_hint(inst)
    pm.hint(start_plan)
    first = replace(cfg, time_limit_s=cfg.time_limit_s * FIRST_PASS_SHARE)
    status, solver, _ = _run(pm, first)
    unit = cfg.scale.time_s / pm.divisor
    if status not in ("OPTIMAL", "FEASIBLE"):
        if status == "UNKNOWN":
            left = deadline - time.perf_counter()
            status, solver, _ = _run(pm, replace(cfg, time_limit_s=max(left, 0.01)))
        if status == "UNKNOWN" and max(stage_memory_bytes(inst, start_plan)) <= inst.pipeline.budget_bytes:
            # no solution found in time (large DAG models): the hint plan fits, return it
            obj = evaluate(inst, start_plan, cfg)
            return Solution(status="FEASIBLE", plan=start_plan, objective_s=obj,
                            bound_s=min(solver.BestObjectiveBound() * unit, obj), wall_s=time.perf_counter() - t0)
        if status not in ("OPTIMAL", "FEASIBLE"):
            return Solution(status=status, plan=None, objective_s=None, bound_s=None, wall_s=time.perf_counter() - t0)
    best = (status, pm.plan(solver), solver.ObjectiveValue(), solver.BestObjectiveBound())
    if status == "FEASIBLE":
        t_inc = max(solver.Value(x) for x in pm.t)
        t_star = _min_bottleneck(inst, sc, 0, t_inc, cfg, t0 + cfg.time_limit_s * (1 + FIRST_PASS_SHARE) / 2)
        pm2 = PPBModel(inst, sc, exact=cfg.exact)
        pm2.floor_stage_time(t_star)
        pm2.hint(best[1])
        left = deadline - time.perf_counter()
        st2, s2, _ = _run(pm2, replace(cfg, time_limit_s=max(left, 0.01)))
        if st2 in ("OPTIMAL", "FEASIBLE") and s2.ObjectiveValue() <= best[2]:
            best = (st2, pm2.plan(s2), s2.ObjectiveValue(), max(s2.BestObjectiveBound(), best[3]))
        elif st2 == "INFEASIBLE" or (st2 == "OPTIMAL"):
            best = ("OPTIMAL", best[1], best[2], best[2])
    status, plan, obj, bound = best
    # a FEASIBLE DAG solution's makespan variable may sit above its plan's longest path:
    # report the plan's own objective (the same model with the plan fixed)
    objective_s = evaluate(inst, plan, cfg) if status == "FEASIBLE" else obj * unit
    return Solution(status=status, plan=plan, objective_s=objective_s, bound_s=min(bound * unit, objective_s),
                    wall_s=time.perf_counter() - t0)


def evaluate(inst: Instance, plan: Plan, cfg: Config = Config()) -> float:
    """The model's step time of a given plan, seconds (memory not enforced)."""
    plan.check(inst)
    sc = scale_instance(inst, cfg.scale)
    pm = PPBModel(inst, sc, enforce_memory=False, exact=cfg.exact)
    pm.fix(plan)
    status, solver, _ = _run(pm, cfg)
    if status != "OPTIMAL":
        raise RuntimeError(f"evaluating a fixed plan returned {status}")
    return solver.ObjectiveValue() * cfg.scale.time_s / pm.divisor


def diagnose(inst: Instance, cfg: Config = Config()) -> Diagnosis:
    """The least peak memory over all plans (ignoring time) and the stage that sets it."""
    sc = scale_instance(inst, cfg.scale)
    pm = PPBModel(inst, sc, objective="memory", enforce_memory=False)
    pm.hint(uniform_plan(inst, "full"))
    status, solver, _ = _run(pm, cfg)
    if status not in ("OPTIMAL", "FEASIBLE"):
        raise RuntimeError(f"the memory-minimising model returned {status}")
    mems = [solver.Value(e) for e in pm.mem]
    stage = max(range(len(mems)), key=mems.__getitem__)
    need = mems[stage] * cfg.scale.memory_bytes
    return Diagnosis(stage=stage, overflow_bytes=need - inst.pipeline.budget_bytes, min_budget_bytes=need)
