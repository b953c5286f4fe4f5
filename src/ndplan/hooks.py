"""Cost-model adaptation in Python: replace any Term with your own formula.

Hardware constants are overridden without code (hardware YAML fields or ``--set
name=value``); a hook replaces a whole Term, for example a measured TP overlap::

    import ndplan
    from ndplan import hooks

    def half_overlapped(term, spec, structure):
        return term.expr / 2          # an expression, or a full ndplan.Term

    hooks.replace_term("time.tp_comm", half_overlapped)
    ndplan.estimate(model, hw, strategy).time_terms["time.tp_comm"]   # halved
    hooks.clear()

Hooks apply wherever the Term is built (estimate, explain, sweep kernels). A hook
receives the strategy's ``Structure`` (structure.py: the categorical fields one kernel
serves), not the numbers: one compiled kernel serves every dp, tp, ... so a hook writes
its dependence on them with the symbols (``ndplan.symbols.tp``). In kernels the model
sizes are symbols too (``ndplan.symbols.MODEL_ARGS``: h, L, a, ...) and the spec a hook
receives records what it reads (readlog.py), so a hook that reads ``spec.hidden_size``
gets a kernel per hidden size and one that writes ``term.expr * 2`` shares it. The registry is read
once, when the Structure is built (``registered``); the builders apply the hooks the
Structure carries. While a hook is registered, compiled kernels are not written to or
read from the disk cache (a Python function has no stable identity across runs).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ndplan.terms import Breakdown

HookFn = Callable[[object, object, object], object]
"""``fn(term, spec, structure) -> Term | SymPy expression`` (SymPy and terms.py are imported
when a Breakdown is hooked, not with this registry: a cached sweep never imports SymPy)."""
_HOOKS: dict[str, HookFn] = {}
_SERIAL: dict[str, int] = {}
"""Registration number of each hook: two functions at one memory address (a replaced
lambda freed, a new one allocated there) never share a kernel cache key."""
_COUNT = [0]


def replace_term(key: str, fn: HookFn) -> None:
    """Build Term ``key`` as ``fn(default_term, model_spec, structure)`` from now on."""
    _COUNT[0] += 1
    _HOOKS[key], _SERIAL[key] = fn, _COUNT[0]


def clear() -> None:
    _HOOKS.clear()
    _SERIAL.clear()


def active() -> bool:
    return bool(_HOOKS)


def registered() -> tuple:
    """The registered hooks as ((key, registration number, fn), ...) sorted by key: what a
    Structure carries (the number makes its kernel key unique per registration)."""
    return tuple((k, _SERIAL[k], _HOOKS[k]) for k in sorted(_HOOKS))


def apply(bd: Breakdown, spec, view) -> Breakdown:
    """``bd`` with every Term hooked in ``view.hooks`` replaced (source notes the replacement)."""
    table = {key: fn for key, _, fn in view.hooks}
    if not table:
        return bd
    import sympy as sp
    from ndplan.terms import Breakdown, Term
    out = []
    for t in bd:
        fn = table.get(t.key)
        if fn is None:
            out.append(t)
            continue
        new = fn(t, spec, view)
        if not isinstance(new, Term):
            name = getattr(fn, "__qualname__", repr(fn))
            new = replace(t, expr=sp.sympify(new), source=f"user hook {name} (replaces: {t.source})")
        out.append(new)
    return Breakdown(tuple(out))
