"""The pipeline of a candidate for the report's timeline: its layers exported from the
symbolic model (ppb.export), balanced with CP-SAT (ppb.solve), replayed by the
discrete-event simulator (ppb.simulate). When the solver finds no plan in its time
budget the even split at the candidate's recompute mode is replayed instead."""

from __future__ import annotations

from dataclasses import dataclass

from ndplan.estimate import Estimate
from ndplan.ppb.export import estimate_instance
from ndplan.ppb.instance import SCHEDULES, Instance
from ndplan.ppb.plan import Plan, uniform_plan
from ndplan.ppb.simulate import SimResult, simulate

REPORT_DETERMINISTIC_TIME = 5.0
"""CP-SAT budget per report in deterministic time units (about a second each; ppb/config.py):
the same report on any machine, under any load, draws the same plan."""


@dataclass(frozen=True)
class PipelineRun:
    estimate: Estimate
    instance: Instance
    plan: Plan
    sim: SimResult
    how: str
    """``balanced (OPTIMAL)``, ``balanced (FEASIBLE)`` or ``even split (...)``."""


def balanceable(e: Estimate) -> bool:
    return e.strategy.pp > 1 and e.strategy.schedule in SCHEDULES


def pipeline_run(e: Estimate, limit_bytes: int, deterministic_time: float = REPORT_DETERMINISTIC_TIME) -> PipelineRun:
    s = e.strategy
    inst = estimate_instance(e, limit_bytes)
    from ndplan.ppb.solve import Config, solve  # ortools: import on use (0.3 s)
    sol = solve(inst, Config(deterministic_time=deterministic_time))
    if sol.plan is not None:
        plan, how = sol.plan, f"balanced by PPB ({sol.status})"
    else:
        plan, how = uniform_plan(inst, s.recompute), f"even split, recompute {s.recompute} (PPB: {sol.status})"
    return PipelineRun(e, inst, plan, simulate(inst, plan), how)
