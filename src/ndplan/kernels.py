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


CHUNK_ROWS = 32768
"""Rows per pass of a 1-D kernel call (see Kernel._chunked)."""


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
        if len(shape) == 1 and shape[0] > CHUNK_ROWS and all(x.ndim == 0 or x.shape == shape for x in arrays):
            return self._chunked(arrays, shape[0])
        outs = self._fn(*arrays)
        return {k: np.broadcast_to(np.asarray(o, dtype=float), shape) for k, o in zip(self.keys, outs)}

    def _chunked(self, arrays: list[np.ndarray], n: int) -> dict[str, np.ndarray]:
        """Evaluate CHUNK_ROWS rows at a time: the temporaries of a long elementwise
        chain then stay in cache (measured 3-4x faster on 1M rows than one pass)."""
        out = {k: np.empty(n) for k in self.keys}
        for lo in range(0, n, CHUNK_ROWS):
            hi = min(n, lo + CHUNK_ROWS)
            part = self._fn(*[x if x.ndim == 0 else x[lo:hi] for x in arrays])
            for k, o in zip(self.keys, part):
                out[k][lo:hi] = o
        return out


@lru_cache(maxsize=256)
def _compile(breakdown: Breakdown, args: tuple[sp.Symbol, ...]) -> Kernel:
    exprs = [sp.sympify(t.expr) for t in breakdown]
    free = set().union(*[e.free_symbols for e in exprs]) - set(args)
    if free:
        raise ValueError(f"breakdown has symbols not among the kernel arguments: {sorted(map(str, free))}")
    return Kernel([t.key for t in breakdown], args, _lambdify(args, exprs))


def _lambdify(args, exprs):
    """lambdify with common-subexpression elimination (about 4x faster kernels) and
    Piecewise printed as nested numpy.where (4x faster than numpy.select)."""
    printer = _WherePrinter({"fully_qualified_modules": False, "inline": True, "allow_unknown_functions": True,
                             "user_functions": {}})  # lambdify's own settings for its numpy printer
    return sp.lambdify(args, exprs, modules="numpy", cse=True, printer=printer)


from sympy.printing.numpy import NumPyPrinter  # noqa: E402


class _WherePrinter(NumPyPrinter):
    def _print_Piecewise(self, expr):
        pieces = list(expr.args)
        out = "nan"  # no branch holds: as numpy.select's default
        if pieces[-1].cond == sp.true:
            out = self._print(pieces.pop().expr)
        for e, c in reversed(pieces):
            out = f"{self._module_format(self._module + '.where')}({self._print(c)}, {self._print(e)}, {out})"
        return out


def compile_breakdown(breakdown: Breakdown, args: tuple[sp.Symbol, ...] = STRATEGY_SYMBOLS) -> Kernel:
    return _compile(breakdown, tuple(args))


# ----------------------------------------------------------------- on-disk kernel cache
#
# A sweep compiles one memory and one time kernel per categorical group (about 130 for a
# dense model on 1024 devices). Building the SymPy Breakdown and lambdifying it costs
# about 0.1 s each; the generated numpy source is cached on disk, keyed by everything
# the expressions depend on (the ndplan formula sources, the model, the categorical
# strategy fields, the argument names, the Python version), so a later run execs the
# stored source and never touches SymPy.

import hashlib
import inspect
from collections import OrderedDict
import json
import marshal
import os
import sys
from pathlib import Path

_PKG = Path(__file__).resolve().parent
_SOURCES_DIGEST: str | None = None
#: Modules whose code decides a kernel's expressions (the CLI and reports do not).
_EXPR_MODULES = ("formulas", "catalog", "engines.py", "engine_fields.py", "torch_facts.py", "units.py", "vocab.py",
                 "symbols.py", "strategy.py", "structure.py", "layouts.py", "terms.py", "kernels.py", "estimate.py", "sweep.py",
                 "readlog.py")
_VALUE_FREE_MODULES = ("errors.py", "limits.py", "paths.py", "rules.py", "hooks.py")
"""Modules the formulas import that decide no expression: messages, input bounds, catalog paths,
validity rules (they reject strategies, never change a Term) and hooks (each hook is in the key)."""
MEMORY_KERNELS = 2048
"""Kernels kept in memory, least recently used dropped first (a 1024-device sweep of a
dense model builds about 270; one kernel is a few kB of code)."""
_MEMORY: "OrderedDict[str, Kernel]" = OrderedDict()
_COMPILE_LISTENERS: list[Callable[[], None]] = []
"""Called before each kernel is built from SymPy (a cache miss); the CLI prints progress."""


class compile_listener:
    """``with compile_listener(fn):`` calls ``fn()`` before each kernel compile."""

    def __init__(self, fn: Callable[[], None]):
        self.fn = fn

    def __enter__(self):
        _COMPILE_LISTENERS.append(self.fn)
        return self

    def __exit__(self, *exc):
        _COMPILE_LISTENERS.remove(self.fn)


def cache_dir() -> Path:
    """``$NDPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/ndplan/kernels`` (``~/.cache``)."""
    env = os.environ.get("NDPLAN_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ndplan" / "kernels"


def _sources_digest() -> str:
    global _SOURCES_DIGEST
    if _SOURCES_DIGEST is None:
        h = hashlib.sha256(sys.version.encode())
        for p in sorted(_PKG.rglob("*.py")):
            if p.relative_to(_PKG).parts[0] not in _EXPR_MODULES:
                continue
            h.update(p.relative_to(_PKG).as_posix().encode())
            h.update(p.read_bytes())
        _SOURCES_DIGEST = h.hexdigest()
    return _SOURCES_DIGEST


def _namespace() -> dict:
    ns: dict = {}
    exec("from numpy import *\nfrom functools import reduce\nimport numpy", ns)  # noqa: S102
    return ns


def _from_source(keys: list[str], args: tuple[str, ...], source: str, code=None) -> Kernel:
    """A Kernel from generated source, or from its compiled code object when given
    (marshalled next to the source: skips Python's compile, 1 ms per kernel)."""
    ns = _namespace()
    exec(code if code is not None else compile(source, "<ndplan-kernel>", "exec"), ns)  # noqa: S102
    fn = ns["_lambdifygenerated"]
    return Kernel(keys, tuple(sp.Symbol(a) for a in args), fn)


def _digest(*parts) -> str:
    return hashlib.sha256(json.dumps([_sources_digest(), *parts]).encode()).hexdigest()[:32]


def _remember(digest: str, kernel: Kernel) -> Kernel:
    _MEMORY[digest] = kernel
    while len(_MEMORY) > MEMORY_KERNELS:
        _MEMORY.popitem(last=False)
    return kernel


def _load(digest: str, names: tuple[str, ...], use_disk: bool) -> Kernel | None:
    """The kernel stored under ``digest`` (memory, then disk), or None."""
    if digest in _MEMORY:
        _MEMORY.move_to_end(digest)
        return _MEMORY[digest]
    path = cache_dir() / f"{digest}.json"
    if not (use_disk and path.exists()):
        return None
    try:
        data = json.loads(path.read_text())
        code_path = path.with_suffix(".code")  # same Python: sys.version is in the digest
        code = marshal.loads(code_path.read_bytes()) if code_path.exists() else None
        return _remember(digest, _from_source(data["keys"], names, data["source"], code))
    except (OSError, ValueError, KeyError, SyntaxError, EOFError, TypeError):
        return None  # a corrupt entry is rebuilt


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _build(bd: Breakdown, args: tuple[sp.Symbol, ...], digest: str, use_disk: bool) -> Kernel:
    """Lambdify ``bd`` over ``args``, remember it, and store its source (and code) on disk."""
    exprs = [sp.sympify(t.expr) for t in bd]
    free = set().union(*[e.free_symbols for e in exprs]) - set(args)
    if free:
        raise ValueError(f"breakdown has symbols not among the kernel arguments: {sorted(map(str, free))}")
    source = inspect.getsource(_lambdify(args, exprs))
    kernel = _from_source(bd.keys(), tuple(a.name for a in args), source)
    if use_disk:
        try:  # the code first: a reader that finds the .json finds its code
            path = cache_dir() / f"{digest}.json"
            _write_atomic(path.with_suffix(".code"), marshal.dumps(compile(source, "<ndplan-kernel>", "exec")))
            _write_atomic(path, json.dumps({"keys": bd.keys(), "source": source}).encode())
        except OSError:
            pass  # a read-only cache only costs speed
    return _remember(digest, kernel)


def _announce() -> None:
    for fn in list(_COMPILE_LISTENERS):
        fn()


def cached_kernel(key: object, build: Callable[[], Breakdown], args: tuple[sp.Symbol, ...] = STRATEGY_SYMBOLS,
                  use_disk: bool = True) -> Kernel:
    """The kernel of ``build()``, compiled once per ``key`` (memory, then disk).

    ``key`` must determine the Breakdown given the ndplan sources: build it with
    structure.kernel_key, from the Structure the builder receives. ``use_disk=False``
    for Breakdowns with user hooks (a function has no identity across runs)."""
    from ndplan import hooks
    names = tuple(a.name for a in args)
    use_disk = use_disk and not hooks.active()
    digest = _digest(repr(key), names)
    kernel = _load(digest, names, use_disk)
    if kernel is None:
        _announce()
        kernel = _build(build(), args, digest, use_disk)
    return kernel


class BoundKernel:
    """A kernel over strategy (and hardware) and model symbols with the model's sizes bound."""

    def __init__(self, kernel: Kernel, model_values: dict[str, float]):
        self.kernel = kernel
        self.keys = kernel.keys
        self.model_values = model_values

    def __call__(self, **values) -> dict[str, np.ndarray]:
        return self.kernel(**values, **self.model_values)


_READ_SETS: dict[str, list[tuple[str, ...]]] = {}
"""Per model-free kernel key: the attribute-name lists builders have read (readlog.py)."""


def _read_sets(base: str, use_disk: bool) -> list[tuple[str, ...]]:
    if base not in _READ_SETS:
        sets: list[tuple[str, ...]] = []
        path = cache_dir() / f"reads-{base}.json"
        if use_disk and path.exists():
            try:
                sets = [tuple(x) for x in json.loads(path.read_text())]
            except (OSError, ValueError, TypeError):
                sets = []
        _READ_SETS[base] = sets
    return _READ_SETS[base]


def model_kernel(spec, key: object, build: Callable, args: tuple[sp.Symbol, ...], use_disk: bool = True
                 ) -> BoundKernel:
    """The kernel of ``build(spec_log, M)`` with the model sizes as kernel arguments, shared
    by every model that agrees with ``spec`` on what the builder read (readlog.py).

    ``key``: the model-free part (structure.kernel_key(None, view, ...)); ``build`` gets a
    readlog.ReadLog of the spec and the symbolic ModelSymbols. The stored kernel is keyed
    by ``key`` and the names and values of the attributes the build read; a lookup tries
    each name list seen under ``key`` with this model's values."""
    from ndplan import hooks
    from ndplan.readlog import ReadLog, values_of
    from ndplan.symbols import MODEL_ARGS, model_arg_values
    use_disk = use_disk and not hooks.active()
    full_args = tuple(args) + MODEL_ARGS
    names = tuple(a.name for a in full_args)
    base = _digest(repr(key), names)
    bound = model_arg_values(spec)
    for read in _read_sets(base, use_disk):
        kernel = _load(_digest(base, values_of(spec, read)), names, use_disk)
        if kernel is not None:
            return BoundKernel(kernel, bound)
    _announce()
    log = ReadLog(spec)
    from ndplan.symbols import ModelSymbols
    bd = build(log, ModelSymbols.symbolic())
    read = log.names()
    kernel = _build(bd, full_args, _digest(base, values_of(spec, read)), use_disk)
    sets = _read_sets(base, use_disk)
    if read not in sets:
        sets.append(read)
        if use_disk:
            try:
                _write_atomic(cache_dir() / f"reads-{base}.json", json.dumps(sets).encode())
            except OSError:
                pass
    return BoundKernel(kernel, bound)
