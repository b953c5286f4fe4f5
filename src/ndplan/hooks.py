"""Cost-model adaptation in Python: replace any Term with your own formula.

Hardware constants are overridden without code (hardware YAML fields or ``--set
name=value``); a hook replaces a whole Term, for example a measured TP overlap::

    import ndplan
    from ndplan import hooks

    def half_overlapped(term, spec, strat):
        return term.expr / 2          # an expression, or a full ndplan.Term

    hooks.replace_term("time.tp_comm", half_overlapped)
    ndplan.estimate(model, hw, strategy).time_terms["time.tp_comm"]   # halved
    hooks.clear()

Hooks apply wherever the Term is built (estimate, explain, sweep kernels). While a
hook is registered, compiled kernels are not written to or read from the disk cache
(a Python function has no stable identity across runs).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import sympy as sp

from ndplan.terms import Breakdown, Term

HookFn = Callable[[Term, object, object], "Term | sp.Expr"]
_HOOKS: dict[str, HookFn] = {}


def replace_term(key: str, fn: HookFn) -> None:
    """Build Term ``key`` as ``fn(default_term, model_spec, strategy)`` from now on."""
    _HOOKS[key] = fn


def clear() -> None:
    _HOOKS.clear()


def active() -> bool:
    return bool(_HOOKS)


def signature() -> tuple:
    """Identity of the registered hooks, for in-process kernel cache keys."""
    return tuple(sorted((k, f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', '')}", id(f))
                        for k, f in _HOOKS.items()))


def apply(bd: Breakdown, spec, strat) -> Breakdown:
    """``bd`` with every hooked Term replaced (source notes the replacement)."""
    if not _HOOKS:
        return bd
    out = []
    for t in bd:
        fn = _HOOKS.get(t.key)
        if fn is None:
            out.append(t)
            continue
        new = fn(t, spec, strat)
        if not isinstance(new, Term):
            name = getattr(fn, "__qualname__", repr(fn))
            new = replace(t, expr=sp.sympify(new), source=f"user hook {name} (replaces: {t.source})")
        out.append(new)
    return Breakdown(tuple(out))
