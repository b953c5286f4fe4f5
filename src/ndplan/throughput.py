"""MFU, HFU and tokens per second: the ratios every report prints, written once.

MFU = model FLOPs per step / (step time x devices x dense bf16 peak), where model FLOPs
are 3 x the forward FLOPs of every GEMM plus the causal attention core at the full
sequence, recompute not counted, MTP excluded (formulas/flops.py; the definition of
Chowdhery et al. 2022 App. B and Megatron-LM's ``num_floating_point_operations``).
HFU uses the hardware FLOPs (model + recompute) instead. Works on numbers and numpy arrays.
"""

from __future__ import annotations


def utilization(flops_per_step, step_s, devices, peak_flop_per_s):
    """Fraction of the devices' peak that ``flops_per_step`` in ``step_s`` seconds uses:
    MFU with model FLOPs, HFU with model + recompute FLOPs."""
    return flops_per_step / (step_s * devices * peak_flop_per_s)


def tokens_per_s_per_device(gbs, seq, step_s, devices):
    """Training tokens per second per device: gbs x seq tokens per step."""
    return gbs * seq / step_s / devices
