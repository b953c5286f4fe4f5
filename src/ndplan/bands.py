"""Uncertainty bands of predicted step times, and ties among ranked candidates (issue 16 part 5).

Each efficiency constant of the time model (catalog.hardware.EFFICIENCY_ARGS) has a relative
standard deviation on the log scale: the calibrated one where the hardware entry was written by
``ndplan calibrate`` (its 95 % interval, in the field's source), else the prior in PRIORS,
each with the figures it comes from. The step time's sensitivity to each constant,
S_i = d ln T / d ln e_i, is a central difference of the compiled time kernel
(estimate.step_time_function) at e_i x exp(+-STEP); the band is
T x exp(+-Z95 sqrt(sum_i (S_i sigma_i)^2)).

Ties. Two candidates share the hardware, so an error in a constant moves both: what decides their
order is the difference d = ln T_b - ln T_a, whose deviation is sqrt(sum_i ((S_b,i - S_a,i)
sigma_i)^2). A candidate is tied with the best when d <= Z95 x that deviation, or when it is
within STRUCTURE_FLOOR of it: at the stated uncertainty the choice among tied candidates does
not matter. The ranking itself stays
the point estimates' (tie-break: table.rank, then the degrees), so a tie never reorders the list.

What a band does not hold: the structure's own error, which the constants cannot absorb
(benchmarks/steptime_validation.py: median |error| 9.3 % over the published runs, 12.4 % with
NeMo's long sequences).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ndplan.catalog import mamf
from ndplan.catalog.hardware import EFFICIENCY_ARGS

Z95 = 1.959964
"""Two-sided 95 % point of the normal distribution."""
STEP = 0.01
"""Relative step of the central differences (1 % of each constant)."""
STRUCTURE_FLOOR = 0.03
"""Candidates within 3 % of the first are tied whatever their sensitivities: the error the
structure keeps after calibration, the median after-fit |error| of benchmarks/steptime_validation.py
part (c) over its five sources (1.1, 2.1, 3.0, 3.1, 6.0 %: 3.0 %)."""

PRIORS: dict[str, tuple[float, str]] = {
    "gemm_efficiency": (0.08, "log-scale standard deviation (n - 1) of the GEMM efficiencies ndplan calibrate "
                              "fits to four published 16-bit sources (benchmarks/steptime_validation.py part c: "
                              "Narayanan 0.823, Megatron-Core 0.697, Korthikanti 0.711, torchtitan 0.684): 0.084; "
                              "a device without a published MAMF adds catalog/mamf.PRIOR_BF16_SIGMA"),
    "fp8_gemm_efficiency": (0.08, "as gemm_efficiency (the same TRAINING_GEMM_FRACTION scales the FP8 MAMF); "
                                  "a device without a published FP8 MAMF adds catalog/mamf.PRIOR_FP8_SIGMA"),
    "attention_efficiency": (0.25, "the long-sequence plateaus of the kernels engines run on H100 (fits to Shah "
                                   "et al. 2024 Figs. 5-6): FlashAttention-2 0.34, cuDNN 0.55-0.57, "
                                   "ln(0.56 / 0.34) / 2 = 0.25"),
    "hbm_efficiency": (0.20, "named prior: streaming kernels reach 60-90 % of nominal HBM bandwidth, "
                             "ln(0.9 / 0.6) / 2 = 0.20 (the fits of the published sources go lower, to 0.31)"),
    "intra_node_efficiency": (0.13, "named prior: nccl-tests bus bandwidth on NVLink 70-90 % of nominal, "
                                    "ln(0.9 / 0.7) / 2 = 0.13"),
    "inter_node_efficiency": (0.23, "named prior: nccl-tests bus bandwidth across nodes 60-95 % of the line "
                                    "rate, by message size and topology, ln(0.95 / 0.6) / 2 = 0.23"),
}
UNFIXED = 1.0
"""Log-scale deviation of a constant whose calibrated interval reaches 0 (a factor e either way):
a named assumption, not a fit. An efficiency the runs do not fix can sit anywhere in (0, 1];
one unit of ln spans the widest prior range above (HBM 0.20 x 2 = 0.4) more than twice, so the
band says "unknown" rather than borrowing a prior the runs contradicted."""
_FITTED = re.compile(r"fitted by ndplan calibrate.*?95 % interval "
                     r"(?:([0-9.eE+-]+) to ([0-9.eE+-]+)|([0-9.]+)-([0-9.]+))")


def spreads(hw, fa2: bool = False) -> dict[str, tuple[float, str]]:
    """Each constant's log-scale deviation and where it comes from: a calibrated interval
    (ndplan calibrate's source text, Z95 wide on each side) or the prior. ``fa2``: the engine
    runs FlashAttention-2, so the attention constant is the device's fa2_attention_efficiency
    where it has one (its calibrated interval, if any)."""
    out = {}
    for field, (sigma, src) in PRIORS.items():
        read = hw.attention_field(fa2) if field == "attention_efficiency" else field
        text = hw.sources.get(read, "")
        extra = mamf.prior_sigma(field, text)
        if extra:
            sigma, src = math.hypot(sigma, extra), f"{src}; with the MAMF prior's {extra:.3g}"
        out[field] = _fitted(text) or (sigma, src)
    return out


def _fitted(source: str) -> tuple[float, str] | None:
    """The deviation ndplan calibrate's 95 % interval gives, if ``source`` is its text; an
    interval reaching 0 (a constant the runs hardly fix) gives UNFIXED."""
    m = _FITTED.search(source)
    try:
        lo, hi = (float(m.group(1) or m.group(3)), float(m.group(2) or m.group(4))) if m else (None, None)
    except ValueError:
        return None
    if lo is None or not 0 <= lo < hi:
        return None
    if lo == 0:
        return UNFIXED, f"ndplan calibrate's 95 % interval {lo}-{hi} reaches 0"
    return math.log(hi / lo) / (2 * Z95), f"ndplan calibrate's 95 % interval {lo}-{hi}"


@dataclass(frozen=True)
class Band:
    """A step time's 95 % band from the constants' uncertainty and its sensitivities."""

    step_s: float
    low_s: float
    high_s: float
    sensitivity: dict[str, float]
    """d ln T / d ln e for each constant."""
    sigma: dict[str, float]

    def to_json(self) -> dict:
        return {"step_s": self.step_s, "low_s": self.low_s, "high_s": self.high_s,
                "sensitivity": self.sensitivity, "sigma": self.sigma}


def band(est) -> Band:
    """The 95 % band of an Estimate's step time (module docstring)."""
    from ndplan.estimate import step_time_function, time_hw_values
    hw, strat, eng = est.hardware, est.strategy, est.time_engine
    base = time_hw_values(hw, strat, eng)
    fields = list(PRIORS)
    args = {k: np.full(2 * len(fields) + 1, v, dtype=float) for k, v in base.items()}
    for j, f in enumerate(fields):
        arg = EFFICIENCY_ARGS[f]
        args[arg][1 + 2 * j] *= math.exp(STEP)
        args[arg][2 + 2 * j] *= math.exp(-STEP)
    t = np.broadcast_to(step_time_function(est.model, strat, eng)(**args), (2 * len(fields) + 1,))
    lt = np.log(t)
    sens = {f: float((lt[1 + 2 * j] - lt[2 + 2 * j]) / (2 * STEP)) for j, f in enumerate(fields)}
    from ndplan.engines import profile
    sig = {f: s for f, (s, _) in spreads(hw, (eng or profile(strat.engine)).attention_fa2).items()}
    half = Z95 * math.sqrt(sum((sens[f] * sig[f]) ** 2 for f in fields))
    return Band(step_s=float(t[0]), low_s=float(t[0] * math.exp(-half)), high_s=float(t[0] * math.exp(half)),
                sensitivity=sens, sigma=sig)


def tied_with_best(bands: list[Band]) -> list[bool]:
    """Whether each ranked candidate is tied with the first (module docstring); the first is.
    Bands of different hardware share no constant: their variances add."""
    if not bands:
        return []
    a = bands[0]
    out = []
    for b in bands:
        d = abs(math.log(b.step_s / a.step_s))
        if a.sigma == b.sigma:
            var = sum(((b.sensitivity[f] - a.sensitivity[f]) * a.sigma[f]) ** 2 for f in a.sigma)
        else:
            var = sum((b.sensitivity[f] * b.sigma[f]) ** 2 + (a.sensitivity[f] * a.sigma[f]) ** 2 for f in a.sigma)
        out.append(d <= Z95 * math.sqrt(var) or d <= math.log(1 + STRUCTURE_FLOOR))
    return out
