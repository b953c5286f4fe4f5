"""Compile a Breakdown into a vectorized numpy function, once per (breakdown, arguments).

    kernel = compile_breakdown(bd)              # arguments: symbols.STRATEGY_SYMBOLS
    out = kernel(dp=np.array([...]), tp=..., stage=np.arange(pp), ...)
    out["mem.weights"]   # broadcast to the common shape of the arguments

Arguments are floats; every output is broadcast to the arguments' common shape
(a constant term lambdifies to a scalar and is broadcast here).
"""

from __future__ import annotations

import functools
import math
from functools import lru_cache
from typing import Callable

import numpy as np
import sympy as sp

from ndplan import prebuilt
from ndplan.lambdify import lambdify
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
        if shape and math.prod(shape) > CHUNK_ROWS and all(x.ndim == 0 or x.shape[-1] == shape[-1] for x in arrays):
            return self._chunked(arrays, shape)
        outs = self._fn(*arrays)
        return {k: np.broadcast_to(np.asarray(o, dtype=float), shape) for k, o in zip(self.keys, outs)}

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
    exprs = [sp.sympify(t.expr) for t in breakdown]
    free = set().union(*[e.free_symbols for e in exprs]) - set(args)
    if free:
        raise ValueError(f"breakdown has symbols not among the kernel arguments: {sorted(map(str, free))}")
    return Kernel([t.key for t in breakdown], args, lambdify(args, exprs))


def compile_breakdown(breakdown: Breakdown, args: tuple[sp.Symbol, ...] = STRATEGY_SYMBOLS) -> Kernel:
    return _compile(breakdown, tuple(args))


# ----------------------------------------------------------------- on-disk kernel cache
#
# A sweep compiles one memory and one time kernel per categorical group (about 130 for a
# dense model on 1024 devices). Building the SymPy Breakdown and lambdifying it costs
# about 0.1 s each; the generated numpy source is cached on disk, keyed by everything
# the expressions depend on (the ndplan formula sources, the model, the categorical
# strategy fields, the argument names), so a later run execs the
# stored source and never touches SymPy. Behind the disk cache is the store of kernels
# shipped with the package (prebuilt.py): a first run of a catalog class finds its
# kernels there and copies them into the disk cache.

import hashlib
import importlib.util
import inspect
from collections import OrderedDict
import json
import marshal
import os
import sys
import threading
from pathlib import Path

_PKG = Path(__file__).resolve().parent
_SOURCES_DIGEST: str | None = None
#: Modules whose code decides a kernel's expressions (the CLI and reports do not).
_EXPR_MODULES = ("formulas", "catalog", "engines.py", "engine_fields.py", "torch_facts.py", "units.py", "vocab.py",
                 "symbols.py", "strategy.py", "structure.py", "layouts.py", "terms.py", "lambdify.py", "estimate.py",
                 "readlog.py")
"""Modules whose sources are in every kernel's key: the builders, what they read, the Breakdowns
estimate.py asks of them, and the code printer (lambdify.py)."""
_VALUE_FREE_MODULES = ("errors.py", "limits.py", "paths.py", "rules.py", "hooks.py", "kernels.py", "prebuilt.py")
"""Modules the formulas import that decide no expression: messages, input bounds, catalog paths,
validity rules (they reject strategies, never change a Term), hooks (each hook is in the key), and
the kernel cache and the shipped store (they store and look up what lambdify.py prints, under keys
that name the view, the model's reads and the sources above)."""
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
    """sha256 of the expression modules' paths and bytes: the part of every kernel key that
    says which formulas built it. The Python version is not in it (the stored source is plain
    Python, and the kernels shipped with the package, prebuilt.py, serve every version); it
    names the marshalled code files instead (_code_path)."""
    global _SOURCES_DIGEST
    if _SOURCES_DIGEST is None:
        h = hashlib.sha256()
        for p in sorted(_PKG.rglob("*.py")):
            if p.relative_to(_PKG).parts[0] not in _EXPR_MODULES:
                continue
            h.update(p.relative_to(_PKG).as_posix().encode())
            h.update(p.read_bytes())
        _SOURCES_DIGEST = h.hexdigest()
    return _SOURCES_DIGEST


_BASE_NAMESPACE: dict = {}


def _namespace() -> dict:
    """A fresh copy of the generated code's globals (numpy's functions and constants, reduce,
    numpy): built once per process, copied per kernel (a star import per kernel cost 0.6 ms)."""
    if not _BASE_NAMESPACE:  # numpy's loaded public names: a star import also loads its lazy submodules (0.1 s)
        _BASE_NAMESPACE.update({k: v for k, v in vars(np).items() if not k.startswith("_")})
        _BASE_NAMESPACE.update(numpy=np, reduce=functools.reduce)
    return dict(_BASE_NAMESPACE)


_CODE_TAG = f"{sys.implementation.cache_tag}-{importlib.util.MAGIC_NUMBER.hex()}"
"""The interpreter and bytecode version: marshalled code only loads under the Python that wrote it."""


def _code_path(path: Path) -> Path:
    return path.with_name(f"{path.stem}.{_CODE_TAG}.code")


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


def _load(digest: str, names: tuple[str, ...], use_disk: bool, use_store: bool = True) -> Kernel | None:
    """The kernel stored under ``digest`` (memory, then disk, then, with ``use_store``, the
    shipped store), or None."""
    if digest in _MEMORY:
        _MEMORY.move_to_end(digest)
        return _MEMORY[digest]
    if not use_disk:
        return None
    path = cache_dir() / f"{digest}.json"
    if path.exists():
        try:
            data = json.loads(path.read_text())
            code_path = _code_path(path)
            if code_path.exists():
                code = marshal.loads(code_path.read_bytes())
            else:  # written by another Python: compile once, and keep this Python's code
                code = _store(path, data["keys"], data["source"], json_too=False)
            return _remember(digest, _from_source(data["keys"], names, data["source"], code))
        except (OSError, ValueError, KeyError, SyntaxError, EOFError, TypeError):
            pass  # a corrupt entry is rebuilt (or taken from the prebuilt store)
    data = prebuilt.entry(digest) if use_store else None
    if data is None:
        return None
    code = _store(path, data["keys"], data["source"])  # later runs load its marshalled code
    return _remember(digest, _from_source(data["keys"], names, data["source"], code))


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}-{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _build(bd: Breakdown, args: tuple[sp.Symbol, ...], digest: str, use_disk: bool) -> Kernel:
    """Lambdify ``bd`` over ``args``, remember it, and store its source (and code) on disk."""
    exprs = [sp.sympify(t.expr) for t in bd]
    free = set().union(*[e.free_symbols for e in exprs]) - set(args)
    if free:
        raise ValueError(f"breakdown has symbols not among the kernel arguments: {sorted(map(str, free))}")
    source = inspect.getsource(lambdify(args, exprs))
    code = _store(cache_dir() / f"{digest}.json", bd.keys(), source) if use_disk else None
    return _remember(digest, _from_source(bd.keys(), tuple(a.name for a in args), source, code))


def _store(path: Path, keys: list[str], source: str, json_too: bool = True):
    """Compile a kernel's source; write its marshalled code (and, with ``json_too``, the
    source) to the disk cache. Returns the code object."""
    code = compile(source, "<ndplan-kernel>", "exec")
    try:  # the code first: a reader that finds the .json finds its code
        _write_atomic(_code_path(path), marshal.dumps(code))
        if json_too:
            _write_atomic(path, json.dumps({"keys": keys, "source": source}).encode())
    except OSError:
        pass  # a read-only cache only costs speed
    return code


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


def _disk_read_sets(path: Path) -> list[tuple[str, ...]]:
    try:
        return [tuple(x) for x in json.loads(path.read_text())] if path.exists() else []
    except (OSError, ValueError, TypeError):
        return []


def _read_sets(base: str, use_disk: bool) -> list[tuple[str, ...]]:
    """The name lists read under ``base`` that the disk cache knows."""
    if base not in _READ_SETS:
        _READ_SETS[base] = _disk_read_sets(cache_dir() / f"reads-{base}.json") if use_disk else []
    return _READ_SETS[base]


def _add_read_set(base: str, read: tuple[str, ...], use_disk: bool) -> None:
    sets = _read_sets(base, use_disk)
    if read in sets:
        return
    sets.append(read)
    if use_disk:  # merged with the file as it is now, under a lock: another process may add a list
        path = cache_dir() / f"reads-{base}.json"
        try:
            with _locked(path.with_suffix(".lock")):
                on_disk = _disk_read_sets(path)
                _write_atomic(path, json.dumps(on_disk + [s for s in sets if s not in on_disk]).encode())
        except OSError:
            pass


class _locked:
    """An exclusive lock on ``path`` (fcntl; where there is none, no lock: a lost read list
    costs a rebuild, never a wrong kernel)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR)
        try:
            import fcntl
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except ImportError:
            pass
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # closing releases the lock


_ARG_VALUES: dict[int, tuple[object, dict[str, float]]] = {}


def _arg_values(spec, fn: Callable) -> dict[str, float]:
    """``fn(spec)`` (symbols.model_arg_values), remembered for the last few specs."""
    hit = _ARG_VALUES.get(id(spec))
    if hit is None or hit[0] is not spec:
        if len(_ARG_VALUES) > 64:
            _ARG_VALUES.clear()
        hit = _ARG_VALUES[id(spec)] = (spec, fn(spec))
    return hit[1]


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
    bound = _arg_values(spec, model_arg_values)
    known = _read_sets(base, use_disk)
    for read in known:  # memory and disk under every name list seen: a miss here opens no store
        kernel = _load(_digest(base, values_of(spec, read)), names, use_disk, use_store=False)
        if kernel is not None:
            return BoundKernel(kernel, bound)
    # the shipped store, only when neither has it (a warm run probing other models' name lists
    # opened it on every miss: 0.2 s of DeepSeek-V3's 131,072-device sweep)
    shipped = [r for r in (prebuilt.read_sets(base) if use_disk else []) if r not in known]
    for read in (known + shipped) if use_disk else []:
        kernel = _load(_digest(base, values_of(spec, read)), names, use_disk)
        if kernel is not None:
            _add_read_set(base, read, use_disk)
            return BoundKernel(kernel, bound)
    _announce()
    log = ReadLog(spec)
    from ndplan.symbols import ModelSymbols
    bd = build(log, ModelSymbols.symbolic())
    read = log.names()
    kernel = _build(bd, full_args, _digest(base, values_of(spec, read)), use_disk)
    _add_read_set(base, read, use_disk)
    return BoundKernel(kernel, bound)
