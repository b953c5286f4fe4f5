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

from ndplan import hooks
from ndplan import symbols as S
from ndplan.catalog.model import ModelSpec
from ndplan.engines import COMPILED_LOSS_BYTES, EngineProfile
from ndplan.formulas import activations as A
from ndplan.formulas import groups as G
from ndplan.formulas import params as P
from ndplan.formulas.placement import chunk_layers, head_chunk, head_device_flag, is_first, pp_expr
from ndplan.formulas.schedules import held_after_first_backward, held_profiles, inflight
from ndplan.structure import Structure, peaks_over_held_vectors, structure
from ndplan.symbols import ModelSymbols
from ndplan.terms import Breakdown, Term
from ndplan.vocab import RECOMPUTE_MODES
from ndplan.symbols import model_symbols

STATIC_KEYS = ("mem.weights", "mem.grads", "mem.master", "mem.optimizer", "mem.graph_constants")
OUTSIDE_TENSOR_KEYS = ("mem.allocator", "mem.reserve")
"""Terms that are not live tensors: the caching allocator's slack and the memory outside it."""

_SRC_STATES = ("Rajbhandari et al. 2020 (ZeRO) Sec. 3-5: stage 1 shards optimizer states, 2 adds "
               "gradients, 3 adds parameters, over the data-parallel group")


def _per_device(pieces: list[P.Piece], tp, ep_etp) -> tuple[sp.Expr, sp.Expr]:
    """(non-expert, expert) parameters of ``pieces`` held by one device."""
    dense = sp.Add(*[p.count / (tp if p.shard == "tp" else 1) for p in pieces if p.shard != "expert"])
    expert = sp.Add(*[p.count / ep_etp for p in pieces if p.shard == "expert"])
    return dense, expert


def stage_params(spec: ModelSpec, M: ModelSymbols, view: Structure, stage) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """(non-expert, expert, input-embedding) parameters on one device of ``stage``; the
    non-expert total includes the embedding."""
    tp, pp, ep_etp = S.tp, pp_expr(spec, view), S.ep * S.etp
    dense, expert = sp.Integer(0), sp.Integer(0)
    layer = {k: _per_device(P.layer_pieces(spec, M, k), tp, ep_etp) for k in ("dense", "moe")}
    for c in range(view.vpp):
        nd, nm = chunk_layers(spec, view, stage, c, pp, M.L)
        dense += nd * layer["dense"][0] + nm * layer["moe"][0]
        expert += nd * layer["dense"][1] + nm * layer["moe"][1]
    first = is_first(stage)
    last = head_device_flag(view.schedule, stage, pp)
    emb_d, _ = _per_device(P.embedding_pieces(spec, M), tp, ep_etp)
    head_d, _ = _per_device(P.head_pieces(spec, M, tied_copy=False), tp, ep_etp)
    dense += first * emb_d + last * head_d
    dense += G.tied_head_copy(spec, first, last) * M.V * M.h / tp
    if spec.mtp_layers:
        mtp_d, mtp_e = _per_device(P.mtp_pieces(spec, M), tp, ep_etp)
        dense += last * spec.mtp_layers * mtp_d
        expert += last * spec.mtp_layers * mtp_e
    return dense, expert, first * emb_d


def device_params(pieces: list[P.Piece]) -> tuple[sp.Expr, sp.Expr]:
    """(non-expert, expert) parameters of ``pieces`` on one device (TP/EP-split, not ZeRO-sharded)."""
    return _per_device(pieces, S.tp, S.ep * S.etp)


def weight_cast(view: Structure, eng: EngineProfile) -> int:
    """1 when the engine casts wide unsharded weights to 16 bits every micro-batch, else 0."""
    return int(eng.weight_cast_per_microbatch and view.zero < eng.weights_sharded_from
               and G.weight_bytes(view, eng) > A.ACT_BYTES)


def layer_params(spec: ModelSpec, M: ModelSymbols, kind: str) -> sp.Expr:
    """Parameters of one layer of ``kind`` on one device (TP/EP-split, not ZeRO-sharded)."""
    d, e = _per_device(P.layer_pieces(spec, M, kind), S.tp, S.ep * S.etp)
    return d + e


def act_context(spec: ModelSpec, view: Structure, capacity=1) -> A.ActContext:
    view = structure(spec, view)
    eng = view.engine
    seq_par = view.seq_parallel
    t_sp = S.tp if seq_par else sp.Integer(1)
    return A.ActContext(s=S.seq / S.cp, b=S.mbs, t=S.tp, t_sp=t_sp, etp=S.etp,
                        capacity=sp.sympify(capacity), flash=view.flash_attention, sp=seq_par, eng=eng, sp_flag=view.sp,
                        selective_configured=view.recompute == "selective", ep=S.ep, traced=spec.traced,
                        traced_mode=view.recompute)


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
    rec_d = sp.Min(nrec, nd)  # the first N layers of the chunk (dense layers come first)
    rec_m = sp.Min(nrec - rec_d, nm)
    return (rec_d * act[("dense", mode)] + (nd - rec_d) * act[("dense", "none")]
            + rec_m * act[("moe", mode)] + (nm - rec_m) * act[("moe", "none")])


def _sharding(view: Structure, eng: EngineProfile, dense, expert, emb):
    """shard(level): groups.optimizer_shard of these parameters at ZeRO level ``level``."""
    return lambda level: G.optimizer_shard(view, eng, dense, expert, emb, level)


def static_terms(spec: ModelSpec, view: Structure, eng: EngineProfile, dense, expert, emb=0) -> list[Term]:
    """Weights, gradients, fp32 master and optimizer-state Terms (bytes) of ``dense``
    non-expert and ``expert`` parameters on one device (``emb`` of them the input
    embedding). stage_memory uses it for a stage; PPB's layer export for one layer."""
    shard = _sharding(view, eng, dense, expert, emb)
    weight_b, master_b, grad_b = G.weight_bytes(view, eng), G.master_bytes(view, eng), G.grad_bytes(view, eng)
    if eng.grads_shard_tp_only:
        # accumulated gradients take the shape of each parameter's model-parallel slice: the
        # layers' TP slice, and the input embedding's (tp*cp) slice when it is not ZeRO-sharded
        grads = dense + expert - (0 if eng.embedding_zero_sharded else emb * (1 - 1 / S.cp))
    else:
        grads = shard(eng.grads_sharded_from)
    if not eng.grads_without_accumulation:
        # no persistent gradient buffer without micro-batch accumulation (pp = 1 and m = 1)
        grads = grads * sp.Min(pp_expr(spec, view) + S.m - 2, 1)
    off = 0 if view.offload_optimizer else 1
    scope = "one device of this stage"
    return [
        Term(key="mem.weights", expr=weight_b * shard(eng.weights_sharded_from), unit="bytes",
             source=f"{weight_b} bytes/param ({eng.name}: {eng.sources['states']}); {_SRC_STATES}", note=scope),
        Term(key="mem.grads", expr=grad_b * grads, unit="bytes",
             source=f"{grad_b} bytes/param gradients; {_SRC_STATES}", note=scope),
        Term(key="mem.master", expr=off * master_b * shard(eng.master_sharded_from), unit="bytes",
             source=f"fp32 master weights, {master_b} bytes/param; {_SRC_STATES}",
             note=scope + (" (offloaded to host)" if view.offload_optimizer else "")),
        Term(key="mem.optimizer", expr=off * eng.optimizer_bytes * shard(1), unit="bytes",
             source=f"Adam m and v in fp32, {eng.optimizer_bytes} bytes/param; {_SRC_STATES}",
             note=scope + (" (offloaded to host)" if view.offload_optimizer else "")),
    ]


def stage_memory(spec: ModelSpec, M: ModelSymbols, view: Structure, stage=S.stage,
                 engine: EngineProfile | None = None) -> Breakdown:
    """Peak memory Terms of one device of pipeline stage ``stage`` (``view``: a Structure,
    or a Strategy turned into one; ``engine`` replaces its profile): static states,
    graph constants, activations, transients, gather buffers, communication buffers and
    the reserve (module docstring)."""
    view = structure(spec, view, engine)
    eng = view.engine
    dense, expert, emb = stage_params(spec, M, view, stage)
    terms = static_terms(spec, view, eng, dense, expert, emb)
    terms.append(graph_constants_term(spec, M, view, eng))
    acts = activation_term(spec, M, view, stage)
    gather = gather_term(spec, M, view, eng, dense, expert, stage, acts.expr)
    shard = _sharding(view, eng, dense, expert, emb)
    dynamic = [acts, transient_term(spec, M, view, stage, acts.expr, gather.expr if gather else 0, shard(1))]
    dynamic += [gather] if gather else []
    terms += dynamic
    if eng.grads_built_in_backward and view.zero >= eng.weights_sharded_from:
        terms = [_grads_beside(t, dynamic) if t.key == "mem.grads" else t for t in terms]
    terms += buffer_terms(spec, M, view, eng, stage)
    terms.insert(-1, allocator_term(eng, terms[:-1]))  # before the reserve, over the tensor Terms
    return hooks.apply(Breakdown(tuple(terms)), spec, view)


def _grads_beside(grads: Term, dynamic: list[Term]) -> Term:
    """Gradients that build up during backward (EngineProfile.grads_built_in_backward): the
    part of them above the activations, transients and gather buffers they replace."""
    dyn = sp.Add(*(t.expr for t in dynamic))
    return Term(key=grads.key, expr=sp.Max(grads.expr - dyn, 0), unit=grads.unit,
                source=grads.source + "; freed when each step begins and written group by group in backward, "
                       "so the peak holds max(gradients, activations + transient + gather) above the other states",
                note=grads.note + " (the part above the dynamic memory)")


def allocator_term(eng: EngineProfile, tensor_terms: list[Term]) -> Term:
    """The caching allocator's slack over the live tensors: reserved = allocated x (1 + slack)."""
    allocated = sp.Add(*(t.expr for t in tensor_terms))
    return Term(key="mem.allocator", expr=sp.Rational(eng.allocator_slack_permille, 1000) * allocated, unit="bytes",
                source=f"{eng.name}: {eng.allocator_slack_permille} per mille of the allocated bytes "
                       f"({eng.sources.get('allocator', 'no allocator slack')})",
                note="reserved minus allocated; allocated = the tensor Terms, reserved = allocated + this")


def graph_constants_term(spec: ModelSpec, M: ModelSymbols, view: Structure, eng: EngineProfile) -> Term:
    """Persistent causal mask and rotary tables, one set per pipeline chunk."""
    consts = eng.attention_mask_bytes * S.seq ** 2
    if not spec.learned_positions:
        consts += eng.rope_table_bytes * 2 * S.seq * M.d
    return Term(key="mem.graph_constants", expr=view.vpp * consts, unit="bytes",
                source=f"{eng.name}: persistent causal mask ({eng.attention_mask_bytes} bytes per s x s "
                       f"element) and rotary cos/sin tables ({eng.rope_table_bytes} bytes per s x head_dim "
                       f"element), one set per pipeline chunk ({eng.sources.get('graph_constants', 'none')})",
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
    first, last = is_first(stage), head_device_flag(view.schedule, stage, pp)
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
        acts = sp.Max(*[sum(h * a for h, a in zip(vec, per_mb)) for vec in vectors])
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
    others = sp.Max(held - 1, 0) * head_device_flag(view.schedule, stage, pp)
    return others * per_logit * ctx.s * ctx.b * M.V / S.tp


def gather_term(spec: ModelSpec, M: ModelSymbols, view: Structure, eng: EngineProfile, dense, expert,
                stage=S.stage, acts=0) -> Term | None:
    """ZeRO-3/FSDP all-gather and reduce-scatter buffers (None below the engine's
    weight-sharding level): per layer, or for the whole stage (``gather_whole_stage``, or
    FSDP under pipelining, ``pp_unsharded_stage_bytes``, where ``acts``, the activation
    Term's expression, sets what the gradients built in the first backward sit beside)."""
    if view.zero < eng.weights_sharded_from:
        return None
    pp = pp_expr(spec, view)
    if eng.gather_whole_stage:
        gather = A.ACT_BYTES * (dense + expert)
        what = "16-bit copies of all the stage's weights (TP/EP-split), gathered once per step"
    else:
        big = _largest_kind(spec)
        gather = _layers_gather(spec, M, eng)
        what = (f"{eng.gather_prefetch_layers} layer(s) ({big}) of unsharded 16-bit weights alive "
                "(current + prefetched)")
        if eng.reduce_scatter_input_bytes:
            what += "; the backward's reduce-scatter buffers are an exclusive transient (fsdp_backward_reduce)"
        if eng.head_group_kept_unsharded:
            gather += _head_group(spec, M, view, stage)
            what += "; the output layer's 16-bit weights, kept gathered from its forward into backward"
        if eng.pp_unsharded_stage_bytes:
            piped = sp.Min(pp - 1, 1)
            weights_16 = A.ACT_BYTES * (dense + expert)  # gathered in the first forward, kept to the step's end
            grads_acc = (eng.pp_unsharded_stage_bytes - A.ACT_BYTES) * (dense + expert)  # from the first backward
            # the accumulated gradients exist from the first backward on, beside fewer held micro-batches
            # than the activation peak (gpipe: m - 1 of m): peak = max(acts + weights, acts x kept + weights
            # + grads), kept = held_after_first_backward / held at the peak
            total = sum(inflight(view.schedule, stage, c, pp, view.vpp, S.m) for c in range(view.vpp))
            freed = (1 - held_after_first_backward(view.schedule, stage, pp, view.vpp, S.m) / total) * acts
            piped_gather = weights_16 + sp.Max(0, grads_acc - freed)
            gather = (1 - piped) * gather + piped * piped_gather
            what += (f"; with pp > 1, {eng.pp_unsharded_stage_bytes} B per stage parameter: its 16-bit unsharded "
                     f"weights from the first forward ({A.ACT_BYTES}) and the fp32 unsharded gradients accumulated "
                     "over the micro-batches from the first backward, beside the micro-batches still held then "
                     "(schedules.held_after_first_backward)")
    if eng.sharded_weights_cast_once and G.weight_bytes(view, eng) > A.ACT_BYTES:
        note = "wide weights: the 16-bit cast copy exists even when dp*cp = 1"
    else:
        gather = gather * sp.Min(G.dense_shard_ranks() - 1, 1)
        note = "zero when dp*cp = 1"
    src = f"ZeRO-3/FSDP/optimizer-parallel all-gather buffers: {what}"
    if "gather" in eng.sources:
        src += f" ({eng.sources['gather']})"
    return Term(key="mem.zero3_gather", expr=gather, unit="bytes", source=src, note=note)


def _layers_gather(spec: ModelSpec, M: ModelSymbols, eng: EngineProfile) -> sp.Expr:
    """The decoder layers' unsharded 16-bit weights alive at once (current + prefetched)."""
    return eng.gather_prefetch_layers * A.ACT_BYTES * layer_params(spec, M, _largest_kind(spec))


def gathered_at_loss(spec: ModelSpec, M: ModelSymbols, view: Structure) -> sp.Expr:
    """Bytes of the gather Term not alive at the loss: the decoder layers' 16-bit weights where
    each layer is resharded as its forward ends (``layers_resharded_after_forward``, without
    pipelining and with dp*cp > 1); 0 otherwise."""
    eng = view.engine
    if (not eng.layers_resharded_after_forward or view.zero < eng.weights_sharded_from
            or eng.gather_whole_stage):
        return sp.Integer(0)
    return _unpiped(spec, view) * sp.Min(G.dense_shard_ranks() - 1, 1) * _layers_gather(spec, M, eng)


def _unpiped(spec: ModelSpec, view: Structure) -> sp.Expr:
    """1 without pipelining, 0 with it, for engines whose FSDP holds the stage unsharded under
    pipelining (``pp_unsharded_stage_bytes``: no per-layer gather or reduce-scatter phases then)."""
    return 1 - sp.Min(pp_expr(spec, view) - 1, 1) if view.engine.pp_unsharded_stage_bytes else sp.Integer(1)


def _head_group(spec: ModelSpec, M: ModelSymbols, view: Structure, stage) -> sp.Expr:
    """The output layer's 16-bit weights on the head's device (EngineProfile.head_group_kept_unsharded)."""
    return head_device_flag(view.schedule, stage, pp_expr(spec, view)) * A.ACT_BYTES * M.V * M.h / S.tp


def fsdp_backward_reduce(spec: ModelSpec, M: ModelSymbols, view: Structure, acts, stage=S.stage) -> sp.Expr | None:
    """FSDP2 without pipelining: the largest total of activations, gradients and buffers at one
    of the backward's reduce-scatters, above the states (``acts``: the activation Term's
    expression). Backward frees the loss and the output layer, then one decoder layer after
    another from the last, and each group's reduce-scatter runs as its backward ends
    (``_rs_bytes``), beside the activations not yet freed, the sharded fp32 gradients already
    written (4 / (dp*cp) per parameter of the groups reduced before) and the next group's
    prefetched 16-bit weights. Per layer, the written gradients grow by 4 / (dp*cp) bytes per
    parameter and the activations shrink by a layer's, so over the layers the total is largest
    at the first or the last two reduce-scatters: the output layer's, the last layer's, the
    second layer's (the first layer prefetched), the first layer's (the embedding prefetched),
    the embedding's. None for engines without a reduce-scatter figure, or below zero 3; zero
    under pipelining (no backward reduce-scatters: pp_final_reduce) or on one rank."""
    eng = view.engine
    if not eng.reduce_scatter_input_bytes or view.zero < eng.weights_sharded_from or eng.gather_whole_stage:
        return None
    ctx, pp = act_context(spec, view), pp_expr(spec, view)
    kinds = spec.layer_kinds or ["dense"]
    size = {k: layer_params(spec, M, k) for k in set(kinds)}
    nd, nm = chunk_layers(spec, view, stage, 0, pp, M.L)
    layers = nd * size.get("dense", 0) + nm * size.get("moe", 0)
    head, emb = M.V * M.h / S.tp, device_params(P.embedding_pieces(spec, M))[0]
    written = A.FP32_BYTES / G.dense_shard_ranks()  # one sharded fp32 gradient byte count per parameter
    first, last = kinds[0], kinds[-1]
    second = kinds[1] if len(kinds) > 1 else first
    mode = "none" if view.partial_recompute else view.recompute  # partial recompute: the first N layers
    if view.partial_recompute:
        rec = sp.Min(S.nrec, 1)
        first_act = (rec * A.layer_activation(spec, M, ctx, first, view.recompute)
                     + (1 - rec) * A.layer_activation(spec, M, ctx, first, "none"))
    else:
        first_act = A.layer_activation(spec, M, ctx, first, mode)
    after_head = acts - head_device_flag(view.schedule, stage, pp) * A.head_activation(spec, M, ctx)
    emb_act = is_first(stage) * A.embedding_activation(spec, M, ctx)
    phases = [
        after_head + _rs_bytes(eng, head, size[last], written),
        after_head - A.layer_activation(spec, M, ctx, last, mode) + written * head
        + _rs_bytes(eng, size[last], size[kinds[-2]] if len(kinds) > 1 else emb, written),
        emb_act + written * (head + layers) + _rs_bytes(eng, emb, 0, written),
        emb_act + written * (head + layers - size[first]) + _rs_bytes(eng, size[first], emb, written),
    ]
    if len(kinds) > 2:
        phases.append(emb_act + first_act + written * (head + layers - size[first] - size[second])
                      + _rs_bytes(eng, size[second], size[first], written))
    return _unpiped(spec, view) * sp.Min(G.dense_shard_ranks() - 1, 1) * sp.Max(*phases)


def _rs_bytes(eng: EngineProfile, group, prefetched, written) -> sp.Expr:
    """FSDP2's buffers at the reduce-scatter of ``group`` parameters (torch 2.13
    _fsdp_collectives.py foreach_reduce): the fp32 input (``reduce_scatter_input_bytes``),
    first beside the 16-bit unsharded gradients it is copied from, which are freed before
    the output is allocated (``written`` per parameter, sharded), and any copy the backend
    makes (``reduce_scatter_copy_bytes``); beside them the next group's ``prefetched``
    16-bit weights. The group's own unsharded weights are freed before (post_backward
    reshards first, _fsdp_param_group.py:637-638)."""
    grads_or_out = sp.Max(A.ACT_BYTES, written + eng.reduce_scatter_copy_bytes)
    return A.ACT_BYTES * prefetched + (eng.reduce_scatter_input_bytes + grads_or_out) * group


def _largest_kind(spec: ModelSpec) -> str:
    """The decoder layer kind with the most parameters (the largest FSDP group)."""
    concrete = model_symbols(spec)  # compare sizes in numbers (M may be symbolic: explain --symbolic)
    return max(("dense", "moe") if spec.is_moe else ("dense",), key=lambda k: P.total(P.layer_pieces(spec, concrete, k)))


def _piped_fsdp(spec: ModelSpec, view: Structure) -> sp.Expr | None:
    """1 where FSDP holds the stage unsharded under pipelining (``pp_unsharded_stage_bytes``,
    zero >= 3, pp > 1, dp*cp > 1), as an expression in pp and dp*cp; None for other engines."""
    eng = view.engine
    if not eng.pp_unsharded_stage_bytes or view.zero < eng.weights_sharded_from or eng.gather_whole_stage:
        return None
    return sp.Min(pp_expr(spec, view) - 1, 1) * sp.Min(G.dense_shard_ranks() - 1, 1)


def pp_group_grads(spec: ModelSpec, M: ModelSymbols, view: Structure) -> sp.Expr | None:
    """FSDP under pipelining, in each micro-batch's backward: one group's 16-bit gradients, alive
    until its post_backward accumulates them into the fp32 unsharded gradient
    (_fsdp_param_group.py:603-612, _fsdp_param.py:802-821, torch 2.13). They appear as the
    layer's backward ends, after the loss's logits are freed (an exclusive transient)."""
    piped = _piped_fsdp(spec, view)
    return None if piped is None else piped * A.ACT_BYTES * layer_params(spec, M, _largest_kind(spec))


def pp_final_reduce(spec: ModelSpec, M: ModelSymbols, view: Structure) -> sp.Expr | None:
    """FSDP under pipelining: bytes above the unsharded stage (``pp_unsharded_stage_bytes``) while
    the step's one reduce-scatter writes the sharded fp32 gradients and frees the accumulated ones
    group by group (PipelineStage.perform_reduce_grad, stage.py:1164-1191, torch 2.13), after every
    activation is freed. Read off the gloo runtime (tests/test_runtime.py, 0.59 M-parameter
    layers): 1.84 / 1.12 MB above the held bytes at dp = 2 / 4, about two sharded fp32 outputs of
    a layer: the one coefficient fitted there."""
    piped = _piped_fsdp(spec, view)
    if piped is None:
        return None
    return piped * 2 * A.FP32_BYTES / G.dense_shard_ranks() * layer_params(spec, M, _largest_kind(spec))


def loss_logits(spec: ModelSpec, M: ModelSymbols, view: Structure, stage=S.stage) -> sp.Expr:
    """The loss's transient on the head's device: logit bytes (the engine's, or the compiled
    loss's COMPILED_LOSS_BYTES) per token and vocabulary entry over tp."""
    ctx = act_context(spec, view)
    last = head_device_flag(view.schedule, stage, pp_expr(spec, view))
    return last * _logit_bytes(view.engine) * ctx.s * ctx.b * M.V / S.tp


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
    one_layer = view.recompute == "full" or eng.backward_layer_workspace
    kind = "moe" if spec.is_moe else "dense"
    # at the loss the layers resharded after forward hold no gathered weights (gathered_at_loss)
    freed = gathered_at_loss(spec, M, view)
    loss_phase = logits if freed == 0 else sp.Max(logits - freed, 0)
    transient = sp.Max(loss_phase, A.layer_activation(spec, M, ctx, kind, "none")) if one_layer else loss_phase
    why = ("compiled loss: saved bf16 logits and their bf16 gradient, engines.COMPILED_LOSS_BYTES"
           if eng.compiled_loss else eng.sources['logits'])
    src = (f"max of exclusive transients: loss logits {logit_bytes} bytes per token x "
           f"vocab/tp on the last stage ({why}); one layer rebuilt by full recompute during "
           "its backward (its no-recompute activations)")
    if eng.backward_layer_workspace:
        src += f", or the activation gradients of the layer in backward ({eng.sources['backward_workspace']})"
    if freed != 0:
        src += ("; at the loss the decoder layers, resharded after their forward, hold no gathered weights: "
                "the logits less the gather Term's layers (gathered_at_loss)")
    backward = fsdp_backward_reduce(spec, M, view, acts, stage)
    if backward is not None:
        # the reduce-scatter phase replaces the activations and the forward's gather
        transient = sp.Max(transient, backward - acts - gather)
        src += ("; FSDP's backward reduce-scatters: at the largest, its buffers, the sharded gradients written "
                "and the activations not yet freed (fsdp_backward_reduce)")
    group_grads, final = pp_group_grads(spec, M, view), pp_final_reduce(spec, M, view)
    if final is not None:
        # after the last backward the activations are gone: the reduce replaces them
        transient = sp.Max(transient, group_grads, final - acts)
        src += ("; under pipelining with FSDP, one group's 16-bit gradients before they are accumulated "
                "(pp_group_grads), or the final reduce-scatter of the accumulated gradients, which runs after "
                "every activation is freed: two layers' sharded fp32 outputs (pp_final_reduce)")
    if eng.optimizer_step_temp_bytes:
        # the optimizer step runs after the last backward, when neither activations nor the
        # gathered 16-bit weights are alive: activations + gather + transient =
        # max(forward/backward phase, optimizer-step temporaries)
        step_tmp = (0 if view.offload_optimizer else 1) * eng.optimizer_step_temp_bytes * opt_shard
        transient = sp.Max(transient, step_tmp - acts - gather)
        src += (f"; optimizer-step temporaries {eng.optimizer_step_temp_bytes} bytes/param, which replace the "
                f"activations and gathered weights ({eng.sources['optimizer_step']})")
    return Term(key="mem.transient", expr=transient, unit="bytes", source=src,
                note="the loss runs in forward, the rebuild in backward, the optimizer step after both")


def buffer_terms(spec: ModelSpec, M: ModelSymbols, view: Structure, eng: EngineProfile,
                 stage=S.stage) -> list[Term]:
    """The SP all-gather buffer, pipelining's receive buffers and the engine's named reserve."""
    ctx = act_context(spec, view)
    comm = A.ACT_BYTES * ctx.s * ctx.b * M.h if (view.sp and eng.comm_buffer_sp_gather) else sp.Integer(0)
    out = [Term(key="mem.comm_buffers", expr=comm * sp.Min(S.tp - 1, 1), unit="bytes",
                source="SP all-gather output of one layer input, 2*s*b*h (Korthikanti Sec. 4.2.2: the gathered "
                       "tensor is transient); zero when tp=1. DP gradient buckets are views of the grad buffer",
                note="transient")]
    if eng.pp_recv_buffers_per_microbatch:
        out.append(pp_recv_buffers_term(spec, M, view, stage))
    return out + [Term(key="mem.reserve", expr=sp.Integer(eng.reserve_bytes), unit="bytes",
                       source=f"{eng.name} reserve: {eng.sources['reserve']}", note="per device")]


MULTI_STAGE_RUNTIME = ("interleaved", "zb-h1", "zbv")
"""ndplan schedules that torch.distributed.pipelining runs with its multi-stage runtime
(ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble:
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
    receives_acts = vpp - is_first(stage)  # chunks that are not the first virtual stage
    receives_grads = vpp - head_device_flag(view.schedule, stage, pp)  # chunks that are not the last
    expr = S.m * (receives_acts + receives_grads)
    if view.schedule in MULTI_STAGE_RUNTIME:
        # every send's Work (and the tensor it sends) is kept until the step ends: at the steady
        # state's last forward, all forwards of the chunks that send activations and the backwards
        # run so far (vpp*m - held_after_first_backward) of the chunks that send gradients
        done = vpp * S.m - held_after_first_backward(view.schedule, stage, pp, vpp, S.m)
        expr += S.m * receives_grads + done * receives_acts / vpp
    expr = sp.Min(pp - 1, 1) * hidden * expr
    return Term(key="mem.pp_buffers", expr=expr, unit="bytes",
                source="torch.distributed.pipelining receive buffers, one per micro-batch and receiving chunk, "
                       "kept for the run (" + view.engine.name + ": PipelineStage, torch 2.13 stage.py:2254-2320; "
                       "pytorch#136380)" + ("; and the step's sent tensors, whose sends are waited for when the "
                       "step ends (MULTI_STAGE_RUNTIME)" if view.schedule in MULTI_STAGE_RUNTIME else ""),
                note="zero when pp = 1")


def host_memory(spec: ModelSpec, M: ModelSymbols, view: Structure, stage=S.stage) -> sp.Expr:
    """Host bytes per device with optimizer offload: master + optimizer states."""
    view = structure(spec, view)
    if not view.offload_optimizer:
        return sp.Integer(0)
    eng = view.engine
    dense, expert, emb = stage_params(spec, M, view, stage)
    # the states that left HBM: mem.master and mem.optimizer of static_terms, same sharding
    shard = _sharding(view, eng, dense, expert, emb)
    return G.master_bytes(view, eng) * shard(eng.master_sharded_from) + eng.optimizer_bytes * shard(1)
