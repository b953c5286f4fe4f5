"""Max and Min as the formulas write them.

SymPy's Max/Min drop redundant arguments by comparing every pair (assumption queries,
factoring): with the model sizes as symbols (kernels.model_kernel) that was 37 % of a
cold kernel build (a llama3-8b interleaved/selective sweep, 16 groups: 14.6 s -> 9.2 s,
every peak and step time equal). Here arguments that are all numbers give a number;
otherwise the Max/Min stays unevaluated (lambdify prints numpy.maximum/minimum, and
xreplace or subs with numbers evaluates it).
"""

from __future__ import annotations

import sympy as sp


def _args(args):
    return [sp.sympify(a) for a in args]


def Max(*args) -> sp.Expr:
    a = _args(args)
    return sp.Max(*a) if all(x.is_Number for x in a) else sp.Max(*a, evaluate=False)


def Min(*args) -> sp.Expr:
    a = _args(args)
    return sp.Min(*a) if all(x.is_Number for x in a) else sp.Min(*a, evaluate=False)
