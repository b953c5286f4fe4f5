"""FSDP2's phases, each an absolute total of live bytes at one moment of the step (torch 2.13
torch/distributed/fsdp/_fully_shard; measured on gloo by trace/runtime.py): the forward's
gathered layers, what is still gathered at the loss, the backward's reduce-scatters without
pipelining, and under pipelining one group's 16-bit gradients and the final reduce-scatter.
memory.gather_term and memory.transient_term combine them into the peak."""

from __future__ import annotations

import sympy as sp

from ndplan.formulas.minmax import Max, Min

from ndplan import symbols as S
from ndplan.catalog.model import ModelSpec
from ndplan.engines import EngineProfile
from ndplan.formulas import activations as A
from ndplan.formulas import groups as G
from ndplan.formulas import params as P
from ndplan.formulas.local import act_context, device_params, largest_kind, layer_params
from ndplan.formulas.placement import chunk_layers, embedding_device_flag, has_kind, head_device_flag, pp_expr
from ndplan.structure import Structure
from ndplan.symbols import ModelSymbols
from ndplan.units import DTYPE_BYTES

FLOAT8_BYTES = DTYPE_BYTES["fp8"]  # float8_e4m3fn, the FSDP float8 all-gather's element


def layers_gather(spec: ModelSpec, M: ModelSymbols, eng: EngineProfile) -> sp.Expr:
    """The decoder layers' unsharded weights alive at once (current + prefetched)."""
    return eng.gather_prefetch_layers * gathered_layer(spec, M, eng, largest_kind(spec))


def gathered_layer(spec: ModelSpec, M: ModelSymbols, eng: EngineProfile, kind: str) -> sp.Expr:
    """Bytes of one all-gathered decoder layer of ``kind`` on one device: 16-bit weights, and one
    byte per Float8Linear weight element under FSDP float8 all-gather
    (EngineProfile.float8_all_gather; params.float8_linear_pieces)."""
    full = A.ACT_BYTES * layer_params(spec, M, kind)
    if not eng.float8_all_gather:
        return full
    swapped, _ = device_params(P.float8_linear_pieces(spec, M, kind))
    return full - (A.ACT_BYTES - FLOAT8_BYTES) * swapped


def float8_stage_saving(spec: ModelSpec, M: ModelSymbols, view: Structure, stage) -> sp.Expr:
    """Under FSDP float8 all-gather, the bytes a stage's gathered decoder layers hold below 16 bits
    (one per Float8Linear weight element, over every chunk's layers); 0 otherwise."""
    eng = view.engine
    if not eng.float8_all_gather:
        return sp.Integer(0)
    pp, saved = pp_expr(spec, view), {}
    for kind in ("dense", "moe"):
        saved[kind] = A.ACT_BYTES * layer_params(spec, M, kind) - gathered_layer(spec, M, eng, kind)
    total = sp.Integer(0)
    for c in range(view.vpp):
        nd, nm = chunk_layers(spec, view, stage, c, pp, M.L)
        total += nd * saved["dense"] + nm * saved["moe"]
    return total


def gathered_at_loss(spec: ModelSpec, M: ModelSymbols, view: Structure) -> sp.Expr:
    """Bytes of the gather Term not alive at the loss: the decoder layers' 16-bit weights where
    each layer is resharded as its forward ends (``layers_resharded_after_forward``, without
    pipelining and with dp*cp > 1); 0 otherwise."""
    eng = view.engine
    if (not eng.layers_resharded_after_forward or view.zero < eng.weights_sharded_from
            or eng.gather_whole_stage):
        return sp.Integer(0)
    return backward_phases_on(spec, view) * layers_gather(spec, M, eng)


def loss_chunk_buffers(spec: ModelSpec, M: ModelSymbols, view: Structure) -> sp.Expr:
    """Under a chunked loss (EngineProfile.loss_chunks), what the chunk loop holds beside the
    activations at every chunk: the fp32 hidden-state gradient buffer, the chunks' contiguous
    copies (micro-batch > 1) and the current chunk's bf16 logits (torchtitan components/loss.py
    ``ChunkedLossWrapper.__call__``, ``GradAccumulator``)."""
    ctx, eng = act_context(spec, view), view.engine
    tokens = ctx.s * ctx.b
    hidden = (A.FP32_BYTES + A.ACT_BYTES * Min(ctx.b - 1, 1)) * tokens * M.h
    return hidden + A.ACT_BYTES * tokens * M.V / S.tp / eng.loss_chunks


def _chunked_head_reduce(spec: ModelSpec, M: ModelSymbols, view: Structure, acts, head, written) -> sp.Expr:
    """The output layer's reduce-scatter under a chunked loss: it runs in the last chunk's backward,
    before the decoder's, so beside every activation and the loop's buffers (``loss_chunk_buffers``);
    the layer's gradient accumulated unsharded in fp32 stays alive through it (4 B per parameter
    beside the fp32 input, the backend's copy and the sharded output), and so do its 16-bit weights
    (resharding after backward is off in the loop). Measured on torchtitan 0.3.0 at tokens (1, 256)."""
    eng = view.engine
    kept = A.ACT_BYTES + A.FP32_BYTES + eng.reduce_scatter_input_bytes + eng.reduce_scatter_copy_bytes
    return acts + loss_chunk_buffers(spec, M, view) + (kept + written) * head


def _unpiped(spec: ModelSpec, view: Structure) -> sp.Expr:
    """1 without pipelining, 0 with it, for engines whose FSDP holds the stage unsharded under
    pipelining (``pp_unsharded_stage_bytes``: no per-layer gather or reduce-scatter phases then)."""
    return 1 - Min(pp_expr(spec, view) - 1, 1) if view.engine.pp_unsharded_stage_bytes else sp.Integer(1)


def head_group(spec: ModelSpec, M: ModelSymbols, view: Structure, stage) -> sp.Expr:
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
    present = [k for k in ("dense", "moe") if has_kind(spec, k)]
    size = {k: layer_params(spec, M, k) for k in present}
    gathered = {k: gathered_layer(spec, M, eng, k) for k in present}
    kinds = spec.edge_layer_kinds  # only the layers at either end are looked at below
    nd, nm = chunk_layers(spec, view, stage, 0, pp, M.L)
    layers = nd * size.get("dense", 0) + nm * size.get("moe", 0)
    head, emb = M.V * M.h / S.tp, device_params(P.embedding_pieces(spec, M))[0]
    written = A.FP32_BYTES / G.dense_shard_ranks()  # one sharded fp32 gradient byte count per parameter
    # the gradients written so far, beside the phase: none in addition once they accumulate over
    # micro-batches (they are then the whole mem.grads Term, each output added in place)
    kept = written * (1 - accumulating(spec, view))
    first, last = kinds[0], kinds[-1]
    second = kinds[1] if len(kinds) > 1 else first
    mode = "none" if view.partial_recompute else view.recompute  # partial recompute: the first N layers
    if view.partial_recompute:  # is the first layer recomputed: every N-th only for N = 1, the first N if N >= 1
        rec = _spread(nd + nm)[2] if eng.recompute_layers_spread else Min(S.nrec, 1)
        first_act = (rec * A.layer_activation(spec, M, ctx, first, view.recompute)
                     + (1 - rec) * A.layer_activation(spec, M, ctx, first, "none"))
    else:
        first_act = A.layer_activation(spec, M, ctx, first, mode)
    last_act = A.layer_activation(spec, M, ctx, last, mode)
    if view.partial_recompute and eng.recompute_layers_spread:  # the last layer wrapped when N divides n
        wrapped = _spread(nd + nm)[3]
        last_act = (1 - wrapped) * last_act + wrapped * A.layer_activation(spec, M, ctx, last, view.recompute)
    after_head = acts - head_device_flag(view.schedule, stage, pp) * A.head_activation(spec, M, ctx)
    emb_act = embedding_device_flag(view.schedule, stage, pp) * A.embedding_activation(spec, M, ctx)
    head_phase = (_chunked_head_reduce(spec, M, view, acts, head, written) if eng.loss_chunks
                  else after_head + _rs_bytes(eng, head, gathered[last], written))
    phases = [
        head_phase,
        after_head - last_act + kept * head
        + _rs_bytes(eng, size[last], gathered[kinds[-2]] if len(kinds) > 1 else A.ACT_BYTES * emb, written),
        emb_act + kept * (head + layers) + _rs_bytes(eng, emb, 0, written),
        emb_act + kept * (head + layers - size[first]) + _rs_bytes(eng, size[first], A.ACT_BYTES * emb, written),
    ]
    if len(kinds) > 2:
        phases.append(emb_act + first_act + kept * (head + layers - size[first] - size[second])
                      + _rs_bytes(eng, size[second], gathered[first], written))
    if rebuilds_in_backward(view):
        held = dict(after_head=after_head, emb_act=emb_act, head=head, layers=layers, written=kept, n=nd + nm)
        phases += _rebuild_phases(spec, M, view, ctx, kinds, size, gathered, held)
    return backward_phases_on(spec, view) * Max(*phases)


def accumulating(spec: ModelSpec, view: Structure) -> sp.Expr:
    """1 where FSDP's sharded gradients accumulate over micro-batches without a pipeline (pp 1,
    m >= 2), else 0: torchtitan zeroes them once per step and runs every micro-batch's forward
    and backward after (v0.2.2 train.py:550-561), so from the second micro-batch on the whole
    sharded fp32 gradients sit beside its activations (EngineProfile.grads_built_in_backward)."""
    return Min(1, Max(0, S.m - 1)) * Max(0, 2 - pp_expr(spec, view))


def _spread(n) -> tuple[sp.Expr, sp.Expr, sp.Expr, sp.Expr]:
    """Every N-th of a chunk's ``n`` layers wrapped, N = floor(n / r) for r = min(nrec, n) wrapped
    (EngineProfile.recompute_layers_spread): (plain layers before the last wrapped one, layers
    after it, 1 when the first layer is wrapped (N = 1), 1 when the last is (N divides n));
    both flags 0 when nrec = 0."""
    r = Max(Min(S.nrec, n), 1)
    every = sp.floor(n / r)
    after = n - r * every
    some = Min(S.nrec, 1)
    return r * (every - 1), after, some * (1 - Min(every - 1, 1)), some * (1 - Min(after, 1))


def backward_phases_on(spec: ModelSpec, view: Structure) -> sp.Expr:
    """1 where FSDP's per-layer backward phases run (no pipelining, dp*cp > 1), else 0."""
    return _unpiped(spec, view) * Min(G.dense_shard_ranks() - 1, 1)


def rebuilds_in_backward(view: Structure) -> bool:
    """Each checkpointed block's backward re-runs its forward: full recompute, or op-level SAC
    (``selective`` on an engine with ``selective_op_sac``), which re-runs every op it did not save."""
    return view.recompute == "full" or (view.recompute == "selective" and view.engine.selective_op_sac)


def rebuilt_layer(spec, M, ctx, kind, mode, workspace: bool = True) -> sp.Expr:
    """The bytes a checkpointed layer's backward makes above what the layer stored: its
    no-recompute activations (full recompute); under op-level SAC the block re-runs as under full
    recompute but reads the outputs it saved from its cache instead of making them again, so it
    makes that less what it stored beyond the block input: at the height of the block's backward
    the live bytes equal full recompute's (measured on torchtitan's modules, tokens (8, 256): the
    backward peak above the stored activations is 10,264 B per token under FullAC and 7,176 under
    SelectiveAC, 3,088 apart, the bytes SelectiveAC saved beyond the input). Then its
    MLP's activation gradients (A.mlp_backward_workspace) with ``workspace``."""
    none = A.layer_activation(spec, M, ctx, kind, "none")
    if mode != "full":  # what SAC saved beyond the checkpointed input comes from its cache, not again
        none -= A.layer_activation(spec, M, ctx, kind, mode) - A.layer_activation(spec, M, ctx, kind, "full")
    return none + (A.mlp_backward_workspace(spec, M, ctx, kind) if workspace else 0)


def _rebuild_phases(spec, M, view, ctx, kinds, size, gathered, held) -> list[sp.Expr]:
    """Full recompute or op-level SAC (``rebuilds_in_backward``): a checkpointed layer's backward
    rebuilds its no-recompute activations (``rebuilt_layer``) and,
    at the height of its MLP backward, the activation gradients (A.mlp_backward_workspace), while
    the reduce-scatter input of the group reduced just before is still alive (torch 2.13 keeps
    one, ``reduce_scatter_max_input_buffers``) beside the layer's gathered weights and the
    previous layer's, prefetched in its pre-backward (sizes approximated by the neighbouring
    kinds). Every layer recomputed: the last layer after the output layer's reduce-scatter, or
    the one before it after the last layer's. Partial recompute (``nrec`` of a chunk's layers):
    the first ``nrec`` (Megatron's block method; the others are freed first) rebuilt last, layer
    nrec - 1 after layer nrec's reduce-scatter; or every N-th (recompute_layers_spread, _spread),
    the last wrapped one rebuilt beside the plain layers before it. Checked on the gloo runtime
    (tests/test_runtime.py)."""
    eng, first, last = view.engine, kinds[0], kinds[-1]
    rs_in, written, head = eng.reduce_scatter_input_bytes, held["written"], held["head"]
    rebuilt = {k: rebuilt_layer(spec, M, ctx, k, view.recompute) for k in set(kinds)}
    inputs = {k: A.layer_activation(spec, M, ctx, k, view.recompute) for k in set(kinds)}  # what it stored
    plain_act = {k: A.layer_activation(spec, M, ctx, k, "none") for k in set(kinds)}
    if view.partial_recompute and eng.recompute_layers_spread:
        plain, after, _, _ = _spread(held["n"])
        ran = Min(after, 1)  # a plain layer after it: its reduce-scatter input, else the output layer's
        wrapped_inputs = Min(S.nrec, held["n"]) * inputs[first]
        return [Min(S.nrec, 1) * (held["emb_act"] + plain * plain_act[first] + wrapped_inputs
                                     + rebuilt[first] + rs_in * (ran * size[first] + (1 - ran) * head)
                                     + written * (head + after * size[first]) + 2 * gathered[first])]
    if view.partial_recompute:
        n = S.nrec
        return [Min(n, 1) * (held["emb_act"] + n * inputs[first] + rebuilt[first] + rs_in * size[first]
                                + written * (head + held["layers"] - n * size[first]) + 2 * gathered[first])]
    before = kinds[-2] if len(kinds) > 1 else last
    phases = [held["after_head"] + rebuilt[last] + rs_in * head + written * head + gathered[last] + gathered[before]]
    if len(kinds) > 1:
        earlier = kinds[-3] if len(kinds) > 2 else before
        phases.append(held["after_head"] - inputs[last] + rebuilt[before] + rs_in * size[last]
                      + written * (head + size[last]) + gathered[before] + gathered[earlier])
    return phases


def _rs_bytes(eng: EngineProfile, group, prefetched_bytes, written) -> sp.Expr:
    """FSDP2's buffers at the reduce-scatter of ``group`` parameters (torch 2.13
    _fsdp_collectives.py foreach_reduce): the fp32 input (``reduce_scatter_input_bytes``),
    first beside the 16-bit unsharded gradients it is copied from, which are freed before
    the output is allocated (``written`` per parameter, sharded), and any copy the backend
    makes (``reduce_scatter_copy_bytes``); beside them the next group's prefetched weights
    (``prefetched_bytes``: gathered_layer, or the 16-bit embedding). The group's own unsharded
    weights are freed before (post_backward reshards first, _fsdp_param_group.py:637-638)."""
    grads_or_out = Max(A.ACT_BYTES, written + eng.reduce_scatter_copy_bytes)
    return prefetched_bytes + (eng.reduce_scatter_input_bytes + grads_or_out) * group


def _piped_fsdp(spec: ModelSpec, view: Structure) -> sp.Expr | None:
    """1 where FSDP holds the stage unsharded under pipelining (``pp_unsharded_stage_bytes``,
    zero >= 3, pp > 1, dp*cp > 1), as an expression in pp and dp*cp; None for other engines."""
    eng = view.engine
    if not eng.pp_unsharded_stage_bytes or view.zero < eng.weights_sharded_from or eng.gather_whole_stage:
        return None
    return Min(pp_expr(spec, view) - 1, 1) * Min(G.dense_shard_ranks() - 1, 1)


def pp_group_grads(spec: ModelSpec, M: ModelSymbols, view: Structure) -> sp.Expr | None:
    """FSDP under pipelining, in each micro-batch's backward: one group's 16-bit gradients, alive
    until its post_backward accumulates them into the fp32 unsharded gradient
    (_fsdp_param_group.py:603-612, _fsdp_param.py:802-821, torch 2.13). They appear as the
    layer's backward ends, after the loss's logits are freed (an exclusive transient)."""
    piped = _piped_fsdp(spec, view)
    return None if piped is None else piped * A.ACT_BYTES * layer_params(spec, M, largest_kind(spec))


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
    return piped * 2 * A.FP32_BYTES / G.dense_shard_ranks() * layer_params(spec, M, largest_kind(spec))
