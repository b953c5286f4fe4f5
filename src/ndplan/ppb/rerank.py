"""``ndplan sweep --balance``: balance the pipeline of each top candidate with pp > 1 and
re-rank by the balanced step time.

Balanced step = PPB's step time (compute, recompute and exposed per-layer communication
over the pipeline, from the exported layers) + the estimate's per-step terms that no
layer carries (pipeline send/recv, data-parallel communication, optimizer step).
The budget is the sweep's memory limit minus the per-stage overhead of the layer export.
"""

from __future__ import annotations

from dataclasses import dataclass

from ndplan.estimate import Estimate
from ndplan.ppb.export import estimate_instance
from ndplan.ppb.instance import SCHEDULES
from ndplan.ppb.plan import uniform_plan
from ndplan.ppb.solve import Config, Solution, evaluate, solve

PER_STEP_TERMS = ("time.pp_comm", "time.dp_comm", "time.optimizer")
"""Estimate terms outside the per-layer pipeline work."""


@dataclass(frozen=True)
class Balanced:
    estimate: Estimate
    solution: Solution | None
    """None when PPB does not apply (pp = 1 or a schedule PPB does not balance)."""
    step_s: float
    """Balanced step time (the estimate's own when PPB does not apply or finds no plan)."""
    own_split_s: float | None = None
    """The estimate's own split and recompute replayed by PPB (the schedule's op order on the
    layers' F, B, W) plus the per-step terms. The estimate's bubble is formulas/step.py's closed
    form (for zbv the ideal (pp - 1) max(T_F, T_F + T_B - 2 T_W), which the paper's hand-written
    order reaches only when F = B = W), so the two differ in either direction; ``sweep --balance``
    prints this replay where they do, which says how much of a balanced step's difference from
    the estimate is the bubble model and how much the balancing."""


def rerank(ests: list[Estimate], mem_limit_bytes: int, cfg: Config = Config()) -> list[Balanced]:
    out = []
    for e in ests:
        s = e.strategy
        if s.pp == 1 or s.schedule not in SCHEDULES:
            out.append(Balanced(e, None, e.step_s))
            continue
        inst = estimate_instance(e, mem_limit_bytes)
        sol = solve(inst, cfg)
        extra = sum(e.time_terms.get(k, 0.0) for k in PER_STEP_TERMS)
        own = evaluate(inst, uniform_plan(inst, s.recompute), cfg) + extra
        out.append(Balanced(e, sol, sol.objective_s + extra if sol.plan is not None else e.step_s, own))
    return sorted(out, key=lambda b: b.step_s)
