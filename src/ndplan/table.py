"""The table of evaluated candidates and its order: which rows a sweep keeps (a group and a
row of it per candidate, with peak bytes and step time), how its strategy columns are read,
the deterministic ranking, and the memory/step-time Pareto front. sweep.py fills it.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ndplan.errors import NdplanError
from ndplan.space import GRID_KEYS, Group
from ndplan.vocab import RECOMPUTE_MODES, SCHEDULES

SORT_KEYS = ("time", "memory", "mfu")
CATEGORICAL = ("schedule", "vpp", "recompute", "zero", "sp")
"""The group-level columns of the table (one value per candidate group), after GRID_KEYS."""


class Table:
    """Evaluated candidates (axis 0: candidate), in any order: each row is a row of a candidate
    group (``group_of``, ``row_of``) with its peak bytes and step time. The strategy columns
    (``grid``: GRID_KEYS and CATEGORICAL) are gathered from the groups when first read, and the
    per-row time terms re-evaluated when first read (``time_terms``; a sweep ranks on the step
    time alone): 1.45 M candidates of DeepSeek-V3 on 131,072 devices keep 22 bytes a row, not
    the 220 of every column."""

    def __init__(self, groups: list[Group], group_of: np.ndarray, row_of: np.ndarray, peak_bytes: np.ndarray,
                 step_s: np.ndarray, terms_of: Callable[[int], dict[str, np.ndarray]] | None = None,
                 terms: dict[str, np.ndarray] | None = None):
        """``terms_of(i)``: group i's time terms, run when ``time_terms`` is first read; ``terms``:
        the time terms already known (a sweep under hooks keeps them: a later run of the kernels
        would see the hooks of that moment)."""
        self.groups, self.group_of, self.row_of = groups, group_of, row_of
        self.peak_bytes, self.step_s = peak_bytes, step_s
        self._terms_of = terms_of
        self._columns: dict[str, np.ndarray] = {}
        self._terms: dict[str, np.ndarray] | None = terms
        self._members: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.peak_bytes)

    def take(self, idx) -> "Table":
        return Table(self.groups, self.group_of[idx], self.row_of[idx], self.peak_bytes[idx], self.step_s[idx],
                     self._terms_of, None if self._terms is None else {k: v[idx] for k, v in self._terms.items()})

    def _by_group(self) -> list[np.ndarray]:
        """Per group, the table rows that belong to it."""
        if self._members is None:
            order = np.argsort(self.group_of, kind="stable")
            cuts = np.searchsorted(self.group_of[order], np.arange(len(self.groups) + 1))
            self._members = [order[cuts[i]:cuts[i + 1]] for i in range(len(self.groups))]
        return self._members

    def column(self, key: str, rows=None) -> np.ndarray:
        """Column ``key`` at ``rows`` (table rows; all when None), gathered from the groups in one
        indexing: a per-row column from the groups' arrays laid end to end, a per-group one
        (CATEGORICAL) from one value per group."""
        if rows is None and key in self._columns:
            return self._columns[key]
        gof = self.group_of if rows is None else self.group_of[rows]
        rof = self.row_of if rows is None else self.row_of[rows]
        if not self.groups:
            return np.empty(0)
        if key in self.groups[0].grid:
            parts = [g.grid[key] for g in self.groups]
            starts = np.concatenate(([0], np.cumsum([len(x) for x in parts])[:-1]))
            out = np.concatenate(parts)[starts[gof] + rof]
        else:
            values = [getattr(g, key) for g in self.groups]
            out = np.array(values, dtype=object if isinstance(values[0], str) else None)[gof]
        if rows is None:
            self._columns[key] = out
        return out

    @property
    def grid(self) -> dict[str, np.ndarray]:
        """Every GRID_KEYS and CATEGORICAL column (gathered once, then kept)."""
        return {k: self.column(k) for k in GRID_KEYS + CATEGORICAL}

    @property
    def time_terms(self) -> dict[str, np.ndarray]:
        """Step-time terms of every row (the groups' time kernels run again, once)."""
        if self._terms is None:
            self._terms = {}
            for i, at in enumerate(self._by_group()):
                if len(at):
                    for k, v in self._terms_of(i).items():
                        self._terms.setdefault(k, np.zeros(len(self)))[at] = np.broadcast_to(v, (len(self.groups[i]),))[self.row_of[at]]
        return self._terms

    def point(self, i: int) -> dict:
        g, r = self.groups[int(self.group_of[i])], int(self.row_of[i])
        out = {k: g.grid[k][r].item() for k in GRID_KEYS}
        out |= {k: (lambda v: v.item() if hasattr(v, "item") else v)(getattr(g, k)) for k in CATEGORICAL}
        return {k: out[k] for k in GRID_KEYS + CATEGORICAL}


SCHEDULE_PREFERENCE = ("1f1b", "interleaved", "zb-h1", "zbv", "dualpipev", "dualpipe", "gpipe")
"""Tie-break among equal rows: the most common schedule first (a ranking choice, not a vocabulary)."""
_SCHED_ORDER = {s: i for i, s in enumerate(SCHEDULE_PREFERENCE)}
_REC_ORDER = {m: i for i, m in enumerate(RECOMPUTE_MODES)}  # least recompute first
assert set(SCHEDULE_PREFERENCE) == set(SCHEDULES)


def rank(table: Table, fits: np.ndarray, sort: str) -> np.ndarray:
    """Deterministic order: feasible first, then the sort key, then the other of peak and
    step time (both rounded to 12 decimals), then ``tie_keys`` (the degrees), then the row:
    one lexsort of the first three, and the degree columns gathered only for the rows those
    leave equal (``_refine``; DeepSeek-V3 on 131,072 devices: 108,840 of 1.45 M rows)."""
    if sort not in SORT_KEYS:
        raise NdplanError("sort", sort, "unknown sort key", f"choose one of {', '.join(SORT_KEYS)}")
    primary = table.peak_bytes if sort == "memory" else table.step_s  # mfu ranks like time
    secondary = table.step_s if sort == "memory" else table.peak_bytes
    main = [np.round(secondary, 12), np.round(primary, 12), ~fits]
    order = np.lexsort(main)
    tied = np.ones(max(len(order) - 1, 0), dtype=bool)
    while main:  # one sorted key alive at a time (1.45 M rows: 12 MB each)
        tied &= _same(main.pop()[order])
    _refine(order, tied, lambda rows: tie_keys(table, rows))
    return order


def tie_keys(table: Table, rows: np.ndarray) -> list[np.ndarray]:
    """The tie-break columns at ``rows``, most significant first."""
    g = {k: table.column(k, rows) for k in ("dp", "tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "zero", "recompute",
                                             "schedule", "sp", "uneven", "first_layers", "last_layers")}
    return [g["dp"], g["tp"], g["pp"], g["cp"], g["ep"], g["etp"], g["vpp"], g["mbs"], g["zero"],
            _codes(g["recompute"], _REC_ORDER), _codes(g["schedule"], _SCHED_ORDER),
            ~g["sp"].astype(bool), g["uneven"], g["first_layers"], g["last_layers"]]


def _same(x: np.ndarray) -> np.ndarray:
    """x[i + 1] equals x[i] (NaN equals NaN, as sorting places them)."""
    eq = x[1:] == x[:-1]
    return eq | (np.isnan(x[1:]) & np.isnan(x[:-1])) if x.dtype.kind == "f" else eq


def _refine(order: np.ndarray, tied: np.ndarray, keys_of: Callable[[np.ndarray], list[np.ndarray]]) -> np.ndarray:
    """Sort each run of ``tied`` rows of ``order`` (in place) by ``keys_of(rows)``, most
    significant first; return which neighbours are still equal."""
    still = np.zeros_like(tied)
    if not tied.any():
        return still
    starts = np.flatnonzero(tied & ~np.concatenate(([False], tied[:-1])))  # run i..j: tied[i:j] all True
    ends = np.flatnonzero(tied & ~np.concatenate((tied[1:], [False]))) + 2
    lengths = ends - starts
    pos = np.repeat(starts, lengths) + (np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths))
    run = np.repeat(np.arange(len(starts)), lengths)
    rows = order[pos]
    keys = keys_of(rows)
    sub = np.lexsort(keys[::-1] + [run])
    order[pos] = rows[sub]
    equal = run[1:] == run[:-1]  # run is sorted already: sub keeps each run in place
    for k in keys:
        equal &= _same(k[sub])
    still[pos[:-1]] = equal
    return still


def _codes(column: np.ndarray, order: dict) -> np.ndarray:
    """``order[x]`` for every entry of a column of names, one look-up per run of equal names
    (evaluate builds the columns a group at a time: 1.4 M rows of DeepSeek-V3 on 131,072
    devices are 36 runs; sorting the names, as numpy.unique does, took 1.5 s)."""
    n = len(column)
    if not n:
        return np.zeros(0, dtype=int)
    starts = np.concatenate(([0], np.flatnonzero(column[1:] != column[:-1]) + 1))
    return np.repeat(np.array([order[column[i]] for i in starts]), np.diff(np.append(starts, n)))


def pareto_front(peak: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Indices (ascending peak) of the points no other point beats on both peak and step."""
    order = np.lexsort((step, peak))
    s = step[order]
    before = np.concatenate(([math.inf], np.fmin.accumulate(s)[:-1])) if len(s) else s  # fmin: NaN never wins
    return order[s < before].astype(np.int64)  # faster than every point of lower (or equal) peak
