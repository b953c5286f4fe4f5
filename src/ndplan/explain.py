"""Render Terms: closed form, value at a strategy, unit, source.

With ``symbolic=True`` model sizes stay symbols (h, L, a, kv, d, f, V, ...) and are
substituted only for the value column, so the printed formula is the general one.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from ndplan import symbols as S
from ndplan.catalog.model import ModelSpec
from ndplan.estimate import strategy_point, symbolic_stage_ok, time_hw_values
from ndplan.formulas import groups as G
from ndplan.formulas import params as P
from ndplan.catalog.hardware import Hardware
from ndplan.formulas.memory import stage_memory
from ndplan.formulas.step import hidden_comm, step_time
from ndplan.strategy import Strategy
from ndplan.symbols import ModelSymbols
from ndplan.terms import Breakdown, Term
from ndplan.symbols import model_symbols

_PARAM_SRC = ("Hugging Face transformers module structure of the model type (formulas/params.py); "
              "held to transformers' exact counts in tests/data/hf_param_counts.yaml")


def params_breakdown(spec: ModelSpec, M: ModelSymbols) -> Breakdown:
    """Parameter-count Terms (whole model, unsharded)."""
    terms = [Term(key="params.embedding", expr=P.total(P.embedding_pieces(spec, M)), unit="count",
                  source=_PARAM_SRC, note="token embedding" + (" + learned positions" if spec.learned_positions else ""))]
    for kind in ("dense", "moe"):
        n = spec.layer_kinds.count(kind)
        if n:
            terms.append(Term(key=f"params.layer.{kind}", expr=P.total(P.layer_pieces(spec, M, kind)), unit="count",
                              source=_PARAM_SRC, note=f"one {kind} decoder layer; the model has {n}"))
    terms.append(Term(key="params.head", expr=P.total(P.head_pieces(spec, M, tied_copy=False)), unit="count",
                      source=_PARAM_SRC, note="final norm" + ("" if spec.tie_word_embeddings else " + output head")))
    if spec.mtp_layers:
        terms.append(Term(key="params.mtp", expr=P.total(P.mtp_pieces(spec, M)), unit="count",
                          source="DeepSeek-V3 report Sec. 2.2 (embedding and head shared)",
                          note=f"one MTP module; the model has {spec.mtp_layers}; not in params.total"))
    terms.append(Term(key="params.total", expr=P.params_total(spec, M), unit="count", source=_PARAM_SRC,
                      note="main model as transformers counts it (MTP excluded)"))
    if spec.is_moe:
        terms.append(Term(key="params.active", expr=P.params_active(spec, M), unit="count", source=_PARAM_SRC,
                          note="per token: k of E routed experts"))
    return Breakdown(tuple(terms))


def _exact(point: dict) -> dict:
    """The point as exact SymPy numbers (30-digit floats), for a value free of rounding."""
    return {k: (sp.Float(v, 30) if isinstance(v, float) else sp.Integer(v)) for k, v in point.items()}


@dataclass
class Explained:
    key: str
    formula: str
    latex: str
    value: float
    unit: str
    source: str
    note: str


def explain(spec: ModelSpec, strat: Strategy, *, stage: int = 0, symbolic: bool = False,
            term: str | None = None, hardware: Hardware | None = None) -> list[Explained]:
    """Every Term (parameters, memory of ``stage``, and with ``hardware`` the step-time
    Terms) with its closed form and its value at the strategy."""
    concrete = model_symbols(spec)
    M = ModelSymbols.symbolic() if symbolic else concrete
    model_subs = M.as_subs(concrete) if symbolic else {}
    stage_arg = S.stage if symbolic_stage_ok(spec, strat) else sp.Integer(stage)
    mem = stage_memory(spec, M, strat, stage_arg)
    bd = params_breakdown(spec, M).plus(mem.terms)
    bd = bd.plus([Term(key="mem.peak", expr=mem.total("mem."), unit="bytes",
                       source="sum of the mem.* terms above", note=f"stage {stage}")])
    point = strategy_point(strat, stage) | {S.stage: stage}
    time_point = point
    if hardware is not None:
        ref = G.head_stage(strat, strat.pp)  # the stage the time Terms describe
        tbd = step_time(spec, M, strat)
        bd = bd.plus(tbd.terms).plus([Term(key="time.step", expr=tbd.total("time."), unit="s",
                                           source="sum of the time.* terms above", note="one training step")])
        bd = bd.plus(hidden_comm(spec, M, strat).terms)
        point |= {S.BY_NAME[k]: v for k, v in time_hw_values(hardware, strat).items()}
        time_point = point | {S.nrec: strategy_point(strat, ref)[S.nrec]}  # memory keeps this stage's nrec
    keys = bd.keys()
    if term is not None:
        if term not in keys:
            from ndplan.errors import NdplanError
            raise NdplanError("--term", term, "unknown term", f"choose one of {', '.join(keys)}")
        bd = Breakdown((bd[term],))
    at = {"mem": _exact(point), "time": _exact(time_point)}
    out = []
    for t in bd:
        expr = sp.sympify(t.expr)
        timed = t.key.startswith(("time.", "hidden."))
        value = expr.xreplace(model_subs).xreplace(at["time" if timed else "mem"]).evalf(30)
        out.append(Explained(key=t.key, formula=sp.sstr(expr), latex=sp.latex(expr), value=float(value),
                             unit=t.unit, source=t.source, note=t.note))
    return out
