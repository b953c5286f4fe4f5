"""Fit the step-time model's named efficiency constants to the user's measured runs
(``ndplan calibrate RUNS.yaml``; issue 16 part 4).

The model's time Terms depend on the hardware constants of catalog/hardware.py
(``EFFICIENCY_ARGS``: achieved fractions of the 16-bit and FP8 GEMM and attention peaks, of HBM bandwidth
and of the intra- and inter-node collective bandwidths). They are kernel arguments, so one
compiled step-time kernel per run, evaluated on arrays of constant values, gives each run's
step time at any candidate set (estimate.step_time_function).

Fit: least squares on r_i = ln(predicted_i / measured_i) (relative error, so a 30 s run and a
1 s run weigh alike), each constant c in (0, 1) through c = 1 / (1 + e^-z), by Gauss-Newton with
Levenberg damping. The Jacobian dr/dz is taken by central differences of the kernel (step 1e-4
in z): the time expression is a max/min of smooth pieces, whose SymPy derivative is the same
piecewise function and would cost a second compiled kernel per run.

Reported: each constant with a 95 % interval from the linearised covariance
s^2 (J^T J)^-1, s^2 = RSS / (n - p), Student's t with n - p degrees of freedom, taken in z and
mapped through the logistic (so it stays inside (0, 1)); a constant the fit drives to a bound
(|z| at its clip) is named: the model's structure, not that constant, is what the runs
disagree with. The error of every run before (the hardware's own constants) and after; the
leave-one-out error (refit from the hardware's values without the run, predict it: a constant
only that run moves keeps the hardware's value); outliers (leave-one-out |error| above three
times the median and above 10 %). The constants are chosen by that same leave-one-out error,
so it is optimistic by the choice. A constant no run moves (no run's step time changes by 0.001 %
per 1 % of it, MIN_SENSITIVITY) is left at its value and named. Measured peak memory, when given, is compared
with the estimate (the fitted constants do not change memory).

Written: a hardware YAML (the run's hardware entry with the fitted values and their source),
which every command takes as ``-H FILE``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ndplan import limits
from ndplan.catalog.hardware import _NUMERIC, EFFICIENCY_ARGS, EFFICIENCY_FIELDS, Hardware
from ndplan.catalog.mamf import MAMF_FIELDS
from ndplan.catalog.model import ModelSpec
from ndplan.errors import NdplanError
from ndplan.strategy import Strategy

FITTABLE = EFFICIENCY_ARGS
"""Hardware field -> its kernel argument (catalog/hardware.py): the fractions a run can fit."""
MIN_SENSITIVITY = 1e-3
"""Largest |d ln step / d ln constant| over the runs below which a constant is not fitted: far
above the central differences' truncation error (Z_STEP^2, 1e-8) and far below any constant a
run depends on (a compute-bound step moves about 0.5-1 per unit of ln gemm_efficiency)."""
Z_STEP = 1e-4
"""Central-difference step in the logistic coordinate z."""
MAX_ITER = 60
LAMBDA0, LAMBDA_DOWN, LAMBDA_UP, LAMBDA_MAX = 1e-3, 3.0, 10.0, 1e10
"""Levenberg-Marquardt damping: start, divide on a step that lowers the cost, multiply on one that
does not, give up above (the usual choices, Marquardt 1963 / Press et al., Numerical Recipes
Sec. 15.5: start 1e-3, factors of about 10); stop when the cost falls by less than 1e-14 of itself
or z moves by less than 1e-9 (both below what the printed 3 digits can show)."""
MAX_STEP_S = 1e7
"""Ceiling of a measured step time, seconds (116 days): above it the value is a unit slip."""
DIGITS = 4
"""Decimals a fitted constant is written with (hardware YAML); the smallest it can be is 10^-DIGITS."""
Z_CLIP = 12.0
"""|z| bound of the fit (c within 6e-6 of 0 or 1): a constant there is reported as at a bound."""
C_EDGE = 1e-6
"""Start values are kept this far inside (0, 1) (an efficiency of exactly 1 is allowed)."""
OUTLIER_FACTOR, OUTLIER_FLOOR = 3.0, 0.10
"""A run is an outlier when its leave-one-out |error| exceeds 3x the median |error| (under
normal errors the median |error| is 0.674 sigma, so 3x is 2.0 sigma: about 1 run in 20 by
chance) and 10 %, about the 9.3 % median error of the published runs before calibration
(benchmarks/steptime_validation.py): smaller misses are the model's ordinary error."""
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
"""Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom (standard tables);
above 30, the first-order Cornish-Fisher term z + (z^3 + z) / (4 dof), z = 1.95996."""


@dataclass(frozen=True)
class Run:
    """One measured run: what ran, on which hardware, and its measured seconds per step."""
    name: str
    model: ModelSpec
    hardware: Hardware
    strategy: Strategy
    step_s: float
    peak_gib: float | None = None
    engine: object = None
    """An EngineProfile replacing the strategy's in the time model (estimate's ``engine``), or None."""


@dataclass
class Fit:
    """The outcome: fitted constants (hardware field -> value), their 95 % intervals, the
    constants left alone and why, and per-run errors (fractions, signed)."""
    runs: list[Run]
    values: dict[str, float]
    intervals: dict[str, tuple[float, float] | None]
    not_fitted: dict[str, str]
    before: list[float]
    after: list[float]
    loo: list[float | None]
    outliers: list[str] = field(default_factory=list)
    dof: int = 0
    at_bound: list[str] = field(default_factory=list)
    peaks: list[tuple[float, float] | None] = field(default_factory=list)
    """(predicted, measured) peak GiB of the runs that give peak_gib, else None."""

    def was(self, name: str) -> float:
        """The value of constant ``name`` the runs were predicted with before the fit (the first
        run's kernel value: ``attention_efficiency`` is fa2_attention_efficiency where its engine
        runs FlashAttention-2)."""
        from ndplan.estimate import time_hw_values
        r = self.runs[0]
        return time_hw_values(r.hardware, r.strategy, r.engine)[FITTABLE[name]]

    def to_json(self) -> dict:
        def pct(x):
            return None if x is None else round(100 * x, 3)
        return {"constants": {k: {"value": v, "interval_95": self.intervals[k], "at_bound": k in self.at_bound}
                              for k, v in self.values.items()},
                "not_fitted": self.not_fitted, "degrees_of_freedom": self.dof,
                "runs": [{"name": r.name, "measured_s": r.step_s, "error_before_pct": pct(b), "error_after_pct": pct(a),
                          "error_leave_one_out_pct": pct(lo)}
                         | ({"peak_gib": {"predicted": pk[0], "measured": pk[1]}} if pk else {})
                         for r, b, a, lo, pk in zip(self.runs, self.before, self.after, self.loo, self.peaks)],
                "median_abs_error_pct": {"before": pct(_median_abs(self.before)), "after": pct(_median_abs(self.after)),
                                         "leave_one_out": pct(_median_abs(self.loo))},
                "outliers": self.outliers}


def _median_abs(xs) -> float | None:
    vals = [abs(x) for x in xs if x is not None]
    return float(np.median(vals)) if vals else None


def _logit(c: float) -> float:
    c = min(max(c, C_EDGE), 1 - C_EDGE)
    return math.log(c / (1 - c))


def _sigmoid(z):
    return 0.5 * (1 + np.tanh(np.asarray(z, dtype=float) / 2))  # 1 / (1 + e^-z), without overflow


class _Model:
    """Each run's step seconds as a function of the fitted constants ``names`` (arrays broadcast)."""

    def __init__(self, runs: list[Run], names: list[str], fns=None):
        from ndplan.estimate import step_time_function
        self.names = names
        from ndplan.estimate import time_hw_values
        self.base = [time_hw_values(r.hardware, r.strategy, r.engine) for r in runs]
        self.fns = fns or [step_time_function(r.model, r.strategy, r.engine) for r in runs]
        self.log_measured = np.log([r.step_s for r in runs])

    def with_names(self, names: list[str]) -> "_Model":
        m = _Model.__new__(_Model)
        m.names, m.base, m.fns, m.log_measured = names, self.base, self.fns, self.log_measured
        return m

    def log_times(self, i: int, values: np.ndarray) -> np.ndarray:
        """ln step seconds of run i at constant values (shape (k, p) -> (k,))."""
        args = dict(self.base[i])
        for j, n in enumerate(self.names):
            args[FITTABLE[n]] = values[:, j]
        return np.log(np.broadcast_to(self.fns[i](**args), values.shape[:1]))

    def residuals(self, rows: list[int], z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(r, dr/dz) of ``rows`` at logistic coordinates z."""
        p = len(z)
        pts = np.repeat(z[None, :], 2 * p + 1, axis=0)
        for j in range(p):
            pts[1 + 2 * j, j] += Z_STEP
            pts[2 + 2 * j, j] -= Z_STEP
        vals = _sigmoid(pts)
        r, J = np.empty(len(rows)), np.empty((len(rows), p))
        for k, i in enumerate(rows):
            lt = self.log_times(i, vals)
            r[k] = lt[0] - self.log_measured[i]
            J[k] = (lt[1::2] - lt[2::2]) / (2 * Z_STEP)
        return r, J


def _solve(model: _Model, rows: list[int], z0: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Levenberg-damped Gauss-Newton from z0: (z, r, J) at the minimum of sum r^2 over ``rows``."""
    z, lam = z0.copy(), LAMBDA0
    r, J = model.residuals(rows, z)
    cost = float(r @ r)
    for _ in range(MAX_ITER):
        A = J.T @ J
        g = J.T @ r
        step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), -g)  # + 1e-12: a zero column stays solvable
        z_new = np.clip(z + step, -Z_CLIP, Z_CLIP)
        r_new, J_new = model.residuals(rows, z_new)
        cost_new = float(r_new @ r_new)
        if cost_new < cost:
            done = cost - cost_new < 1e-14 * max(cost, 1e-30) or np.max(np.abs(z_new - z)) < 1e-9
            z, r, J, cost, lam = z_new, r_new, J_new, cost_new, lam / LAMBDA_DOWN
            if done:
                break
        else:
            lam *= LAMBDA_UP
            if lam > LAMBDA_MAX:
                break
    return z, r, J


def _t95(dof: int) -> float:
    from ndplan.bands import Z95 as z
    return T95[dof - 1] if dof <= len(T95) else z + (z ** 3 + z) / (4 * dof)


def _start(runs: list[Run], names: list[str]) -> np.ndarray:
    return np.array([_logit(getattr(runs[0].hardware, n)) for n in names])


def sensitivities(model: _Model, runs: list[Run]) -> dict[str, float]:
    """Largest |d ln step / d ln c| over the runs, per constant of ``model``, at the hardware's values."""
    z0 = _start(runs, model.names)
    _, J = model.residuals(list(range(len(runs))), z0)
    c = _sigmoid(z0)
    # d ln t / d ln c = (d ln t / dz) / (1 - c)
    return {n: float(np.max(np.abs(J[:, j]))) / (1 - c[j]) for j, n in enumerate(model.names)}


def _leave_one_out(model: _Model, runs: list[Run]) -> list[float | None]:
    """Each run's error predicted by a fit to the others that starts from the hardware's values
    (None when too few remain)."""
    n, z0 = len(runs), _start(runs, model.names)
    out: list[float | None] = []
    for i in range(n):
        rest = [k for k in range(n) if k != i]
        if len(rest) <= len(z0):
            out.append(None)
            continue
        zi, _, _ = _solve(model, rest, z0)
        ri, _ = model.residuals([i], zi)
        out.append(float(np.expm1(ri[0])))
    return out


def _loo_median(model: _Model, runs: list[Run]) -> float:
    med = _median_abs(_leave_one_out(model, runs))
    return math.inf if med is None else med


def fit(runs: list[Run], names: list[str] | None = None) -> Fit:
    """Fit ``names``; by default the constants chosen forward by the leave-one-out error: the
    one the runs move most first, then each next one only if it lowers the leave-one-out
    median |error| (a constant the data cannot pin down does not enter)."""
    check_runs(runs)
    if names is not None and not names:
        raise NdplanError("--fit", "", "names no constant", f"give one or more of {', '.join(FITTABLE)}")
    asked = list(dict.fromkeys(names)) if names else list(FITTABLE)
    for n in asked:
        if n not in FITTABLE:
            raise NdplanError("--fit", n, "not a constant calibrate fits", f"choose from {', '.join(FITTABLE)}")
    model = _Model(runs, asked)
    sens = sensitivities(model, runs)
    not_fitted = {n: f"no run's step time moves with it (largest |d ln t / d ln c| {sens[n]:.1e})"
                  for n in asked if sens[n] < MIN_SENSITIVITY}
    ranked = sorted((n for n in asked if n not in not_fitted), key=lambda n: -sens[n])
    for n in ranked[max(len(runs) - 1, 0):]:
        not_fitted[n] = f"{len(runs)} run(s) fit at most {len(runs) - 1} constant(s); this one moves the step least"
    ranked = ranked[:max(len(runs) - 1, 0)]
    if not ranked:
        raise NdplanError("runs", f"{len(runs)} run(s)", "tell none of the constants apart",
                          "give more runs than constants, whose step times depend on them (compute-bound and "
                          "communication-bound ones)")
    use = ranked
    if names is None and len(ranked) > 1:
        use, best = ranked[:1], _loo_median(model.with_names(ranked[:1]), runs)
        for n in ranked[1:]:
            trial = _loo_median(model.with_names(use + [n]), runs)
            if trial < best:
                use, best = use + [n], trial
            else:
                not_fitted[n] = (f"adding it does not lower the leave-one-out median |error| ({100 * best:.1f} % -> "
                                 f"{100 * trial:.1f} %)")
    return _fit(model.with_names(use), runs, not_fitted)


def _fit(model: _Model, runs: list[Run], not_fitted: dict[str, str]) -> Fit:
    use, every = model.names, list(range(len(runs)))
    z0 = _start(runs, use)
    base_r, _ = model.residuals(every, z0)
    z, r, J = _solve(model, every, z0)
    dof = len(runs) - len(use)
    c = _sigmoid(z)
    intervals: dict[str, tuple[float, float] | None] = {n: None for n in use}
    at_bound = [n for n, zj in zip(use, z) if abs(zj) >= Z_CLIP - 1e-9]
    if dof > 0:
        cov = float(r @ r) / dof * np.linalg.pinv(J.T @ J)
        for j, n in enumerate(use):
            half = _t95(dof) * math.sqrt(max(cov[j, j], 0.0))
            intervals[n] = (float(_sigmoid(z[j] - half)), float(_sigmoid(z[j] + half)))
    loo = _leave_one_out(model, runs)
    med = _median_abs(loo)
    outliers = [run.name for run, e in zip(runs, loo)
                if e is not None and med is not None and abs(e) > max(OUTLIER_FACTOR * med, OUTLIER_FLOOR)]
    return Fit(runs=runs, values={n: float(v) for n, v in zip(use, c)}, intervals=intervals, not_fitted=not_fitted,
               before=[float(x) for x in np.expm1(base_r)], after=[float(x) for x in np.expm1(r)], loo=loo,
               outliers=outliers, dof=dof, at_bound=at_bound, peaks=[_peak(run) for run in runs])


def _peak(run: Run) -> tuple[float, float] | None:
    """(predicted, measured) peak GiB of a run that gives one (memory: no fitted constant)."""
    if run.peak_gib is None:
        return None
    from ndplan.estimate import estimate
    from ndplan.units import GIB
    return estimate(run.model, run.hardware, run.strategy).peak_bytes / GIB, run.peak_gib


def check_runs(runs: list[Run]) -> None:
    """One hardware entry, at least one run, positive finite step times."""
    if not runs:
        raise NdplanError("runs", [], "no runs", "list at least two measured runs under runs:")
    for r in runs:
        step_seconds(f"{r.name}.step_time_s", r.step_s)
    names = sorted({r.hardware.name for r in runs})
    if len(names) > 1:
        raise NdplanError("hardware", names, "runs on more than one hardware entry",
                          "calibrate one device type at a time: one RUNS file per hardware")


def step_seconds(field: str, v) -> float:
    """A measured step time: seconds in (0, MAX_STEP_S]."""
    return limits.real(field, v, 0.0, MAX_STEP_S, lo_open=True, what="the measured seconds per step")


def _fitted_field(f: Fit, field: str) -> str | None:
    """The fitted constant that ``field`` of the written YAML takes: itself, except that the
    attention kernel argument (eff_attn) is ``fa2_attention_efficiency`` in the runs whose engine
    runs FlashAttention-2 (EngineProfile.attention_fa2) on a device that has one, so the fit goes
    to the field those runs read (to both when the runs mix kernels)."""
    from ndplan.catalog.hardware import FA2_FIELD
    from ndplan.engines import profile
    if field not in (FA2_FIELD, "attention_efficiency"):
        return field
    fa2 = [r.hardware.attention_field((r.engine or profile(r.strategy.engine)).attention_fa2) == FA2_FIELD
           for r in f.runs]
    reads = any(fa2) if field == FA2_FIELD else not all(fa2)
    return "attention_efficiency" if reads else None


def hardware_yaml(f: Fit, runs_file: str) -> str:
    """The runs' hardware entry with the fitted constants, as a hardware YAML (-H FILE)."""
    import yaml
    hw = f.runs[0].hardware
    names = ", ".join(r.name for r in f.runs)
    doc = {"display_name": f"{hw.display_name} (calibrated)"}  # its name is the file's (load_hardware)
    for k in (*_NUMERIC, *MAMF_FIELDS, *EFFICIENCY_FIELDS):
        v = getattr(hw, k)
        if v is None:
            continue
        src = hw.sources.get(k, "")
        fitted = _fitted_field(f, k)
        if fitted in f.values:
            k_fit = fitted
            iv, loo = f.intervals[k_fit], _median_abs(f.loo)
            v = min(max(round(f.values[k_fit], DIGITS), 10.0 ** -DIGITS), 1.0)  # in (0, 1] (FIELD_RULES)
            src = (f"fitted by ndplan calibrate on {runs_file} ({len(f.runs)} runs: {names}); 95 % interval "
                   + (f"{iv[0]:.4g} to {iv[1]:.4g}" if iv else "not available (as many runs as constants)")
                   + ("; at a bound of the fit" if k_fit in f.at_bound else "")
                   + "; leave-one-out median |error| " + ("n/a" if loo is None else f"{100 * loo:.1f} %")
                   + f"; was {getattr(hw, k):.4g}")
        doc[k] = {"value": v, "source": src}
    return "# Written by ndplan calibrate: use it as -H FILE with any command.\n" + yaml.safe_dump(
        doc, sort_keys=False, width=120)


def load_runs(path: Path) -> list[Run]:
    """Runs of a RUNS.yaml (calibrate's help shows the form; paths are relative to the file)."""
    from ndplan.catalog.files import read_mapping
    from ndplan.catalog.hardware import load_hardware
    doc = read_mapping(path, "runs")
    _known_keys("RUNS", doc, TOP_KEYS)
    items = doc.get("runs")
    if not isinstance(items, list) or not items:
        raise NdplanError("runs", items, f"{path.name} has no list of runs", "write runs:\n  - name: ...\n    model: ...")
    default_hw = doc.get("hardware")
    out = []
    for k, item in enumerate(items):
        where = f"runs[{k}]"
        if not isinstance(item, dict):
            raise NdplanError(where, item, "not a mapping", "give name, model, hardware, strategy (or file), step_time_s")
        _known_keys(where, item, RUN_KEYS)
        name = str(item.get("name", where))
        step = step_seconds(f"{where}.step_time_s", item.get("step_time_s"))
        peak = item.get("peak_gib")
        if peak is not None:
            peak = limits.gib(f"{where}.peak_gib", peak)
        hw_name = item.get("hardware", default_hw)
        if hw_name is None:
            raise NdplanError(f"{where}.hardware", None, "no hardware", "give hardware: (a catalog name or YAML path)")
        hw = load_hardware(_path_or_name(path, hw_name))
        try:
            model, strat = _run_strategy(path, item, name, where)
        except NdplanError as e:
            raise NdplanError(f"{where}.{e.field}", e.value, e.problem, e.fix) from None
        out.append(Run(name=name, model=model, hardware=hw, strategy=strat, step_s=step, peak_gib=peak))
    return out


TOP_KEYS = ("hardware", "runs")
RUN_KEYS = ("name", "model", "hardware", "strategy", "file", "step_time_s", "peak_gib", "gpus", "seq", "gbs")


def _known_keys(where: str, doc: dict, keys: tuple[str, ...]) -> None:
    """A key calibrate does not read is a one-line error (a typo would drop its value)."""
    for k in doc:
        if k not in keys:
            import difflib
            close = difflib.get_close_matches(str(k), keys, n=1)
            raise NdplanError(f"{where}.{k}", doc[k], "not a key calibrate reads",
                              f"did you mean {close[0]}?" if close else f"use {', '.join(keys)}")


def _run_strategy(path: Path, item: dict, name: str, where: str):
    """(model, strategy) of one run: from its launch file (``file:``, read as ``check`` reads it,
    with the run's model, gpus, seq and gbs when the file lacks them) or its model and strategy."""
    from ndplan.catalog.model import load_model
    from ndplan.points import strategy_from_point
    bounds = {"gpus": (limits.MAX_DEVICES, "a device count"), "seq": (limits.MAX_SEQ, "a sequence length"),
              "gbs": (limits.MAX_BATCH, "a batch size in sequences")}
    given = {k: limits.count(k, item[k], 1, hi, what) for k, (hi, what) in bounds.items() if item.get(k) is not None}
    model = item.get("model")
    model = None if model is None else load_model(_path_or_name(path, model))
    if "file" in item and "strategy" in item:
        raise NdplanError(f"{where}.strategy", item["strategy"], "given beside file:",
                          "give the launch file or the strategy, not both")
    if "file" in item:
        from ndplan.interop import read_config
        ci = read_config(path.parent / str(item["file"]), model=model, **given)
        return ci.model, ci.strategy
    if model is None or not isinstance(item.get("strategy"), dict):
        raise NdplanError("strategy", name, "needs model and strategy (or file)",
                          "give model: NAME and strategy: {dp: .., tp: .., gbs: .., seq: ..}")
    point = dict(item["strategy"])
    for k in ("seq", "gbs"):  # the run's seq / gbs fill the strategy's, never silently differ
        if k in given:
            if k in point and point[k] != given[k]:
                raise NdplanError(k, given[k], f"differs from strategy's {k}={point[k]!r}", "give it once")
            point[k] = given[k]
    strat = strategy_from_point(point, given.get("gpus"))
    strat.check(model, given.get("gpus"))
    return model, strat


def _path_or_name(base: Path, value) -> str:
    p = base.parent / str(value)
    return str(p) if p.suffix in (".yaml", ".yml", ".json") and p.exists() else str(value)
