"""Units: bytes use binary prefixes, counts and FLOPs decimal.

Every number ndplan stores is in base units (bytes, seconds, FLOPs, FLOP/s).
"""

KIB = 2**10
MIB = 2**20
GIB = 2**30
TIB = 2**40

KILO = 10**3
MEGA = 10**6
GIGA = 10**9
TERA = 10**12

# Bytes per element of each dtype ndplan models.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def fmt_bytes(n: float) -> str:
    """Binary-prefixed bytes: 1536 -> '1.50 KiB'."""
    n = float(n)
    for unit, scale in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_count(n: float) -> str:
    """Decimal-prefixed count: 8_030_261_248 -> '8.03 B'."""
    n = float(n)
    for unit, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f}"


def fmt_seconds(t: float) -> str:
    t = float(t)
    if abs(t) < 5e-10:
        return "0 s"
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.3f} us"
