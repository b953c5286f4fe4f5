"""``ndplan check``: estimate a user's framework config, say whether it fits, which
terms make it not fit, and the nearest strategies that fit, each as a diff of the file.

Memory limit, first that applies: ``mem_limit_gib`` (GiB) or ``mem_fraction`` (of HBM);
the file's own cap (MindFormers ``context.max_device_memory``); the device HBM. The
engine's reserve (``mem.reserve``: CUDA context, allocator slack) is a term of the peak,
so comparing the peak with HBM is comparing the rest with HBM minus the reserve.

OOM causes: on the peak stage, the largest terms, largest first, until their sum covers
the excess of the peak over the limit -- the terms that alone would have to go for the
config to fit -- each with its bytes and its share of the peak.

Nearest fitting strategies: ``sweep`` at the same devices, sequence length and global
batch (engine, dtypes, flash attention and placement order kept; dp/tp/pp/cp, mbs,
zero and recompute explored, the user's own schedule / vpp / sp and the plain 1f1b / vpp
1 / sp on), feasible candidates only. Distance to the user's strategy = the number of
``DISTANCE_FIELDS`` whose value differs (recompute counts as one field with its per-layer
counts; dp counts on its own, so trading tp for dp is two changes); ties go to the
shorter step time. The k nearest that the file's format can express are kept.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field

import numpy as np

from ndplan import limits
from ndplan.catalog.hardware import Hardware
from ndplan.catalog import load_hardware
from ndplan.errors import NdplanError, warn
from ndplan.estimate import Estimate, estimate
from ndplan.interop import READERS, REMOVE, CheckInput, launcher, shell
from ndplan.strategy import Strategy
from ndplan.sweep import mem_limit as sweep_mem_limit
from ndplan.sweep import smallest_count, sweep
from ndplan.units import GIB
from ndplan.labels import label

DISTANCE_FIELDS = ("dp", "tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "zero", "sp", "recompute", "schedule",
                   "layers_per_stage")
DEFAULT_HARDWARE = {"mindformers": "ascend-910b"}
"""Hardware when ``-H`` is not given; others: h100-sxm (the CLI's default)."""


def _value(s: Strategy, f: str):
    return (s.recompute, s.recompute_layers) if f == "recompute" else getattr(s, f)


def changed_fields(user: Strategy, other: Strategy) -> dict[str, tuple]:
    """{field: (user value, other value)} over DISTANCE_FIELDS."""
    out = {}
    for f in DISTANCE_FIELDS:
        a, b = _value(user, f), _value(other, f)
        if a != b:
            out[f] = (a, b)
    return out


def distance(user: Strategy, other: Strategy) -> int:
    return len(changed_fields(user, other))


@dataclass
class Proposal:
    strategy: Strategy
    estimate: Estimate
    changed: dict[str, tuple]
    diff: str
    """Unified diff of the user's file."""
    text: str
    """The user's file with the diff applied."""
    launch: str | None = None
    """How to run it on another device count when the file cannot state the count."""

    @property
    def distance(self) -> int:
        return len(self.changed)

    def to_json(self) -> dict:
        return {"strategy": self.strategy.as_dict(), "distance": self.distance,
                "changed": {k: [_plain(a), _plain(b)] for k, (a, b) in self.changed.items()},
                "peak_bytes": self.estimate.peak_bytes, "step_s": self.estimate.step_s, "mfu": self.estimate.mfu,
                "diff": self.diff, "launch": self.launch}


def _plain(v):
    return [_plain(x) for x in v] if isinstance(v, tuple) else v


@dataclass
class CheckResult:
    input: CheckInput
    hardware: Hardware
    estimate: Estimate
    limit_bytes: int
    limit_source: str
    causes: list[dict] = field(default_factory=list)
    """OOM causes: {key, bytes, share} on the peak stage (empty when it fits)."""
    proposals: list[Proposal] = field(default_factory=list)
    scaled_gpus: int | None = None
    """When nothing fits on the file's devices: the device count the proposals run on."""
    tried_gpus: list[int] = field(default_factory=list)
    """The device counts tried above the file's (sweep.smallest_count)."""

    @property
    def fits(self) -> bool:
        return self.estimate.peak_bytes <= self.limit_bytes

    def to_json(self) -> dict:
        from ndplan.bands import band
        ci = self.input
        est = self.estimate.to_json()
        est["time"]["band_95"] = band(self.estimate).to_json()
        return {"file": str(ci.path), "format": ci.fmt, "model_source": ci.model_origin, "gpus": ci.gpus,
                "origin": ci.origin, "unknown": list(ci.unknown), "notes": list(ci.notes),
                "estimate": est,
                "limit": {"bytes": self.limit_bytes, "source": self.limit_source},
                "fits": self.fits, "oom_causes": self.causes, "proposals": [p.to_json() for p in self.proposals],
                "proposals_gpus": self.scaled_gpus or ci.gpus, "tried_gpus": self.tried_gpus}


def limit_of(ci: CheckInput, hw: Hardware, mem_limit_gib: float | None = None,
             mem_fraction: float | None = None) -> tuple[int, str]:
    if mem_limit_gib is not None or mem_fraction is not None:
        return (sweep_mem_limit(hw, mem_limit_gib, mem_fraction),
                "--mem-limit-gib" if mem_limit_gib is not None else "--mem-fraction")
    if ci.mem_limit_bytes and ci.mem_limit_bytes > hw.hbm_bytes:
        warn(ci.mem_limit_origin, f"{ci.mem_limit_bytes / GIB:g} GiB", f"above the {hw.hbm_gib:g} GiB of {hw.name}",
             "the device's HBM is used as the limit; lower the file's cap or choose the device (-H)")
        return hw.hbm_bytes, f"{hw.name} HBM, below the file's {ci.mem_limit_origin}"
    if ci.mem_limit_bytes:
        return ci.mem_limit_bytes, f"the file's {ci.mem_limit_origin}"
    return hw.hbm_bytes, f"{hw.name} HBM; the engine reserve is the mem.reserve term of the peak"


def oom_causes(est: Estimate, limit: int) -> list[dict]:
    """Largest terms of the peak stage, largest first, until they cover the excess."""
    stage = max(est.per_stage, key=lambda s: s["peak_bytes"])
    excess = stage["peak_bytes"] - limit
    out, acc = [], 0
    for key, b in sorted(stage["terms"].items(), key=lambda kv: -kv[1]):
        if acc >= excess:
            break
        out.append({"key": key, "bytes": b, "share": b / stage["peak_bytes"], "stage": stage["stage"]})
        acc += b
    return out


def file_diff(ci: CheckInput, strat: Strategy) -> tuple[str, str]:
    """(unified diff, new text): the user's file rewritten to express ``strat``.

    Only the values that differ between the two strategies' forms are touched; when the
    edited file does not read back as ``strat`` (a key the file leaves to the framework's
    default whose default now means something else, e.g. torchtitan's global batch =
    local x dp), the proposal's keys absent from the file are written out too (one
    such key if that is enough, else all of them). A file
    that still does not read back as ``strat`` raises NdplanError (not expressible)."""
    mod = READERS[ci.fmt]
    if hasattr(mod, "rewrite"):  # formats proposed as a new file (torchtitan 0.3 launches)
        text = mod.rewrite(ci, strat)
        name = ci.path.name
        return "".join(difflib.unified_diff(ci.text.splitlines(True), text.splitlines(True), f"a/{name}",
                                            f"b/{name}")), text
    try:
        old, _ = mod.fields(ci.model, ci.strategy)
    except NdplanError:  # the exporter cannot write the file's own strategy: the values the file holds
        old = mod.current(ci) if hasattr(mod, "current") else {}
    new, _ = mod.fields(ci.model, strat)  # NdplanError: the format cannot express it
    changes = {k: v for k, v in new.items() if str(old.get(k)) != str(v)} | {k: REMOVE for k in old if k not in new}
    if hasattr(mod, "follow_up"):  # keys the format ties to the changed ones (mindformers)
        changes |= mod.follow_up(ci, strat)
    absent = {k: v for k, v in new.items() if k not in ci.lines}
    for extra in [{}] + [{k: v} for k, v in absent.items()] + [absent]:
        text = mod.edit(ci.text, changes | extra)
        try:
            back = mod.read(ci.path, text, model=ci.model, gpus=ci.gpus, **ci.overrides).strategy
        except NdplanError:
            back = None
        if back == strat:
            name = ci.path.name
            diff = difflib.unified_diff(ci.text.splitlines(True), text.splitlines(True), f"a/{name}", f"b/{name}")
            return "".join(diff), text
    raise NdplanError("strategy", label(strat, sep=","), f"{ci.fmt} form does not read back as this strategy",
                      "the file's format cannot express it")


def _space(ci: CheckInput) -> dict:
    u = ci.strategy
    space = {"vpp": sorted({1, u.vpp}), "schedule": sorted({"1f1b", u.schedule}), "sp": sorted({True, u.sp}),
             "mbs": sorted({1, 2, 4, 8, u.mbs})}
    if ci.fmt == "deepspeed":
        space |= {"cp": [1], "vpp": [1], "schedule": ["1f1b"]}
    mod = READERS[ci.fmt]
    return space | (mod.proposal_space(ci) if hasattr(mod, "proposal_space") else {})


MAX_TRIED = 200
"""Fitting candidates tried as edits of the file, nearest first (a format that cannot
express most of them must not make ``check`` re-read the file for every candidate)."""


def nearest(ci: CheckInput, hw: Hardware, limit: int, k: int) -> list[Proposal]:
    u = ci.strategy
    base = {f: getattr(u, f) for f in ("engine", "flash_attention", "order", "grad_dtype", "weight_dtype",
                                       "offload_optimizer")}
    try:  # every valid candidate is in the table; those under ``limit`` (bytes, no GiB round trip) are kept
        res = sweep(ci.model, hw, ci.gpus, u.seq, u.gbs, _space(ci), top=0, base=base)
    except NdplanError:  # no valid candidate at these devices / seq / gbs
        return []
    t = res.table
    fit = np.nonzero(t.peak_bytes <= limit)[0]
    n = len(fit)
    if not n:
        return []
    g = {f: t.grid[f][fit] for f in t.grid}
    dist = np.zeros(n, dtype=int)
    for f in ("dp", "tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "zero", "schedule"):
        dist += g[f] != getattr(u, f)
    dist += g["sp"].astype(bool) != u.sp
    dist += (g["recompute"] != u.recompute) | (u.recompute_layers is not None)
    dist += u.layers_per_stage is not None
    out: list[Proposal] = []
    for i in fit[np.lexsort((t.step_s[fit], dist))][:MAX_TRIED]:
        s = res.strategy(int(i))
        changed = changed_fields(u, s)
        if any(_adds_to(changed, p.changed) and t.step_s[i] >= p.estimate.step_s for p in out):
            continue  # an earlier proposal's changes plus more, and not faster
        try:
            diff, text = file_diff(ci, s)
        except NdplanError:
            continue  # the file's format cannot express this candidate
        out.append(Proposal(s, estimate(ci.model, hw, s, ci.gpus), changed, diff, text))
        if len(out) == k:
            break
    return out


MAX_DEVICE_FACTOR = 32
"""When nothing fits on the file's devices: counts up to this multiple of them are tried."""


def _node_size(ci: CheckInput, hw: Hardware) -> int:
    """The step between device counts tried: the launch's processes per node when the file
    states them (torchrun ``--nproc_per_node``), else the device's node size, or the file's
    count when it is not a whole number of such nodes."""
    if ci.fmt in ("megatron", "torchtitan-0.3"):
        got = launcher.launched(shell.read_words(ci.text, os.environ))
        if got is not None and ci.gpus % got[0] == 0:
            return got[0]
    node = hw.devices_per_node
    return node if ci.gpus % node == 0 else ci.gpus


def nearest_scaled(ci: CheckInput, hw: Hardware, limit: int, k: int) -> tuple[int | None, list[Proposal], list[int]]:
    """(device count, proposals, counts tried) at the smallest device count above the
    file's where a strategy fits (sweep.smallest_count over whole nodes), with the sequence length and global
    batch kept; each proposal's ``changed`` starts with ``gpus``, and its diff writes the
    new count where the file states it (``_on_devices``)."""
    found: dict[int, list[Proposal]] = {}

    def fits(n: int) -> bool:
        found[n] = nearest(dataclasses.replace(ci, gpus=n), hw, limit, k)
        return bool(found[n])

    top = min(ci.gpus * MAX_DEVICE_FACTOR, limits.MAX_DEVICES)
    n, tried = smallest_count(2 * ci.gpus, _node_size(ci, hw), top, fits, floor=ci.gpus)
    if n is None:
        return None, [], tried
    for p in found[n]:
        p.changed = {"gpus": (ci.gpus, n)} | p.changed
        _on_devices(ci, p, n)
    return n, found[n], tried


def _on_devices(ci: CheckInput, p: Proposal, n: int) -> None:
    """Make the proposal's file launch ``n`` devices: its torchrun count rewritten
    (interop.launcher), or the degrees alone when they fix the count (MindFormers, a
    torchtitan TOML with every degree given); checked by reading the file back without
    ``--gpus``. A file that does not state its count (DeepSpeed JSON, a count given with
    ``--gpus`` or taken from the environment) keeps its diff, and ``p.launch`` says how to
    run it."""
    mod = READERS[ci.fmt]
    text = p.text
    if ci.origin.get("gpus") != "--gpus" and hasattr(mod, "set_devices"):
        text = mod.set_devices(text, n) or text
    try:
        back = mod.read(ci.path, text, model=ci.model, gpus=None, **ci.overrides)
    except NdplanError:
        back = None
    if back is not None and back.gpus == n and back.strategy == p.strategy:
        name = ci.path.name
        p.text = text
        p.diff = "".join(difflib.unified_diff(ci.text.splitlines(True), text.splitlines(True), f"a/{name}",
                                              f"b/{name}"))
    else:
        p.launch = (f"the diff cannot set the device count (the file's: {ci.origin.get('gpus', '--gpus')}): "
                    f"launch it on {n} devices (ndplan check {ci.path.name} --gpus {n})")


def _adds_to(changed: dict, earlier: dict) -> bool:
    """True when ``changed`` makes every change of ``earlier`` (same new values) and more."""
    return len(changed) > len(earlier) and all(changed.get(f, (None, None))[1] == b for f, (_, b) in earlier.items())


def check(ci: CheckInput, hardware: str | Hardware | None = None, *, mem_limit_gib: float | None = None,
          mem_fraction: float | None = None, top: int = 3) -> CheckResult:
    """Estimate ``ci`` (interop.read_config), compare with the limit, and when it does not
    fit name the causes and propose the ``top`` nearest fitting strategies."""
    top = limits.count("top", top, 0, limits.MAX_TOP, "a number of proposals")
    hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware or DEFAULT_HARDWARE.get(ci.fmt, "h100-sxm"))
    limit, source = limit_of(ci, hw, mem_limit_gib, mem_fraction)
    est = estimate(ci.model, hw, ci.strategy, ci.gpus)
    res = CheckResult(ci, hw, est, limit, source)
    if not res.fits:
        res.causes = oom_causes(est, limit)
        if top:
            res.proposals = nearest(ci, hw, limit, top)
            if not res.proposals:
                res.scaled_gpus, res.proposals, res.tried_gpus = nearest_scaled(ci, hw, limit, top)
    return res
