"""Library API: estimate a strategy's per-stage memory and its step time, MFU and
throughput (throughput.py), and return them in the JSON schema of ../shared/DESIGN.md."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ndplan.argnames import HW_ARGS, STRATEGY_ARGS
from ndplan.errors import warn
from ndplan.catalog.hardware import Hardware
from ndplan.catalog.model import ModelSpec
from ndplan.engines import EngineProfile, fp8_gemms
from ndplan.kernels import model_kernel
from ndplan.layouts import ends_of, head_stage, symbolic_layout as symbolic_stage_ok
from ndplan.strategy import Strategy
from ndplan.structure import Structure, kernel_key, structure
from ndplan.throughput import tokens_per_s_per_device, utilization
from ndplan.vocab import OUTSIDE_TENSOR_KEYS, STATIC_KEYS

if TYPE_CHECKING:
    from ndplan.terms import Breakdown

# SymPy and the formula builders are imported where a kernel is built or a Breakdown is asked
# for: an estimate whose kernels are cached runs on numpy alone (kernels.py).


def strategy_values(strat: Strategy, stage: int = 0) -> dict[str, int]:
    """Values of the strategy kernel arguments by name (stage excluded; nrec taken at ``stage``
    when recompute_layers is per stage; first_layers/last_layers those of an ends layout,
    layouts.ends_of, else 0: no other kernel reads them)."""
    ends = ends_of(strat.pp, strat.vpp, strat.schedule, strat.layers_per_stage) or (0, 0)  # read by ends kernels only
    return {"dp": strat.dp, "tp": strat.tp, "pp": strat.pp, "vpp": strat.vpp, "cp": strat.cp, "ep": strat.ep,
            "etp": strat.etp, "mbs": strat.mbs, "m": strat.m, "seq": strat.seq,
            "nrec": strat.nrec[stage] if isinstance(strat.nrec, tuple) else strat.nrec,
            "first_layers": ends[0], "last_layers": ends[1]}


def strategy_point(strat: Strategy, stage: int = 0) -> dict:
    """``strategy_values`` keyed by the SymPy symbols (symbols.BY_NAME), for substitution."""
    from ndplan.symbols import BY_NAME
    return {BY_NAME[k]: v for k, v in strategy_values(strat, stage).items()}


def stage_breakdown(model: ModelSpec, view: Structure, stage: int | None = None, M=None) -> Breakdown:
    """Memory Terms of a stage. ``stage=None`` keeps the stage index a symbol where the
    layout allows it (even split); otherwise give the stage number. ``M``: the model sizes
    (default the model's numbers; kernels pass ModelSymbols.symbolic())."""
    import sympy as sp
    from ndplan import symbols as S
    from ndplan.formulas.memory import stage_memory
    view = structure(model, view)
    M = S.model_symbols(model) if M is None else M
    if stage is None:
        stage = S.stage if symbolic_stage_ok(model, view) else 0
    return stage_memory(model, M, view, stage if isinstance(stage, sp.Symbol) else sp.Integer(stage))


def memory_kernel(model: ModelSpec, view: Structure, stage: int | None = None):
    """The compiled memory kernel of ``view`` (``stage``: the concrete stage of a
    non-symbolic layout, else None), shared by the models the builder cannot tell apart
    (kernels.model_kernel) and bound to this model's sizes."""
    view = structure(model, view)
    return model_kernel(model, kernel_key(None, view, "memory", stage),
                        lambda spec, M: stage_breakdown(spec, view, stage, M), STRATEGY_ARGS,
                        use_disk=not view.hooks)


def _step_breakdown(spec, M, view) -> Breakdown:
    from ndplan.formulas.step import step_time
    return step_time(spec, M, view)


def _hidden_breakdown(spec, M, view) -> Breakdown:
    from ndplan.formulas.step import hidden_comm
    return hidden_comm(spec, M, view)


def hidden_kernel(model: ModelSpec, view: Structure):
    """The compiled kernel of the collective seconds that overlap compute (formulas/step.py
    ``hidden_comm``; arguments as time_kernel's): built when a report asks, not by sweeps."""
    return model_kernel(model, kernel_key(None, view, "hidden"), lambda spec, M: _hidden_breakdown(spec, M, view),
                        STRATEGY_ARGS + HW_ARGS, use_disk=not view.hooks)


def time_kernel(model: ModelSpec, view: Structure):
    """The compiled step-time kernel of ``view`` (arguments: strategy and hardware symbols)."""
    return model_kernel(model, kernel_key(None, view, "time"), lambda spec, M: _step_breakdown(spec, M, view),
                        STRATEGY_ARGS + HW_ARGS, use_disk=not view.hooks)


def _terms(rows) -> Breakdown:
    """A Breakdown of (key, expression, unit, source) rows."""
    import sympy as sp
    from ndplan.terms import Breakdown, Term
    return Breakdown(tuple(Term(key=k, expr=sp.sympify(e), unit=u, source=src) for k, e, u, src in rows))


def _model_totals(spec, M, mode: str) -> Breakdown:
    import sympy as sp
    from ndplan import symbols as S
    from ndplan.formulas import flops as FL, params as P
    return _terms((("total.params", P.params_total(spec, M), "count", "formulas/params.py params_total"),
                   ("total.params_active", P.params_active(spec, M) if spec.is_moe else sp.Integer(0), "count",
                    "formulas/params.py params_active (0: a dense model)"),
                   ("total.flops_per_sequence", FL.model_flops_per_sequence(spec, M, S.seq), "flop",
                    "formulas/flops.py model_flops_per_sequence"),
                   ("total.recompute_flops_per_sequence", FL.recompute_flops_per_sequence(spec, M, S.seq, mode),
                    "flop", "formulas/flops.py recompute_flops_per_sequence")))


def model_totals(model: ModelSpec, seq: int, recompute: str = "none") -> dict[str, float]:
    """Parameters (total; active, 0 for a dense model) and the model and ``recompute`` FLOPs of
    one sequence of ``seq`` tokens, from a compiled kernel (argument: seq): numbers a cached
    estimate or sweep reads without SymPy."""
    kernel = model_kernel(model, ("model totals", recompute), lambda spec, M: _model_totals(spec, M, recompute),
                          ("seq",))
    return {k: float(v) for k, v in kernel(seq=float(seq)).items()}


def _host_breakdown(spec, M, view) -> Breakdown:
    import sympy as sp
    from ndplan.formulas.states import host_memory
    return _terms((("total.host_bytes", host_memory(spec, M, view, sp.Integer(0)), "bytes",
                    "formulas/states.py host_memory (stage 0)"),))


def host_kernel(model: ModelSpec, view: Structure):
    """The compiled host-memory kernel of ``view`` (bytes per device; arguments: strategy symbols)."""
    view = structure(model, view)
    return model_kernel(model, kernel_key(None, view, "host"), lambda spec, M: _host_breakdown(spec, M, view),
                        STRATEGY_ARGS, use_disk=not view.hooks)


@dataclass
class Estimate:
    model: ModelSpec
    hardware: Hardware
    strategy: Strategy
    per_stage: list[dict]
    params_total: int
    params_active: int | None
    host_bytes: int
    time_terms: dict[str, float] = field(default_factory=dict)
    flops_per_step: float = 0.0
    """Model FLOPs per step (MFU numerator)."""
    hardware_flops_per_step: float = 0.0
    """Model + recompute FLOPs per step (HFU numerator)."""
    time_engine: EngineProfile | None = None
    """The engine profile that replaced the strategy's in the time model (``estimate``'s
    ``engine``), or None: what bands.band re-evaluates."""
    _breakdowns: list = field(repr=False, default_factory=list)
    _time_breakdown: object = field(repr=False, default=None)
    _hidden: object = field(repr=False, default=None)

    @functools.cached_property
    def hidden_terms(self) -> dict[str, float]:
        """Collective seconds per axis that overlap compute (``hidden.tp_comm``, ``hidden.cp_comm``,
        ``hidden.dp_comm``; formulas/step.py hidden_comm): beside the exposed ``time.*_comm``, what the
        overlap hides. Evaluated on first use (its kernel is not a sweep's)."""
        return self._hidden() if self._hidden else {}

    @property
    def breakdowns(self) -> list[Breakdown]:
        """Memory Breakdown per stage (built on demand: kernels may come from the cache)."""
        return [b() for b in self._breakdowns]

    @property
    def time_breakdown(self) -> Breakdown:
        return self._time_breakdown()

    @property
    def step_s(self) -> float:
        return sum(self.time_terms.values())

    @property
    def mfu(self) -> float:
        return utilization(self.flops_per_step, self.step_s, self.strategy.world, self.hardware.bf16_flop_per_s)

    @property
    def hfu(self) -> float:
        return utilization(self.hardware_flops_per_step, self.step_s, self.strategy.world,
                           self.hardware.bf16_flop_per_s)

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second per device."""
        return tokens_per_s_per_device(self.strategy.gbs, self.strategy.seq, self.step_s, self.strategy.world)

    @property
    def peak_bytes(self) -> int:
        return max(s["peak_bytes"] for s in self.per_stage)

    @property
    def peak_stage(self) -> int:
        return max(self.per_stage, key=lambda s: s["peak_bytes"])["stage"]

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.hardware.hbm_bytes

    def to_json(self, hidden: bool = True) -> dict:
        """The DESIGN.md estimate schema; ``hidden``: with ``time.hidden`` (hidden_terms, whose kernel
        a sweep's top rows would otherwise compile; the sweep leaves it out)."""
        doc = {
            "strategy": self.strategy.as_dict(),
            "model": {"name": self.model.name, "architecture": self.model.architecture,
                      "params_total": self.params_total,
                      **({"params_active": self.params_active} if self.params_active is not None else {})},
            "hardware": {"name": self.hardware.name, "hbm_bytes": self.hardware.hbm_bytes},
            "memory": {"per_stage": self.per_stage, "peak_bytes": self.peak_bytes,
                       "peak_stage": self.peak_stage, "host_bytes": self.host_bytes},
            "time": {"step_s": self.step_s, "terms": self.time_terms, "mfu": self.mfu,
                     "hfu": self.hfu, "tokens_per_s": self.tokens_per_s, "flops_per_step": self.flops_per_step},
            "fits": self.fits,
        }
        if hidden:
            doc["time"]["hidden"] = self.hidden_terms
        return doc


def _stage_rows(values: list[dict[str, np.ndarray]], stages) -> list[dict]:
    rows = []
    for i, vals in enumerate(values):
        terms = {k: int(np.ceil(float(v))) for k, v in vals.items()}
        static = sum(terms[k] for k in STATIC_KEYS)
        total = sum(terms.values())
        allocated = total - sum(terms.get(k, 0) for k in OUTSIDE_TENSOR_KEYS)
        rows.append({"stage": int(stages[i]), "peak_bytes": total, "static_bytes": static,
                     "dynamic_bytes": total - static, "allocated_bytes": allocated,
                     "reserved_bytes": allocated + terms.get("mem.allocator", 0), "terms": terms})
    return rows


SUSPICIOUS_STEP_S = 86400.0
"""A step longer than a day is reported with a warning (a hardware value is likely off)."""


def estimate(model: ModelSpec, hardware: Hardware, strat: Strategy, gpus: int | None = None,
             engine: EngineProfile | None = None) -> Estimate:
    """Per-stage peak memory and step time of ``strat`` for ``model`` on ``hardware``.

    ``engine`` replaces the strategy's named profile in the time model only (e.g. the
    same engine with a stated ``--tp-comm-overlap``: ``dataclasses.replace(MEGATRON,
    overlap_tp_comm=True)``); memory always uses the named profile."""
    strat.check(model, gpus)
    point = strategy_values(strat)
    stages = np.arange(strat.pp)
    if isinstance(strat.recompute_layers, tuple):
        point["nrec"] = np.asarray(strat.recompute_layers, dtype=float)  # one count per stage
    view = structure(model, strat)
    if symbolic_stage_ok(model, view):
        bd = lambda: stage_breakdown(model, view)  # noqa: E731
        out = memory_kernel(model, view)(**point, stage=stages)
        bds = [bd] * strat.pp
        values = [{k: v[i] for k, v in out.items()} for i in range(strat.pp)]
    else:
        bds = [functools.partial(stage_breakdown, model, view, int(i)) for i in stages]
        nrec = np.broadcast_to(np.asarray(point["nrec"], dtype=float), (strat.pp,))
        values = [memory_kernel(model, view, int(i))(**(point | {"nrec": nrec[i]}), stage=float(i)) for i in stages]
    rows = _stage_rows(values, stages)
    totals = model_totals(model, strat.seq, strat.recompute)
    host = float(host_kernel(model, view)(**strategy_values(strat), stage=0.0)["total.host_bytes"])  # stage 0, as before
    tview = structure(model, strat, engine)
    hw_values = time_hw_values(hardware, strat, tview.engine)
    tvals = _time_values(model, strat, tview, hw_values)
    time_terms = {k: float(v) for k, v in tvals.items()}
    if sum(time_terms.values()) > SUSPICIOUS_STEP_S:
        warn("step", f"{sum(time_terms.values()) / 86400:,.1f} days", "one training step longer than a day",
             "check the hardware values (--set, -H) and the strategy")
    flops = totals["total.flops_per_sequence"] * strat.gbs
    rec = totals["total.recompute_flops_per_sequence"] * strat.gbs
    return Estimate(model=model, hardware=hardware, strategy=strat, per_stage=rows,
                    params_total=round(totals["total.params"]),
                    params_active=round(totals["total.params_active"]) if model.is_moe else None,
                    host_bytes=int(np.ceil(host)), time_terms=time_terms, flops_per_step=flops,
                    hardware_flops_per_step=flops + rec, time_engine=engine, _breakdowns=bds,
                    _time_breakdown=lambda: _step_breakdown(model, _model_symbols(model), tview),
                    _hidden=lambda: _hidden_values(model, strat, tview, hw_values))


def _hidden_values(model: ModelSpec, strat: Strategy, tview: Structure, hw_values: dict) -> dict[str, float]:
    """hidden_kernel's Terms for ``strat``, evaluated as _time_values evaluates the step's."""
    out = _time_values(model, strat, tview, hw_values, hidden_kernel)
    return {k: float(v) for k, v in out.items()}


def time_hw_values(hardware: Hardware, strat: Strategy, engine: EngineProfile | None = None) -> dict:
    """The hardware kernel values ``strat``'s step time is evaluated at: fp8 GEMMs by the one rule
    (engines.fp8_gemms) and the attention kernel (EngineProfile.attention_fa2) under ``engine`` or
    the strategy's own profile."""
    from ndplan.engines import profile
    eng = engine or profile(strat.engine)
    return hardware.kernel_values(fp8=fp8_gemms(strat.weight_dtype, eng), fa2=eng.attention_fa2)


def _time_values(model: ModelSpec, strat: Strategy, tview: Structure, hw_values: dict, kernel=None) -> dict:
    """The step-time kernel's Terms (or ``kernel``'s, another of the time arguments) for ``strat`` at
    the hardware kernel values ``hw_values`` (symbols.HW_SYMBOLS by name; numpy arrays broadcast);
    recompute counts at the head stage."""
    head = strategy_values(strat, head_stage(strat, strat.pp))["nrec"]
    return (kernel or time_kernel)(model, tview)(**(strategy_values(strat) | {"nrec": head}), stage=0.0, **hw_values)


def step_time_function(model: ModelSpec, strat: Strategy, engine: EngineProfile | None = None):
    """Seconds per step of ``strat`` as a function of the hardware kernel values (keyword
    arguments as Hardware.kernel_values gives them; arrays broadcast): what ``estimate``
    evaluates, for fitting those values (ndplan.calibrate)."""
    strat.check(model)
    tview = structure(model, strat, engine)

    def step_s(**hw_values):
        return sum(np.asarray(v, dtype=float) for v in _time_values(model, strat, tview, hw_values).values())
    return step_s


def _model_symbols(model: ModelSpec):
    from ndplan.symbols import model_symbols
    return model_symbols(model)
