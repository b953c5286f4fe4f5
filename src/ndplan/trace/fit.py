"""The exact polynomial behind traced bytes: per site, bytes as a sum of monomials in the
micro-batch ``b``, the sequence ``s`` and the model's sizes, with integer coefficients
(bytes per element of each tensor class).

Every saved tensor is a product of a few sizes: tokens (b*s) times one width (h, f, V, E,
...) or a head product (a*d, kv*d, a*dv, k*fe, ...); the attention scores b*a*s^2; rotary
tables s*d; a few per-token or per-sequence scalars. ``basis`` lists those monomials for the
sizes an architecture has. ``fit`` solves the least-squares system over traced shapes,
rounds each coefficient to the integer it is (bytes), and checks the result exactly at
shapes that were not in the fit; a residual there means the basis is missing a tensor
class, and is reported, never hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sympy as sp

b_sym, s_sym = sp.symbols("b s", positive=True, integer=True)

PAIRS = (("a", "d"), ("kv", "d"), ("a", "dn"), ("a", "dr"), ("a", "dv"), ("k", "h"), ("k", "fe"),
         ("k", "f"), ("ns", "fe"), ("k", "E"))
"""Head and expert products that size one tensor (heads x head dim, routed pairs x width)."""


def symbols_for(names) -> dict[str, sp.Symbol]:
    return {n: sp.Symbol(n, positive=True, integer=True) for n in names}


def basis(names) -> list[sp.Expr]:
    """Candidate monomials for an architecture with the size symbols ``names``."""
    S = symbols_for(names)
    b, s = b_sym, s_sym
    out = [sp.Integer(1), b, s, s * s, b * s, b * s * s]
    out += [b * s * S[n] for n in names]
    out += [b * s * S[x] * S[y] for x, y in PAIRS if x in S and y in S]
    if "a" in S:
        out.append(b * s * s * S["a"])
    out += [s * S[n] for n in ("d", "dr") if n in S]
    return out


@dataclass(frozen=True)
class Fit:
    expr: sp.Expr
    """Bytes as a polynomial in b, s and the size symbols."""
    max_rel_error: float
    """Largest |traced - polynomial| / traced over all traced shapes (0 = exact)."""
    max_abs_error: int
    """The same in bytes."""
    exact: bool
    """Every traced shape within ``SCALAR_BYTES`` of the polynomial."""


SCALAR_BYTES = 64
"""Tolerance for 'exact': a few scalars (loss, counters) that exist at some shapes only."""


def _monomial_value(m: sp.Expr, point: dict) -> int:
    """A monomial (product of symbols with integer powers) at integer sizes, in exact integers."""
    out = 1
    for factor in sp.Mul.make_args(m):
        base, power = factor.as_base_exp()
        out *= int(base) ** int(power) if base.is_Number else int(point[base]) ** int(power)
    return out


def _row(monos, point: dict) -> list[int]:
    return [_monomial_value(m, point) for m in monos]


def fit(monos: list[sp.Expr], points: list[dict], values: list[int], held_points: list[dict],
        held_values: list[int]) -> Fit:
    """Integer coefficients of ``monos`` that reproduce ``values`` at ``points``, checked at
    the held-out points."""
    rows = [_row(monos, p) for p in points]
    A = np.array(rows, dtype=float)
    y = np.array(values, dtype=float)
    scale = np.maximum(np.abs(A).max(axis=0), 1.0)
    coef, *_ = np.linalg.lstsq(A / scale, y, rcond=None)
    coef = coef / scale
    rounded = [int(round(c)) for c in coef]  # bytes per element of a tensor class: whole numbers
    expr = sp.Add(*[sp.Integer(c) * m for c, m in zip(rounded, monos) if c != 0])
    rel, absolute = 0.0, 0
    for row, v in zip([_row(monos, p) for p in held_points] + rows, held_values + values):
        err = abs(sum(c * x for c, x in zip(rounded, row)) - v)
        absolute = max(absolute, err)
        rel = max(rel, err / max(abs(v), 1))
    return Fit(expr=sp.expand(expr), max_rel_error=rel, max_abs_error=absolute, exact=absolute <= SCALAR_BYTES)
