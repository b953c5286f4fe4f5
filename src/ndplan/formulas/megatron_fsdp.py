"""Megatron-FSDP's buffers (Megatron-LM ``--use-megatron-fsdp``, EngineProfile.megatron_fsdp).

Sources at NVIDIA/Megatron-LM@d98e8a64, files under megatron/core/distributed/fsdp/src/
megatron_fsdp/ unless named otherwise (pgb = param_and_grad_buffer.py, mf = megatron_fsdp.py).

What each ``--data-parallel-sharding-strategy`` keeps for the run (pgb:2330-2348), all in the
states Terms (formulas/states.py), ZeRO level in brackets:

* no_shard [0]: no model weight buffer (the module's 16-bit weights), the main weights
  (``--megatron-fsdp-main-params-dtype``, fp32: mixed_precision.py:382) and the main gradients
  (the parameters' dtype unless ``--megatron-fsdp-main-grads-dtype``: pgb:2313-2322) unsharded;
* optim [1]: the model weight buffer unsharded (pgb:2651-2667), main weights sharded
  (pgb:2689-2705), main gradients unsharded (pgb:2708-2733);
* optim_grads [2]: main gradients sharded too;
* optim_grads_params [3]: model weights sharded too.

The optimizer keeps its states on the (sharded) main weights (pgb:3224-3293). What this module
adds to those Terms:

* ``kept_vocab``: at 3 the FSDP units are the decoder layers (TransformerLayer, MoETransformerLayer,
  MambaLayer: mcore_fsdp_adapter.py:171); the embedding and output layer are not units, their
  buckets are gathered by their forward pre-hooks and never released (no post-forward hook,
  mf:1086-1099; "Non-unit modules should remain persistently allocated", pgb:4636-4641; reset keeps
  them, pgb:4364-4367): a 16-bit copy of each beside its shard (mem.weights);
* ``gather_term``: at 3 the unit about to run and the units prefetched after it until
  ``comm_unit / 2`` elements are in flight (pgb:4487-4514; mf:443-444), each released after its
  forward (mf:977-998) and backward (mf:684-700); with ``--fp8-param-gather`` the fp8 bytes
  (pgb:2632) and, in backward, the running unit's fp8 transpose (mf:497-498, discarded at release
  unless --keep-fp8-transpose-cache, mf:602-628); with double buffering a pool of two units'
  weight buffers and, at 2 and 3, two units' gradient buffers kept for the run (pgb:2519-2576,
  FixedPoolAllocator :647-857; prefetch and the queue stop at two units, :4475-4484, 3956-3978);
* ``grad_phase``: at 2 and 3 each gradient is written into an unsharded bucket in the
  gradient dtype (the main_grad getter, pgb:3094-3118), reduce-scattered when its unit (or
  non-unit bucket) is complete, and freed only when the queue exceeds ``comm_unit`` elements
  (pgb:3936-3948, 4231-4250) or the backward ends (mf:867-901);
* ``step_phase``: the optimizer step casts the (sharded at >= 1) main gradients to the main
  weights' dtype when they differ (pgb:3351-3381), kept until the next step's zero_grad
  (pgb:3189-3214), while start_param_sync gathers the first units again (mf:1302-1308).

With dp*cp = 1 no buffer is distributed (pgb:2656-2657, 2718) and none of this is allocated.
"""

from __future__ import annotations

import sympy as sp

from ndplan.formulas.minmax import Max, Min

from ndplan import symbols as S
from ndplan.catalog.model import ModelSpec
from ndplan.engines import EngineProfile
from ndplan.formulas import activations as A
from ndplan.formulas import groups as G
from ndplan.formulas.local import act_context, largest_kind, layer_params, vocab_params
from ndplan.formulas.placement import chunk_layers, is_first, pp_expr
from ndplan.formulas.states import FP8_VOCAB_BYTES
from ndplan.structure import Structure
from ndplan.symbols import ModelSymbols
from ndplan.terms import Term

SRC = "NVIDIA/Megatron-LM@d98e8a64 megatron/core/distributed/fsdp/src/megatron_fsdp/"
DEFAULT_COMM_UNIT = 1_000_000_000
"""The floor of the default communication unit (mf:437-441: ``max(1_000_000_000, ...)``)."""


def distributed() -> sp.Expr:
    """1 when the buffers are sharded, i.e. the DP-shard group (dp*cp) has more than one rank."""
    return Min(G.dense_shard_ranks() - 1, 1)


def unit_params(spec: ModelSpec, M: ModelSymbols) -> sp.Expr:
    """Parameters of one FSDP unit on a device: the largest decoder layer (TP/EP-split)."""
    return layer_params(spec, M, largest_kind(spec))


def comm_unit(spec: ModelSpec, M: ModelSymbols, view: Structure) -> sp.Expr:
    """``suggested_communication_unit_size`` in elements (mf:420-444): the given value, else
    max(1e9, 2 x a unit's parameters) at optim_grads_params and max(1e9, the DDP bucket,
    max(4e7, 1e6 x dp*cp), training.py:2189) below."""
    given = view.engine.megatron_fsdp_comm_unit_elements
    if given:
        return sp.Integer(given)
    if view.zero >= 3:
        return Max(DEFAULT_COMM_UNIT, 2 * unit_params(spec, M))
    return Max(DEFAULT_COMM_UNIT, 10**6 * G.dense_shard_ranks())


def _stage_layers(spec: ModelSpec, M: ModelSymbols, view: Structure, stage) -> sp.Expr:
    nd, nm = chunk_layers(spec, view, stage, 0, pp_expr(spec, view), M.L)
    return nd + nm


def gathered_units(spec: ModelSpec, M: ModelSymbols, view: Structure, stage=S.stage) -> sp.Expr:
    """Units gathered at once at optim_grads_params: the running one and, until the prefetched
    ones reach comm_unit // 2 elements, the next ones (pgb:4487-4514: 1 + ceil(prefetch / unit));
    two with double buffering (pgb:4475-4484); at most the chunk's layers."""
    if view.engine.megatron_fsdp_double_buffer:
        k = sp.Integer(2)
    else:
        k = 1 + sp.ceiling(sp.floor(comm_unit(spec, M, view) / 2) / unit_params(spec, M))
    return Min(k, _stage_layers(spec, M, view, stage))


def _fp8_transpose(spec: ModelSpec, M: ModelSymbols, view: Structure) -> sp.Expr:
    """The running unit's fp8 transpose in backward (fp8 primary weights on Hopper: one fp8 copy,
    with the recipe's block scales, groups.fp8_element_bytes)."""
    if view.weight_dtype != "fp8" or view.zero < 3:
        return sp.Integer(0)
    return G.fp8_element_bytes(view.engine, view.engine.fp8_weight_block) * unit_params(spec, M)


def grad_bucket_bytes(view: Structure, eng: EngineProfile) -> int:
    """Bytes per element of an unsharded gradient bucket: --megatron-fsdp-grad-comm-dtype, else
    the main gradients' dtype (pgb:3107-3111)."""
    return eng.megatron_fsdp_grad_comm_bytes or G.grad_bytes(view, eng)


def kept_vocab(view: Structure, eng: EngineProfile, vocab) -> sp.Expr:
    """16-bit copies of the device's embedding and output layer, gathered once and kept at
    optim_grads_params (module docstring), beside the shards mem.weights already counts."""
    if not eng.megatron_fsdp or view.zero < 3:
        return sp.Integer(0)
    b = FP8_VOCAB_BYTES if view.weight_dtype == "fp8" else G.weight_bytes(view, eng)
    return b * vocab[0] * distributed()


def dynamic_gather(spec: ModelSpec, M: ModelSymbols, view: Structure, stage=S.stage) -> sp.Expr:
    """The part of gather_term released after each unit: the gathered units (without double
    buffering) and the fp8 transpose; none of it is alive at the loss (each unit is released
    after its forward, mf:977-998, the last before the output layer runs)."""
    out = _fp8_transpose(spec, M, view)
    if view.zero >= 3 and not view.engine.megatron_fsdp_double_buffer:
        out += gathered_units(spec, M, view, stage) * G.weight_bytes(view, view.engine) * unit_params(spec, M)
    return out * distributed()


def gather_expr(spec: ModelSpec, M: ModelSymbols, view: Structure, stage=S.stage) -> sp.Expr:
    """Bytes of the units' buffers beside the activations at a backward's start."""
    eng, L = view.engine, unit_params(spec, M)
    out = dynamic_gather(spec, M, view, stage)
    if eng.megatron_fsdp_double_buffer and view.zero >= 2:  # the pools, kept for the run
        pool = 2 * grad_bucket_bytes(view, eng) * L
        if view.zero >= 3:
            pool += 2 * G.weight_bytes(view, eng) * L
        out += pool * distributed()
    return out


def gather_term(spec: ModelSpec, M: ModelSymbols, view: Structure, stage=S.stage) -> Term | None:
    """mem.zero3_gather under Megatron-FSDP (None where it allocates no unit buffer)."""
    eng = view.engine
    expr = gather_expr(spec, M, view, stage)
    if expr == 0:
        return None
    if eng.megatron_fsdp_double_buffer:
        what = ("double buffering: pools of two units' 16-bit weights (optim_grads_params) and two units' "
                "gradient buckets, kept for the run (pgb:2519-2576, FixedPoolAllocator pgb:647-857)")
    else:
        what = ("1 + ceil(comm_unit // 2 / unit) units (the running decoder layer and those prefetched until "
                "comm_unit // 2 elements are in flight, pgb:4487-4514, mf:420-444), at most the chunk's layers")
    if view.weight_dtype == "fp8" and view.zero >= 3:
        what += "; in fp8 (pgb:2632), with the running unit's fp8 transpose in backward (mf:497-498)"
    return Term(key="mem.zero3_gather", expr=expr, unit="bytes",
                source=f"Megatron-FSDP unit buffers ({SRC}): {what}",
                note="zero when dp*cp = 1; the gathered units are not alive at the loss (mem.transient)")


def _freed_per_layer(spec: ModelSpec, M: ModelSymbols, view: Structure) -> sp.Expr:
    """Activations of one micro-batch that one decoder layer's backward frees (the last layers:
    under a partial recompute count the first layers are the recomputed ones)."""
    mode = "none" if view.partial_recompute else view.recompute
    return A.layer_activation(spec, M, act_context(spec, view), spec.edge_layer_kinds[-1], mode)


def grad_phase(spec: ModelSpec, M: ModelSymbols, view: Structure, stage=S.stage) -> sp.Expr:
    """Bytes of unsharded gradient buckets alive, less the activations already freed, at the worst
    moment of a backward (optim_grads and optim_grads_params; 0 below).

    Backward order: the output layer's bucket (``head`` elements), the final norm's, then decoder
    layer j = 0, 1, ... (from the last; ``unit`` elements each), then the embedding's (``emb``).
    Before each bucket group is reduce-scattered, the queue is popped until it holds at most ``cap``
    elements (pgb:3936-3948), so the final norm's reduce-scatter frees a head larger than ``cap``;
    the running layer's bucket is allocated at its first gradient (pgb:3094-3118). So during layer
    j's backward the alive buckets are head + unit at j = 0 and, for j >= 1, the longest suffix of
    [head, unit x (j-1)] within cap, plus the previous layer's (appended) and the running one's,
    while j layers' activations are freed (head: 0 if above cap; the norm's 4,096-odd elements are
    left out). That is piecewise linear in j, so
    its largest value is at j in {0, 1, j1, j1 + 1, q + 1} (clipped to the chunk's layers), with
    q = floor(cap / unit) and j1 = floor((cap - head) / unit) + 1 the last j whose suffix keeps the
    head; then the embedding's bucket after every layer. Double buffering keeps the units' buckets
    in the pool (gather_term), so only the head's or the embedding's remains."""
    eng = view.engine
    if view.zero < 2:
        return sp.Integer(0)
    L, g, cap = unit_params(spec, M), grad_bucket_bytes(view, eng), comm_unit(spec, M, view)
    vocab = vocab_params(spec, M, view, stage)
    head, emb = vocab[0] - vocab[1], vocab[1]
    n = _stage_layers(spec, M, view, stage)
    a = _freed_per_layer(spec, M, view)
    if eng.megatron_fsdp_double_buffer:
        return Max(g * head, g * emb - n * a) * distributed()
    q = sp.floor(cap / L)
    head = head * _at_most(head, cap) if head != 0 else head  # a head above cap is gone

    def suffix(k):  # the longest suffix of [head, unit x (k - 1)] within cap (k >= 0; k = 0: [head])
        k1 = Max(k - 1, 0)
        return Min(k1, q) * L + head * _at_most(head + k1 * L, cap)

    def value(j):
        j = Max(0, Min(j, n - 1))
        return g * (suffix(j) + L + L * Min(j, 1)) - j * a

    j1 = sp.floor((cap - head) / L) + 1
    phases = [value(j) for j in (0, 1, j1, j1 + 1, q + 1)]
    if emb != 0:
        phases.append(g * (suffix(n) + L + emb) - n * a)
    return Max(*phases) * distributed()


def _at_most(x, cap) -> sp.Expr:
    """1 if x <= cap else 0, for whole numbers x and cap (element counts)."""
    return Max(0, Min(1, cap - x + 1))


def step_phase(spec: ModelSpec, M: ModelSymbols, view: Structure, opt_shard, stage=S.stage) -> sp.Expr:
    """Bytes alive at the optimizer step besides the states and kept weights: the main gradients
    cast to the main weights' dtype when they differ (pgb:3376-3381; sharded from optim, else
    every local parameter), and, after the step, the units start_param_sync gathers for the next
    forward (the first parameter's unit and its prefetch, mf:1302-1308), beside the pools."""
    eng = view.engine
    master, grad = G.master_bytes(view, eng), G.grad_bytes(view, eng)
    cast = master * opt_shard if master and grad != master and not view.offload_optimizer else sp.Integer(0)
    pools = gather_expr(spec, M, view, stage) - dynamic_gather(spec, M, view, stage)
    regather = sp.Integer(0)
    if view.zero >= 3 and not eng.megatron_fsdp_double_buffer:  # stage 0 starts at the embedding
        units = Max(gathered_units(spec, M, view, stage) - is_first(stage), 0)
        regather = units * G.weight_bytes(view, eng) * unit_params(spec, M) * distributed()
    return cast + pools + regather


def transient(spec: ModelSpec, M: ModelSymbols, view: Structure, stage, transient_, logits, rebuild, dispatch,
              acts, gather, opt_shard) -> tuple[sp.Expr, str]:
    """memory.transient_term under Megatron-FSDP: (expression, source to append). At the loss
    no unit is gathered (the logits less dynamic_gather); in backward the gradient buckets
    (grad_phase) sit beside the gathered units and the layer full recompute rebuilds; the
    optimizer step (step_phase) replaces the activations and the gather buffers."""
    out, src = transient_, ""
    if view.zero >= 2:
        dyn = dynamic_gather(spec, M, view, stage)
        loss = Max(logits - dyn, 0) if dyn != 0 else logits
        out = Max(loss, rebuild + grad_phase(spec, M, view, stage))
        if dispatch != 0:
            out = Max(out, dispatch)
        src += ("; Megatron-FSDP: at the loss no decoder layer is gathered (the logits less the unit buffers), "
                "in backward the unsharded gradient buckets in the reduce-scatter queue, less the activations "
                f"freed (formulas/megatron_fsdp.py grad_phase; {SRC}param_and_grad_buffer.py:3094-3118, 3924-3954)")
    step = step_phase(spec, M, view, opt_shard, stage)
    if step != 0:
        out = Max(out, step - acts - gather)
        src += ("; the optimizer step: the main gradients cast to the main weights' dtype and the units gathered "
                "again for the next forward, which replace the activations and gather buffers (step_phase; "
                "param_and_grad_buffer.py:3376-3381, megatron_fsdp.py:1302-1308)")
    return out, src
