"""Compile a Breakdown into a vectorized numpy function, once per (breakdown, arguments).

    kernel = compile_breakdown(bd)              # arguments: symbols.STRATEGY_SYMBOLS
    out = kernel(dp=np.array([...]), tp=..., stage=np.arange(pp), ...)
    out["mem.weights"]   # broadcast to the common shape of the arguments

Arguments are floats; every output is broadcast to the arguments' common shape
(a constant term lambdifies to a scalar and is broadcast here).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import numpy as np
import sympy as sp

from ndplan.symbols import STRATEGY_SYMBOLS
from ndplan.terms import Breakdown


class Kernel:
    def __init__(self, keys: list[str], args: tuple[sp.Symbol, ...], fn: Callable):
        self.keys = keys
        self.args = args
        self._fn = fn

    def __call__(self, **values) -> dict[str, np.ndarray]:
        missing = [a.name for a in self.args if a.name not in values]
        if missing:
            raise TypeError(f"kernel needs values for {', '.join(missing)}")
        arrays = [np.asarray(values[a.name], dtype=float) for a in self.args]
        shape = np.broadcast_shapes(*[x.shape for x in arrays])
        outs = self._fn(*arrays)
        return {k: np.broadcast_to(np.asarray(o, dtype=float), shape) for k, o in zip(self.keys, outs)}


@lru_cache(maxsize=256)
def _compile(breakdown: Breakdown, args: tuple[sp.Symbol, ...]) -> Kernel:
    exprs = [sp.sympify(t.expr) for t in breakdown]
    free = set().union(*[e.free_symbols for e in exprs]) - set(args)
    if free:
        raise ValueError(f"breakdown has symbols not among the kernel arguments: {sorted(map(str, free))}")
    fn = sp.lambdify(args, exprs, modules="numpy", cse=True)
    return Kernel([t.key for t in breakdown], args, fn)


def compile_breakdown(breakdown: Breakdown, args: tuple[sp.Symbol, ...] = STRATEGY_SYMBOLS) -> Kernel:
    return _compile(breakdown, tuple(args))
