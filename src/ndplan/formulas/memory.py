"""Per-device peak memory of one pipeline stage, as a Breakdown of Terms.

peak = static (weights + gradients + fp32 master + optimizer states)
     + activations (per-layer bytes x layers x in-flight micro-batches, per chunk)
     + max(loss logits, one layer rebuilt by full recompute or, per engine, the
           activation gradients of the layer in backward)   [exclusive transients]
     + ZeRO-3/FSDP all-gather buffers + communication buffers + framework reserve.

Sharding groups (Megatron-Core; torchtitan's dp_shard_cp mesh): non-expert weights
and their states shard over dp*cp; routed-expert weights over the expert-data-parallel
group edp = dp*cp*tp/(ep*etp).
"""

from __future__ import annotations

import sympy as sp

from ndplan.formulas.minmax import Max, Min

from ndplan import hooks
from ndplan import symbols as S
from ndplan.catalog.model import ModelSpec
from ndplan.engines import COMPILED_LOSS_BYTES, EngineProfile
from ndplan.formulas import activations as A
from ndplan.formulas import groups as G
from ndplan.formulas.deepspeed_gather import deepspeed_gather
from ndplan.formulas.dispatch import dispatch_rows_text, moe_dispatch_transient, moe_gathered_tokens
from ndplan.formulas.fsdp_phases import (accumulating, backward_phases_on, float8_stage_saving, fsdp_backward_reduce,
                                         gathered_at_loss, head_group, layers_gather, pp_final_reduce, pp_group_grads,
                                         loss_chunk_buffers, rebuilds_in_backward, rebuilt_layer)
from ndplan.formulas.local import act_context, largest_kind, layer_params, stage_params, vocab_params
from ndplan.formulas.muon import muon_step_bytes
from ndplan.formulas.states import _sharding, gradient_bytes, static_terms
from ndplan.vocab import BIDIRECTIONAL_SCHEDULES
from ndplan.formulas.placement import chunk_layers, embedding_device_flag, head_chunk, head_device_flag, pp_expr
from ndplan.formulas.schedules import held_after_first_backward, held_profiles, inflight
from ndplan.structure import Structure, peaks_over_held_vectors, structure
from ndplan.symbols import ModelSymbols
from ndplan.terms import Breakdown, Term
from ndplan.vocab import RECOMPUTE_MODES

from ndplan.vocab import OUTSIDE_TENSOR_KEYS, STATIC_KEYS  # noqa: F401  (re-exported)


def weight_cast(view: Structure, eng: EngineProfile) -> int:
    """1 when the engine casts wide unsharded weights to 16 bits every micro-batch, else 0."""
    return int(eng.weight_cast_per_microbatch and view.zero < eng.weights_sharded_from
               and G.weight_bytes(view, eng) > A.ACT_BYTES)


def chunk_recompute_count(eng: EngineProfile, view: Structure, chunk: int) -> sp.Expr:
    """Layers of chunk ``chunk`` that a recompute count ``nrec`` covers (before clipping
    to the chunk's layers). Per chunk by default; with ``eng.recompute_count_per_stage``
    the stage's count is dealt one layer at a time to chunks 0..vpp-1, 0, ..., so chunk c
    gets floor((nrec + vpp - 1 - c) / vpp) (exact for equal chunks; with uneven chunks a
    full chunk's leftover is not passed on)."""
    if eng.recompute_count_per_stage and view.vpp > 1:
        return sp.floor((S.nrec + view.vpp - 1 - chunk) / view.vpp)
    return S.nrec


def chunk_activation(spec, M, ctx, view, nd, nm, cast, nrec=S.nrec) -> sp.Expr:
    """Bytes one micro-batch leaves on a chunk of nd dense and nm MoE layers; ``cast``
    adds the engine's per-micro-batch 16-bit weight cast (0 or 1); ``nrec`` is the
    chunk's recompute count (chunk_recompute_count)."""
    view = structure(spec, view)
    act = {(k, mode): A.layer_activation(spec, M, ctx, k, mode) + cast * A.ACT_BYTES * layer_params(spec, M, k)
           for k in ("dense", "moe") for mode in RECOMPUTE_MODES}
    if not view.partial_recompute:
        return nd * act[("dense", view.recompute)] + nm * act[("moe", view.recompute)]
    mode = view.recompute
    rec_d = Min(nrec, nd)  # the first N layers of the chunk (dense layers come first)
    rec_m = Min(nrec - rec_d, nm)
    return (rec_d * act[("dense", mode)] + (nd - rec_d) * act[("dense", "none")]
            + rec_m * act[("moe", mode)] + (nm - rec_m) * act[("moe", "none")])


def stage_memory(spec: ModelSpec, M: ModelSymbols, view: Structure, stage=S.stage,
                 engine: EngineProfile | None = None) -> Breakdown:
    """Peak memory Terms of one device of pipeline stage ``stage`` (``view``: a Structure,
    or a Strategy turned into one; ``engine`` replaces its profile): static states,
    graph constants, activations, transients, gather buffers, communication buffers and
    the reserve (module docstring)."""
    view = structure(spec, view, engine)
    eng = view.engine
    dense, expert, emb = stage_params(spec, M, view, stage)
    terms = static_terms(spec, view, eng, dense, expert, emb, vocab_params(spec, M, view, stage))
    terms.append(graph_constants_term(spec, M, view, eng, stage))
    acts = activation_term(spec, M, view, stage)
    gather = gather_term(spec, M, view, eng, dense, expert, stage, acts.expr)
    shard = _sharding(view, eng, dense, expert, emb)
    dynamic = [acts, transient_term(spec, M, view, stage, acts.expr, gather.expr if gather else 0, shard(1))]
    dynamic += [gather] if gather else []
    terms += dynamic
    if eng.grads_built_in_backward and view.zero >= eng.weights_sharded_from:
        acc = accumulating(spec, view)
        # no-sync accumulation holds the unsharded gradients instead (EngineProfile.grads_accumulate_unsharded)
        extra = (G.grad_bytes(view, eng) * (dense + expert) - gradient_bytes(spec, view, eng, dense, expert, emb)
                 if eng.grads_accumulate_unsharded else 0)
        terms = [_grads_beside(t, dynamic, acc, extra) if t.key == "mem.grads" else t for t in terms]
    terms += buffer_terms(spec, M, view, eng, stage)
    terms.insert(-1, allocator_term(eng, terms[:-1]))  # before the reserve, over the tensor Terms
    return hooks.apply(Breakdown(tuple(terms)), spec, view)


def _grads_beside(grads: Term, dynamic: list[Term], acc, extra=0) -> Term:
    """Gradients that build up during backward (EngineProfile.grads_built_in_backward): the
    part of them above the activations, transients and gather buffers they replace; all of them
    where they accumulate over micro-batches (``acc``: fsdp_phases.accumulating), plus ``extra``
    there (the unsharded no-sync gradients' excess over the sharded ones)."""
    dyn = sp.Add(*(t.expr for t in dynamic))
    return Term(key=grads.key, expr=Max(grads.expr + acc * extra - (1 - acc) * dyn, 0), unit=grads.unit,
                source=grads.source + "; freed when each step begins and written group by group in backward, "
                       "so the peak holds max(gradients, activations + transient + gather) above the other states; "
                       "with micro-batches (pp 1, m >= 2) all of them, beside the later micro-batches' activations "
                       "(fsdp_phases.accumulating)",
                note=grads.note + " (the part above the dynamic memory; all of it from the second micro-batch)")


def allocator_term(eng: EngineProfile, tensor_terms: list[Term]) -> Term:
    """The caching allocator's slack over the live tensors: reserved = allocated x (1 + slack)."""
    allocated = sp.Add(*(t.expr for t in tensor_terms))
    return Term(key="mem.allocator", expr=sp.Rational(eng.allocator_slack_permille, 1000) * allocated, unit="bytes",
                source=f"{eng.name}: {eng.allocator_slack_permille} per mille of the allocated bytes "
                       f"({eng.sources.get('allocator', 'no allocator slack')})",
                note="reserved minus allocated; allocated = the tensor Terms, reserved = allocated + this")


def graph_constants_term(spec: ModelSpec, M: ModelSymbols, view: Structure, eng: EngineProfile,
                         stage=S.stage) -> Term:
    """Persistent causal mask and rotary tables, one set per pipeline chunk (the rotary tables
    once per decoder layer of the stage under ``rope_table_per_layer``)."""
    mask = view.vpp * eng.attention_mask_bytes * S.seq ** 2
    rope = sp.Integer(0) if spec.learned_positions else eng.rope_table_bytes * 2 * S.seq * M.d
    if eng.rope_table_per_layer:
        pp = pp_expr(spec, view)
        rope *= sum((sum(chunk_layers(spec, view, stage, c, pp, M.L)) for c in range(view.vpp)), sp.Integer(0))
    else:
        rope *= view.vpp
    return Term(key="mem.graph_constants", expr=mask + rope, unit="bytes",
                source=f"{eng.name}: persistent causal mask ({eng.attention_mask_bytes} bytes per s x s "
                       f"element) and rotary cos/sin tables ({eng.rope_table_bytes} bytes per s x head_dim "
                       f"element), one set per {'decoder layer' if eng.rope_table_per_layer else 'pipeline chunk'} "
                       f"({eng.sources.get('graph_constants', 'none')})",
                note="full sequence, not split by cp")


def chunk_activations(spec: ModelSpec, M: ModelSymbols, view: Structure, stage) -> list[sp.Expr]:
    """Bytes each chunk of ``stage`` keeps per micro-batch in flight (embedding on
    chunk 0 of stage 0, head and MTP on the head's chunk)."""
    eng, ctx, pp = view.engine, act_context(spec, view), pp_expr(spec, view)
    cast = weight_cast(view, eng)
    per_mb = []
    for c in range(view.vpp):
        nd, nm = chunk_layers(spec, view, stage, c, pp, M.L)
        per_mb.append(chunk_activation(spec, M, ctx, view, nd, nm, cast, chunk_recompute_count(eng, view, c)))
    first, last = embedding_device_flag(view.schedule, stage, pp), head_device_flag(view.schedule, stage, pp)
    hc = head_chunk(view.schedule, view.vpp)
    per_mb[0] += first * A.embedding_activation(spec, M, ctx)
    per_mb[hc] += last * A.head_activation(spec, M, ctx)
    if spec.mtp_layers:
        mtp_kind = "moe" if spec.is_moe else "dense"
        mode = "none" if view.partial_recompute else view.recompute
        per_mb[hc] += last * spec.mtp_layers * (A.layer_activation(spec, M, ctx, mtp_kind, mode)
                                                + A.head_activation(spec, M, ctx))
    return per_mb


def activation_term(spec: ModelSpec, M: ModelSymbols, view: Structure, stage) -> Term:
    """Activations of every chunk times the micro-batches the schedule keeps in flight."""
    per_mb, pp = chunk_activations(spec, M, view, stage), pp_expr(spec, view)
    if peaks_over_held_vectors(view):
        vectors = held_profiles(view.schedule, int(stage), int(pp), view.vpp, view.m)
        acts = Max(*[sum(h * a for h, a in zip(vec, per_mb)) for vec in vectors])
        how = "max over the held vectors of the schedule's op order (schedules.held_profiles)"
    else:
        acts = sum(inflight(view.schedule, stage, c, pp, view.vpp, S.m) * a for c, a in enumerate(per_mb))
        how = "in-flight micro-batches of the schedule (schedules.inflight)"
    acts += _held_loss(spec, M, view, stage)
    per_layer = ("Korthikanti et al. 2022 Table 2 per layer (deviations in formulas/activations.py)" if spec.traced is None
                 else f"traced per layer kind: {spec.traced.source} (TP/CP rule: formulas/traced.py)")
    return Term(key="mem.activations", expr=acts, unit="bytes",
                source=f"{per_layer} x layers per chunk x {how}",
                note=f"{view.recompute} recompute, schedule {view.schedule}, vpp={view.vpp}")


def _held_loss(spec: ModelSpec, M: ModelSymbols, view: Structure, stage) -> sp.Expr:
    """On the device of the last virtual stage, what each held micro-batch but the one in
    backward keeps of its loss (EngineProfile.loss_saved_bytes_per_element) and, under
    torch.distributed.pipelining, of the stage output, the 16-bit logits, which PipelineStage
    keeps in ``fwd_cache`` until the micro-batch's backward (stage.py:913, 966, torch 2.13; a
    compiled loss saves that same tensor)."""
    eng, ctx, pp = view.engine, act_context(spec, view), pp_expr(spec, view)
    per_logit = A.ACT_BYTES if eng.compiled_loss else eng.loss_saved_bytes_per_element  # compiled: the bf16 logits
    if eng.pp_recv_buffers_per_microbatch and not eng.compiled_loss:
        per_logit += A.ACT_BYTES
    if not per_logit:
        return sp.Integer(0)
    held = inflight(view.schedule, stage, head_chunk(view.schedule, view.vpp), pp, view.vpp, S.m)
    others = Max(held - 1, 0) * head_device_flag(view.schedule, stage, pp)
    return others * per_logit * ctx.s * ctx.b * M.V / S.tp


def gather_term(spec: ModelSpec, M: ModelSymbols, view: Structure, eng: EngineProfile, dense, expert,
                stage=S.stage, acts=0) -> Term | None:
    """ZeRO-3/FSDP all-gather and reduce-scatter buffers (None below the engine's
    weight-sharding level): per layer, as DeepSpeed's coordinator keeps them
    (``zero3_param_coordinator``, formulas/deepspeed_gather.py), or for the whole stage (``gather_whole_stage``, or
    FSDP under pipelining, ``pp_unsharded_stage_bytes``, where ``acts``, the activation
    Term's expression, sets what the gradients built in the first backward sit beside)."""
    if eng.megatron_fsdp:  # Megatron-FSDP's unit buffers (formulas/megatron_fsdp.py)
        from ndplan.formulas import megatron_fsdp as MF
        return MF.gather_term(spec, M, view, stage)
    if view.zero < eng.weights_sharded_from:
        return None
    pp = pp_expr(spec, view)
    if eng.gather_whole_stage:
        gather = A.ACT_BYTES * (dense + expert)
        what = "16-bit copies of all the stage's weights (TP/EP-split), gathered once per step"
    elif eng.zero3_param_coordinator:
        gather, what = deepspeed_gather(spec, M, view, eng, dense, expert, stage)
    else:
        big = largest_kind(spec)
        gather = layers_gather(spec, M, eng)
        what = (f"{eng.gather_prefetch_layers} layer(s) ({big}) of unsharded 16-bit weights alive "
                "(current + prefetched)")
        if eng.float8_all_gather:
            what += "; float8 all-gather: 1 B per Float8Linear weight element (fsdp_phases.gathered_layer)"
        if eng.reduce_scatter_input_bytes:
            what += "; the backward's reduce-scatter buffers are an exclusive transient (fsdp_backward_reduce)"
        if eng.head_group_kept_unsharded:
            gather += head_group(spec, M, view, stage)
            what += "; the output layer's 16-bit weights, kept gathered from its forward into backward"
        if eng.pp_unsharded_stage_bytes:
            piped = Min(pp - 1, 1)
            # gathered in the first forward, kept to the step's end (float8 all-gather: 1 B per swapped weight)
            weights_16 = A.ACT_BYTES * (dense + expert) - float8_stage_saving(spec, M, view, stage)
            grads_acc = (eng.pp_unsharded_stage_bytes - A.ACT_BYTES) * (dense + expert)  # from the first backward
            # the accumulated gradients exist from the first backward on, beside fewer held micro-batches
            # than the activation peak (gpipe: m - 1 of m): peak = max(acts + weights, acts x kept + weights
            # + grads), kept = held_after_first_backward / held at the peak
            total = sum(inflight(view.schedule, stage, c, pp, view.vpp, S.m) for c in range(view.vpp))
            freed = (1 - held_after_first_backward(view.schedule, stage, pp, view.vpp, S.m) / total) * acts
            piped_gather = weights_16 + Max(0, grads_acc - freed)
            gather = (1 - piped) * gather + piped * piped_gather
            what += (f"; with pp > 1, {eng.pp_unsharded_stage_bytes} B per stage parameter: its 16-bit unsharded "
                     f"weights from the first forward ({A.ACT_BYTES}) and the fp32 unsharded gradients accumulated "
                     "over the micro-batches from the first backward, beside the micro-batches still held then "
                     "(schedules.held_after_first_backward)")
    if eng.sharded_weights_cast_once and G.weight_bytes(view, eng) > A.ACT_BYTES:
        note = "wide weights: the 16-bit cast copy exists even when dp*cp = 1"
    else:
        gather = gather * Min(G.state_shard_ranks(eng)[0] - 1, 1)
        note = "zero when dp*cp = 1"
    src = f"ZeRO-3/FSDP/optimizer-parallel all-gather buffers: {what}"
    if "gather" in eng.sources:
        src += f" ({eng.sources['gather']})"
    return Term(key="mem.zero3_gather", expr=gather, unit="bytes", source=src, note=note)


def loss_logits(spec: ModelSpec, M: ModelSymbols, view: Structure, stage=S.stage) -> sp.Expr:
    """The loss's transient on the head's device: logit bytes (the engine's, or the compiled
    loss's COMPILED_LOSS_BYTES) per token and vocabulary entry over tp."""
    ctx = act_context(spec, view)
    last = head_device_flag(view.schedule, stage, pp_expr(spec, view))
    chunks = view.engine.loss_chunks
    if chunks:
        return last * chunked_loss(spec, M, view)
    return last * _logit_bytes(view.engine) * ctx.s * ctx.b * M.V / S.tp


def chunked_loss(spec: ModelSpec, M: ModelSymbols, view: Structure) -> sp.Expr:
    """The loss phase of ``loss_chunks`` chunks (EngineProfile.loss_chunks): one chunk's logits
    transient and its bf16 logits, the fp32 hidden-state gradient buffer, the chunks' contiguous
    copies when the micro-batch exceeds 1, and the output layer's fp32 gradient accumulated
    unsharded. Measured on torchtitan 0.3.0's ChunkedLossWrapper on gloo (tests/test_runtime.py)."""
    ctx, eng = act_context(spec, view), view.engine
    per_chunk = _logit_bytes(eng) * ctx.s * ctx.b * M.V / S.tp / eng.loss_chunks
    return per_chunk + loss_chunk_buffers(spec, M, view) + A.FP32_BYTES * M.V * M.h / S.tp


def _logit_bytes(eng: EngineProfile) -> int:
    return COMPILED_LOSS_BYTES if eng.compiled_loss else eng.logits_bytes_per_element


def transient_term(spec: ModelSpec, M: ModelSymbols, view: Structure, stage, acts, gather, opt_shard) -> Term:
    """The largest of the exclusive transients: loss logits, one layer rebuilt by full
    recompute (or the engine's backward workspace), optimizer-step temporaries (which
    replace ``acts`` and ``gather``; ``opt_shard`` parameters hold optimizer state)."""
    eng, ctx = view.engine, act_context(spec, view)
    logit_bytes = _logit_bytes(eng)
    logits = loss_logits(spec, M, view, stage)
    # one layer's no-recompute activations during its backward: rebuilt by full recompute, or
    # (engine option backward_layer_workspace) the gradients of any layer's activations
    one_layer = rebuilds_in_backward(view) or eng.backward_layer_workspace
    kind = "moe" if spec.is_moe else "dense"
    # at the loss the layers resharded after forward hold no gathered weights (gathered_at_loss)
    freed = gathered_at_loss(spec, M, view)
    if eng.gathered_inputs_kept:  # the output layer's gathered input is saved, no all-gather is in flight
        freed = freed + head_device_flag(view.schedule, stage, pp_expr(spec, view)) * sp_gather_buffer(spec, M, view)
    loss_phase = logits if freed == 0 else Max(logits - freed, 0)
    rebuild = rebuilt_layer(spec, M, ctx, kind, view.recompute if rebuilds_in_backward(view) else "full",
                            workspace=False)
    backward = fsdp_backward_reduce(spec, M, view, acts, stage)
    if backward is not None and rebuilds_in_backward(view) and not eng.backward_layer_workspace:
        rebuild *= 1 - backward_phases_on(spec, view)  # FSDP's backward phases place the rebuild themselves
    transient = Max(loss_phase, rebuild) if one_layer else loss_phase
    dispatch = moe_dispatch_transient(spec, M, view)
    if dispatch != 0:
        transient = Max(transient, dispatch)
    why = ("compiled loss: saved bf16 logits and their bf16 gradient, engines.COMPILED_LOSS_BYTES"
           if eng.compiled_loss else eng.sources['logits'])
    src = (f"max of exclusive transients: loss logits {logit_bytes} bytes per token x "
           f"vocab/tp on the last stage ({why}); one layer rebuilt by full recompute (or re-run by op-level "
           "SAC, less the tensors its cache holds: fsdp_phases.rebuilt_layer) during its backward")
    if eng.backward_layer_workspace:
        src += f", or the activation gradients of the layer in backward ({eng.sources['backward_workspace']})"
    if freed != 0:
        src += ("; at the loss no decoder layer's weights stay gathered where each is resharded after its forward "
                "(gathered_at_loss), and under SP no all-gather is in flight (the output layer saved its gathered "
                "input, gathered_inputs_kept): the logits less those Terms")
    if dispatch != 0:
        src += ("; one MoE layer's combine under the allgather dispatcher: the experts' output (k x capacity / ep "
                "rows per gathered token) and the unpermuted gathered tokens (etp x ep x tokens), 16-bit (engine setting "
                "moe_allgather_dispatch; counted on every stage of an MoE model)" if eng.moe_allgather_dispatch else
                f"; one MoE layer's dispatch and combine: {dispatch_rows_text(eng)} copies of its routed rows "
                "(k x tokens x capacity x h, 16-bit) beside what it saves (counted on every stage of an MoE model)")
    if backward is not None:
        # the reduce-scatter phase replaces the activations and the forward's gather
        transient = Max(transient, backward - acts - gather)
        src += ("; FSDP's backward reduce-scatters: at the largest, its buffers, the sharded gradients written "
                "and the activations not yet freed (fsdp_backward_reduce)")
        if rebuilds_in_backward(view) and not eng.backward_layer_workspace:
            src += ("; there, with dp*cp > 1 and no pipelining, the rebuilt layer is one of those phases: its "
                    "activations and its MLP's activation gradients beside the reduce-scatter input before it and "
                    "two gathered layers (fsdp_phases._rebuild_phases)")
    group_grads, final = pp_group_grads(spec, M, view), pp_final_reduce(spec, M, view)
    if final is not None:
        # after the last backward the activations are gone: the reduce replaces them
        transient = Max(transient, group_grads, final - acts)
        src += ("; under pipelining with FSDP, one group's 16-bit gradients before they are accumulated "
                "(pp_group_grads), or the final reduce-scatter of the accumulated gradients, which runs after "
                "every activation is freed: two layers' sharded fp32 outputs (pp_final_reduce)")
    if eng.megatron_fsdp:  # Megatron-FSDP's loss, backward and optimizer-step phases (formulas/megatron_fsdp.py)
        from ndplan.formulas import megatron_fsdp as MF
        transient, more = MF.transient(spec, M, view, stage, transient, logits, rebuild if one_layer else 0,
                                       dispatch, acts, gather, opt_shard)
        src += more
    if eng.muon_tp_mode:
        # Megatron's Muon step, after the last backward: it replaces the activations and gathered weights
        # with the optimizer offloaded the step runs on the host (its temporaries too, like step_tmp below)
        muon = (0 if view.offload_optimizer else 1) * muon_step_bytes(spec, M, eng)
        transient = Max(transient, muon - acts - gather)
        src += ("; Megatron's Muon step: the Newton-Schulz scratch of its largest matrix (formulas/muon.py), "
                "which replaces the activations and gathered weights")
    if eng.optimizer_step_temp_bytes:
        # the optimizer step runs after the last backward, when neither activations nor the
        # gathered 16-bit weights are alive: activations + gather + transient =
        # max(forward/backward phase, optimizer-step temporaries)
        step_tmp = (0 if view.offload_optimizer else 1) * eng.optimizer_step_temp_bytes * opt_shard
        transient = Max(transient, step_tmp - acts - gather)
        src += (f"; optimizer-step temporaries {eng.optimizer_step_temp_bytes} bytes/param, which replace the "
                f"activations and gathered weights ({eng.sources['optimizer_step']})")
    return Term(key="mem.transient", expr=transient, unit="bytes", source=src,
                note="the loss runs in forward, the rebuild in backward, the optimizer step after both")


def sp_gather_buffer(spec: ModelSpec, M: ModelSymbols, view: Structure) -> sp.Expr:
    """The SP all-gather output of one layer input, 2*s*b*h (0 without SP, at tp = 1, or for
    engines without the transient, ``comm_buffer_sp_gather``)."""
    if not (view.sp and view.engine.comm_buffer_sp_gather):
        return sp.Integer(0)
    ctx = act_context(spec, view)
    return A.ACT_BYTES * ctx.s * ctx.b * M.h * Min(S.tp - 1, 1)


def buffer_terms(spec: ModelSpec, M: ModelSymbols, view: Structure, eng: EngineProfile,
                 stage=S.stage) -> list[Term]:
    """The SP all-gather buffer, pipelining's receive buffers and the engine's named reserve."""
    gathered = moe_gathered_tokens(spec, M, view)
    buffer = sp_gather_buffer(spec, M, view) if gathered == 0 else Max(sp_gather_buffer(spec, M, view), gathered)
    out = [Term(key="mem.comm_buffers", expr=buffer, unit="bytes",
                source=("the shared all-gather buffer: the larger of the MoE allgather dispatcher's gathered tokens, "
                        "2*s*b/t_sp*etp*ep*h (EngineProfile.moe_allgather_dispatch), and " if gathered != 0 else "") +
                       "SP all-gather output of one layer input, 2*s*b*h (Korthikanti Sec. 4.2.2: the gathered "
                       "tensor is transient); zero when tp=1. DP gradient buckets are views of the grad buffer (Megatron-LM@d98e8a64 "
                       "param_and_grad_buffer.py:506-526, 1530-1547: in-place reduce-scatter/all-gather on bucket "
                       "views; --overlap-grad-reduce/--overlap-param-gather set only the bucket size, "
                       "distributed_data_parallel.py:133-137)",
                note="transient")]
    if eng.pp_recv_buffers_per_microbatch:
        out.append(pp_recv_buffers_term(spec, M, view, stage))
    if eng.reduce_bucket_elements and view.zero >= 1 and not (eng.fp32_grad_accumulation and view.zero == 1):
        out.append(reduce_bucket_term(view, eng))
    if eng.deepep_sms and spec.is_moe:
        out.append(deepep_term(spec, eng))
    return out + [Term(key="mem.reserve", expr=sp.Integer(eng.reserve_bytes), unit="bytes",
                       source=f"{eng.name} reserve: {eng.sources['reserve']}", note="per device")]


def reduce_bucket_term(view: Structure, eng: EngineProfile) -> Term:
    """DeepSpeed's ZeRO gradient-reduction bucket buffer(s), EngineProfile.reduce_bucket_elements."""
    buffers = 2 if (eng.reduce_bucket_double and view.zero in (1, 2)) else 1
    expr = sp.Integer(buffers * A.ACT_BYTES * eng.reduce_bucket_elements)
    return Term(key="mem.reduce_buckets", expr=expr, unit="bytes",
                source=f"{buffers} x reduce_bucket_size = {eng.reduce_bucket_elements:,} elements x {A.ACT_BYTES} B "
                       "(DeepSpeed 0.19.8 runtime/zero/stage_1_and_2.py:3256-3278: allocated at each backward's first "
                       "gradient hook, a second with overlap_comm; stage3.py:780-784: one, at init)",
                note="ZeRO >= 1; alive through backward")


def deepep_term(spec: ModelSpec, eng: EngineProfile) -> Term:
    """DeepEP's process-wide dispatch/combine buffer over the etp x ep group (formulas/deepep.py)."""
    from ndplan.formulas import deepep
    return Term(key="mem.dispatch_buffers", expr=deepep.buffer_expr(spec.hidden_size, eng.deepep_sms),
                unit="bytes",
                source=f"DeepEP normal-mode Buffer for etp*ep ranks, {eng.deepep_sms} SMs, bf16 tokens of "
                       f"{spec.hidden_size}: NVLink buffer + RDMA buffer in 512 MiB NVSHMEM granules + 32 MiB "
                       "workspace (Megatron-LM@d98e8a64 fused_a2a.py:24-69; deepseek-ai/DeepEP@dd758caf "
                       "csrc/legacy/config.hpp:53-98, buffer.hpp:101-149)",
                note="per device, kept for the run; DeepEP refuses group sizes outside its table (infinite here)")


MULTI_STAGE_RUNTIME = ("interleaved", "zb-h1", "zbv", "dualpipev")
"""ndplan schedules that torch.distributed.pipelining runs with its multi-stage runtime
(ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble, ScheduleDualPipeV:
``_PipelineScheduleRuntime._step_microbatches``), which appends every send's Work to one list
and waits for them when the step ends (schedules.py:2440, 2470-2472, 2654-2655, torch 2.13);
gpipe and 1f1b run on PipelineScheduleSingle, which waits for each 1F1B send at the next one
(schedules.py:1081, 1164) and for gpipe's sends after all forwards or backwards."""


def pp_recv_buffers_term(spec: ModelSpec, M: ModelSymbols, view: Structure, stage=S.stage) -> Term:
    """torch.distributed.pipelining's buffers (EngineProfile.pp_recv_buffers_per_microbatch), in
    stage-boundary hidden states (16-bit, b x s x h over SP and CP): one receive buffer per
    micro-batch for each chunk that receives activations and one for each chunk that receives
    gradients, kept for the run; under the multi-stage runtime (``MULTI_STAGE_RUNTIME``) also
    every tensor sent so far in the step, counted at the steady state's last forward, where the
    held activations peak for the last time (exact for one chunk; zbv and interleaved spread
    the backwards evenly over the chunks)."""
    ctx, pp = act_context(spec, view), pp_expr(spec, view)
    hidden = A.ACT_BYTES * ctx.b * ctx.s * M.h / ctx.t_sp
    vpp = view.vpp
    receives_acts = vpp - embedding_device_flag(view.schedule, stage, pp)  # chunks that are not the first virtual stage
    receives_grads = vpp - head_device_flag(view.schedule, stage, pp)  # chunks that are not the last
    expr = S.m * (receives_acts + receives_grads)
    if view.schedule in MULTI_STAGE_RUNTIME:
        # every send's Work (and the tensor it sends) is kept until the step ends: at the steady
        # state's last forward, all forwards of the chunks that send activations and the backwards
        # run so far (vpp*m - held_after_first_backward) of the chunks that send gradients
        done = vpp * S.m - held_after_first_backward(view.schedule, stage, pp, vpp, S.m)
        expr += S.m * receives_grads + done * receives_acts / vpp
    expr = Min(pp - 1, 1) * hidden * expr
    if view.schedule in BIDIRECTIONAL_SCHEDULES:
        # DeepSeek's DualPipe library, not torch's PipelineStage: it receives into a fresh tensor
        # per micro-batch, the chunk's input, dropped at its backward (dualpipe.py _recv_forward,
        # _backward_compute_chunk), and frees what it sent at its next wait (_free_tensors)
        expr = sp.Integer(0)
    return Term(key="mem.pp_buffers", expr=expr, unit="bytes",
                source="torch.distributed.pipelining receive buffers, one per micro-batch and receiving chunk, "
                       "kept for the run (" + view.engine.name + ": PipelineStage, torch 2.13 stage.py:2254-2320; "
                       "pytorch#136380)" + ("; and the step's sent tensors, whose sends are waited for when the "
                       "step ends (MULTI_STAGE_RUNTIME)" if view.schedule in MULTI_STAGE_RUNTIME else ""),
                note="zero when pp = 1")
