"""ndplan: symbolic planning engine for N-dimensional parallel training.

Notebook API (see README):

    >>> import ndplan
    >>> model = ndplan.load_model("llama3-8b")
    >>> hw = ndplan.load_hardware("h100-sxm")
    >>> strat = ndplan.Strategy(dp=8, tp=1, pp=1, mbs=1, gbs=64, seq=8192)
    >>> est = ndplan.estimate(model, hw, strat)
    >>> est.peak_bytes, est.step_s, est.mfu
    >>> res = ndplan.sweep(model, hw, gpus=64, seq=8192, gbs=512)   # exhaustive search
    >>> ndplan.step_time(model, ndplan.model_symbols(model), strat)["time.tp_comm"].expr   # a closed form
"""

from ndplan.errors import NdplanError
from ndplan.catalog import load_model, load_hardware, list_models, list_hardware, ModelSpec, Hardware
from ndplan.strategy import Strategy
from ndplan.points import strategy_from_point
from ndplan.estimate import estimate, stage_breakdown, Estimate
from ndplan.terms import Term, Breakdown
from ndplan.kernels import compile_breakdown
from ndplan.formulas.step import step_time
from ndplan.sweep import sweep, SweepResult
from ndplan import hooks
from ndplan.symbols import model_symbols

__all__ = [
    "NdplanError",
    "load_model",
    "load_hardware",
    "list_models",
    "list_hardware",
    "ModelSpec",
    "Hardware",
    "Strategy",
    "strategy_from_point",
    "estimate",
    "stage_breakdown",
    "Estimate",
    "Term",
    "Breakdown",
    "compile_breakdown",
    "step_time",
    "model_symbols",
    "sweep",
    "SweepResult",
    "hooks",
]
__version__ = "0.1.0"
