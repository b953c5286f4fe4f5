"""The dimensions of a design space and how a space is written: a YAML file or CLI flags
(``dim: value | [values] | auto``), read into checked tuples of values. space.py builds the
candidates of a space; its module docstring says what each dimension's auto means.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Mapping

from ndplan import limits
from ndplan.catalog.files import read_mapping
from ndplan.errors import NdplanError
from ndplan.vocab import RECOMPUTE_MODES, SCHEDULE_ALIASES, SCHEDULES, ZERO_LEVELS as ZERO_STAGES

DIMS = ("dp", "tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "zero", "recompute", "schedule", "sp", "uneven",
        "first_layers", "last_layers")
WORLD_DIMS = ("dp", "tp", "pp", "cp")
#: Positive-integer dimensions.
DEGREE_DIMS = ("dp", "tp", "pp", "cp", "ep", "etp", "vpp", "mbs")
#: Layer-count dimensions (positive integers; kernel arguments, not categorical).
LAYER_DIMS = ("first_layers", "last_layers")
#: Sweep arguments people put in a space file by mistake.
_NOT_DIMS = {"gbs": "--gbs", "seq": "--seq", "gpus": "--gpus", "model": "--model", "hardware": "--hardware",
             "engine": "--engine"}


def load_space(path: str | Path) -> dict[str, object]:
    """Read a space YAML file (``dim: value | [values] | auto``) and validate it.

    Returns the mapping as written (merge CLI flags over it, then ``normalize_space``).
    Malformed YAML, a non-mapping, an unknown dimension or a bad value raises NdplanError.
    """
    raw = read_mapping(Path(path), "space")
    normalize_space(raw)
    return raw


def normalize_space(raw: Mapping | None) -> dict[str, tuple | None]:
    """Validate a space: every dimension of DIMS -> tuple of allowed values, or None (auto).

    Accepts scalars, lists/tuples, ``"auto"``/None, and comma-separated strings
    (``"1,2,4"``, as CLI flags give them). Degrees and mbs are positive ints, zero in
    0..3, recompute and schedule names, sp a bool. Idempotent.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise NdplanError("space", raw, "not a mapping", "write dimension: value, [values] or auto")
    out: dict[str, tuple | None] = dict.fromkeys(DIMS)
    for key, value in raw.items():
        name = str(key)
        if name not in DIMS:
            raise NdplanError("space", name, *_unknown_dim_fix(name))
        out[name] = _values(name, value)
    return out


def _unknown_dim_fix(name: str) -> tuple[str, str]:
    """(what is wrong, how to fix) for a key that is not a dimension."""
    if name in _NOT_DIMS:
        return f"{name} is a sweep argument, not a space dimension", f"give it as {_NOT_DIMS[name]}"
    close = difflib.get_close_matches(name.lower(), DIMS, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return "unknown dimension", f"{hint}dimensions are {', '.join(DIMS)}"


def _is_auto(value) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() == "auto")


def _values(dim: str, value) -> tuple | None:
    """One dimension's constraint as a tuple of checked values (None for auto)."""
    if _is_auto(value):
        return None
    if isinstance(value, str) and "," in value:
        value = [v for v in value.split(",") if v.strip()]
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise NdplanError(dim, value, "empty list", "give at least one value or auto")
    out = []
    for item in items:
        if _is_auto(item):
            raise NdplanError(dim, value, "auto cannot sit inside a list", "write `auto` alone")
        v = _value(dim, item)
        if v not in out:
            out.append(v)
    return tuple(out)


def _value(dim: str, item):
    """Check and convert one value of ``dim``."""
    if dim in ("sp", "uneven"):
        if isinstance(item, bool):
            return item
        words = {"true": True, "on": True, "false": False, "off": False}  # on/off: as labels.py prints it
        if isinstance(item, str) and item.strip().lower() in words:
            return words[item.strip().lower()]
        raise NdplanError(dim, item, "not a boolean", "give true or false, on or off (or a list of them, or auto)")
    if dim in ("recompute", "schedule"):
        names = RECOMPUTE_MODES if dim == "recompute" else SCHEDULES + tuple(SCHEDULE_ALIASES)
        s = item.strip().lower() if isinstance(item, str) else item
        if s not in names:
            close = difflib.get_close_matches(str(s), names, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]}? " if close else ""
            raise NdplanError(dim, item, f"unknown {dim}", f"{hint}choose from {', '.join(names)} or auto")
        return SCHEDULE_ALIASES.get(s, s)
    if isinstance(item, str) and item.strip().lstrip("-").isdigit():
        item = int(item)
    if dim == "zero":
        if isinstance(item, bool) or not isinstance(item, int) or item not in ZERO_STAGES:
            raise NdplanError(dim, item, "not a ZeRO level", "give 0, 1, 2 or 3 (or a list of them, or auto)")
        return int(item)
    if isinstance(item, bool) or not isinstance(item, int):
        raise NdplanError(dim, item, "not an integer", "give a whole number >= 1 (or a list of them, or auto)")
    hi = {"mbs": limits.MAX_BATCH, "vpp": limits.MAX_LAYERS, "first_layers": limits.MAX_LAYERS,
          "last_layers": limits.MAX_LAYERS}.get(dim, limits.MAX_DEVICES)
    return limits.count(dim, item, 1, hi)
