"""The pipeline of a candidate for the report's timeline: its layers exported from the
symbolic model (ppb.export), balanced with CP-SAT (ppb.solve), replayed by the
discrete-event simulator (ppb.simulate). When the solver finds no plan in its time
limit the even split at the candidate's recompute mode is replayed instead."""

from __future__ import annotations

from dataclasses import dataclass

from ndplan.estimate import Estimate
from ndplan.ppb.export import layers_from_model
from ndplan.ppb.instance import SCHEDULES, Instance, Pipeline
from ndplan.ppb.plan import Plan, uniform_plan
from ndplan.ppb.simulate import SimResult, simulate

REPORT_TIME_LIMIT_S = 5.0
"""CP-SAT limit per report (ndplan balance's default is 10 s; a report only draws it)."""


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


def pipeline_run(e: Estimate, limit_bytes: int, time_limit_s: float = REPORT_TIME_LIMIT_S) -> PipelineRun:
    s = e.strategy
    layers, meta = layers_from_model(e.model, e.hardware, s)
    pipe = Pipeline(pp=s.pp, vpp=s.vpp, m=s.m, schedule=s.schedule,
                    budget_bytes=max(int(limit_bytes - meta["overhead_bytes"]), 1))
    inst = Instance(layers=layers, pipeline=pipe)
    from ndplan.ppb.solve import Config, solve  # ortools: import on use (0.3 s)
    sol = solve(inst, Config(time_limit_s=time_limit_s))
    if sol.plan is not None:
        plan, how = sol.plan, f"balanced by PPB ({sol.status})"
    else:
        plan, how = uniform_plan(inst, s.recompute), f"even split, recompute {s.recompute} (PPB: {sol.status})"
    return PipelineRun(e, inst, plan, simulate(inst, plan), how)
