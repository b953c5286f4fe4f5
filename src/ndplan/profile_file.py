"""A profile YAML from ``ndplan profile`` turned into the hardware constants it measured
(``--profile FILE``; issue 16 part 3). Each value replaces the catalog's, and its source says
it came from the profile (``ndplan explain`` prints the sources of the hardware constants).

* gemm_efficiency: the planned model's layer GEMMs (its shapes at the planned sequence,
  micro-batch, tp and cp; a sweep or compare, which rank many degrees, takes tp 1), each timed
  at the rate interpolated in log space between the measured GEMMs (log TFLOP/s against log
  FLOPs per GEMM, piecewise linear, held flat beyond the ends), weighted by how often each runs
  (local experts, layers of its kind): sum FLOPs / sum seconds / the 16-bit peak.
* fp8_gemm_efficiency: the profile times 16-bit GEMMs only, so the FP8 one moves with it, at the
  device's FP8 / BF16 MAMF ratio (catalog/mamf.py; kept from the hardware entry if that lands above 1).
* attention_efficiency: the longest measured causal attention, forward + backward FLOPs (2 and
  5 of the 4 b h s^2 d / 2 causal products, FlashAttention-2 Sec. 3.2) over its seconds, over the
  16-bit peak, divided by the length factor s / (s + formulas.step.ATTN_HALF_TOKENS): the
  plateau that ``attention_efficiency`` means, of the kernel torch's SDPA picks on the profiled
  machine; it is also ``fa2_attention_efficiency`` where the device has one (the profile cannot
  tell the engine's kernel from SDPA's).
* hbm_efficiency: the copy's read + write bytes per second over the nominal bandwidth.
* intra_node_efficiency / inter_node_efficiency: all-gather bus bandwidth at the largest size
  (the 'intra' group, or 'world' on one node; 'inter' across nodes) over the nominal link;
  intra_node_latency_us / inter_node_latency_us: the smallest all-gather's time over its n - 1
  ring steps.

A profile taken on CPU (gloo, fp32) is valid input: its constants are small, and its
source says so; it exists so that the path from measurement to prediction runs in CI.
"""

from __future__ import annotations

import math
from pathlib import Path

from ndplan import limits
from ndplan.errors import NdplanError

SECTIONS = ("gemm", "attention", "hbm", "collectives")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
"""The collectives ndplan profile times; only the all-gathers set constants (_link), the others are raw timings."""
GROUPS = ("world", "intra", "inter")
META_COUNTS = ("seq", "mbs", "nodes", "world")
_NUM = {"gemm": ("m", "k", "n", "seconds"),
        "attention": ("batch", "heads", "seq", "head_dim", "forward_s", "backward_s"),
        "hbm": ("bytes", "seconds"), "collectives": ("ranks", "bytes", "seconds")}


def load(path: str) -> dict:
    """The profile document, every field checked (one-line errors naming the field)."""
    from ndplan.catalog.files import read_mapping
    doc = read_mapping(Path(path), "--profile")
    if doc.get("ndplan_profile") != 1:
        raise NdplanError("ndplan_profile", doc.get("ndplan_profile"), f"{path} is not an ndplan profile (version 1)",
                          "write it with ndplan profile -o FILE")
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        raise NdplanError("meta", meta, "not a mapping", f"regenerate {path} with ndplan profile")
    for key in META_COUNTS:
        if meta.get(key) is not None:
            limits.count(f"meta.{key}", meta[key], 1, limits.MAX_SEQ if key in ("seq", "mbs") else limits.MAX_DEVICES,
                         "a positive whole number")
    for sec in SECTIONS:
        rows = doc.get(sec, [])
        if not isinstance(rows, list):
            raise NdplanError(sec, type(rows).__name__, "not a list", f"regenerate {path} with ndplan profile")
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise NdplanError(f"{sec}[{i}]", row, "not a mapping", f"regenerate {path} with ndplan profile")
            for key in _NUM[sec]:
                limits.real(f"{sec}[{i}].{key}", row.get(key), 0.0, 1e18, lo_open=True, what="a positive number")
            if sec == "collectives":
                _collective_row(f"{sec}[{i}]", row, path)
    if not doc.get("gemm"):
        raise NdplanError("gemm", None, f"{path} has no GEMM timings", "run ndplan profile again")
    return doc


def _collective_row(where: str, row: dict, path: str) -> None:
    if row.get("op") not in OPS:
        raise NdplanError(f"{where}.op", row.get("op"), "not a collective ndplan profile times",
                          f"one of {', '.join(OPS)}")
    if row.get("group") not in GROUPS:
        raise NdplanError(f"{where}.group", row.get("group"), "not a group ndplan profile times",
                          f"one of {', '.join(GROUPS)}")
    limits.count(f"{where}.ranks", row["ranks"], 1, limits.MAX_DEVICES, "a rank count")


def _flops(row: dict) -> float:
    return 2.0 * row["m"] * row["k"] * row["n"]


def interpolate_rate(rows: list[dict], flops: float) -> float:
    """FLOP/s of a GEMM of ``flops`` FLOPs: piecewise linear in (log FLOPs, log FLOP/s) through
    the measured GEMMs (the fastest where several share a size), flat beyond the ends."""
    pts = {}
    for r in rows:
        x, y = math.log(_flops(r)), math.log(_flops(r) / r["seconds"])
        pts[x] = max(pts.get(x, y), y)
    xs = sorted(pts)
    lx = math.log(flops)
    if lx <= xs[0]:
        return math.exp(pts[xs[0]])
    if lx >= xs[-1]:
        return math.exp(pts[xs[-1]])
    j = next(i for i in range(1, len(xs)) if xs[i] >= lx)
    x0, x1 = xs[j - 1], xs[j]
    w = (lx - x0) / (x1 - x0)
    return math.exp(pts[x0] * (1 - w) + pts[x1] * w)


def gemm_efficiency(doc: dict, peak_flops: float, model=None, seq: int | None = None, tp: int = 1,
                    mbs: int | None = None, cp: int = 1) -> float:
    rows = doc["gemm"]
    if model is None:
        shapes = [(r["m"], r["k"], r["n"], 1) for r in rows]
    else:
        from ndplan.profile_run import gemm_shapes
        meta = doc.get("meta", {})
        seq, mbs = seq or meta.get("seq"), mbs or meta.get("mbs") or 1
        if not seq:
            raise NdplanError("meta.seq", None, "the profile records no sequence length and none was given",
                              "give --seq N")
        shapes = [s[1:] for s in gemm_shapes(model, int(seq), int(mbs), tp, cp)]
    flops = [(2.0 * m * k * n, count) for m, k, n, count in shapes]
    seconds = sum(count * f / interpolate_rate(rows, f) for f, count in flops)
    return sum(count * f for f, count in flops) / seconds / peak_flops


def attention_efficiency(doc: dict, peak_flops: float) -> float | None:
    from ndplan.formulas import flops as FL
    from ndplan.formulas.step import ATTN_HALF_TOKENS
    rows = doc.get("attention") or []
    if not rows:
        return None
    r = max(rows, key=lambda x: x["seq"])
    # QK^T and PV of a causal call: the forward FLOPs and backward factor of formulas/flops.py
    fwd = float(FL.CAUSAL_FACTOR) * 2 * r["batch"] * r["heads"] * r["seq"] ** 2 * 2 * r["head_dim"]
    rate = fwd * (1 + float(FL.CORE_BACKWARD_FACTOR)) / (r["forward_s"] + r["backward_s"])
    return rate / peak_flops * (r["seq"] + ATTN_HALF_TOKENS) / r["seq"]


def _link(doc: dict, group: str) -> tuple[float, float] | None:
    """(bus bandwidth B/s at the largest all-gather, latency s per ring step at the smallest)."""
    rows = [r for r in doc.get("collectives") or [] if r.get("op") == "all_gather" and r.get("group") == group
            and r["ranks"] > 1]
    if not rows:
        return None
    big, small = max(rows, key=lambda r: r["bytes"]), min(rows, key=lambda r: r["bytes"])
    n = big["ranks"]
    return big["bytes"] / big["seconds"] * (n - 1) / n, small["seconds"] / (small["ranks"] - 1)


def overrides(doc: dict, hw, model=None, seq: int | None = None, tp: int = 1, where: str = "profile",
              mbs: int | None = None, cp: int = 1) -> dict:
    """Hardware field -> (value, source) from the profile (module docstring). An efficiency above 1
    (a rate above ``hw``'s nominal peak or bandwidth) is a one-line error: the profile is of
    other hardware than -H says."""
    meta = doc.get("meta", {})
    tag = (f"{where} ({meta.get('device', '?')}, {meta.get('backend', '?')}, {meta.get('dtype', '?')}, "
           f"{meta.get('date', '?')})")
    peak = hw.bf16_tflops * 1e12
    out = {}

    def eff(name, v, how):
        if v is not None and v > 1:
            raise NdplanError("--profile", where, f"measures {name} {v:.3g}, above {hw.name}'s nominal rate",
                              f"give the -H of the profiled devices ({meta.get('hardware', '?')})")
        if v is not None and v > 0:
            out[name] = (v, f"{tag}: {how}")
    eff("gemm_efficiency", gemm_efficiency(doc, peak, model, seq, tp, mbs, cp),
        "the planned layer GEMMs at rates interpolated in log space between the measured ones, over the 16-bit peak")
    if "gemm_efficiency" in out and hw.fp8_tflops:
        from ndplan.catalog.mamf import derived
        d = derived(hw.bf16_tflops, hw.fp8_tflops, hw.mamf_bf16_tflops, hw.mamf_fp8_tflops)
        ratio = d["fp8_gemm_efficiency"][0] / d["gemm_efficiency"][0]
        fp8 = out["gemm_efficiency"][0] * ratio
        if fp8 <= 1:  # derived, not measured: above 1 it is left to the hardware entry
            out["fp8_gemm_efficiency"] = (fp8, f"{tag}: the profiled gemm_efficiency x the FP8 / BF16 MAMF ratio "
                                               f"{ratio:.3g} (catalog/mamf.py; 16-bit GEMMs were timed)")
    attn = attention_efficiency(doc, peak)
    how = "the longest causal attention's forward + backward FLOP/s over the 16-bit peak, over the length factor"
    eff("attention_efficiency", attn, how)
    if hw.fa2_attention_efficiency:
        eff("fa2_attention_efficiency", attn, how + " (SDPA's kernel on the profiled machine)")
    if doc.get("hbm"):
        r = max(doc["hbm"], key=lambda x: x["bytes"])
        eff("hbm_efficiency", 2 * r["bytes"] / r["seconds"] / (hw.hbm_gb_per_s * 1e9), "copy read + write bytes/s")
    one_node = int(meta.get("nodes") or 1) <= 1
    for field, group, nominal in (("intra_node", "world" if one_node else "intra", hw.intra_node_gb_per_s),
                                  ("inter_node", "inter", hw.inter_node_gb_per_s)):
        link = _link(doc, group)
        if link:
            eff(f"{field}_efficiency", link[0] / (nominal * 1e9), f"all-gather bus bandwidth on the '{group}' group")
            out[f"{field}_latency_us"] = (link[1] * 1e6, f"{tag}: smallest all-gather's time per ring step")
    return out


def apply(path: str, hw, model=None, seq: int | None = None, tp: int = 1, mbs: int | None = None, cp: int = 1):
    """``hw`` with the profile's constants (sources name the file)."""
    from dataclasses import replace

    from ndplan.catalog.hardware import check_field
    doc = load(path)
    profiled = doc.get("meta", {}).get("hardware")
    if profiled and profiled != hw.name:
        raise NdplanError("--profile", path, f"measured for -H {profiled}, not {hw.name}",
                          f"give -H {profiled}, or profile the devices {hw.name} describes")
    found = overrides(doc, hw, model, seq, tp, where=f"profile {path}", mbs=mbs, cp=cp)
    vals = {k: check_field(k, v, f"--profile {path}") for k, (v, _) in found.items()}
    return replace(hw, **vals, sources=dict(hw.sources) | {k: s for k, (_, s) in found.items()})
