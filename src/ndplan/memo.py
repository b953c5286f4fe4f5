"""Values remembered per object identity, for objects that are unhashable or costly to hash
(a model spec, an engine profile): the table holds the object itself, so an id reused after
the object is freed never answers for another one."""

from __future__ import annotations

from typing import Callable, Hashable, TypeVar

T = TypeVar("T")
LIMIT = 64
"""Objects a table keeps before it starts over (a process sees a few models and engines)."""


def by_identity(table: dict, obj: object, make: Callable[[], T], extra: Hashable = None) -> T:
    """``make()`` for ``obj`` (and ``extra``), computed once while ``obj`` is in ``table``."""
    key = (id(obj), extra)
    hit = table.get(key)
    if hit is None or hit[0] is not obj:
        if len(table) > LIMIT:
            table.clear()
        hit = table[key] = (obj, make())
    return hit[1]
