"""Which layers each pipeline (stage, chunk) holds, and where embedding and head sit.

Even split (Megatron default): every virtual stage v holds Lc = L/(pp*vpp) consecutive
layers [v*Lc, (v+1)*Lc). For models whose first ``k`` layers are dense and the rest
MoE (DeepSeek first_k_dense_replace, all-MoE Mixtral/Qwen3-MoE, all-dense models) the
dense count of virtual stage v is min(max(k - v*Lc, 0), Lc), a closed form in the
symbols pp and stage. "Ends" layouts (layouts.py: stage 0 and stage pp-1 apart, the
middle stages even) are closed forms too, in the symbols first_layers (F) and
last_layers (Lst): stage s holds n(s) = F [s = 0] + Lst [s = pp-1 > 0] + M [0 < s < pp-1]
layers, M = (L - F - Lst) / max(pp - 2, 1), n(s)/vpp per chunk; virtual stage (row r,
position q) starts at r*L/vpp + (F [q > 0] + M max(q - 1, 0)) / vpp (interleaved: row =
chunk, position = stage; zbv's second chunk runs the stages backwards). Other uneven
splits (``layers_per_stage``) and other MoE patterns are counted from the layer list
with concrete pp and stage.

The embedding (and learned positions) sit on the device running virtual stage 0
(stage 0); the final norm, output head, loss and MTP modules on the device running
the last virtual stage (stage pp-1; stage 0 under zbv and dualpipev, whose V ends where it
starts; both end stages under dualpipe, each holding both ends of one model copy).
Indicator forms for integer 0 <= stage <= pp-1: is_first = max(0, 1 - stage),
is_last = max(0, stage - pp + 2); both lambdify to numpy.maximum.
"""

from __future__ import annotations

import sympy as sp

from ndplan.formulas.minmax import Max, Min

from ndplan.catalog.model import ModelSpec
from ndplan.layouts import virtual_stage
from ndplan.layouts import ends_layout, leading_dense, mixed_layers, symbolic_layout  # noqa: F401  (plain Python)
from ndplan.strategy import Strategy
from ndplan.layouts import slices
from ndplan.vocab import BIDIRECTIONAL_SCHEDULES, HEAD_ON_FIRST_STAGE, V_SCHEDULES


def _is_num(x) -> bool:
    return isinstance(x, (int, sp.Integer))


def layer_count(spec: ModelSpec, M, kind: str):
    """Decoder layers of ``kind`` ("dense" or "moe") as an expression in M.L (and the
    count of leading dense layers), from the layer pattern (ModelSpec.layer_pattern)."""
    pattern = spec.layer_pattern
    if pattern[0] == "mixed":
        return sp.Integer(spec.layer_kinds.count(kind))
    if pattern[0] == "leading":
        return sp.Integer(pattern[1]) if kind == "dense" else M.L - pattern[1]
    return M.L if kind == pattern[0] else sp.Integer(0)


def has_kind(spec: ModelSpec, kind: str) -> bool:
    """Does the model have a decoder layer of ``kind``?"""
    pattern = spec.layer_pattern
    return kind in pattern[1] if pattern[0] == "mixed" else pattern[0] == "leading" or pattern[0] == kind


def pp_expr(spec: ModelSpec, strat: Strategy):
    """The pp symbol when the layout is symbolic, else the strategy's pp as a number."""
    from ndplan import symbols as S
    return S.pp if symbolic_layout(spec, strat) else sp.Integer(strat.pp)


def is_first(stage):
    return sp.Integer(1 if int(stage) == 0 else 0) if _is_num(stage) else Max(0, 1 - stage)


def is_last(stage, pp):
    if _is_num(stage) and _is_num(pp):
        return sp.Integer(1 if int(stage) == int(pp) - 1 else 0)
    return Max(0, stage - pp + 2)


def head_device_flag(schedule: str, stage, pp):
    """1 on a device that runs the last virtual stage (head, loss, MTP): stage pp-1, stage 0
    under a V schedule, both under a bidirectional one (each end holds a whole model copy's ends)."""
    if schedule in BIDIRECTIONAL_SCHEDULES:
        return end_flag(stage, pp)
    return is_first(stage) if schedule in HEAD_ON_FIRST_STAGE else is_last(stage, pp)


def embedding_device_flag(schedule: str, stage, pp):
    """1 on a device that runs virtual stage 0 (the input embedding): stage 0, and stage pp-1 too
    under a bidirectional schedule."""
    return end_flag(stage, pp) if schedule in BIDIRECTIONAL_SCHEDULES else is_first(stage)


def end_flag(stage, pp):
    """1 on stage 0 and on stage pp-1 (once when pp = 1)."""
    return is_first(stage) + is_last(stage, pp) * (1 - is_first(stage))


def head_chunk(schedule: str, vpp: int) -> int:
    """The chunk holding the head on its device (the embedding is on chunk 0): the V's second
    arm, a bidirectional schedule's chunk 1 (layouts.virtual_stage), else the last chunk."""
    return 1 if schedule in V_SCHEDULES + BIDIRECTIONAL_SCHEDULES else vpp - 1


def chunk_layers(spec: ModelSpec, strat: Strategy, stage, chunk: int, pp, L=None) -> tuple:
    """(dense layers, MoE layers) in chunk ``chunk`` of ``stage``; ``L`` is the layer
    count as an expression (a symbol under ``explain --symbolic``)."""
    v = virtual_stage(strat.schedule, stage, chunk, pp)
    concrete = strat.layers_per_stage is not None and _is_num(v) and _is_num(pp)
    if not concrete and symbolic_layout(spec, strat) and ends_layout(spec, strat):
        return _ends_chunk(spec, strat, stage, chunk, pp, sp.Integer(spec.num_hidden_layers) if L is None else L)
    if strat.layers_per_stage is not None or mixed_layers(spec):
        if not (_is_num(v) and _is_num(pp)):
            raise ValueError("uneven or interleaved-MoE layouts need concrete pp and stage")
        v = int(v)
        if strat.layers_per_stage is not None:
            start = sum(strat.layers_per_stage[:v])
            n = strat.layers_per_stage[v]
        else:
            n = spec.num_hidden_layers // slices(strat.schedule, int(pp), strat.vpp)
            start = v * n
        kinds = spec.layer_kinds[start:start + n]
        return sp.Integer(kinds.count("dense")), sp.Integer(kinds.count("moe"))
    pattern = spec.layer_pattern[0]
    n_slices = pp if strat.schedule in BIDIRECTIONAL_SCHEDULES else pp * strat.vpp  # layouts.slices
    lc = (sp.Integer(spec.num_hidden_layers) if L is None else L) / n_slices
    if pattern == "dense":
        return lc, sp.Integer(0)
    if pattern == "moe":
        return sp.Integer(0), lc
    k = leading_dense(spec)
    n_dense = Min(Max(k - v * lc, 0), lc)
    return n_dense, lc - n_dense


def _ends_counts(stage, pp, L):
    """(layers of ``stage``, layers before it in its row x vpp) of an ends layout."""
    from ndplan import symbols as S
    F, Lst = S.first_layers, S.last_layers
    first = is_first(stage)
    last = is_last(stage, pp) * (1 - first)  # pp = 1: the one stage is the first
    mid = (L - F - Lst) / Max(pp - 2, 1)
    n = first * F + last * Lst + (1 - first - last) * mid
    return n, mid


def _ends_chunk(spec: ModelSpec, strat, stage, chunk: int, pp, L) -> tuple:
    """(dense, MoE) layers of chunk ``chunk`` of ``stage`` in an ends layout (module docstring)."""
    from ndplan import symbols as S
    F, Lst = S.first_layers, S.last_layers
    if strat.schedule in BIDIRECTIONAL_SCHEDULES:  # a chunk is a whole slice v of a pp-slice split
        v = virtual_stage(strat.schedule, stage, chunk, pp)
        lc, mid = _ends_counts(v, pp, L)
        before = (1 - is_first(v)) * F + Max(v - 1, 0) * mid
        return _leading_dense_split(spec, lc, before)
    n, mid = _ends_counts(stage, pp, L)
    lc = n / strat.vpp
    pattern = spec.layer_pattern[0]
    if pattern == "dense":
        return lc, sp.Integer(0)
    if pattern == "moe":
        return sp.Integer(0), lc
    k = leading_dense(spec)
    if strat.schedule in V_SCHEDULES and chunk == 1:  # stages pp-1 .. 0 after the first half
        before = (1 - is_last(stage, pp)) * Lst + Max(pp - 2 - stage, 0) * mid
    else:
        before = (1 - is_first(stage)) * F + Max(stage - 1, 0) * mid
    start = chunk * L / strat.vpp + before / strat.vpp
    n_dense = Min(Max(k - start, 0), lc)
    return n_dense, lc - n_dense


def _leading_dense_split(spec: ModelSpec, lc, start) -> tuple:
    """(dense, MoE) of ``lc`` layers starting at layer ``start``, for the layer patterns with a
    closed form (all dense, all MoE, k dense then MoE)."""
    pattern = spec.layer_pattern[0]
    if pattern == "dense":
        return lc, sp.Integer(0)
    if pattern == "moe":
        return sp.Integer(0), lc
    n_dense = Min(Max(leading_dense(spec) - start, 0), lc)
    return n_dense, lc - n_dense
