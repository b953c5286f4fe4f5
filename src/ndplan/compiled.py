"""Compile a Breakdown into a vectorized numpy function, once per (breakdown, arguments).

    kernel = compile_breakdown(bd)              # arguments: symbols.STRATEGY_SYMBOLS
    out = kernel(dp=np.array([...]), tp=..., stage=np.arange(pp), ...)
    out["mem.weights"]   # broadcast to the common shape of the arguments

Arguments are floats; every output is broadcast to the arguments' common shape
(a constant term lambdifies to a scalar and is broadcast here). SymPy is imported only
to build a kernel: one found in the cache runs on numpy alone (argnames.py). The on-disk
cache of kernels, keyed by what built them, is kernels.py.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:
    import sympy as sp

    from ndplan.terms import Breakdown


CHUNK_ROWS = 32768
"""Rows per pass of a 1-D kernel call (see Kernel._chunked)."""


class Kernel:
    """A generated numpy function; ``args``: its argument names (symbol names), in order."""

    def __init__(self, keys: list[str], args: tuple[str, ...], fn: Callable):
        self.keys = keys
        self.args = args
        self._fn = fn

    def __call__(self, **values) -> dict[str, np.ndarray]:
        missing = [a for a in self.args if a not in values]
        if missing:
            raise TypeError(f"kernel needs values for {', '.join(missing)}")
        arrays = [np.asarray(values[a], dtype=float) for a in self.args]
        shape = np.broadcast_shapes(*[x.shape for x in arrays])
        if shape and math.prod(shape) > CHUNK_ROWS and all(x.ndim == 0 or x.shape[-1] == shape[-1] for x in arrays):
            return self._chunked(arrays, shape)
        return self._own(self._fn(*arrays), arrays, shape)

    def _own(self, outs, arrays: list[np.ndarray], shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        """Each output at ``shape``: the generated function's own array where it is new and
        unshared, else a read-only broadcast view (a Term equal to an argument returns the
        argument; common subexpressions return one array for several Terms)."""
        seen = {id(x) for x in arrays}
        out = {}
        for k, o in zip(self.keys, outs):
            if isinstance(o, np.ndarray) and o.shape == shape and o.dtype == float and id(o) not in seen:
                out[k] = o
            else:
                out[k] = np.broadcast_to(np.asarray(o, dtype=float), shape)
            seen.add(id(o))
        return out

    def _chunked(self, arrays: list[np.ndarray], shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        """Evaluate about CHUNK_ROWS elements at a time, in slices of the last axis: the
        temporaries of a long elementwise chain then stay in cache (measured 3-4x faster on
        1M rows than one pass). Arguments of fewer dimensions broadcast as numpy does (the
        sweep passes the stage as (stage sets, rows) beside (rows,) degrees)."""
        n = shape[-1]
        step = max(1, CHUNK_ROWS // math.prod(shape[:-1]))
        out = {k: np.empty(shape) for k in self.keys}
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            part = self._fn(*[x if x.ndim == 0 else x[..., lo:hi] for x in arrays])
            for k, o in zip(self.keys, part):
                out[k][..., lo:hi] = o
        return out


@lru_cache(maxsize=256)
def _compile(breakdown: Breakdown, args: tuple[sp.Symbol, ...]) -> Kernel:
    from ndplan.lambdify import lambdify
    return Kernel([t.key for t in breakdown], tuple(a.name for a in args), lambdify(args, _exprs(breakdown, args)))


def _exprs(breakdown: Breakdown, args: tuple[sp.Symbol, ...]) -> list:
    """The Terms' expressions, refused when a symbol is not among ``args``."""
    import sympy as sp
    exprs = [sp.sympify(t.expr) for t in breakdown]
    free = set().union(*[e.free_symbols for e in exprs]) - set(args)
    if free:
        raise ValueError(f"breakdown has symbols not among the kernel arguments: {sorted(map(str, free))}")
    return exprs


def compile_breakdown(breakdown: Breakdown, args: tuple[sp.Symbol, ...] | None = None) -> Kernel:
    """``args``: SymPy symbols (default symbols.STRATEGY_SYMBOLS)."""
    if args is None:
        from ndplan.symbols import STRATEGY_SYMBOLS as args
    return _compile(breakdown, tuple(args))
