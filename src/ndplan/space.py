"""Candidate generation for ``ndplan sweep``: the grid of valid parallel strategies.

Every dimension of the vocabulary (``DIMS``) takes its values from a *space*: a
mapping in which a scalar fixes a dimension, a list enumerates it, and ``auto`` (or a
missing key, or ``None``) explores it with these defaults:

==========  ==================================================================
dimension   auto values
==========  ==================================================================
dp tp pp cp every ordered factorization dp*tp*pp*cp == gpus (divisors of gpus)
ep          dense model: 1; MoE: divisors of num_experts that also divide gpus
            (ep*etp must divide dp*cp*tp, a divisor of gpus)
etp         1 (list values to explore expert tensor parallelism); a MoE
            model under the fsdp engine: tp where ep is 1 (torchtitan
            splits its experts over tp then, rules.py)
vpp         1 if every schedule of the space has one chunk per stage; else
            the divisors v of num_hidden_layers with v == 1 or 2*v <= L (vpp > 1
            needs pp >= 2 whole chunks per stage)
mbs         1..8
zero        0, 1, 2, 3
recompute   none, selective, full
schedule    gpipe, 1f1b, interleaved, zb-h1, zbv, dualpipe, dualpipev (``dualpipe-v`` is read as
            dualpipev); dualpipe rows split the layers evenly over pp slices (no ends layouts)
sp          True only: sequence parallelism is on whenever tp > 1 (list
            ``[true, false]`` to compare); under the deepspeed engine True and
            False, the engine rule keeping False only at tp > 1 (points.default_sp)
uneven      False and True: the even split and the "ends" layouts of layouts.py
            (first and last stage apart, middle stages even), for models whose
            dense layers come first (all dense, all MoE, DeepSeek); even only for
            other layer patterns
first_layers, last_layers
            any: the decoder layers of stage 0 / stage pp-1 (even rows: L/pp);
            list values to keep only those counts
==========  ==================================================================

Candidates are built as numpy arrays, never by exceptions in a loop: the world rule
holds by construction (only factorizations of ``gpus`` are made), then each rule of
the one table in ``rules.py`` (the table ``Strategy`` and PPB's ``Pipeline`` evaluate)
is a vectorized predicate and every rejected candidate is counted under the group of
the *first* rule it fails, in ``RULES`` order, so ``generated == valid +
sum(rejected.values())``. One canonical rule, ``duplicate``, is the space's own: with
pp == 1 no pipeline schedule runs, so only schedule 1f1b with vpp 1 is kept; with
tp == 1 sequence parallelism does nothing, so only sp=True is kept.

``recompute`` enters no rule and ``zero`` only the engine rules (evaluated per level,
last): they multiply the counts and split the valid rows into groups. A ``Group`` is one categorical combination (schedule, vpp,
recompute, zero, sp) -- one compiled kernel downstream -- holding equal-length int64
arrays of the numeric degrees.

``why(...)`` names the rule that rejects one point, with its numbers; it evaluates the
same predicates as ``generate``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ndplan.catalog.model import ModelSpec
from ndplan import limits
from ndplan import points as P
from ndplan import rules as R
from ndplan.strategy import micro_batches
from ndplan.layouts import leading_dense
from ndplan.layouts import RANGE_TEXT, ends_options
from ndplan.errors import NdplanError
from ndplan.vocab import BIDIRECTIONAL_SCHEDULES
from ndplan.space_file import DEGREE_DIMS, DIMS, LAYER_DIMS, WORLD_DIMS, load_space, normalize_space  # noqa: F401
from ndplan.strategy import Strategy
from ndplan.vocab import ONE_CHUNK_SCHEDULES, RECOMPUTE_MODES, SCHEDULES, ZERO_LEVELS as ZERO_STAGES

#: Keys of ``Group.grid``; ``m`` = gbs // (dp*mbs) micro-batches per step; first_layers and
#: last_layers the decoder layers of stage 0 and pp-1 (L/pp for even rows), uneven 1 for
#: the rows of an ends layout (layouts.py).
GRID_KEYS = ("dp", "tp", "pp", "cp", "ep", "etp", "mbs", "m", "first_layers", "last_layers", "uneven")
AUTO_MBS = tuple(range(1, 9))


# --------------------------------------------------------------------------- rules

@dataclass
class _Ctx:
    """Rule inputs (rules.py): numeric degrees as int64 arrays (plain ints for one point
    in ``why``), the categorical knobs of one combination as scalars, the sweep arguments."""
    model: ModelSpec
    gpus: int
    seq: int
    gbs: int
    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    mbs: np.ndarray
    vpp: int
    schedule: str
    sp: bool
    engine: str = "megatron"
    zero: int | None = None
    """The ZeRO level, set while the ``reads_zero`` rules are evaluated (generate)."""
    layers_per_stage: None = None
    """The space gives uneven splits as ``uneven`` rows (first/last counts), not lists."""
    uneven: np.ndarray | bool = False
    """Rows of an ends layout (layouts.py): the even-split rule does not apply to them."""

    @property
    def m(self) -> np.ndarray:
        return micro_batches(self.gbs, self.dp, self.mbs)


#: (name, one-line description) in evaluation order; a rejected candidate is counted
#: under the first rule it fails (the one table of rules.py).
RULES: list[tuple[str, str]] = R.describe()


# --------------------------------------------------------------------------- space

def row_label(p: Mapping) -> str:
    """One candidate (a sweep ``Table.point``) in one line, as the CLI and the figures print it."""
    from ndplan.labels import label
    return label(p)


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def _check_args(gpus: int, seq: int, gbs: int) -> None:
    for name, v, hi in (("gpus", gpus, limits.MAX_DEVICES), ("seq", seq, limits.MAX_SEQ), ("gbs", gbs, limits.MAX_BATCH)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise NdplanError(name, v, "not an integer", f"give a whole number in 1..{hi:,}")
        limits.count(name, v, 1, hi)


def _domains(model: ModelSpec, gpus: int, cons: dict[str, tuple | None], engine: str = "megatron"
             ) -> dict[str, tuple]:
    """Values each dimension takes: the constraint, or the auto default (module docstring).

    A listed degree that cannot divide gpus (dp, tp, pp, cp, and ep, etp through
    dp*cp*tp) raises NdplanError.
    """
    divs = _divisors(gpus)
    for dim in WORLD_DIMS + ("ep", "etp"):
        for v in cons[dim] or ():
            if gpus % v:
                raise NdplanError(dim, v, f"does not divide --gpus {gpus}", f"choose from {', '.join(map(str, divs))}")
    schedules = cons["schedule"] or SCHEDULES
    L = model.num_hidden_layers
    if any(s not in ONE_CHUNK_SCHEDULES for s in schedules):
        auto_vpp = tuple(v for v in _divisors(L) if v == 1 or 2 * v <= L)
    else:
        auto_vpp = (1,)
    auto = {
        "ep": _divisors(math.gcd(model.num_experts, gpus)) if model.is_moe else (1,),
        "etp": (1,), "vpp": auto_vpp, "mbs": AUTO_MBS, "zero": ZERO_STAGES,
        "recompute": RECOMPUTE_MODES, "schedule": SCHEDULES,
        "sp": tuple(sorted({P.default_sp(engine, tp) for tp in divs}, reverse=True)),  # the defaults of each tp
        "uneven": (False, True) if leading_dense(model) is not None else (False,),
        "first_layers": None, "last_layers": None,  # any count
        **dict.fromkeys(WORLD_DIMS, divs),
    }
    if cons["uneven"] and True in cons["uneven"] and leading_dense(model) is None:
        raise NdplanError("uneven", True, f"model {model.name} interleaves its dense and MoE layers",
                          "the sweep's uneven layouts need the dense layers first; use uneven: false")
    return {d: cons[d] if cons[d] is not None else auto[d] for d in DIMS}


# --------------------------------------------------------------------------- candidates

@dataclass
class Group:
    """One categorical combination (one compiled kernel downstream) and its valid rows."""
    schedule: str
    vpp: int
    recompute: str
    zero: int
    sp: bool
    grid: dict[str, np.ndarray]
    """GRID_KEYS -> read-only int64 arrays of equal length (axis 0: candidate row)."""

    def __len__(self) -> int:
        return len(self.grid["dp"])


@dataclass
class Candidates:
    """All valid candidates, split into groups, and the count of every rejection."""
    groups: list[Group]
    generated: int
    """Size of the raw product considered (factorizations x listed values of every other dim)."""
    rejected: dict[str, int]
    """Rule name -> candidates removed by it (first failing rule, RULES order); all rules present."""

    @property
    def valid(self) -> int:
        return sum(len(g) for g in self.groups)


def _factorizations(gpus: int, dom: dict[str, tuple]) -> dict[str, np.ndarray]:
    """All (dp, tp, pp, cp) from the domains with dp*tp*pp*cp == gpus, as int64 arrays."""
    # axes: 0 dp, 1 tp, 2 pp (values from each domain); cp is what is left of gpus
    dp, tp, pp = (a.ravel() for a in np.meshgrid(*(np.array(dom[d], dtype=np.int64) for d in ("dp", "tp", "pp")),
                                                  indexing="ij"))
    rest = dp * tp * pp
    ok = gpus % rest == 0
    cp = np.where(ok, gpus // np.where(ok, rest, 1), 0)
    ok &= np.isin(cp, np.array(dom["cp"], dtype=np.int64))
    if not ok.any():
        fixed = ", ".join(f"{d}={list(dom[d])}" for d in WORLD_DIMS)
        raise NdplanError("gpus", gpus, f"no dp*tp*pp*cp == {gpus} with {fixed}", "relax a constraint")
    return {"dp": dp[ok], "tp": tp[ok], "pp": pp[ok], "cp": cp[ok]}


def _base_grid(gpus: int, dom: dict[str, tuple]) -> dict[str, np.ndarray]:
    """Numeric rows: factorizations x ep x etp x mbs, flattened (axis 0: row)."""
    fact = _factorizations(gpus, dom)
    # axes of the product: 0 factorization index, 1 ep, 2 etp, 3 mbs
    idx, ep, etp, mbs = (a.ravel() for a in np.meshgrid(
        np.arange(len(fact["dp"])), *(np.array(dom[d], dtype=np.int64) for d in ("ep", "etp", "mbs")),
        indexing="ij"))
    return {**{d: fact[d][idx] for d in WORLD_DIMS}, "ep": ep, "etp": etp, "mbs": mbs}


def _layout_rows(model: ModelSpec, pp: np.ndarray, vpp: int, dom: dict, ends: bool = True) -> tuple[np.ndarray, ...]:
    """(base row index, first_layers, last_layers, uneven) of every layout row at ``vpp``:
    per base row its even split (first = last = L/pp; 0 when L does not divide, which the
    even-split rule rejects) and, with uneven in the space, each ends layout of
    layouts.ends_options, both kept only where the first/last counts are in the space."""
    L = model.num_hidden_layers
    firsts, lasts = dom["first_layers"], dom["last_layers"]

    def listed(f: int, last: int) -> bool:
        return (firsts is None or f in firsts) and (lasts is None or last in lasts)
    parts = []
    for u in np.unique(pp):
        opts = []
        if False in dom["uneven"]:
            even = L // u if L % (u * vpp) == 0 else 0
            if even == 0 or listed(even, even):
                opts.append((even, even, False))
        if True in dom["uneven"] and ends:
            opts += [(f, last, True) for f, last in ends_options(L, int(u), vpp) if listed(f, last)]
        idx = np.nonzero(pp == u)[0]
        parts += [(idx, np.full(len(idx), f, np.int64), np.full(len(idx), last, np.int64), np.full(len(idx), unv))
                  for f, last, unv in opts]
    if not parts:
        empty = np.empty(0, np.int64)
        return empty, empty, empty, np.empty(0, bool)
    return tuple(np.concatenate(x) for x in zip(*parts))


def generate(model: ModelSpec, gpus: int, seq: int, gbs: int, space: Mapping | None = None,
             engine: str = "megatron") -> Candidates:
    """Every candidate of the space that satisfies RULES (those of ``engine`` included),
    grouped by categorical knobs.

    Raises NdplanError for a bad space, non-positive arguments, a listed degree that
    cannot divide gpus, or constraints no factorization of gpus meets.
    """
    _check_args(gpus, seq, gbs)
    cons = normalize_space(space)
    dom = _domains(model, gpus, cons, engine)
    base = _base_grid(gpus, dom)
    if cons["etp"] is None and model.is_moe and R.engine_name(engine) == "fsdp":
        base["etp"] = np.where(base["ep"] == 1, base["tp"], base["etp"])  # torchtitan's experts (rules.py)
    n = len(base["dp"])
    per_zero = len(dom["recompute"])  # a knob in no rule: multiply counts
    per_combo = len(dom["zero"]) * per_zero
    rejected = dict.fromkeys(R.GROUPS, 0)
    static: dict[int, np.ndarray] = {}
    groups: list[Group] = []
    base_ctx = _Ctx(model=model, gpus=gpus, seq=seq, gbs=gbs, vpp=1, schedule="1f1b", sp=True, engine=engine, **base)
    generated = 0
    layouts: dict[int, tuple] = {}
    for schedule, vpp, sp in itertools.product(dom["schedule"], dom["vpp"], dom["sp"]):
        # a bidirectional schedule splits the layers over pp slices (layouts.slices), evenly
        key = (1, "even") if schedule in BIDIRECTIONAL_SCHEDULES else (vpp, "any")
        if key not in layouts:
            layouts[key] = _layout_rows(model, base["pp"], key[0], dom, ends=key[1] == "any")
        rows, first, last, uneven = layouts[key]
        k = len(rows)
        generated += k * per_combo
        c = _Ctx(model=model, gpus=gpus, seq=seq, gbs=gbs, vpp=vpp, schedule=schedule, sp=sp, uneven=uneven,
                 engine=engine, **{d: v[rows] for d, v in base.items()})
        alive = np.ones(k, dtype=bool)
        for i, rule in enumerate(R.RULES):
            if rule.reads_zero:
                continue  # per ZeRO level below (these rules come last: R.RULES)
            if not rule.static:
                fails = np.broadcast_to(rule.fails(c), (k,))
            else:
                if i not in static:
                    static[i] = np.broadcast_to(rule.fails(base_ctx), (n,))
                fails = static[i][rows]
            bad = alive & fails
            rejected[rule.group] += int(bad.sum()) * per_combo
            alive &= ~bad
        if not alive.any():
            continue
        for zero in dom["zero"]:
            ok = alive.copy()
            c.zero = zero
            for rule in R.RULES:
                if rule.reads_zero:
                    bad = ok & np.broadcast_to(rule.fails(c), (k,))
                    rejected[rule.group] += int(bad.sum()) * per_zero
                    ok &= ~bad
            if not ok.any():
                continue
            grid = {d: base[d][rows][ok] for d in base}
            grid["m"] = micro_batches(gbs, grid["dp"], grid["mbs"])
            grid |= {"first_layers": first[ok], "last_layers": last[ok], "uneven": uneven[ok].astype(np.int64)}
            for a in grid.values():
                a.flags.writeable = False
            for recompute in dom["recompute"]:
                groups.append(Group(schedule=schedule, vpp=vpp, recompute=recompute, zero=zero, sp=sp,
                                    grid=dict(grid)))  # own dict, shared read-only arrays
    return Candidates(groups=groups, generated=generated, rejected=rejected)


def group_strategies(model: ModelSpec, group: Group, seq: int, gbs: int, rows=None,
                     engine: str = "megatron") -> list[Strategy]:
    """``Strategy`` objects for some rows of a group (all rows when ``rows`` is None)."""
    rows = range(len(group)) if rows is None else rows
    cat = {"vpp": group.vpp, "zero": group.zero, "sp": group.sp, "recompute": group.recompute,
           "schedule": group.schedule}
    return [P.strategy_from_row({**{k: group.grid[k][i] for k in GRID_KEYS}, **cat}, seq, gbs, {"engine": engine},
                                model.num_hidden_layers) for i in rows]


# --------------------------------------------------------------------------- why

def why(model: ModelSpec, gpus: int, seq: int, gbs: int, space: Mapping | None, point: Mapping,
        engine: str = "megatron") -> str | None:
    """Why ``point`` is not a candidate: ``"<rule>: <explanation>"``, or None if it is one.

    Missing dimensions take the space's value when it fixes one (its first listed value
    when the default is not listed), else the defaults of ``points`` (Strategy's, the
    schedule interleaved when vpp > 1); a missing dp is
    gpus/(tp*pp*cp). A point that passes every rule but lies outside the space's values
    gets ``"space: ..."`` (not a RULES name: generate never makes such a point).
    """
    _check_args(gpus, seq, gbs)
    cons = normalize_space(space)
    dom = _domains(model, gpus, cons, engine)
    given = normalize_space(point)
    for dim, vals in given.items():
        if vals is not None and len(vals) != 1:
            raise NdplanError(dim, list(vals), "several values", "a point takes one value per dimension")
    p = {}
    for dim in DIMS[1:]:
        if dim in LAYER_DIMS + ("uneven",):
            continue  # _layout_reason
        if given[dim] is not None:
            p[dim] = given[dim][0]
        else:
            default = (P.default_schedule(p["vpp"]) if dim == "schedule" else P.default_sp(engine, p["tp"])
                       if dim == "sp" else P.STRATEGY_DEFAULTS[dim])
            p[dim] = default if default in dom[dim] else dom[dim][0]
    rest = p["tp"] * p["pp"] * p["cp"]
    if given["dp"] is None and gpus % rest:
        return f"world: tp*pp*cp={p['tp']}*{p['pp']}*{p['cp']}={rest} does not divide gpus={gpus}"
    p["dp"] = given["dp"][0] if given["dp"] is not None else gpus // rest
    if p["dp"] * rest != gpus:
        return f"world: dp*tp*pp*cp={p['dp']}*{p['tp']}*{p['pp']}*{p['cp']}={p['dp'] * rest} != gpus={gpus}"
    c = _Ctx(model=model, gpus=gpus, seq=seq, gbs=gbs, **{d: p[d] for d in DEGREE_DIMS if d != "vpp"},
             vpp=p["vpp"], schedule=p["schedule"], sp=p["sp"], engine=engine, zero=p["zero"])
    layout = _layout_point(model, p, given)
    if isinstance(layout, str):
        return layout
    c.uneven = layout["uneven"]
    rule = R.first_failure(c, ("strategy", "schedule", "model", "canonical") + R.ENGINE_SCOPES)
    if rule is not None:
        return f"{rule.group}: {R.field_of(rule, c)}={rule.value(c)}: {rule.problem(c)}"
    p |= layout
    for dim in DIMS:
        if dom[dim] is not None and p[dim] not in dom[dim]:
            how = "given" if cons[dim] is not None else "auto"
            return (f"space: {dim}={p[dim]} is outside the {how} values of this sweep "
                    f"({', '.join(map(str, dom[dim]))}); list it in the space")
    return None


def _layout_point(model: ModelSpec, p: dict, given: dict) -> dict | str:
    """{uneven, first_layers, last_layers} of a ``why`` point (the even split unless first
    or last counts other than L/pp are given), or the reason the counts are no layout of
    the sweep's family (layouts.RANGE_TEXT)."""
    L, pp, vpp = model.num_hidden_layers, p["pp"], p["vpp"]
    even = L // pp
    f = given["first_layers"][0] if given["first_layers"] is not None else None
    last = given["last_layers"][0] if given["last_layers"] is not None else None
    want = given["uneven"][0] if given["uneven"] is not None else None
    if want is not True and f in (None, even) and last in (None, even):
        return {"uneven": False, "first_layers": even, "last_layers": even}
    options = ends_options(L, pp, vpp)
    fits = [o for o in options if f in (None, o[0]) and last in (None, o[1])]
    if not fits:
        return (f"layout: first_layers={f} last_layers={last} with pp={pp} vpp={vpp} is no uneven layout of the "
                f"sweep for {L} layers ({RANGE_TEXT}); the ones there: "
                f"{', '.join(f'{a}/{b}' for a, b in options) or 'none'}")
    return {"uneven": True, "first_layers": fits[0][0], "last_layers": fits[0][1]}
