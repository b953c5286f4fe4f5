"""Sane bounds for every count and number a user gives, and the checks that apply them.

One source for the ranges: Strategy, the catalogs, PPB layer files and the CLI option
types (cli_types.py) all call these, so a NaN, an infinity, a sign error or an
absurd size is refused with one line naming the field, before any work starts.

The bounds are generous ceilings, not model assumptions: they exist so that a typo
(``--gpus 99999999999999999999``) is an error instead of a 4e15 s step that "fits".
"""

from __future__ import annotations

import math
import numbers

from ndplan.errors import NdplanError

MAX_DEVICES = 2**20
"""Devices in one job, and the ceiling of every parallel degree: 1,048,576 (the largest
published training clusters are about 1e5 devices)."""
MAX_SEQ = 2**24
"""Sequence length, tokens: 16,777,216 (published long-context training stops near 1e7)."""
MAX_BATCH = 2**24
"""Global and micro batch, sequences."""
MAX_MODEL_DIM = 2**24
"""Any one model dimension (hidden, intermediate, vocabulary, heads, ranks, positions)."""
MAX_LAYERS = 2**14
"""Decoder layers of a model (the deepest published LLMs have about 1e2)."""
MAX_TOP = 1000
"""Ranked candidates detailed by ``sweep --top`` / proposals of ``check --top``; each is
re-estimated stage by stage."""
MAX_PP = 1024
"""PPB pipeline stages."""
MAX_MICROBATCHES = 2**16
"""PPB micro-batches per step (the op DAG has 3 x pp x vpp x m ops)."""
MAX_TIME_LIMIT_S = 86400.0
"""CP-SAT wall-clock limit: one day."""
MAX_WORKERS = 256
MAX_GIB = 2.0**20
"""A memory size in GiB (1 PiB)."""
MAX_ELEMENTS = 2**40
"""Element counts of one device's buffers or budgets (about 1.1e12): no device holds more
parameters. A framework setting above it is either refused (a count the user must have
mistyped) or, where the framework reads a huge value as "no limit", taken as this."""


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _num(x: float) -> str:
    """A bound as a user reads it: 1,048,576 rather than 1.04858e+06."""
    return f"{int(x):,}" if math.isfinite(x) and float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def count(field: str, v, lo: int = 1, hi: int = MAX_DEVICES, what: str = "") -> int:
    """An integer in lo..hi (a float that is a whole number is accepted as one)."""
    if _is_number(v) and not isinstance(v, numbers.Integral) and math.isfinite(v) and float(v).is_integer():
        v = int(v)
    if not (_is_number(v) and isinstance(v, numbers.Integral)):
        raise NdplanError(field, v, "not an integer", f"give {what or 'a whole number'} in {lo}..{hi:,}")
    if not lo <= v <= hi:
        raise NdplanError(field, int(v), f"out of range {lo}..{hi:,}",
                          f"give {what or 'a whole number'} in that range")
    return int(v)


def real(field: str, v, lo: float = 0.0, hi: float = math.inf, *, lo_open: bool = True, hi_open: bool = False,
         what: str = "a number") -> float:
    """A finite float in (lo, hi] (or [lo, hi] / (lo, hi) per the flags)."""
    rng = f"{'(' if lo_open else '['}{_num(lo)}, {_num(hi)}{')' if hi_open else ']'}"
    if not _is_number(v):
        raise NdplanError(field, v, "not a number", f"give {what} in {rng}")
    x = float(v)
    if not math.isfinite(x):
        raise NdplanError(field, v, "not a finite number", f"give {what} in {rng}")
    below = x <= lo if lo_open else x < lo
    above = x >= hi if hi_open else x > hi
    if below or above:
        raise NdplanError(field, v, f"outside {rng}", f"give {what} in that range")
    return x


def fraction(field: str, v) -> float:
    """An efficiency or share in (0, 1]."""
    return real(field, v, 0.0, 1.0, what="a fraction")


def gib(field: str, v, lo_open: bool = True) -> float:
    """A memory size in GiB: finite, > 0 (>= 0 with lo_open=False), at most MAX_GIB."""
    return real(field, v, 0.0, MAX_GIB, lo_open=lo_open, what="a size in GiB")
