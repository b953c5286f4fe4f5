"""Hardware: one device type and its node, from hardware/<name>.yaml.

Each numeric field in the YAML is ``{value: X, source: "...", unverified?: true, note?: ...}``.
Bandwidths are unidirectional per device in GB/s (1e9 B/s); HBM capacity in GiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ndplan import limits
from ndplan.catalog import mamf
from ndplan.catalog.files import catalog_names, read_mapping, resolve
from ndplan.errors import NdplanError, warn
from ndplan.units import GIB, GIGA, TERA

_NUMERIC = ("bf16_tflops", "fp8_tflops", "hbm_gib", "hbm_gb_per_s", "intra_node_gb_per_s",
            "inter_node_gb_per_s", "devices_per_node")
#: Performance-model efficiencies and latencies: optional in a hardware YAML (same
#: {value, source} form), overridable with ``--set name=value``. Defaults and why:
EFFICIENCY_DEFAULTS: dict[str, tuple[float, str]] = {
    "attention_efficiency": (0.55, "long-sequence plateau of the fused attention core over the 16-bit peak "
                                   "(the length factor L/(L+400) is formulas/step.ATTN_HALF_TOKENS): Dao 2023 "
                                   "(FlashAttention-2) Sec. 4.1, forward 50-73 % and backward lower of the A100 "
                                   "peak; cuDNN on H100 plateaus at 561/989 = 0.57 forward and 542/989 = 0.55 "
                                   "backward (fits to Shah et al. 2024, Figs. 5-6)"),
    "hbm_efficiency": (0.8, "named default: streaming elementwise kernels reach about 80 % of the "
                            "nominal HBM bandwidth"),
    "intra_node_efficiency": (0.8, "named default: NCCL ring bus bandwidth about 80 % of the nominal "
                                   "NVLink per-direction bandwidth (nccl-tests busbw on DGX A100/H100)"),
    "inter_node_efficiency": (0.85, "named default: NCCL bus bandwidth about 85 % of the NIC line rate"),
    "intra_node_latency_us": (5.0, "named default: NCCL per-step latency inside a node, microseconds"),
    "inter_node_latency_us": (10.0, "named default: NCCL per-step latency across nodes, microseconds"),
}
GEMM_EFFICIENCIES = ("gemm_efficiency", "fp8_gemm_efficiency")
"""Efficiencies derived per device and dtype from its MAMF (catalog/mamf.py) unless given."""
FA2_FIELD = "fa2_attention_efficiency"
"""The attention plateau of FlashAttention-2 where it differs from the fused kernels (Hopper);
unset, ``attention_efficiency`` (engine_time.TimeChoices.attention_fa2 picks it)."""
EFFICIENCY_FIELDS = (*GEMM_EFFICIENCIES, *EFFICIENCY_DEFAULTS, FA2_FIELD)
"""Every efficiency and latency field of the time model."""
EFFICIENCY_ARGS = {"gemm_efficiency": "eff_gemm", "fp8_gemm_efficiency": "eff_gemm8", "attention_efficiency": "eff_attn", "hbm_efficiency": "eff_hbm",
                   "intra_node_efficiency": "eff_intra", "inter_node_efficiency": "eff_inter"}
"""Each efficiency field -> the kernel argument it gives (symbols.HW_SYMBOLS; kernel_values)."""
_REQUIRED = ("bf16_tflops", "hbm_gib", "hbm_gb_per_s", "intra_node_gb_per_s", "inter_node_gb_per_s",
             "devices_per_node")
MAX_RATE = 1e6
"""Ceiling of a peak in TFLOPS and of a bandwidth in GB/s (about 400x today's parts)."""
MIN_RATE = {"bf16_tflops": 1.0, "fp8_tflops": 1.0, "mamf_bf16_tflops": 0.1, "mamf_fp8_tflops": 0.1,
            "hbm_gb_per_s": 10.0, "intra_node_gb_per_s": 1.0,
            "inter_node_gb_per_s": 0.1}
"""Floors: 1 TFLOPS (a T4 does 65 dense fp16), 10 GB/s of device memory (one DDR4
channel is 25), 1 GB/s inside a node (a PCIe 3.0 x1 lane) and 0.1 GB/s between nodes
(1 Gb Ethernet); below them a step takes years and is surely a unit slip. A MAMF may sit below
its peak's floor (it is at most the peak, and --set on the peak scales it)."""
MAX_DEVICES_PER_NODE = 1024
MAX_LATENCY_US = 1e6


def _rate(field: str, v) -> float:
    return limits.real(field, v, MIN_RATE[field], MAX_RATE, lo_open=False,
                       what="TFLOPS" if field.endswith("tflops") else "GB/s")


def _latency(field: str, v) -> float:
    return limits.real(field, v, 0.0, MAX_LATENCY_US, lo_open=False, what="microseconds")


FIELD_RULES = {
    "bf16_tflops": _rate, "fp8_tflops": _rate, "mamf_bf16_tflops": _rate, "mamf_fp8_tflops": _rate,
    "hbm_gb_per_s": _rate, "intra_node_gb_per_s": _rate,
    "inter_node_gb_per_s": _rate, "hbm_gib": limits.gib,
    "devices_per_node": lambda f, v: limits.count(f, v, 1, MAX_DEVICES_PER_NODE, "a device count"),
    "gemm_efficiency": limits.fraction, "fp8_gemm_efficiency": limits.fraction, FA2_FIELD: limits.fraction,
    "attention_efficiency": limits.fraction, "hbm_efficiency": limits.fraction, "intra_node_efficiency": limits.fraction, "inter_node_efficiency": limits.fraction,
    "intra_node_latency_us": _latency, "inter_node_latency_us": _latency,
}
"""The one rule per numeric hardware field (catalog YAML, --set, Python): rates and sizes
finite and positive, efficiencies in (0, 1], latencies >= 0, devices per node an integer."""


def check_field(name: str, value, where: str):
    """``value`` checked by FIELD_RULES[name]; the error says where the value came from."""
    try:
        return FIELD_RULES[name](name, value)
    except NdplanError as e:
        raise NdplanError(e.field, e.value, f"{e.problem} (in {where})", e.fix) from None


@dataclass(frozen=True, kw_only=True)
class Hardware:
    name: str
    display_name: str
    bf16_tflops: float
    """Dense BF16/FP16 tensor-core peak, TFLOPS (1e12 FLOP/s)."""
    fp8_tflops: float | None
    """Dense FP8 peak, TFLOPS; None if the device has no FP8."""
    hbm_gib: float
    """Device memory capacity, GiB."""
    hbm_gb_per_s: float
    """HBM bandwidth, GB/s."""
    intra_node_gb_per_s: float
    """Per-device unidirectional bandwidth inside a node (NVLink/HCCS/xGMI), GB/s."""
    inter_node_gb_per_s: float
    """Per-device unidirectional NIC bandwidth across nodes, GB/s."""
    devices_per_node: int
    mamf_bf16_tflops: float | None = None
    """Maximum achievable BF16 matmul TFLOPS (best shape), measured; None if unpublished (catalog/mamf.py)."""
    mamf_fp8_tflops: float | None = None
    """Maximum achievable FP8 matmul TFLOPS, measured; None if unpublished."""
    gemm_efficiency: float | None = None
    """Achieved / 16-bit peak FLOP/s of a training step's GEMMs; None: derived from the MAMF (catalog/mamf.py)."""
    fp8_gemm_efficiency: float | None = None
    """Achieved / FP8 peak FLOP/s of fp8 GEMMs; None: derived from the FP8 MAMF (catalog/mamf.py)."""
    attention_efficiency: float = EFFICIENCY_DEFAULTS["attention_efficiency"][0]
    """Achieved / 16-bit peak FLOP/s of the fused attention core at long sequences (forward + backward)."""
    hbm_efficiency: float = EFFICIENCY_DEFAULTS["hbm_efficiency"][0]
    """Achieved / nominal HBM bandwidth of memory-bound kernels."""
    intra_node_efficiency: float = EFFICIENCY_DEFAULTS["intra_node_efficiency"][0]
    """Collective bus bandwidth / nominal intra-node bandwidth."""
    inter_node_efficiency: float = EFFICIENCY_DEFAULTS["inter_node_efficiency"][0]
    """Collective bus bandwidth / nominal NIC bandwidth."""
    fa2_attention_efficiency: float | None = None
    """attention_efficiency of FlashAttention-2 where it runs below the fused kernels (Hopper); None: the same."""
    intra_node_latency_us: float = EFFICIENCY_DEFAULTS["intra_node_latency_us"][0]
    inter_node_latency_us: float = EFFICIENCY_DEFAULTS["inter_node_latency_us"][0]
    sources: dict = field(default_factory=dict)
    """Field -> source string; fields whose value is unverified carry '(unverified)'."""

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gib * GIB)

    @property
    def bf16_flop_per_s(self) -> float:
        return self.bf16_tflops * TERA

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gb_per_s * GIGA

    def attention_field(self, fa2: bool) -> str:
        """The field the attention core's ``eff_attn`` reads: ``fa2_attention_efficiency`` when the
        engine runs FlashAttention-2 (EngineProfile.attention_fa2) and the device has one, else
        ``attention_efficiency``; the one rule kernel_values, bands, calibrate and explain follow."""
        return FA2_FIELD if fa2 and self.fa2_attention_efficiency else "attention_efficiency"

    def kernel_values(self, fp8: bool = False, fa2: bool = False) -> dict[str, float]:
        """Values of the hardware symbols (symbols.HW_SYMBOLS) in base units; ``fp8``: the GEMMs
        run in fp8 (engines.fp8_gemms), timed at the FP8 peak with their operands quantised
        (``fp8_gemm``) at ``eff_gemm8``; the attention core, router and output layer keep the 16-bit
        peak (``peak_bf16``) and ``eff_gemm``. ``fa2``: the engine's attention core is FlashAttention-2
        (EngineProfile.attention_fa2), at ``fa2_attention_efficiency`` where the device has one."""
        if fp8 and not self.fp8_tflops:
            warn("fp8 GEMMs", "on", f"{self.name} has no FP8 peak", "its GEMMs are timed at the bf16 peak")
        fp8_on = bool(fp8 and self.fp8_tflops)
        peak = self.fp8_tflops if fp8_on else self.bf16_tflops
        return {"peak": peak * TERA, "peak_bf16": self.bf16_tflops * TERA, "fp8_gemm": float(fp8_on),
                "hbm_bytes_per_s": self.hbm_gb_per_s * GIGA,
                "bw_intra": self.intra_node_gb_per_s * GIGA, "bw_inter": self.inter_node_gb_per_s * GIGA,
                **{arg: getattr(self, f) for f, arg in EFFICIENCY_ARGS.items()},
                "eff_attn": getattr(self, self.attention_field(fa2)),
                "lat_intra": self.intra_node_latency_us * 1e-6, "lat_inter": self.inter_node_latency_us * 1e-6,
                "node": float(self.devices_per_node)}

    def with_overrides(self, overrides: dict[str, float]) -> "Hardware":
        """A copy with fields replaced (``--set name=value``); unknown names are errors."""
        vals = {}
        for k, v in overrides.items():
            if k not in FIELD_RULES:
                import difflib
                close = difflib.get_close_matches(k, sorted(FIELD_RULES), n=3)
                raise NdplanError("--set", k, "unknown hardware parameter",
                                  f"did you mean {', '.join(close)}?" if close else f"choose from {', '.join(sorted(FIELD_RULES))}")
            vals[k] = check_field(k, v, "--set")
        sources = dict(self.sources) | {k: "--set on the command line" for k in overrides}
        for rate, peak in zip(mamf.MAMF_FIELDS, ("bf16_tflops", "fp8_tflops")):
            old, top = getattr(self, rate), vals.get(peak)
            if top and old and rate not in vals and getattr(self, peak):  # a new peak keeps the MAMF's ratio
                vals[rate] = old * top / getattr(self, peak)
                sources[rate] = f"{self.sources.get(rate, '')}; scaled with {peak} set on the command line"
        moved = set(vals) & {*mamf.MAMF_FIELDS, "bf16_tflops", "fp8_tflops"}
        for k in GEMM_EFFICIENCIES:  # a new MAMF or peak re-derives the efficiencies that came from them
            if k not in vals and moved and str(sources.get(k, "")).startswith((mamf.DERIVED, mamf.PRIOR)):
                vals[k] = None
        return replace(self, **vals, sources=sources)

    def __post_init__(self):
        for f_ in FIELD_RULES:
            v = getattr(self, f_)
            if v is None and f_ not in _REQUIRED:
                continue
            if v is None:
                raise NdplanError(f_, v, f"missing in hardware '{self.name}'", f"add `{f_}: {{value: <number>, source: ...}}`")
            object.__setattr__(self, f_, check_field(f_, v, f"hardware '{self.name}'"))
        for rate, peak in zip(mamf.MAMF_FIELDS, ("bf16_tflops", "fp8_tflops")):
            m, top = getattr(self, rate), getattr(self, peak)
            if m is not None and top is None:
                raise NdplanError(rate, m, f"given for hardware '{self.name}', which has no {peak}",
                                  f"give {peak} too, or remove {rate}")
            if m is not None and m > top:
                raise NdplanError(rate, m, f"above {peak}={top} in hardware '{self.name}' (a measured matmul "
                                  "rate cannot beat the dense peak)", "check both values; MAMF is at most the peak")
        derived = mamf.derived(self.bf16_tflops, self.fp8_tflops, self.mamf_bf16_tflops, self.mamf_fp8_tflops)
        missing = [f_ for f_ in GEMM_EFFICIENCIES if getattr(self, f_) is None]
        for f_ in missing:
            object.__setattr__(self, f_, derived[f_][0])
        if missing:
            object.__setattr__(self, "sources", dict(self.sources) | {f_: derived[f_][1] for f_ in missing})


def load_hardware(name_or_path: str) -> Hardware:
    """A catalog name (``h100-sxm``) or a hardware YAML path; every value is checked by
    FIELD_RULES (Hardware.__post_init__)."""
    path = resolve("hardware", name_or_path, "hardware")
    raw = read_mapping(path, "hardware")
    vals, sources = {}, {}
    for f_ in _NUMERIC + mamf.MAMF_FIELDS + EFFICIENCY_FIELDS:
        entry = raw.get(f_)
        v, src = (entry.get("value"), str(entry.get("source", ""))) if isinstance(entry, dict) else (entry, "")
        if isinstance(entry, dict) and entry.get("unverified"):
            src += " (unverified)"
        if v is None and f_ in EFFICIENCY_DEFAULTS:
            v, src = EFFICIENCY_DEFAULTS[f_][0], EFFICIENCY_DEFAULTS[f_][1]
        if v is None and f_ in _REQUIRED:
            raise NdplanError(f_, None, f"missing in {path}", f"add `{f_}: {{value: <number>, source: ...}}`")
        vals[f_] = v
        sources[f_] = src
    return Hardware(name=path.stem, display_name=str(raw.get("display_name", path.stem)), sources=sources, **vals)


def list_hardware() -> list[Hardware]:
    return [load_hardware(n) for n in catalog_names("hardware")]
