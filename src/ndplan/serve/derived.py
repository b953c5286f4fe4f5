"""Serving quantities derived from the memory and step Terms, one function each. Each takes numbers
(serve/estimate.py computes with them) or SymPy symbols (serve/explain.py prints the same
function's closed form and evaluates it at the estimate's values), so the number a user reads in
``--explain`` and the one the estimate ranks by come from one expression."""

from __future__ import annotations

import math

import sympy as sp


def _symbolic(*xs) -> bool:
    return any(isinstance(x, sp.Basic) for x in xs)


def _max(*xs):
    return sp.Max(*xs) if _symbolic(*xs) else max(xs)


def _floor(x):
    return sp.floor(x) if _symbolic(x) else math.floor(x)


def kv_pool(rule: str, total, fraction, weights, workspace, non_torch):
    """Bytes of one device's KV pool under an engine's rule (serve/engines.py module docstring)."""
    if rule == "total_minus_peak":  # vLLM gpu_memory_utilization
        return total * fraction - weights - workspace - non_torch
    if rule == "static":  # SGLang mem_fraction_static
        return total * fraction - weights
    return fraction * (total - weights - workspace - non_torch)  # TensorRT-LLM free_gpu_memory_fraction


def capacity_tokens(pool, kv_per_token, block):
    """Tokens a pool of ``pool`` bytes holds, in whole pages of ``block`` tokens."""
    return _floor(pool / (kv_per_token * block)) * block


def requests_held(pool, request_bytes):
    """Whole requests of ``request_bytes`` each a pool holds."""
    return _floor(pool / request_bytes)


def lifetime(ttft, tpot, osl):
    """Seconds one request stays: its first token, then OSL - 1 steps."""
    return ttft + (osl - 1) * tpot


def first_token(tpot, chunks, chunk_step):
    """Seconds to the first token once running: the prompt's chunks, each a step beside the others
    decoding, never under one step."""
    return _max(tpot, chunks * chunk_step)


def ttft(tpot, chunks, chunk_step, waiting, running, osl):
    """TTFT in a closed loop: the first token once running, plus the wait for a slot, ``waiting`` /
    ``running`` request lifetimes (serve/estimate.py module docstring)."""
    first = first_token(tpot, chunks, chunk_step)
    return first + waiting / running * lifetime(first, tpot, osl)


def output_per_gpu(running, osl, tpot, chunks, chunk_step, devices):
    """Little's law: ``running`` requests of OSL tokens each, one lifetime apart, over the devices."""
    return running * osl / lifetime(first_token(tpot, chunks, chunk_step), tpot, osl) / devices
