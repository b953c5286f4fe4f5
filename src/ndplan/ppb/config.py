"""Solver configuration of PPB (``Config``) and its defaults; no ortools import, so the
CLI can show the defaults in --help without loading the solver."""

from __future__ import annotations

from dataclasses import dataclass, field

from ndplan.ppb.scale import Scale

DEFAULT_TIME_LIMIT_S = 10.0
"""Solver wall-clock limit unless the caller gives one (the issue's 10 s target)."""
DEFAULT_WORKERS = 2
"""CP-SAT search workers unless the caller gives a count. A fixed count, not the
machine's cores: CP-SAT runs one search strategy per worker, so what a solve finds
depends on the count as it does on the seed. The count, ``Config.seed`` and a
deterministic budget (``Config.deterministic_time``) together make a solve reproducible;
a count taken from the machine would make the plan depend on where it ran."""


@dataclass(frozen=True, kw_only=True)
class Config:
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    """Wall-clock budget of one ``solve``, seconds (CP-SAT passes and local search);
    ignored when ``deterministic_time`` is given."""
    workers: int = DEFAULT_WORKERS
    """CP-SAT search workers (DEFAULT_WORKERS says why the count is fixed)."""
    scale: Scale = field(default_factory=Scale)
    """Time resolution and memory unit (scale.py)."""
    seed: int = 0
    """CP-SAT random seed."""
    deterministic_time: float | None = None
    """Budget of one ``solve`` in CP-SAT deterministic time units (about a second each)
    instead of wall-clock seconds: every CP-SAT pass stops at ``max_deterministic_time``,
    the budget counts only what the passes spend, and local search runs to its local
    optimum (it always ends: every move lowers (step time, recompute)). With one worker,
    or with ``interleave_search`` (set here when workers > 1; sat_parameters.proto: "the
    search is deterministic (independently of num_workers!)"), the same instance, seed
    and workers give the same plan on any machine and under any load. A wall-clock
    ``time_limit_s`` cannot: what a pass reaches by its deadline depends on the machine."""
