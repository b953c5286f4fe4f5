"""What ``ndplan balance`` computes, as one result: the solved plan, its replay, the
baselines it is compared with and the gain over each, the framework forms of the plan,
and the strategy the balanced plan runs at.

Gain over a baseline = (baseline step - plan step) / baseline step, both the model's step
time (the longest path of the schedule's op DAG, solve.evaluate); 0 for a zero-time
baseline. Baselines: the even split with every layer at each recompute mode, and the
user's plan when given.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ndplan.export.balance import plan_forms
from ndplan.ppb.instance import MODES, Instance
from ndplan.ppb.plan import Plan, stage_memory_bytes, stage_slices, stage_time_s, uniform_plan
from ndplan.ppb.simulate import SimResult, simulate
from ndplan.ppb.solve import Config, Diagnosis, Solution, diagnose, evaluate, solve


@dataclass(frozen=True, kw_only=True)
class Baseline:
    objective_s: float
    """The model's step time of the baseline plan, seconds."""
    fits: bool
    """Every stage's memory within the budget."""
    gain: float
    """(objective_s - solved step) / objective_s: the solved plan's saving."""
    simulated_step_s: float
    """The replay's step time of the baseline plan, seconds."""


@dataclass(frozen=True, kw_only=True)
class BalanceResult:
    inst: Instance
    solution: Solution
    simulation: SimResult | None = None
    """Replay of the solved plan (None without a plan)."""
    baselines: dict[str, Baseline] = field(default_factory=dict)
    """even_<mode> for every mode some layer offers, and user (the given plan)."""
    diagnosis: Diagnosis | None = None
    """Why no plan fits (INFEASIBLE only)."""

    @property
    def plan(self) -> Plan | None:
        return self.solution.plan

    def forms(self) -> dict:
        """MindFormers and Megatron-LM forms of the plan (export/balance.py)."""
        return plan_forms(self.inst, self.plan)

    def stage_rows(self) -> list[dict]:
        """One row per (stage, chunk): layers, modes, times, peaks and the idle split."""
        inst, plan, sim, p = self.inst, self.plan, self.simulation, self.inst.pipeline
        times, mems = stage_time_s(inst, plan), stage_memory_bytes(inst, plan)
        rows = []
        for s, c, v in ((s, c, v) for s in range(p.pp) for c, v in stage_slices(p, s)):
            rows.append({"stage": s, "chunk": c, "layers": list(plan.layers(v)),
                         "recompute": [plan.recompute[i] for i in plan.layers(v)],
                         "time_s": sum(inst.layers[i].time_s(plan.recompute[i]) for i in plan.layers(v)),
                         "stage_time_s": times[s], "peak_bytes": int(mems[s]),
                         "simulated_peak_bytes": int(sim.peak_bytes[s]), "bubble_s": sim.bubble_s[s],
                         "imbalance_s": sim.imbalance_s[s], "recompute_s": sim.recompute_s[s]})
        return sorted(rows, key=lambda r: (r["stage"], r["chunk"]))

    def as_dict(self) -> dict:
        """The JSON form (``ndplan balance --json``; the report reads it too)."""
        sol = self.solution
        out = {"status": sol.status, "objective_s": sol.objective_s, "bound_s": sol.bound_s,
               "bound_source": sol.bound_source if sol.bound_s is not None else None, "solve_s": sol.wall_s,
               "budget_bytes": self.inst.pipeline.budget_bytes}
        if self.diagnosis is not None:
            d = self.diagnosis
            out["infeasible"] = {"stage": d.stage, "overflow_bytes": d.overflow_bytes,
                                 "min_budget_bytes": d.min_budget_bytes}
        if self.plan is None:
            return out
        out |= {"simulated_step_s": self.simulation.step_s, "stages": self.stage_rows(),
                "baselines": {k: dataclasses.asdict(b) for k, b in self.baselines.items()}}
        return out | self.forms()


def gain(baseline_s: float, step_s: float) -> float:
    """Share of the baseline's step time the plan saves (module docstring)."""
    return (baseline_s - step_s) / baseline_s if baseline_s else 0.0


def baseline_plans(inst: Instance, user: Plan | None = None) -> dict[str, Plan]:
    plans = {f"even_{mode}": uniform_plan(inst, mode) for mode in MODES
             if any(mode in layer.modes for layer in inst.layers)}
    if user is not None:
        plans["user"] = user
    return plans


def baselines(inst: Instance, cfg: Config, step_s: float, user: Plan | None = None) -> dict[str, Baseline]:
    """Each baseline plan against a plan of step ``step_s``."""
    out = {}
    for name, plan in baseline_plans(inst, user).items():
        t = evaluate(inst, plan, cfg)
        out[name] = Baseline(objective_s=t, fits=max(stage_memory_bytes(inst, plan)) <= inst.pipeline.budget_bytes,
                             gain=gain(t, step_s), simulated_step_s=simulate(inst, plan).step_s)
    return out


def balance(inst: Instance, cfg: Config = Config(), user: Plan | None = None) -> BalanceResult:
    """Solve ``inst``; with a plan, replay it and compare it with the baselines (and
    ``user``); without one, diagnose an infeasible budget."""
    sol = solve(inst, cfg)
    if sol.plan is None:
        return BalanceResult(inst=inst, solution=sol,
                             diagnosis=diagnose(inst, cfg) if sol.status == "INFEASIBLE" else None)
    return BalanceResult(inst=inst, solution=sol, simulation=simulate(inst, sol.plan),
                         baselines=baselines(inst, cfg, sol.objective_s, user))


def balanced_strategy(strategy: dict, inst: Instance, plan: Plan):
    """The Strategy a balanced plan runs at: ``strategy`` (the fields of the layer file's
    strategy, ``ndplan estimate --export-layers``) with this pipeline's pp, vpp, schedule
    and micro-batches, the plan's decoder layers per virtual stage and its deepest
    recompute mode. gbs = dp * mbs * m: the one inverse of ``Strategy.m`` = gbs / (dp * mbs)."""
    from ndplan.export import Balance
    from ndplan.export.common import recompute_mode
    from ndplan.strategy import Strategy
    names = {f.name for f in dataclasses.fields(Strategy)}
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in strategy.items() if k in names}
    bal, p = Balance(inst, plan), inst.pipeline
    return Strategy(**given | {"pp": p.pp, "vpp": p.vpp, "schedule": p.schedule,
                               "gbs": given["dp"] * given["mbs"] * p.m,
                               "layers_per_stage": bal.decoder_layers(), "recompute_layers": None,
                               "recompute": recompute_mode(*bal.recompute_counts())})
