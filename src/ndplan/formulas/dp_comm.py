"""Exposed data-parallel seconds per step, engine by engine (formulas/step.py's ``time.dp_comm``).

ZeRO 0-2 (``_zero012_exposed``): the gradient reduction once per step (every micro-batch where
the engine reduces as backward fills its buckets) and, at ZeRO 1-2, the all-gather of the updated
16-bit weights. Overlapped, the reduction hides behind the last micro-batch's backward and the
gather behind the first forward, except the last gradient bucket and the first gather bucket;
without overlap, or where a pipeline reduces after its last backward, they are exposed.
ZeRO-3 (``_zero3_exposed``): per micro-batch the gathers for forward and backward and the
reduce-scatter, prefetched under the neighbouring layer's compute, except the first unit's
gather and the last unit's reduce-scatter. The compute windows they hide in lose the time the
hidden TP and CP collectives hold the same links (``shared_window``). The EngineProfile time
fields cite each engine's lines; tests/test_dp_overlap.py derives the exposed seconds by hand.
"""

from __future__ import annotations

import sympy as sp

from ndplan import symbols as S
from ndplan.catalog.model import ModelSpec
from ndplan.engines import EngineProfile
from ndplan.formulas import comm as C
from ndplan.formulas import groups as G
from ndplan.formulas import params as P
from ndplan.formulas.activations import ACT_BYTES
from ndplan.formulas.local import device_params
from ndplan.formulas.placement import has_kind, pp_expr
from ndplan.structure import Structure
from ndplan.symbols import ModelSymbols


def dp_comm_time(spec: ModelSpec, M: ModelSymbols, view: Structure, eng: EngineProfile, ref: dict,
                 params: tuple, stage=0) -> tuple[sp.Expr, str, sp.Expr]:
    """Exposed data-parallel seconds per step, their description (module docstring) and the
    seconds of the stage's own data-parallel collectives that hide under compute:
    16-bit weights gathered, gradients (groups.grad_bytes per element) reduced, over the
    dp*cp ranks for non-expert and edp ranks for expert parameters; ``params``: the reference
    stage's (non-expert, expert, embedding) parameters per device (local.stage_params), ``stage``
    its index."""
    dense, expert, emb = params
    order = view.order
    dense_span, exp_span = C.span(order, ("cp", "dp")), C.span(order, ("dp",), "expert")
    n_dense, n_exp = G.dense_shard_ranks(), G.expert_shard_ranks()

    def both(op, nbytes, d=dense, e=expert):  # a dense model runs no expert collective (nor its latency)
        return op(n_dense, nbytes * d, dense_span) + (op(n_exp, nbytes * e, exp_span) if spec.is_moe else 0)
    pp = pp_expr(spec, view)
    ref = shared_window(view, ref, dense_span)  # the windows the collectives hide in
    if view.zero >= 3:
        return _zero3_exposed(spec, M, view, eng, ref, both, emb, C.vmin(pp - 1, 1), (stage, dense))
    return _zero012_exposed(view, eng, ref, both, (dense, expert), pp, n_dense)


def _zero3_exposed(spec, M, view, eng, ref, both, emb, piped, wire) -> tuple[sp.Expr, str, sp.Expr]:  # pp>1: piped 1
    """ZeRO-3/FSDP: per micro-batch the weights are all-gathered for forward and for backward and
    the gradients reduce-scattered, each layer's collective prefetched under the neighbouring
    layer's compute (FSDP2 one layer ahead, _fsdp_param_group.py:540-555, 795-830; DeepSpeed's
    prefetch from the recorded trace, partitioned_param_coordinator.py:420-485), but the first unit's
    all-gather (the embedding's group, then the first layer's behind its tiny forward) is waited for
    before any compute (_fsdp_state.py:146-154; DeepSpeed's queue restarts every step, :251-290) and
    the last unit's reduce-scatter after the last compute (finalize_backward, _fsdp_param_group.py:
    763-766; stage3.py:1407-1414). Under pipelining with pp_unsharded_stage_bytes the stage
    gathers once (its weights stay unsharded, pp_unsharded_stage_bytes) and reduces once after its
    last backward, exposed (pp_unsharded_stage_bytes: torch.distributed.pipelining keeps the stage
    unsharded, stage.py:843-848, and reduces once, stage.py:1164-1191). Under FSDP float8
    all-gather (EngineProfile.float8_all_gather) the swapped linears' weights travel at one byte
    per element (fsdp_phases.gathered_layer, the bytes the memory side holds)."""
    wb, gb = ACT_BYTES, _comm_bytes(view, eng)
    first_kind = "dense" if has_kind(spec, "dense") else "moe"  # dense layers come first
    unit_d, unit_e = device_params(P.layer_pieces(spec, M, first_kind))
    dense, first = params_gathered(spec, M, view, eng, *wire, first_kind)
    gather, reduce = both(C.all_gather, wb, dense), both(C.all_gather, gb)
    unit_g = both(C.all_gather, wb, emb + unit_d - first, unit_e)
    unit_r = both(C.all_gather, gb, emb + unit_d, unit_e)
    forward = unit_g + C.vmax(0, gather - unit_g - ref["fwd_window"])
    backward = unit_r + C.vmax(0, gather + reduce - unit_r - ref["bwd_window"])
    src = ("ZeRO-3/FSDP: per micro-batch, weights all-gathered for forward and backward, grads reduce-scattered, "
           "prefetched under compute; the first unit's all-gather and the last unit's reduce-scatter exposed")
    hidden = (gather - unit_g) - C.vmax(0, gather - unit_g - ref["fwd_window"])
    hidden_b = (gather + reduce - unit_r) - C.vmax(0, gather + reduce - unit_r - ref["bwd_window"])
    if not eng.pp_unsharded_stage_bytes:
        return S.m * (forward + backward), src, S.m * (hidden + hidden_b)
    return ((1 - piped) * S.m * (forward + backward) + piped * (forward + reduce),
            src + "; at pp > 1 gathered once per step and reduced after the last backward",
            (1 - piped) * S.m * (hidden + hidden_b) + piped * hidden)


def shared_window(view, ref: dict, dp_span) -> dict:
    """The forward and backward seconds of one micro-batch of ``ref`` that the data-parallel
    collectives hide in (``fwd_window`` F, ``bwd_window`` B + W: the windows _zero3_exposed and
    _zero012_exposed always took; a recompute, which runs inside the backward, is left out of the
    window and so are the collectives it reruns), shortened by the hidden TP and CP
    collectives that hold the same links meanwhile: a link is NVLink inside a node or the NICs
    across nodes (comm.bandwidth), so a TP or CP group on the
    same side of the node boundary as the (dense) data-parallel group shares it, and the link's
    busy time, not each collective's alone, must fit under the compute (never below 0). The test
    takes the dense group's span; an expert group spans the same ranks in the default order."""
    same = {axis: _same_link(C.span(view.order, (axis,)), dp_span) for axis in ("tp", "cp")}
    busy_f = sum(same[a] * ref[f"{a}_hidden_f"] for a in same)
    busy_b = sum(same[a] * ref[f"{a}_hidden_b"] for a in same)  # the recompute is not in the window
    return {"fwd_window": C.vmax(0, ref["F"] - busy_f), "bwd_window": C.vmax(0, ref["B"] + ref["W"] - busy_b)}


def _same_link(a, b) -> sp.Expr:
    """1 when groups spanning ``a`` and ``b`` consecutive ranks use the same kind of link (both
    inside a node or both across nodes), else 0."""
    return sp.Piecewise((1, sp.And(a <= S.node, b <= S.node)), (1, sp.And(a > S.node, b > S.node)), (0, True))


def params_gathered(spec, M, view, eng, stage, dense, first_kind) -> tuple[sp.Expr, sp.Expr]:
    """(the stage's ``dense`` non-expert parameters as 16-bit elements on the all-gather's wire,
    how many fewer the first layer (of ``first_kind``) sends): every parameter at 2 B, except the
    float8 all-gather's one byte per swapped linear weight element (fsdp_phases.float8_stage_saving)."""
    from ndplan.formulas.fsdp_phases import float8_stage_saving, gathered_layer
    from ndplan.formulas.local import layer_params
    if not eng.float8_all_gather:
        return dense, sp.Integer(0)
    first = (ACT_BYTES * layer_params(spec, M, first_kind) - gathered_layer(spec, M, eng, first_kind)) / ACT_BYTES
    return dense - float8_stage_saving(spec, M, view, stage) / ACT_BYTES, first


def _comm_bytes(view, eng) -> int:
    """Bytes per gradient element the reduction moves (EngineProfile.grad_comm_bytes)."""
    return eng.grad_comm_bytes or G.grad_bytes(view, eng)


def _zero012_exposed(view, eng, ref, both, params, pp, dp_ranks) -> tuple[sp.Expr, str, sp.Expr]:
    """ZeRO 0-2: the gradient all-reduce (ZeRO 0) or reduce-scatter (ZeRO 1-2; all-reduce where
    the engine all-reduces its buckets) once per step, or every micro-batch at ZeRO-2 where the
    engine reduces as backward fills its buckets, plus the updated 16-bit weights' all-gather
    (ZeRO 1-2). Overlapped, the reduction hides behind the last micro-batch's backward and the
    gather behind the first forward, but never the last gradient bucket nor the first gather
    bucket (grad_bucket_min_elements); pipelines whose engine reduces after the last backward
    expose it, and under stage_gather_at_first_forward each later stage of a non-interleaved
    pipeline adds its whole gather to the fill. The exposed buckets are whole collectives
    (their latency too) of min(bucket, the stage's parameters) elements."""
    wb, gb = ACT_BYTES, _comm_bytes(view, eng)
    dense, expert = params
    piped = C.vmin(pp - 1, 1)  # 1 at pp > 1
    op_r = C.all_reduce if (view.zero == 0 or eng.grads_all_reduced) else C.all_gather
    reduce = both(op_r, gb)
    gather = both(C.all_gather, wb) if view.zero else sp.Integer(0)
    last_r = first_g = sp.Integer(0)
    if eng.grad_bucket_min_elements:
        size = C.vmax(eng.grad_bucket_min_elements, eng.grad_bucket_elements_per_rank * dp_ranks)
        last_r = both(op_r, gb, C.vmin(size, dense), C.vmin(size, expert))
        first_g = both(C.all_gather, wb, C.vmin(size, dense), C.vmin(size, expert)) if view.zero else 0
    per_mb = view.zero == 2 and eng.zero2_reduce_per_microbatch
    if eng.overlap_grad_reduce:
        exposed_r = C.vmax(last_r, reduce - ref["bwd_window"])
        if eng.grad_reduce_after_last_backward:
            exposed_r = (1 - piped) * exposed_r + piped * reduce
    else:
        exposed_r = reduce
    times = S.m if per_mb else 1
    stage_gather = eng.stage_gather_at_first_forward and view.schedule in ("1f1b", "gpipe")
    if eng.overlap_param_gather and view.zero:
        exposed_g = C.vmax(first_g, gather - ref["fwd_window"])
        fill = (pp - 1) * gather if stage_gather else 0  # the later stages' gathers, waited for on the fill
    else:
        exposed_g, fill = gather, 0
    how = ("gradient all-reduce (ZeRO 0)" if view.zero == 0 else
           f"gradient {'all-reduce' if eng.grads_all_reduced else 'reduce-scatter'}"
           f"{' every micro-batch' if per_mb else ''} + weight all-gather (ZeRO {view.zero})")
    return (times * exposed_r + exposed_g + fill,
            f"{how}, overlap grad reduce={eng.overlap_grad_reduce}, param gather={eng.overlap_param_gather}"
            + (", last gradient and first gather bucket exposed" if eng.grad_bucket_min_elements else "")
            + ("; each later pipeline stage gathers its weights at its first forward ((pp-1) x the gather)"
               if stage_gather and eng.overlap_param_gather and view.zero else ""),
            times * (reduce - exposed_r) + gather - exposed_g)
