"""PPB instance: ordered layers with per-recompute-mode time and memory, plus the
pipeline configuration.

A layer (one entry of the expanded, ordered list) carries, per micro-batch on one device:

* ``forward_s`` F, ``backward_input_s`` B (activation gradient), ``backward_weight_s``
  W (weight gradient; zero-bubble schedules run it apart from B),
* ``static_bytes``: weights + gradients + master + optimizer share on its device,
* ``activation_bytes[mode]``: bytes kept for backward per micro-batch under each
  recompute mode it offers (``none`` always; ``selective``, ``comm``, ``selective+comm``,
  ``full`` when meaningful: vocab.PPB_RECOMPUTE_MODES),
* ``recompute_s[mode]``: the extra forward time the mode costs in backward
  (``none`` -> 0).

Layer files (JSON or YAML), format ``ndplan-layers/1``::

    format: ndplan-layers/1
    layers:
      - {name: embedding, kind: embedding, forward_s: .., backward_input_s: ..,
         backward_weight_s: .., static_bytes: .., activation_bytes: {none: ..}}
      - {name: decoder, kind: dense, count: 80, ...,                      # repeated block
         activation_bytes: {none: .., selective: .., full: ..},
         recompute_s: {selective: .., full: ..}}

MindSpore SAPP ``layers_description`` files are accepted too (see ``from_sapp``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ndplan import limits, rules
from ndplan.catalog.files import read_mapping
from ndplan.errors import NdplanError, warn
from ndplan.layouts import slices
from ndplan.units import GIB, MIB
from ndplan.vocab import PPB_RECOMPUTE_MODES as MODES, RECOMPUTE_BELOW, SCHEDULES  # PPB balances every schedule

FORMAT = "ndplan-layers/1"


MAX_LAYER_S = 1e6
"""Ceiling of one layer's per-micro-batch time, seconds (real ones are below 1 s)."""
MAX_LAYER_BYTES = 2.0**60
"""Ceiling of one layer's bytes (1 EiB)."""


def _seconds(field: str, v) -> float:
    return limits.real(field, v, 0.0, MAX_LAYER_S, lo_open=False, what="seconds")


def _bytes(field: str, v) -> float:
    return limits.real(field, v, 0.0, MAX_LAYER_BYTES, lo_open=False, what="bytes")


@dataclass(frozen=True, kw_only=True)
class Layer:
    name: str
    """Layer name (repeated blocks share it)."""
    kind: str
    """embedding, dense, moe, mtp, head, or any label."""
    forward_s: float
    """Forward time per micro-batch, seconds."""
    backward_input_s: float
    """Input-gradient backward per micro-batch, seconds."""
    backward_weight_s: float
    """Weight-gradient backward per micro-batch, seconds."""
    static_bytes: int
    """Weights + grads + master + optimizer share on one device, bytes."""
    activation_bytes: dict
    """Recompute mode -> bytes kept per micro-batch."""
    recompute_s: dict = field(default_factory=dict)
    """Recompute mode -> extra forward seconds per micro-batch (none: 0)."""

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(m for m in MODES if m in self.activation_bytes)

    @property
    def by_memory(self) -> tuple[str, ...]:
        """This layer's modes from the most activation bytes kept to the fewest (ties: less
        recompute time first): the one order PPB's local search steps through ("one mode
        deeper" is the next, "lighter" any earlier), since the modes are only partially
        ordered (vocab.PPB_RECOMPUTE_MODES)."""
        return tuple(sorted(self.modes, key=lambda m: (-self.activation_bytes[m], self.recompute_s.get(m, 0.0),
                                                       MODES.index(m))))

    def at_most(self, mode: str) -> str:
        """The offered mode nearest ``mode`` from below in the partial order: ``mode`` itself when
        offered, else the one of the modes it includes (RECOMPUTE_BELOW) keeping the fewest bytes."""
        if mode in self.activation_bytes:
            return mode
        below = [m for m in RECOMPUTE_BELOW[mode] if m in self.activation_bytes]
        return min(below, key=lambda m: (self.activation_bytes[m], MODES.index(m)))

    def time_s(self, mode: str) -> float:
        """F + B + W + recompute of one micro-batch under ``mode``."""
        return self.forward_s + self.backward_input_s + self.backward_weight_s + self.recompute_s.get(mode, 0.0)

    def __post_init__(self):
        where = f"layers[{self.name}]"
        for f in ("forward_s", "backward_input_s", "backward_weight_s"):
            _seconds(f"{where}.{f}", getattr(self, f))
        _bytes(f"{where}.static_bytes", self.static_bytes)
        if "none" not in self.activation_bytes:
            raise NdplanError(f"{where}.activation_bytes", dict(self.activation_bytes),
                              "lacks the 'none' mode (bytes kept without recompute)", "add `none: <bytes>`")
        for mode in list(self.activation_bytes) + list(self.recompute_s):
            if mode not in MODES:
                raise NdplanError(f"{where}.recompute mode", mode, "unknown mode", f"use one of {', '.join(MODES)}")
        for mode, v in self.activation_bytes.items():
            _bytes(f"{where}.activation_bytes[{mode}]", v)
        for mode, v in self.recompute_s.items():
            _seconds(f"{where}.recompute_s[{mode}]", v)
        for mode in self.recompute_s:
            if mode not in self.activation_bytes:
                raise NdplanError(f"{where}.recompute_s", mode, "has no activation_bytes for the same mode",
                                  f"add activation_bytes.{mode}")


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    pp: int
    """Pipeline stages."""
    vpp: int = 1
    """Chunks per stage (2 for zbv)."""
    m: int
    """Micro-batches per step."""
    schedule: str = "1f1b"
    budget_bytes: int
    """Per-device memory available for static + activations, bytes."""

    def __post_init__(self):
        for f, hi in (("pp", limits.MAX_PP), ("vpp", limits.MAX_PP), ("m", limits.MAX_MICROBATCHES)):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int):
                raise NdplanError(f, v, "not an integer", f"give a whole number in 1..{hi}")
            limits.count(f, v, 1, hi)
        if self.schedule not in SCHEDULES:
            raise NdplanError("schedule", self.schedule, "not a schedule PPB balances",
                              f"choose one of {', '.join(SCHEDULES)}")
        rules.check(self, ("schedule",))  # the rules Strategy and the space generator evaluate
        limits.real("budget_bytes", self.budget_bytes, 0.0, limits.MAX_GIB * GIB, what="bytes")

    @property
    def chunks(self) -> int:
        """Virtual stages (model slices in layer order): pp * vpp, pp under dualpipe (layouts.slices)."""
        return slices(self.schedule, self.pp, self.vpp)


@dataclass(frozen=True, kw_only=True)
class Instance:
    layers: tuple[Layer, ...]
    """Ordered layers, repeated blocks expanded."""
    pipeline: Pipeline

    def __post_init__(self):
        if len(self.layers) < self.pipeline.chunks:
            raise NdplanError("pp", self.pipeline.pp, f"{self.pipeline.chunks} model slices (pp*vpp; pp under "
                                                      f"dualpipe) exceed the {len(self.layers)} layers", "lower pp or vpp")


# ---------------------------------------------------------------- file formats

def _number(d: dict, key: str, where: str, default=None):
    if key not in d:
        if default is not None:
            return default
        raise NdplanError(f"{where}.{key}", None, "missing", "every layer needs it (see ndplan balance --help)")
    return d[key]


def layer_from_dict(d: dict, where: str) -> Layer:
    if not isinstance(d, dict):
        raise NdplanError(where, d, "not a mapping", "write each layer as a mapping of field: value")
    act = _number(d, "activation_bytes", where)
    if not isinstance(act, dict):
        raise NdplanError(f"{where}.activation_bytes", act, "not a mapping", "give mode -> bytes, e.g. {none: 1.2e9}")
    rec = d.get("recompute_s", {}) or {}
    if not isinstance(rec, dict):
        raise NdplanError(f"{where}.recompute_s", rec, "not a mapping", "give mode -> seconds, e.g. {full: 0.01}")
    try:
        return Layer(name=str(d.get("name", where)), kind=str(d.get("kind", "layer")),
                     forward_s=_number(d, "forward_s", where), backward_input_s=_number(d, "backward_input_s", where),
                     backward_weight_s=_number(d, "backward_weight_s", where),
                     static_bytes=_number(d, "static_bytes", where),
                     activation_bytes=dict(act), recompute_s={k: v for k, v in rec.items() if k != "none"})
    except TypeError as e:  # unexpected value types inside dicts
        raise NdplanError(where, d, f"bad layer entry ({e})", "see the ndplan-layers/1 format in ndplan balance --help") from None


def _expand(entries: list, where: str, make) -> tuple[Layer, ...]:
    out = []
    for i, d in enumerate(entries):
        count = d.get("count", 1) if isinstance(d, dict) else 1
        if isinstance(count, bool) or not isinstance(count, int):
            raise NdplanError(f"{where}[{i}].count", count, "not an integer", "give a whole number of layers")
        limits.count(f"{where}[{i}].count", count, 1, limits.MAX_LAYERS, "a layer count")
        out.extend([make(d, f"{where}[{i}]")] * count)
        if len(out) > limits.MAX_LAYERS:
            raise NdplanError(where, len(out), f"more than {limits.MAX_LAYERS:,} layers", "give a smaller model")
    if not out:
        raise NdplanError(where, entries, "no layers given", "list at least one layer")
    return tuple(out)


def layers_from_doc(doc) -> tuple[Layer, ...]:
    """Layers of a parsed layer file: ndplan format or MindSpore SAPP ``layers_description``."""
    if not isinstance(doc, dict):
        raise NdplanError("layer file", type(doc).__name__, "top level is not a mapping",
                          f"give a mapping with 'layers' ({FORMAT})")
    if "layers_description" in doc:
        return from_sapp(doc)
    if "format" in doc and doc["format"] != FORMAT:
        raise NdplanError("format", doc["format"], "unknown layer file format",
                          f"this ndplan reads {FORMAT} (and SAPP layers_description); re-export it with "
                          "ndplan estimate --export-layers")
    if "layers" not in doc:
        raise NdplanError("layers", None, "missing", f"give a '{FORMAT}' file or a SAPP file with layers_description")
    if not isinstance(doc["layers"], list):
        raise NdplanError("layers", doc["layers"], "not a list", "give a list of layer mappings")
    return _expand(doc["layers"], "layers", layer_from_dict)


def load_layer_doc(path: str | Path) -> dict:
    """The parsed JSON or YAML layer file (a mapping)."""
    return read_mapping(Path(path), "--layers")


def load_layers(path: str | Path) -> tuple[Layer, ...]:
    """Read a JSON or YAML layer file."""
    return layers_from_doc(load_layer_doc(path))


def layers_to_doc(layers: tuple[Layer, ...], meta: dict | None = None) -> dict:
    """The ndplan file form, runs of identical layers folded into ``count``."""
    out: list[dict] = []
    prev = None
    for layer in layers:
        if layer == prev:
            out[-1]["count"] = out[-1].get("count", 1) + 1
            continue
        prev = layer
        out.append({"name": layer.name, "kind": layer.kind, "forward_s": layer.forward_s,
                    "backward_input_s": layer.backward_input_s, "backward_weight_s": layer.backward_weight_s,
                    "static_bytes": layer.static_bytes, "activation_bytes": dict(layer.activation_bytes),
                    "recompute_s": {k: v for k, v in layer.recompute_s.items() if k != "none"}})
    return {"format": FORMAT, **(meta or {}), "layers": out}


# ------------------------------------------------------------ MindSpore SAPP

SAPP_MODES = {
    "none": ("memory_activation", "backward_time", "backward_coef", 0.0),
    "selective": ("memory_select_rec", "select_rec_time", "select_rec_coef", 0.04),
    "comm": ("memory_select_comm", "select_comm_time", "select_comm_coef", 0.125),
    "selective+comm": ("memory_both_comm_select", "both_comm_select_time", "both_comm_select_coef", 0.165),
    "full": ("memory_recompute", "recompute_time ", "recompute_coef", 0.5),
}
"""ndplan mode -> (SAPP activation key, MB per micro-batch; backward-time key, ms; coefficient key;
SAPP's default coefficient), from mindformers v1.6.0-beta1 toolkit/pipeline_balance/utils/
recompute.py (``JSON_MEMORY_NAME``, ``JSON_TIME_NAME``, ``JSON_COEF_NAME``, ``DEFAULT_COEF``). The
full mode's time key is ``"recompute_time "`` with a trailing space there, so SAPP never reads a
file's ``recompute_time``: its full-recompute backward always comes from ``recompute_coef``."""
SAPP_BACKWARD_RATIO = 2
"""SAPP ``Layer.backward_default_ratio``: a layer's backward is 2 x its ``time`` (not its
forward_time) times (1 + the mode's coefficient) unless the mode's time is given (``compute_internal_time``)."""
SAPP_KINDS = {"HEAD": "embedding", "BODY": "body", "TAIL": "head"}
"""SAPP entry type -> layer kind: SAPP's HEAD is the model's first layer (the embedding)
and TAIL its last (output layer and loss), ``Layer.type_enum`` of SAPP
``toolkit/pipeline_balance/utils/layer.py``; ndplan's ``head`` is the output layer, so a
SAPP HEAD must not become one (the exporters count decoder layers by kind,
export/balance.py)."""
SAPP_TIME_UNIT_S = 1e-3
"""SAPP profiles state times in milliseconds."""
SAPP_WEIGHT_GRAD_SHARE = 0.5
"""SAPP does not split backward into B and W; the weight-gradient GEMMs take as many
FLOPs as the input-gradient ones (formulas/step.py: B = gemm + ..., W = gemm), so W is
taken as half the no-recompute backward."""
SAPP_ENTRY_FIELDS = frozenset({"name", "model_name", "type", "time", "nb_layer", "forward_time", "memory_parameter",
                               "recompute_time"}
                              | {f for keys in SAPP_MODES.values() for f in keys[:3]})
"""The fields SAPP's ``generate_layers_list`` reads from an entry (and ``recompute_time``, which it
means to read): any other is named in a warning."""
SAPP_TOP_FIELDS = frozenset({"name", "pre_defined_layer", "auto_partition_layer", "layers_description",
                             "stage_const_mem"})
"""Top-level keys of a SAPP layer file (``run_pipeline_balance.py``, ``config.get_stage_const_mem``)."""


def _sapp_backward(d: dict, mode: str) -> float:
    """SAPP's backward time (ms, its recompute included) of a BODY entry under ``mode``."""
    _, time_key, coef_key, default = SAPP_MODES[mode]
    given = d.get(time_key)
    if given:
        return given
    coef = d.get(coef_key)
    return (1 + (default if coef is None else coef)) * SAPP_BACKWARD_RATIO * d["time"]


def _sapp_numbers(d: dict, where: str) -> None:
    for k in ("time", "forward_time", "memory_parameter", *(f for keys in SAPP_MODES.values() for f in keys[:3]),
              "recompute_time"):
        if d.get(k) is not None:
            limits.real(f"{where}.{k}", d[k], 0.0, MAX_LAYER_S / SAPP_TIME_UNIT_S, lo_open=False,
                        what="a number (SAPP: milliseconds, MB, coefficients)")


def _sapp_layer(d: dict, where: str) -> Layer:
    """One SAPP entry as SAPP reads it (``Layer.compute_internal_time`` and the solver's time and
    memory terms): HEAD and TAIL run ``time`` forward and 2 x ``time`` backward and keep no
    activations (SAPP counts BODY activations only); a BODY entry's forward is ``forward_time``
    (else ``time``) and each mode it considers (its activation MB > 0) has the backward
    ``_sapp_backward`` gives, the mode's recompute being that less the no-recompute backward."""
    if not isinstance(d, dict):
        raise NdplanError(where, d, "not a mapping", "write each layers_description entry as a mapping")
    _sapp_numbers(d, where)
    for k in sorted(set(d) - SAPP_ENTRY_FIELDS - {"count"}):
        warn(f"{where}.{k}", d[k], "not a SAPP layer field: ignored", "check the spelling against SAPP's "
             "layers_description keys")
    if "recompute_time" in d:
        warn(f"{where}.recompute_time", d["recompute_time"], "never read by SAPP (v1.6.0-beta1 looks up "
             "'recompute_time ' with a trailing space): ndplan does as SAPP does and takes recompute_coef",
             "give recompute_coef instead")
    kind = SAPP_KINDS[str(d.get("type", "BODY")).upper()]
    if d.get("time") is None:
        raise NdplanError(f"{where}.time", None, "missing", "give the layer's forward time in ms (SAPP's time)")
    t = d["time"]
    static = int((d.get("memory_parameter") or 0) * MIB)  # SAPP: absent or null, no memory information
    if kind != "body":
        w = SAPP_WEIGHT_GRAD_SHARE * SAPP_BACKWARD_RATIO * t
        return Layer(name=str(d.get("name", where)), kind=kind, forward_s=t * SAPP_TIME_UNIT_S,
                     backward_input_s=(SAPP_BACKWARD_RATIO * t - w) * SAPP_TIME_UNIT_S,
                     backward_weight_s=w * SAPP_TIME_UNIT_S, static_bytes=static, activation_bytes={"none": 0})
    act = {mode: d[keys[0]] * MIB for mode, keys in SAPP_MODES.items() if (d.get(keys[0]) or 0) > 0}
    if not act:  # no memory information: SAPP balances time alone
        act = {"none": 0}
    if "none" not in act:
        raise NdplanError(f"{where}.memory_activation", d.get("memory_activation"),
                          "missing or 0: SAPP would then never leave this layer without recompute, which ndplan "
                          "does not model", "give the layer's activation MB without recompute")
    bwd = {mode: _sapp_backward(d, mode) for mode in act}
    fwd = d.get("forward_time")
    w = SAPP_WEIGHT_GRAD_SHARE * bwd["none"]
    return Layer(name=str(d.get("name", where)), kind=kind, forward_s=(t if fwd is None else fwd) * SAPP_TIME_UNIT_S,
                 backward_input_s=(bwd["none"] - w) * SAPP_TIME_UNIT_S, backward_weight_s=w * SAPP_TIME_UNIT_S,
                 static_bytes=static, activation_bytes={k: int(v) for k, v in act.items()},
                 recompute_s={m: max(bwd[m] - bwd["none"], 0) * SAPP_TIME_UNIT_S for m in act if m != "none"})


def from_sapp(doc: dict) -> tuple[Layer, ...]:
    """Layers of a SAPP ``layers_description`` (MindSpore SAPP pipeline balancing input; every
    field SAPP reads, as it reads it: ``_sapp_layer``, SAPP_MODES; ``stage_const_mem`` is
    ``stage_constant_bytes``). Entries typed HEAD / BODY / TAIL with ``nb_layer`` repeats, in the
    order HEAD entries, BODY entries as listed, TAIL entries."""
    entries = doc["layers_description"]
    if not isinstance(entries, list) or not entries:
        raise NdplanError("layers_description", entries, "not a non-empty list", "list the HEAD, BODY and TAIL entries")
    for k in sorted(set(doc) - SAPP_TOP_FIELDS):
        warn(k, doc[k], "not a SAPP layer-file key: ignored", "check the spelling")
    rank = {"HEAD": 0, "BODY": 1, "TAIL": 2}
    for i, d in enumerate(entries):
        if not isinstance(d, dict) or str(d.get("type", "BODY")).upper() not in rank:
            raise NdplanError(f"layers_description[{i}].type", d.get("type") if isinstance(d, dict) else d,
                              "unknown entry type", "give HEAD, BODY or TAIL")
    ordered = sorted(entries, key=lambda d: rank[str(d.get("type", "BODY")).upper()])
    for i, d in enumerate(ordered):  # SAPP counts a HEAD or TAIL once (sapp_solver.py stage_param_memory)
        if str(d.get("type", "BODY")).upper() != "BODY" and d.get("nb_layer", 1) != 1:
            warn(f"layers_description[{i}].nb_layer", d["nb_layer"], "on a HEAD or TAIL entry: SAPP counts it once",
                 "ndplan does the same; give separate entries for several")
    return _expand([dict(d, count=d.get("nb_layer", 1) if str(d.get("type", "BODY")).upper() == "BODY" else 1)
                    for d in ordered], "layers_description", _sapp_layer)


def stage_constant_bytes(doc: dict) -> int:
    """Memory every stage holds besides its layers: SAPP's ``stage_const_mem`` (MB), which its
    solver adds to every stage's memory constraint (sapp_solver.py ``add_pipeline_memory_constraint``:
    ``memory_limit >= param + activation + overhead + constant_memory_``); 0 when absent."""
    if "layers_description" not in doc or doc.get("stage_const_mem") is None:
        return 0
    return int(limits.real("stage_const_mem", doc["stage_const_mem"], 0.0, MAX_LAYER_BYTES / MIB, lo_open=False,
                           what="MB") * MIB)
