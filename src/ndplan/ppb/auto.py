"""A schedule choice under memory (``ndplan balance --schedule auto``): for the given pp, m and
budget, every fixed op order PPB replays (gpipe, 1f1b and zb-h1 on one chunk per stage,
interleaved on the given vpp or 2, zbv on 2) that the schedule rules admit (rules.py, through
``Pipeline``) is balanced in turn (result.balance, the same budget each), beside its even split
at the least recompute that fits; the fastest balanced plan that fits is recommended. Each
schedule's own plan keeps its op order, so the comparison is the replayed step time of each
order's best plan found, not of one plan under several orders."""

from __future__ import annotations

from dataclasses import dataclass

from ndplan.errors import NdplanError
from ndplan.ppb.config import Config
from ndplan.ppb.instance import Instance, Layer, Pipeline
from ndplan.ppb.result import BalanceResult, balance
from ndplan.vocab import ONE_CHUNK_SCHEDULES, SCHEDULES


@dataclass(frozen=True)
class Choice:
    schedule: str
    vpp: int
    result: BalanceResult | None
    """None when the schedule cannot run this pipeline (``why``)."""
    why: str = ""

    @property
    def step_s(self) -> float | None:
        return self.result.solution.objective_s if self.result and self.result.plan else None

    @property
    def even_s(self) -> float | None:
        """The even split's step at the least recompute that fits (None when none fits)."""
        if not self.result or not self.result.baselines:
            return None
        fits = [b.objective_s for name, b in self.result.baselines.items() if name.startswith("even_") and b.fits]
        return min(fits) if fits else None

    def to_json(self) -> dict:
        sol = self.result.solution if self.result else None
        return {"schedule": self.schedule, "vpp": self.vpp, "status": sol.status if sol else "NOT_RUN",
                "balanced_step_s": self.step_s, "even_step_s": self.even_s,
                "bound_s": sol.bound_s if sol else None, "why": self.why or None}


def candidates(pp: int, vpp: int) -> list[tuple[str, int]]:
    """(schedule, vpp) pairs to compare: one-chunk orders at vpp 1, interleaved at the given vpp
    (2 when 1), zbv, dualpipe and dualpipev at 2 (each kept where the schedule rules admit it)."""
    out = []
    for schedule in SCHEDULES:
        if schedule in ONE_CHUNK_SCHEDULES:
            out.append((schedule, 1))
        elif schedule == "interleaved":
            out.append((schedule, vpp if vpp > 1 else 2))
        else:
            out.append((schedule, 2))
    return out if pp > 1 else [("1f1b", 1)]


def choose(layers: tuple[Layer, ...], pp: int, vpp: int, m: int, budget_bytes: int, cfg: Config,
           progress=None) -> tuple[list[Choice], Choice | None]:
    """(every schedule's Choice, the recommended one or None when no schedule fits)."""
    out = []
    for i, (schedule, v) in enumerate(candidates(pp, vpp)):
        if progress:
            progress(i, schedule)
        try:
            inst = Instance(layers=layers, pipeline=Pipeline(pp=pp, vpp=v, m=m, schedule=schedule,
                                                             budget_bytes=budget_bytes))
        except NdplanError as e:
            out.append(Choice(schedule, v, None, e.problem))
            continue
        out.append(Choice(schedule, v, balance(inst, cfg)))
    ok = [c for c in out if c.step_s is not None]
    return out, min(ok, key=lambda c: (c.step_s, SCHEDULES.index(c.schedule))) if ok else None
