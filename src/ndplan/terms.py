"""Term and Breakdown: the contract every formula builder returns.

A Term is one named component (stable dotted key, SymPy expression, unit, source,
scope note). A Breakdown is an ordered collection of Terms; totals are Terms too, so
printing (explain), compiling (kernels) and PPB coefficients come from one object.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Iterator

import sympy as sp


@dataclass(frozen=True, kw_only=True)
class Term:
    key: str
    """Stable dotted key, e.g. ``mem.weights``."""
    expr: sp.Expr
    """Closed form over strategy (and, with --symbolic, model) symbols."""
    unit: str
    """``bytes``, ``s``, ``flop`` or ``count``."""
    source: str
    """Paper + table/equation, or the derivation."""
    note: str = ""
    """Scope: which device, stage, and what is included."""

    def subs(self, mapping: dict) -> "Term":
        return replace(self, expr=sp.sympify(self.expr).subs(mapping))


@dataclass(frozen=True)
class Breakdown:
    """Ordered Terms. ``total`` is the sum of the terms whose key starts with prefix."""

    terms: tuple[Term, ...] = field(default_factory=tuple)

    def __iter__(self) -> Iterator[Term]:
        return iter(self.terms)

    def __len__(self) -> int:
        return len(self.terms)

    def __getitem__(self, key: str) -> Term:
        for t in self.terms:
            if t.key == key:
                return t
        raise KeyError(f"no term {key!r}; have {', '.join(self.keys())}")

    def __contains__(self, key: str) -> bool:
        return any(t.key == key for t in self.terms)

    def keys(self) -> list[str]:
        return [t.key for t in self.terms]

    def select(self, prefix: str) -> "Breakdown":
        return Breakdown(tuple(t for t in self.terms if t.key.startswith(prefix)))

    def subs(self, mapping: dict) -> "Breakdown":
        return Breakdown(tuple(t.subs(mapping) for t in self.terms))

    def total(self, prefix: str = "") -> sp.Expr:
        return sp.Add(*[t.expr for t in self.terms if t.key.startswith(prefix)])

    def plus(self, more: Iterable[Term]) -> "Breakdown":
        return Breakdown(self.terms + tuple(more))
