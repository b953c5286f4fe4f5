"""DeepSpeed ZeRO-3's gathered parameters (EngineProfile.zero3_param_coordinator): the bytes of
unsharded parameters and all-gather buffers on one device at the forward/backward turn, where the
activations peak, as DeepSpeed 0.19.8's PartitionedParameterCoordinator keeps them
(runtime/zero/partitioned_param_coordinator.py; paths relative to the ``deepspeed`` package).

Derivation, in elements of one device's (TP/EP-split) parameters, ``S`` those of the stage:

* Released or kept. After a module runs (release_sub_module, :494-533) its parameters are
  partitioned again unless the modules until their next use in the recorded trace (forward then
  backward) hold fewer than ``stage3_max_reuse_distance`` = R elements (__params_to_release,
  :653-662). At the turn, a module whose forward successors hold A elements is reused after 2A
  (the same modules again in backward), so the modules within R/2 of the end of the forward stay
  gathered: kept = min(S, max(H, R/2)), H the output layer (V*h/tp, reused at once; it is also
  the module in use when the backward starts). The module that crosses R/2 is kept whole, so
  this is low by less than one module.
* Under full recompute a layer's backward follows its recomputed forward, so one whole layer P
  is gathered then: in use = min(S, max(kept, P)); else in use = kept.
* Prefetched. At every module's fetch the coordinator all-gathers the next parameters of the
  trace, up to ``stage3_prefetch_bucket_size`` = B elements but never past
  ``stage3_max_live_parameters`` = Lv gathered in all (min(Lv - n_available, B), :452-485; the
  fetch of the module in use is not limited). With B > 0 the gathered elements reach
  min(S, max(in use, Lv)); B = 0 prefetches nothing. This assumes the prefetch keeps pace (it
  adds up to B at every module's hook, parents included); when a layer holds more than its
  modules' hooks prefetch, fewer stay gathered.
* Buffers. A prefetched bucket is one coalesced all-gather into a flat 16-bit buffer
  (partition_parameters.py _all_gather_dtype, :1329-1370); waiting on it copies each parameter
  out (torch.cat, :786-796) while the handle, held by the registry until the bucket's last
  parameter is used (:398-406), keeps the buffer: 2 B per element of the bucket in use,
  b = min(B, gathered - in use), beside its parameters. Not yet waited on, a bucket is its buffer
  alone (2 B per element, the parameter's own bytes). With ZeRO++ qwZ (zero_quantized_weights)
  the buffer is int8 (1 B per element, :1479-1537) until the wait dequantizes it into a 16-bit
  flat tensor (:772-779) that the handle keeps beside the int8 buffer: 1 B per element ahead,
  2 + 1 + 2 per element of the bucket in use.

bytes = 2 * gathered + 2 * b; with qwZ 2 * in use + (gathered - in use) + 4 * b.
Persistent parameters (``stage3_param_persistence_threshold``) and the fetch scales (one fp32 per
group of up to 8,000 elements) are not counted.
"""

from __future__ import annotations

import sympy as sp

from ndplan.catalog.model import ModelSpec
from ndplan import symbols as S
from ndplan.engines import EngineProfile
from ndplan.formulas import groups as G
from ndplan.formulas.local import largest_kind, layer_params
from ndplan.formulas.minmax import Max, Min
from ndplan.formulas.placement import head_device_flag, pp_expr
from ndplan.structure import Structure
from ndplan.symbols import ModelSymbols

QWZ_INT8_BYTES = 1
"""qwZ all-gathers int8 (partition_parameters.py:1384, 1485-1486: ``dtype=torch.int8``)."""


def deepspeed_gather(spec: ModelSpec, M: ModelSymbols, view: Structure, eng: EngineProfile, dense, expert,
                     stage=S.stage) -> tuple[sp.Expr, str]:
    """(bytes, description) of the gathered parameters and buffers at the turn (module docstring)."""
    stage_elems = dense + expert
    head = head_device_flag(view.schedule, stage, pp_expr(spec, view)) * M.V * M.h / S.tp
    kept = Min(stage_elems, Max(head, sp.Rational(eng.zero3_reuse_elements, 2)))
    in_use = kept
    if view.recompute == "full":
        in_use = Min(stage_elems, Max(kept, layer_params(spec, M, largest_kind(spec))))
    if eng.zero3_prefetch_elements > 0:
        gathered = Min(stage_elems, Max(in_use, eng.zero3_live_elements))
        bucket = Min(eng.zero3_prefetch_elements, gathered - in_use)
    else:
        gathered, bucket = in_use, sp.Integer(0)
    w = G.weight_bytes(view, eng)  # parameters are gathered in their own dtype (_all_gather_dtype)
    if eng.zero3_quantized_weights:
        # ahead: the int8 buffer; the bucket in use adds its dequantized flat tensor and its parameters
        out = w * in_use + QWZ_INT8_BYTES * (gathered - in_use) + 2 * w * bucket
        buffers = f"qwZ: 1 B per prefetched element (int8) and {2 * w} B more per element of the bucket in use"
    else:
        # ahead: the buffer (or the parameter copied out of it); the bucket in use: buffer and parameters
        out = w * gathered + w * bucket
        buffers = f"{w} B more per element of the bucket in use (its coalesced all-gather buffer)"
    what = (f"DeepSpeed ZeRO-3 coordinator: parameters reused within stage3_max_reuse_distance/2 = "
            f"{eng.zero3_reuse_elements // 2:,} elements of the forward's end (the output layer at least)"
            + (", or one whole layer under full recompute" if view.recompute == "full" else "")
            + (f", prefetched up to stage3_max_live_parameters = {eng.zero3_live_elements:,} gathered elements in "
               f"buckets of stage3_prefetch_bucket_size = {eng.zero3_prefetch_elements:,}"
               if eng.zero3_prefetch_elements else ", no prefetch (stage3_prefetch_bucket_size 0)")
            + f", {w} B per element; {buffers} (formulas/deepspeed_gather.py)")
    return out, what
