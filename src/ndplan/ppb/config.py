"""Solver configuration of PPB (``Config``) and its defaults; no ortools import, so the
CLI can show the defaults in --help without loading the solver."""

from __future__ import annotations

from dataclasses import dataclass, field

from ndplan.ppb.scale import Scale

DEFAULT_TIME_LIMIT_S = 10.0
"""The wall-clock limit ``ndplan balance --time-limit`` shows as an example (wall-clock budgets are
opt-in: the default is DEFAULT_DETERMINISTIC_TIME)."""
DEFAULT_DETERMINISTIC_TIME = 3.0
"""The default budget of one solve, CP-SAT deterministic time units: the same plan on every machine
and under any load (Config.deterministic_time). Measured 2026-12-07 on the 2-core machine
(benchmarks/ppb_solve.py, with the branch and bound): 9-13 s of wall time for 96 layers on 16 stages
x vpp 2 x 32 micro-batches (interleaved), 5-7 s for the same on 1f1b."""
DEFAULT_WORKERS = 2
"""CP-SAT search workers unless the caller gives a count. A fixed count, not the
machine's cores: CP-SAT runs one search strategy per worker, so what a solve finds
depends on the count as it does on the seed. The count, ``Config.seed`` and a
deterministic budget (``Config.deterministic_time``) together make a solve reproducible;
a count taken from the machine would make the plan depend on where it ran."""


@dataclass(frozen=True, kw_only=True)
class Config:
    time_limit_s: float | None = None
    """A wall-clock budget of one ``solve`` instead of the deterministic one, seconds (CP-SAT passes
    and local search): opt-in, since what a pass reaches by a deadline depends on the machine."""
    workers: int = DEFAULT_WORKERS
    """CP-SAT search workers (DEFAULT_WORKERS says why the count is fixed)."""
    scale: Scale = field(default_factory=Scale)
    """Time resolution and memory unit (scale.py)."""
    seed: int = 0
    """CP-SAT random seed."""
    deterministic_time: float = DEFAULT_DETERMINISTIC_TIME
    """Budget of one ``solve`` in CP-SAT deterministic time units (the default; used unless
    ``time_limit_s`` is given): every CP-SAT pass stops at ``max_deterministic_time``,
    the budget counts only what the passes spend, and local search runs to its local
    optimum (it always ends: every move lowers (step time, recompute)). With one worker,
    or with ``interleave_search`` (set here when workers > 1; sat_parameters.proto: "the
    search is deterministic (independently of num_workers!)"), the same instance, seed
    and workers give the same plan on any machine and under any load. A wall-clock
    ``time_limit_s`` cannot: what a pass reaches by its deadline depends on the machine."""

    @property
    def deterministic(self) -> bool:
        """The budget is deterministic time (no wall-clock ``time_limit_s`` given)."""
        return self.time_limit_s is None
