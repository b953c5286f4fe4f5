"""SymPy expressions to numpy source: the one code generator of every kernel (kernels.py).

Its source is part of every kernel's key (kernels._EXPR_MODULES): what it prints is what a
cached or shipped kernel runs."""

from __future__ import annotations

import sympy as sp
from sympy.printing.numpy import NumPyPrinter


class _Max(sp.Function):
    """Max as an opaque function while the code is generated: the common-subexpression pass
    rebuilds every node it visits, and SymPy's Max/Min constructor compares each pair of
    arguments (assumption queries) even where formulas/minmax.py built it unevaluated. Printed
    as ``reduce(maximum, [...])`` (_WherePrinter._reduce)."""


class _Min(sp.Function):
    """Min likewise."""


def lambdify(args, exprs):
    """lambdify with common-subexpression elimination (about 4x faster kernels), Piecewise
    printed as nested numpy.where (4x faster than numpy.select), Max/Min kept opaque through
    the elimination (_Max)."""
    printer = _WherePrinter({"fully_qualified_modules": False, "inline": True, "allow_unknown_functions": True,
                             "user_functions": {}})  # lambdify's own settings for its numpy printer
    memo: dict = {}
    opaque = [_opaque(sp.sympify(e), memo) for e in exprs]
    # use_imps=False: no implemented_function is ever printed, and SymPy's search for them walks
    # every expression as a tree, not a graph (9.5 of the 40.7 s lambdify took in a profiled cold
    # README sweep, 290 kernels)
    return sp.lambdify(args, opaque, modules="numpy", cse=True, printer=printer, use_imps=False)


def _opaque(e: sp.Basic, memo: dict) -> sp.Basic:
    """``e`` with every Max/Min as _Max/_Min, the other nodes rebuilt unevaluated (SymPy's own
    ``replace`` rebuilds with the evaluating constructors: the time kernels of a llama3-70b
    sweep, every sixth group, were 15-22x slower to generate)."""
    hit = memo.get(e)
    if hit is not None:
        return hit
    if not e.args:
        out = e
    else:
        new = tuple(_opaque(a, memo) for a in e.args)
        if isinstance(e, sp.Max):
            out = _Max(*new)
        elif isinstance(e, sp.Min):
            out = _Min(*new)
        elif new == e.args:
            out = e
        else:
            try:
                out = e.func(*new, evaluate=False)
            except TypeError:  # a node without the keyword (ExprCondPair, Tuple)
                out = e.func(*new)
    memo[e] = out
    return out


class _WherePrinter(NumPyPrinter):
    def _print_Piecewise(self, expr):
        pieces = list(expr.args)
        out = "nan"  # no branch holds: as numpy.select's default
        if pieces[-1].cond == sp.true:
            out = self._print(pieces.pop().expr)
        for e, c in reversed(pieces):
            out = f"{self._module_format(self._module + '.where')}({self._print(c)}, {self._print(e)}, {out})"
        return out

    def _print__Max(self, expr):
        return self._reduce("maximum", expr.args)

    def _print__Min(self, expr):
        return self._reduce("minimum", expr.args)

    def _reduce(self, ufunc: str, args) -> str:
        """``reduce(maximum, [a, b, ...])``, written here rather than by SymPy's printer, whose
        Max varies with its version (1.12: amax over a tuple, 1.13: amax over asarray, which
        fails on a scalar beside an array or on arrays of different shapes; 1.14: this form)."""
        return (f"{self._module_format('functools.reduce')}({self._module_format(self._module + '.' + ufunc)}, "
                f"[{', '.join(self._print(a) for a in args)}])")
