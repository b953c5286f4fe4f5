"""Layer description of a model at a strategy, from the symbolic model (``ndplan
estimate --export-layers FILE``): the same Terms the estimate uses, evaluated per layer.

Per layer and micro-batch (formulas/step.py ``layer_parts`` / ``head_parts``): forward_s = F + half
the layer's exposed TP/CP/EP communication, backward_input_s = B + the other half,
backward_weight_s = W, recompute_s[mode] = R under that mode. Static bytes: weights,
grads, master and optimizer states of the layer's parameters (memory.static_terms).
Activations: memory.chunk_activation of one layer per mode (the estimate's formula,
incl. an engine's per-micro-batch weight cast), the embedding's and head's own pieces.
Per-step and per-stage constants that no layer carries (pipeline/DP communication, the
optimizer step, reserve, graph constants, loss/recompute transients, gather and comm
buffers) are not layers: ``overhead_bytes`` (the largest over stages) is written beside
the layers so that ``ndplan balance`` can take it off the device memory.
"""

from __future__ import annotations

import dataclasses

import sympy as sp

from ndplan import symbols as S
from ndplan.catalog.hardware import Hardware
from ndplan.catalog.model import ModelSpec
from ndplan.engines import profile
from ndplan.estimate import time_hw_values
from ndplan.estimate import estimate, strategy_point
from ndplan.formulas import activations as A
from ndplan.formulas import groups as G
from ndplan.formulas import params as P
from ndplan.formulas.local import act_context, device_params
from ndplan.formulas.memory import chunk_activation, weight_cast
from ndplan.formulas.states import static_terms
from ndplan.formulas.step import head_parts, layer_parts
from ndplan.ppb.instance import Layer
from ndplan.vocab import RECOMPUTE_MODES as MODES  # the training formulas' modes
from ndplan.vocab import BIDIRECTIONAL_SCHEDULES
from ndplan.strategy import Strategy
from ndplan.symbols import model_symbols

OVERHEAD_KEYS = ("mem.reserve", "mem.allocator", "mem.graph_constants", "mem.transient", "mem.comm_buffers",
                 "mem.pp_buffers", "mem.zero3_gather", "mem.reduce_buckets", "mem.dispatch_buffers")
"""Per-stage memory Terms that belong to no layer (the allocator slack taken at the estimate's
even split, its largest stage: a PPB plan moves layers, which changes it by slack x the moved bytes)."""


def _value(expr, point) -> float:
    return float(sp.sympify(expr).subs(point))


def _static(spec, strat, eng, pieces, point, emb=False, vocab=False) -> int:
    """Static bytes of ``pieces``: a layer, or (``vocab``) the input embedding (``emb``) or the head."""
    dense, expert = device_params(pieces)
    terms = static_terms(spec, strat, eng, dense, expert, dense if emb else 0,
                         (dense, dense if emb else 0) if vocab else (0, 0))
    return int(round(sum(_value(t.expr, point) for t in terms)))


def _times(parts: dict, point) -> tuple[float, float, float]:
    comm = _value(parts["tp"] + parts["cp"] + parts["ep"], point) / 2
    return _value(parts["F"], point) + comm, _value(parts["B"], point) + comm, _value(parts["W"], point)


def _head(spec: ModelSpec, M, strat: Strategy, eng, c, point) -> Layer:
    """The output layer and loss; ``c`` the activation context of the strategy's mode."""
    f, b, w = _times(head_parts(spec, M, c, eng), point)
    # the head's stage keeps its own copy of a tied embedding unless it is stage 0 too
    # (memory.stage_params); under zbv the head sits on stage 0
    # groups.tied_head_copy: the head not on stage 0; under dualpipe the head is the other model copy's
    tied_copy = G.head_stage(strat, strat.pp) != 0 or strat.schedule in BIDIRECTIONAL_SCHEDULES
    head_static = _static(spec, strat, eng, P.head_pieces(spec, M, tied_copy=tied_copy), point, vocab=True)
    return Layer(name="head", kind="head", forward_s=f, backward_input_s=b, backward_weight_s=w,
                 static_bytes=head_static,
                 activation_bytes={"none": int(round(_value(A.head_activation(spec, M, c), point)))})


def layers_from_model(spec: ModelSpec, hw: Hardware, strat: Strategy) -> tuple[tuple[Layer, ...], dict]:
    """(ordered layers, meta) of ``spec`` under ``strat`` on ``hw``."""
    eng = profile(strat.engine)  # a base name or one derived with --set
    M = model_symbols(spec)
    point = dict(strategy_point(strat)) | {S.stage: 0}
    point |= {S.BY_NAME[k]: v for k, v in time_hw_values(hw, strat, eng).items()}
    cast = weight_cast(strat, eng)
    modes = {m: dataclasses.replace(strat, recompute=m, recompute_layers=None) for m in MODES}
    ctx = {m: act_context(spec, s) for m, s in modes.items()}

    def decoder(kind: str, name: str, extra_static=None) -> Layer:
        per = {m: layer_parts(spec, M, modes[m], ctx[m], kind, eng) for m in MODES}
        f, b, w = _times(per["none"], point)
        nd, nm = (1, 0) if kind == "dense" else (0, 1)
        act = {m: int(round(_value(chunk_activation(spec, M, ctx[m], modes[m], nd, nm, cast), point))) for m in MODES}
        static = _static(spec, strat, eng, extra_static or P.layer_pieces(spec, M, kind), point)
        return Layer(name=name, kind=kind, forward_s=f, backward_input_s=b, backward_weight_s=w, static_bytes=static,
                     activation_bytes=act, recompute_s={m: _value(per[m]["R"], point) for m in MODES[1:]})

    c = ctx[strat.recompute]
    emb_pieces = P.embedding_pieces(spec, M)
    layers = [Layer(name="embedding", kind="embedding", forward_s=0.0, backward_input_s=0.0, backward_weight_s=0.0,
                    static_bytes=_static(spec, strat, eng, emb_pieces, point, emb=True, vocab=True),
                    activation_bytes={"none": int(round(_value(A.embedding_activation(spec, M, c), point)))})]
    cache: dict[str, Layer] = {}
    for kind in spec.layer_kinds:
        if kind not in cache:
            cache[kind] = decoder(kind, f"decoder.{kind}")
        layers.append(cache[kind])
    head_layer = _head(spec, M, strat, eng, c, point)
    for k in range(spec.mtp_layers):
        mtp_kind = "moe" if spec.is_moe else "dense"
        base = decoder(mtp_kind, f"mtp.{k}", extra_static=P.mtp_pieces(spec, M))
        layers.append(dataclasses.replace(
            base, kind="mtp", forward_s=base.forward_s + head_layer.forward_s,
            backward_input_s=base.backward_input_s + head_layer.backward_input_s,
            backward_weight_s=base.backward_weight_s + head_layer.backward_weight_s,
            activation_bytes={m: a + head_layer.activation_bytes["none"] for m, a in base.activation_bytes.items()}))
    layers.append(head_layer)
    est = estimate(spec, hw, strat)
    overhead = max(sum(row["terms"].get(k, 0) for k in OVERHEAD_KEYS) for row in est.per_stage)
    meta = {"model": spec.name, "hardware": hw.name, "hbm_bytes": hw.hbm_bytes, "overhead_bytes": int(overhead),
            "strategy": strat.as_dict(),
            "note": "per micro-batch on one device; overhead_bytes = per-stage memory no layer carries "
                    "(reserve, allocator slack, graph constants, transients, buffers), the largest over stages"}
    return tuple(layers), meta


def estimate_instance(e, limit_bytes: int):
    """The PPB Instance of an estimate's pipeline: its layers (layers_from_model) under a
    per-device budget of ``limit_bytes`` minus the memory no layer carries (at least 1 byte)."""
    from ndplan.ppb.instance import Instance, Pipeline
    s = e.strategy
    layers, meta = layers_from_model(e.model, e.hardware, s)
    pipe = Pipeline(pp=s.pp, vpp=s.vpp, m=s.m, schedule=s.schedule,
                    budget_bytes=max(int(limit_bytes - meta["overhead_bytes"]), 1))
    return Instance(layers=layers, pipeline=pipe)
