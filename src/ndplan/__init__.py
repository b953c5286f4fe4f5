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

import importlib as _importlib
import importlib.util as _util
import sys as _sys
import types as _types

_EXPORTS = {
    "NdplanError": "ndplan.errors", "load_model": "ndplan.catalog", "load_hardware": "ndplan.catalog",
    "list_models": "ndplan.catalog", "list_hardware": "ndplan.catalog", "ModelSpec": "ndplan.catalog",
    "Hardware": "ndplan.catalog", "Strategy": "ndplan.strategy", "strategy_from_point": "ndplan.points",
    "estimate": "ndplan.estimate", "stage_breakdown": "ndplan.estimate", "Estimate": "ndplan.estimate",
    "Term": "ndplan.terms", "Breakdown": "ndplan.terms", "compile_breakdown": "ndplan.compiled",
    "step_time": "ndplan.formulas.step", "sweep": "ndplan.sweep", "SweepResult": "ndplan.sweep",
    "hooks": "ndplan", "model_symbols": "ndplan.symbols",
}
"""Public name -> the module defining it, imported on first use (PEP 562): the command line
imports only what a command needs, and a sweep whose kernels are cached never imports SymPy."""


def __getattr__(name: str):
    """A public name, else a submodule (``ndplan.symbols.tp``), imported on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        if name.startswith("_") or _util.find_spec(f"ndplan.{name}") is None:
            raise AttributeError(f"module 'ndplan' has no attribute {name!r}")
        module = "ndplan"
    value = _importlib.import_module(f"ndplan.{name}") if module == "ndplan" else getattr(
        _importlib.import_module(module), name)
    globals()[name] = value  # a submodule of the same name (ndplan.estimate, ndplan.sweep) is shadowed, as before
    return value


def __dir__():
    return sorted({k for k in globals() if not k.startswith("_")} | set(_EXPORTS) | {"__version__"})


class _Package(_types.ModuleType):
    """Keeps ``ndplan.estimate`` and ``ndplan.sweep`` the functions when their modules are
    imported (the import system binds a loaded submodule on its package)."""

    def __setattr__(self, name, value):
        if isinstance(value, _types.ModuleType) and _EXPORTS.get(name, "ndplan") == value.__name__:
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


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
