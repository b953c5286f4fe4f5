"""Hardware: one device type and its node, from hardware/<name>.yaml.

Each numeric field in the YAML is ``{value: X, source: "...", unverified?: true, note?: ...}``.
Bandwidths are unidirectional per device in GB/s (1e9 B/s); HBM capacity in GiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ndplan.catalog.files import catalog_names, read_mapping, resolve
from ndplan.errors import NdplanError
from ndplan.units import GIB, GIGA, TERA

_NUMERIC = ("bf16_tflops", "fp8_tflops", "hbm_gib", "hbm_gb_per_s", "intra_node_gb_per_s",
            "inter_node_gb_per_s", "devices_per_node")
_REQUIRED = ("bf16_tflops", "hbm_gib", "hbm_gb_per_s", "intra_node_gb_per_s", "inter_node_gb_per_s",
             "devices_per_node")


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

    def __post_init__(self):
        for f_ in _REQUIRED:
            v = getattr(self, f_)
            if v is None or v <= 0:
                raise NdplanError(f_, v, f"hardware '{self.name}' needs a positive {f_}")


def load_hardware(name_or_path: str) -> Hardware:
    path = resolve("hardware", name_or_path, "hardware")
    raw = read_mapping(path, "hardware")
    vals, sources = {}, {}
    for f_ in _NUMERIC:
        entry = raw.get(f_)
        if isinstance(entry, dict):
            v, src = entry.get("value"), str(entry.get("source", ""))
            if entry.get("unverified"):
                src += " (unverified)"
        else:
            v, src = entry, ""
        if v is None and f_ in _REQUIRED:
            raise NdplanError(f_, None, f"missing in {path}; add `{f_}: {{value: <number>, source: ...}}`")
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise NdplanError(f_, v, f"must be a number (in {path})")
        vals[f_] = v
        sources[f_] = src
    return Hardware(name=path.stem, display_name=str(raw.get("display_name", path.stem)),
                    bf16_tflops=float(vals["bf16_tflops"]),
                    fp8_tflops=None if vals["fp8_tflops"] is None else float(vals["fp8_tflops"]),
                    hbm_gib=float(vals["hbm_gib"]), hbm_gb_per_s=float(vals["hbm_gb_per_s"]),
                    intra_node_gb_per_s=float(vals["intra_node_gb_per_s"]),
                    inter_node_gb_per_s=float(vals["inter_node_gb_per_s"]),
                    devices_per_node=int(vals["devices_per_node"]), sources=sources)


def list_hardware() -> list[Hardware]:
    return [load_hardware(n) for n in catalog_names("hardware")]
