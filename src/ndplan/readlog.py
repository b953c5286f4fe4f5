"""A ModelSpec that records what a builder read from it.

Kernels are built with the model sizes as symbols (symbols.ModelSymbols.symbolic) and
the sizes passed as kernel arguments, so one kernel serves every model the builder
cannot tell apart. What it can tell apart is exactly what it read from the spec: the
builder receives a ``ReadLog`` and every attribute it reads (a field, or a property such
as ``is_moe`` or ``layer_pattern``, taken on the real spec) is recorded with its value.
A builder is a deterministic function of what it read (and of the Structure and the
ndplan sources, which are in the kernel key), so a second model with the same values
for the same attribute names gets the same expressions: kernels.model_kernel keys the
stored kernel by those names and values.

Methods are refused (their arguments and results are not recorded); builders read
fields and properties only, or call a function of the model alone marked ``@derived``
(recorded as one read under "module:name", its result the value: e.g. which layer kind
is largest, a comparison of sizes whose answer is shared by models of different sizes).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable


class ReadLog:
    """Wraps a ModelSpec; ``names()`` lists the attributes read, in first-read order."""

    __slots__ = ("_spec", "_reads")

    def __init__(self, spec):
        object.__setattr__(self, "_spec", spec)
        object.__setattr__(self, "_reads", {})

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._spec, name)
        if callable(value) and not isinstance(value, type):
            raise TypeError(f"kernel builders read fields and properties of a model, not its methods ({name})")
        self._reads.setdefault(name, value)
        return value

    def __setattr__(self, name, value):
        raise AttributeError("a model is read-only to kernel builders")

    def names(self) -> tuple[str, ...]:
        return tuple(self._reads)

    def __repr__(self) -> str:
        return f"ReadLog({self._spec.name})"


def derived(fn: Callable) -> Callable:
    """Mark ``fn(spec)``, a function of the model alone, as one recorded read."""
    name = f"{fn.__module__}:{fn.__qualname__}"

    @functools.wraps(fn)
    def read(spec):
        if isinstance(spec, ReadLog):
            value = fn(spec._spec)
            spec._reads.setdefault(name, value)
            return value
        return fn(spec)
    return read


def _value(spec, name: str):
    if ":" in name:  # a @derived function, "module:qualname"
        module, _, qual = name.partition(":")
        return getattr(importlib.import_module(module), qual)(spec)
    return getattr(spec, name)


def values_of(spec, names: tuple[str, ...], derived: dict[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """(name, repr(value)) of ``spec`` for ``names``: the model part of a kernel key
    (each value remembered per spec: a sweep asks for 300 kernels' keys). ``derived``: the
    values of @derived reads already known for this spec (kernels.py keeps them on disk:
    computing one imports the formulas and SymPy); the ones computed here are added to it."""
    return tuple((n, _shown(spec, n, derived)) for n in names)


def _shown(spec, name: str, derived: dict[str, str] | None = None) -> str:
    if derived is not None and ":" in name:
        if name not in derived:
            derived[name] = _shown(spec, name)
        return derived[name]
    try:
        return _shown_memo(spec, name)
    except TypeError:  # a spec with an unhashable field
        return repr(_value(spec, name))


_shown_memo = functools.lru_cache(maxsize=4096)(lambda spec, name: repr(_value(spec, name)))
