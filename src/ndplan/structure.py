"""The structure of a strategy: exactly the fields the SymPy builders may branch on.

A compiled kernel is an expression in the strategy symbols (dp, tp, pp, cp, ep, etp,
vpp, mbs, m, seq, nrec, stage) evaluated at numbers, so one kernel serves every
strategy with the same *structure*. The builders (formulas/memory.py,
formulas/step.py) branch in Python on categorical fields (schedule, recompute mode,
ZeRO level, engine settings, ...) and, in three cases, on a numeric field:

* ``pp`` when the layer layout cannot be written in the symbols pp and stage (an
  uneven ``layers_per_stage`` that is no "ends" layout, or MoE layers that do not
  follow the dense ones): layer counts are counted from the layer list
  (formulas/placement.py). An ends layout (layouts.py) is the field ``ends``: its
  first/last stage counts are the kernel arguments first_layers and last_layers;
* ``cp > 1`` when the engine turns sequence parallelism on under CP
  (``cp_implies_sp``) and the strategy has sp off;
* ``m`` when a given uneven layout runs under vpp > 1: the peak is a max over the
  held vectors of the schedule's op order, which depend on m (schedules.held_profiles).

``structure(spec, strat)`` is the one function that builds the view; builders receive
only a ``Structure``, and the kernel cache key (``kernel_key``) is derived from it, so a
field the builders read is a field of the key by construction. The registered hooks are
part of the structure too (hooks.py): builders apply the hooks the view carries, and
never read the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ndplan.catalog.model import ModelSpec
from ndplan.engines import EngineProfile, profile
from ndplan.layouts import ends_layout, symbolic_layout
from ndplan.memo import by_identity


@dataclass(frozen=True, kw_only=True)
class Structure:
    """What a memory or time Breakdown depends on beyond the kernel arguments."""
    engine: EngineProfile
    """The engine profile itself (not its name: ``--set`` variants are other profiles)."""
    schedule: str
    vpp: int
    """Chunks per stage: the builders loop over them."""
    recompute: str
    zero: int
    sp: bool
    flash_attention: bool
    order: str
    grad_dtype: str
    weight_dtype: str
    offload_optimizer: bool
    layers_per_stage: tuple[int, ...] | None
    """A concrete uneven split (None for even and for ends layouts)."""
    partial_recompute: bool
    """``recompute_layers`` is given (its counts are the kernel argument nrec)."""
    pp: int | None = None
    """Concrete pp, only when the layout is not symbolic in pp (else None)."""
    cp_gt1: bool | None = None
    """cp > 1, only when the engine's sequence parallelism follows CP and sp is off."""
    m: int | None = None
    """Micro-batches, only when the peak is a max over held vectors (else None)."""
    ends: bool = False
    """The layout is an ends layout in the symbols first_layers/last_layers (layouts.py); the
    sweep evaluates even rows through it too (first = last = L/pp)."""
    hooks: tuple = ()
    """Registered Term hooks, ((key, registration number, fn), ...) sorted by key (hooks.py)."""

    @property
    def seq_parallel(self) -> bool:
        """Sequence parallelism in effect: asked for, or implied by the engine under CP."""
        return self.sp or bool(self.engine.cp_implies_sp and self.cp_gt1)


def peaks_over_held_vectors(strat) -> bool:
    """A given (uneven) layout under vpp > 1: chunks differ, and the stage may peak
    holding more of its heavier chunk than the in-flight table's split, so activations
    are the max over every per-chunk held vector the op order passes through
    (schedules.held_profiles, exact for any chunk sizes), which fixes m in the formula."""
    return strat.vpp > 1 and strat.layers_per_stage is not None


def structure(spec: ModelSpec, strat, engine: EngineProfile | None = None, hooks: tuple | None = None) -> Structure:
    """The Structure of ``strat`` (a Strategy; a Structure is returned as it is).
    ``engine`` replaces the strategy's named profile (estimate's time model); ``hooks``
    defaults to the registered ones (hooks.registered)."""
    if isinstance(strat, Structure):
        if engine is not None or hooks is not None:
            raise ValueError("a Structure already holds its engine and hooks: build it with them")
        return strat
    from ndplan import hooks as H
    eng = engine or profile(strat.engine)
    symbolic = symbolic_layout(spec, strat)
    ends = symbolic and ends_layout(spec, strat)
    lps = None if ends else strat.layers_per_stage
    return Structure(
        engine=eng, schedule=strat.schedule, vpp=strat.vpp, recompute=strat.recompute, zero=strat.zero,
        sp=strat.sp, flash_attention=strat.flash_attention, order=strat.order, grad_dtype=strat.grad_dtype,
        weight_dtype=strat.weight_dtype, offload_optimizer=strat.offload_optimizer,
        layers_per_stage=lps, partial_recompute=strat.recompute_layers is not None, ends=ends,
        pp=None if symbolic else strat.pp,
        cp_gt1=(strat.cp > 1) if (eng.cp_implies_sp and not strat.sp) else None,
        m=strat.m if strat.vpp > 1 and lps is not None else None,  # peaks_over_held_vectors of the view
        hooks=H.registered() if hooks is None else hooks)


#: Structure fields that come from a numeric Strategy field (view field -> strategy
#: field): sweep splits a group's rows by the strategy fields whose view field is set.
NUMERIC_FIELDS = {"pp": "pp", "cp_gt1": "cp", "m": "m"}


def kernel_key(spec: ModelSpec, view: Structure, what: str, stage: int | None = None) -> tuple:
    """Cache key of the kernel of ``what`` ("memory" or "time") for ``view``: the model,
    every field of the view, and the concrete stage a non-symbolic layout was built at."""
    return (repr(spec), tuple((f.name, _repr(getattr(view, f.name))) for f in fields(view)), what, stage)


_PROFILE_REPRS: dict = {}


def _repr(value) -> str:
    """repr, remembered for an engine profile (a 60-field dataclass a sweep keys 300 times;
    frozen, so its repr never changes; remembered by identity, it holds a dict)."""
    if not isinstance(value, EngineProfile):
        return repr(value)
    return by_identity(_PROFILE_REPRS, value, lambda: repr(value))
