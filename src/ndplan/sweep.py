"""Exhaustive sweep: evaluate every candidate of a space through compiled kernels, drop
what does not fit, rank the rest, and keep the Pareto front of memory vs step time.

Per categorical group (space.Group: schedule, vpp, recompute, zero, sp) one memory
kernel and one time kernel are compiled (cached on disk, kernels.model_kernel) and
called once on the group's arrays. The peak of a candidate is the maximum over the
stages that can hold it (``PEAK_STAGES``); the top-k are then re-estimated stage by
stage with ``estimate.estimate`` for their full breakdowns. The table of results, its
ranking and the Pareto front are table.py's.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from ndplan import bands, kernels, limits
from ndplan.engines import fp8_gemms, profile
from ndplan.catalog.hardware import Hardware
from ndplan.catalog.model import ModelSpec
from ndplan.errors import NdplanError, warn
from ndplan.estimate import Estimate, estimate, memory_kernel, model_totals, time_kernel
from ndplan.layouts import leading_dense, symbolic_layout
from ndplan.layouts import ends_of
from ndplan.throughput import utilization
from ndplan.space import GRID_KEYS, Candidates, Group, generate
from ndplan.table import SORT_KEYS, Table, pareto_front, rank
from ndplan.points import strategy_from_row
from ndplan.strategy import Strategy
from ndplan.structure import NUMERIC_FIELDS, kernel_key, structure
from ndplan.units import GIB

PEAK_STAGES = """Stages evaluated for the peak: 0 (embedding, most in-flight micro-batches), 1 (the
first middle stage of an uneven layout), pp-1 (head, loss) and, for models whose first k
layers are dense, the first stage holding no dense layer. In-flight activations never
grow with the stage index and the stages in between hold the same layers as one of
these, so their maximum is the maximum over all stages for the even and ends layouts a
sweep generates (tests/test_sweep.py and tests/test_uneven_sweep.py hold it to
estimate())."""


@dataclass
class SweepResult:
    model: ModelSpec
    hardware: Hardware
    gpus: int
    seq: int
    gbs: int
    mem_limit_bytes: int
    candidates: Candidates
    table: Table
    """Every valid candidate (feasible or not), ranked: feasible first by the sort key."""
    feasible: int
    top: list[Estimate]
    pareto: list[int]
    """Indices into ``table`` of the memory/step-time Pareto front (feasible candidates)."""
    flops_per_step: float
    elapsed_s: float = 0.0
    sort: str = "time"
    base: dict = field(default_factory=dict)
    bands: list = field(default_factory=list)
    """bands.Band of each top candidate's step time (the constants' 95 % band)."""
    tied: list = field(default_factory=list)
    """Whether each top candidate is tied with the first (bands.tied_with_best)."""

    @property
    def infeasible(self) -> int:
        return len(self.table) - self.feasible

    def mfu(self, step_s) -> np.ndarray:
        return utilization(self.flops_per_step, np.asarray(step_s), self.gpus, self.hardware.bf16_flop_per_s)

    def strategy(self, i: int) -> Strategy:
        return row_strategy(self.table.point(i), self.seq, self.gbs, self.base, self.model.num_hidden_layers)

    def _top_json(self, i: int) -> dict:
        """Top candidate i (the estimate schema), its step's 95 % band and whether it ties with #1."""
        out = self.top[i].to_json(hidden=False)  # an estimate of the row gives them
        if self.bands:
            out["time"]["band_95"] = self.bands[i].to_json()
        if self.tied:
            out["time"]["tied_with_best"] = self.tied[i]
        return out

    def to_json(self) -> dict:
        t = self.table
        return {
            "model": self.model.name, "hardware": self.hardware.name, "gpus": self.gpus, "seq": self.seq,
            "gbs": self.gbs, "mem_limit_bytes": self.mem_limit_bytes, "sort": self.sort,
            "candidates": {"generated": self.candidates.generated,
                           "rejected": sum(self.candidates.rejected.values()),
                           "rejected_by_rule": dict(self.candidates.rejected),
                           "infeasible": self.infeasible, "feasible": self.feasible},
            "top": [self._top_json(i) for i in range(len(self.top))],
            "pareto": [{"strategy": self.strategy(i).as_dict(), "peak_bytes": int(t.peak_bytes[i]),
                        "step_s": float(t.step_s[i]), "mfu": float(self.mfu(t.step_s[i]))} for i in self.pareto],
        }


row_strategy = strategy_from_row
"""A sweep row's Strategy (points.strategy_from_row)."""


def _subgroups(model: ModelSpec, group: Group, seq: int, gbs: int, base: Mapping):
    """Split a group's rows by Structure: [(view, row index array or slice(None))].

    Within a group only the numeric fields of structure.NUMERIC_FIELDS can change the
    view, and only those the representative's view holds: rows are split by the unique
    values of those columns, one Strategy each goes through ``structure``, and rows
    whose views are equal share one entry (one kernel)."""
    g = group.grid
    cat = {"vpp": group.vpp, "zero": group.zero, "sp": group.sp, "recompute": group.recompute,
           "schedule": group.schedule}

    def view_at(i: int):
        return sweep_view(model, structure(model, row_strategy({**{k: g[k][i] for k in GRID_KEYS}, **cat}, seq, gbs,
                                                               base, model.num_hidden_layers)))
    first = view_at(0)
    cols = [NUMERIC_FIELDS[f] for f in NUMERIC_FIELDS if getattr(first, f) is not None]
    if not cols:
        return [(first, slice(None))]
    _, firsts, inverse = np.unique(np.stack([g[c] for c in cols], axis=1), axis=0, return_index=True,
                                   return_inverse=True)
    by_key: dict = {}
    for u, i in enumerate(firsts):
        view = view_at(int(i))
        by_key.setdefault(kernel_key(model, view, ""), (view, []))[1].append(u)
    if len(by_key) == 1:
        return [(first, slice(None))]
    return [(view, np.nonzero(np.isin(inverse.ravel(), us))[0]) for view, us in by_key.values()]


def sweep_view(model: ModelSpec, view):
    """The view a sweep row is evaluated under: an even or ends layout as an ends layout, so
    even rows (first = last = L/pp) and uneven ones share one kernel. Under vpp > 1 a given
    ends layout is a concrete split with its exact held-vector peak (one kernel per pp, m and
    stage, structure.peaks_over_held_vectors); the sweep ranks it with the in-flight split as
    it does even rows (layouts.ends_layout)."""
    if leading_dense(model) is None or view.ends:
        return view
    lps = view.layers_per_stage
    if lps is None or (view.pp is not None and ends_of(view.pp, view.vpp, view.schedule, lps) is not None):
        return dataclasses.replace(view, ends=True, layers_per_stage=None, pp=None, m=None)
    return view


def peak_stages(model: ModelSpec, pp: np.ndarray, vpp: int, first: np.ndarray | None = None,
                last_layers: np.ndarray | None = None) -> list[np.ndarray]:
    """Stage index arrays to evaluate (see PEAK_STAGES); ``first``, ``last_layers``: the
    first_layers and last_layers columns (None: the even split)."""
    last = pp - 1
    k = leading_dense(model) or 0
    L = model.num_hidden_layers
    stages = [np.zeros_like(pp), np.minimum(1, last), last]
    if 0 < k < L:
        if first is None:
            first = last_layers = L // pp
        mid = (L - first - last_layers) / np.maximum(pp - 2, 1)  # only read where pp > 2; even rows: L/pp
        # first stage whose first chunk starts at or after layer k (row 0 of the virtual stages)
        j = np.where(k * vpp <= first, 1, 1 + np.ceil((k * vpp - first) / np.maximum(mid, 1)))
        stages.append(np.minimum(j, last).astype(pp.dtype))
    return stages


def evaluate_group(model: ModelSpec, hw: Hardware, group: Group, seq: int, gbs: int, base: Mapping,
                   hw_values: Mapping) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(peak bytes, step s, time terms) for every row of a group."""
    n = len(group)
    peak = np.empty(n)
    terms: dict[str, np.ndarray] = {}
    for view, rows in _subgroups(model, group, seq, gbs, base):
        p_, t_ = _evaluate_rows(model, group, view, rows, seq, hw_values)
        if isinstance(rows, slice):  # the whole group: keep the kernels' own output arrays
            return np.ceil(p_), _total(t_), t_
        peak[rows] = p_
        for k, v in t_.items():
            terms.setdefault(k, np.empty(n))[rows] = v
    return np.ceil(peak), _total(terms), terms


def _evaluate_rows(model, group, view, rows, seq, hw_values):
    """(peak bytes, time terms) of the rows ``rows`` of a group, one Structure."""
    g = {k: group.grid[k][rows].astype(float) for k in GRID_KEYS}
    args = {**g, "vpp": float(group.vpp), "seq": float(seq), "nrec": 0.0}
    if symbolic_layout(model, view):
        stage_sets = peak_stages(model, group.grid["pp"][rows], group.vpp, group.grid["first_layers"][rows],
                                 group.grid["last_layers"][rows])
        peak = _peak_over_stages(memory_kernel(model, view), args, stage_sets)
    else:
        peak = functools.reduce(np.maximum, [_total(memory_kernel(model, view, i)(**args, stage=float(i)))
                                             for i in range(view.pp)])
    return peak, time_kernel(model, view)(**args, stage=0.0, **hw_values)


def _peak_over_stages(kernel, args: dict, stage_sets: list[np.ndarray]) -> np.ndarray:
    """The maximum over ``stage_sets`` of the memory total, in one kernel call: the stage is
    passed as a (stage sets, rows) array beside the (rows,) degrees, so numpy broadcasting
    computes what does not depend on the stage once per row, and the generated code's
    per-operation cost is paid once, not once per set (most groups hold a few hundred rows)."""
    total = _total(kernel(**args, stage=np.stack(stage_sets).astype(float)))
    return total.max(axis=0)


def _total(out: dict[str, np.ndarray]) -> np.ndarray:
    vals = iter(out.values())
    total = np.array(next(vals), dtype=float)
    for v in vals:
        total += v
    return total


def evaluate(model: ModelSpec, hw: Hardware, cands: Candidates, seq: int, gbs: int, base: Mapping,
             progress: Callable[[int], None] | None = None) -> Table:
    """Peak memory and step time of every valid candidate, group by group, written into columns
    allocated once at the candidate count (the table's other columns are the groups' own)."""
    from ndplan import hooks
    eng = profile(base.get("engine", "megatron"))
    hw_values = hw.kernel_values(fp8=fp8_gemms(base.get("weight_dtype"), eng), fa2=eng.attention_fa2)
    n_all = cands.valid
    group_of = np.empty(n_all, dtype=np.int16 if len(cands.groups) < 2 ** 15 else np.int32)
    row_of = np.empty(n_all, dtype=np.int32)
    peak_all, step_all = np.empty(n_all), np.empty(n_all)
    kept = {} if hooks.active() else None  # the terms of this moment's hooks
    at = 0
    for i, group in enumerate(cands.groups):
        peak, step, terms = evaluate_group(model, hw, group, seq, gbs, base, hw_values)
        n = len(group)
        rows = slice(at, at + n)
        group_of[rows], row_of[rows] = i, np.arange(n)
        peak_all[rows], step_all[rows] = peak, step
        if kept is not None:
            for k, v in terms.items():
                kept.setdefault(k, np.zeros(n_all))[rows] = v
        at += n
        if progress:
            progress(1)

    def terms_of(i: int) -> dict[str, np.ndarray]:
        return evaluate_group(model, hw, cands.groups[i], seq, gbs, base, hw_values)[2]

    return Table(cands.groups, group_of, row_of, peak_all, step_all, terms_of, kept)


def mem_limit(hw: Hardware, gib: float | None = None, fraction: float | None = None) -> int:
    """Per-device limit in bytes: all HBM by default, else ``gib`` GiB or ``fraction`` of HBM."""
    if gib is not None and fraction is not None:
        raise NdplanError("mem_fraction", fraction, f"given together with mem_limit_gib={gib}",
                          "give one of --mem-limit-gib and --mem-fraction")
    if gib is not None:
        if limits.gib("mem_limit_gib", gib) < 1:
            warn("mem_limit_gib", gib, "is under 1 GiB per device", "for a share of HBM give mem_fraction (--mem-fraction)")
        if gib * GIB > hw.hbm_bytes:
            raise NdplanError("mem_limit_gib", gib, f"exceeds the {hw.hbm_gib:g} GiB of {hw.name}",
                              "give at most that, or a device with more memory (-H, or --set hbm_gib=...)")
        return int(gib * GIB)
    if fraction is not None:
        return int(hw.hbm_bytes * limits.fraction("mem_fraction", fraction))
    return hw.hbm_bytes


def sweep(model: ModelSpec, hw: Hardware, gpus: int, seq: int, gbs: int, space: Mapping | None = None, *,
          top: int = 10, sort: str = "time", mem_limit_gib: float | None = None, mem_fraction: float | None = None,
          base: Mapping | None = None,
          progress: Callable[[int, int], Callable[[int], None]] | None = None) -> SweepResult:
    """Evaluate, filter, rank. ``base`` fixes the non-swept Strategy fields (engine,
    flash_attention, order, grad_dtype, weight_dtype, offload_optimizer). The memory limit
    is all HBM unless ``mem_limit_gib`` or ``mem_fraction`` says otherwise. Every argument
    is checked (limits.py; gpus, seq and gbs by space.generate) before any candidate is
    evaluated."""
    t0 = time.perf_counter()
    top = limits.count("top", top, 0, limits.MAX_TOP, "a number of candidates")  # gpus, seq, gbs: space.generate
    if sort not in SORT_KEYS:
        raise NdplanError("sort", sort, "unknown sort key", f"choose one of {', '.join(SORT_KEYS)}")
    cap = mem_limit(hw, mem_limit_gib, mem_fraction)
    model.warn_long_seq(seq)
    base = dict(base or {})
    cands = generate(model, gpus, seq, gbs, space, base.get("engine", "megatron"))
    tick = progress(len(cands.groups), cands.valid) if progress else None
    table = evaluate(model, hw, cands, seq, gbs, base, tick)
    fits = table.peak_bytes <= cap
    order = rank(table, fits, sort)
    table = table.take(order)
    fits = fits[order]
    feasible = int(fits.sum())
    front = pareto_front(table.peak_bytes[:feasible], table.step_s[:feasible]) if feasible else np.empty(0, int)
    front = np.sort(front)  # rank order
    top_est = [estimate(model, hw, row_strategy(table.point(i), seq, gbs, base, model.num_hidden_layers), gpus)
               for i in range(min(top, feasible))]
    top_bands = [bands.band(e) for e in top_est]
    flops = model_totals(model, seq)["total.flops_per_sequence"] * gbs
    kernels.flush()  # what the look-ups learned, for the next process
    return SweepResult(model=model, hardware=hw, gpus=gpus, seq=seq, gbs=gbs, mem_limit_bytes=cap,
                       candidates=cands, table=table, feasible=feasible, top=top_est,
                       pareto=[int(i) for i in front], flops_per_step=flops,
                       elapsed_s=time.perf_counter() - t0, sort=sort, base=base,
                       bands=top_bands, tied=bands.tied_with_best(top_bands) if sort != "memory" else [])


def smallest_count(first: int, step: int, top: int, fits: Callable[[int], bool], floor: int = 0
                   ) -> tuple[int | None, list[int]]:
    """(smallest multiple of ``step`` in (floor, top] for which ``fits`` holds, counts tried):
    ``first`` doubled until one fits, then every multiple of ``step`` above ``floor`` and below
    it not yet tried, ascending; the first that fits is the answer. Feasibility is not monotonic
    in the count (divisibility decides), so no count below the doubling that fits is skipped;
    the doubling only bounds the walk."""
    tried: list[int] = []
    seen: dict[int, bool] = {}

    def ok(n: int) -> bool:
        if n not in seen:
            tried.append(n)
            seen[n] = fits(n)
        return seen[n]

    n = first
    while n <= top and not ok(n):
        n *= 2
    if n > top:
        return None, sorted(tried)
    for m in range(floor + step - floor % step, n, step):
        if ok(m):
            return m, sorted(tried)
    return n, sorted(tried)


def find_min_gpus(model: ModelSpec, hw: Hardware, seq: int, gbs: int, space: Mapping | None = None, *,
                  mem_limit_gib: float | None = None, mem_fraction: float | None = None,
                  base: Mapping | None = None, max_nodes: int = 4096, sort: str = "time", top: int = 10,
                  progress: Callable[[int], None] | None = None) -> SweepResult:
    """The sweep at the smallest whole-node device count with a feasible candidate
    (``smallest_count``: node counts doubled until one fits, then every count below it;
    ``progress`` is told each device count tried)."""
    mem_limit(hw, mem_limit_gib, mem_fraction)  # bad limits fail before the first sweep
    node = hw.devices_per_node
    max_nodes = min(max_nodes, limits.MAX_DEVICES // node)
    seen: dict[int, SweepResult | None] = {}

    def feasible_at(gpus: int) -> bool:
        if progress:
            progress(gpus)
        try:
            r = sweep(model, hw, gpus, seq, gbs, space, top=top, sort=sort, mem_limit_gib=mem_limit_gib,
                      mem_fraction=mem_fraction, base=base)
            seen[gpus] = r if r.feasible else None
        except NdplanError:
            seen[gpus] = None  # no candidate at this count (constraints cannot divide it)
        return seen[gpus] is not None

    n, _ = smallest_count(node, node, max_nodes * node, feasible_at)
    if n is None:
        raise NdplanError("gpus", max_nodes * node, f"nothing fits on up to {max_nodes} nodes of {node}",
                          "relax the space constraints or raise the memory limit")
    return seen[n]
