"""A partial point of the design space -> a ``Strategy``: the one place where the
derived defaults live.

* dp = gpus / (tp*pp*cp) when dp is not given (1 without a device count);
* the global batch defaults to dp*mbs*pp sequences: pp micro-batches fill the pipeline
  once (m = pp, which the interleaved schedule also needs);
* the schedule defaults to 1f1b, interleaved when vpp > 1;
* sequence parallelism defaults to on, off for the deepspeed engine at tp > 1 (AutoTP
  has none: rules.py);
* every other field takes ``Strategy``'s own default (tp, pp, cp, ep, etp, vpp, mbs 1,
  zero 1, recompute none, ...).

``estimate``/``explain`` (cli.build), ``compare`` (cli_sweep) and the config readers'
dp (interop.base.world_dp) derive through these functions; a framework's own default
(Megatron-LM's --global-batch-size = mbs*dp) stays with its reader.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Mapping

from ndplan.errors import NdplanError
from ndplan.rules import engine_name
from ndplan.strategy import Strategy

STRATEGY_DEFAULTS: dict[str, object] = {f.name: f.default for f in fields(Strategy) if f.default is not MISSING}
"""Strategy field -> its default (the values a point's missing fields take, but dp, gbs,
schedule and sp, which are derived)."""
DERIVED = ("dp", "gbs", "schedule", "sp")


def data_parallel(gpus: int, tp: int = 1, pp: int = 1, cp: int = 1, field: str = "--gpus", context: str = "") -> int:
    """dp filling the devices tp*pp*cp leave, or NdplanError naming ``field``."""
    rest = tp * pp * cp
    if gpus % rest:
        raise NdplanError(field, gpus, f"not divisible by tp*pp*cp = {tp}*{pp}*{cp} = {rest}{context}",
                          "change a degree or --gpus")
    return gpus // rest


def default_gbs(dp: int, mbs: int, pp: int) -> int:
    """Global batch when none is given: pp micro-batches of mbs on every replica."""
    return dp * mbs * pp


def default_sp(engine: str, tp: int) -> bool:
    """Sequence parallelism when none is given: on, but for DeepSpeed at tp > 1, whose AutoTP
    has none (rules.py, the engine rules)."""
    return not (engine_name(engine) == "deepspeed" and tp > 1)


def default_schedule(vpp: int) -> str:
    """Pipeline schedule when none is given: interleaved with virtual chunks, else 1f1b."""
    return "interleaved" if vpp > 1 else "1f1b"


def complete_point(point: Mapping, gpus: int | None = None, field: str = "--gpus", context: str = "") -> dict:
    """Every Strategy field of ``point`` (missing or None ones defaulted or derived, see
    the module docstring). ``m`` (micro-batches) gives gbs = dp*mbs*m when gbs is missing
    and must agree with it otherwise. Any other key that is no Strategy field raises
    NdplanError."""
    unknown = [k for k in point if k not in STRATEGY_DEFAULTS and k != "m"]
    if unknown:
        raise NdplanError(unknown[0], point[unknown[0]], "not a strategy field",
                          f"give one of {', '.join(STRATEGY_DEFAULTS)}")
    p = {k: v for k, v in STRATEGY_DEFAULTS.items() if k not in DERIVED}
    p.update({k: v for k, v in point.items() if v is not None and k != "m"})
    if point.get("dp") is None:
        p["dp"] = 1 if gpus is None else data_parallel(gpus, p["tp"], p["pp"], p["cp"], field, context)
    m = point.get("m")
    if point.get("gbs") is None:
        p["gbs"] = default_gbs(p["dp"], p["mbs"], p["pp"]) if m is None else p["dp"] * p["mbs"] * m
    elif m is not None and p["gbs"] != p["dp"] * p["mbs"] * m:
        raise NdplanError("m", m, f"gbs={p['gbs']} with dp*mbs = {p['dp'] * p['mbs']} gives m = "
                          f"{p['gbs'] // (p['dp'] * p['mbs'])}", "give m or gbs, or values that agree")
    if point.get("schedule") is None:
        p["schedule"] = default_schedule(p["vpp"])
    if point.get("sp") is None:
        p["sp"] = default_sp(p["engine"], p["tp"])
    return p


def strategy_from_point(point: Mapping, gpus: int | None = None, field: str = "--gpus",
                        context: str = "") -> Strategy:
    """The Strategy of a partial point (Strategy field names; a sweep row works too).

    ``gpus`` derives dp when the point has none; a dp that does not divide it raises
    NdplanError naming ``field`` (``context`` is appended to the problem). Strategy checks
    every value; ``Strategy.check(model, gpus)`` is the caller's (it needs the model).
    """
    return Strategy(**complete_point(point, gpus, field, context))


#: Fields of a sweep row (space.Group grid + its categorical knobs) and their Python types.
ROW_FIELDS = {"dp": int, "tp": int, "pp": int, "cp": int, "ep": int, "etp": int, "vpp": int, "mbs": int,
              "zero": int, "sp": bool, "recompute": str, "schedule": str}


def strategy_from_row(row: Mapping, seq: int, gbs: int, base: Mapping | None = None,
                      num_layers: int | None = None) -> Strategy:
    """The Strategy of one sweep candidate (numpy scalars welcome; ``m`` is derived)
    with the sweep's seq, gbs and fixed fields ``base`` (engine, dtypes, ...). A row of an
    uneven layout (``uneven`` 1: first_layers/last_layers, layouts.py) needs the model's
    ``num_layers`` and becomes ``layers_per_stage``."""
    fields_ = {k: t(row[k]) for k, t in ROW_FIELDS.items()}
    if row.get("uneven"):
        if num_layers is None:
            raise ValueError("an uneven sweep row needs num_layers")
        from ndplan.layouts import layers_per_stage
        fields_["layers_per_stage"] = layers_per_stage(num_layers, fields_["pp"], fields_["vpp"], fields_["schedule"],
                                                       int(row["first_layers"]), int(row["last_layers"]))
    return Strategy(**fields_, gbs=gbs, seq=seq, **(base or {}))
