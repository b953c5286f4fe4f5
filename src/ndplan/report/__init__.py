"""Reports: a run's inputs, tables, figures and the formulas behind the chosen plan,
written as Markdown (PNG figures beside it) or self-contained HTML (figures embedded).

model.py     Report / Table / Figure dataclasses (CSV and JSON per table)
tables.py    tables of a sweep, an estimate and a balance run
figures.py   matplotlib figures (optional extra ``ndplan[plot]``), PNG bytes
pipeline.py  PPB balance + discrete-event replay of a candidate for the timeline
build.py     assemble a Report from a SweepResult, an Estimate or a balance run
serve.py     the Report of ``ndplan serve``
render.py    Markdown / HTML writers
cli.py       the ``--report`` / ``--csv`` option block shared by the commands
"""

import importlib as _importlib

_EXPORTS = {"balance_report": "build", "estimate_report": "build", "sweep_report": "build", "serve_report": "serve",
            "PLOT_MISSING": "notes", "have_matplotlib": "figures", "Figure": "model", "Report": "model",
            "Table": "model", "write_report": "render"}
"""Name -> the submodule defining it, imported on first use (PEP 562): the commands' option
block (cli.py) loads without the report builders and SymPy."""

__all__ = ["Report", "Table", "Figure", "sweep_report", "estimate_report", "balance_report", "serve_report",
           "write_report", "have_matplotlib", "PLOT_MISSING"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ndplan.report' has no attribute {name!r}")
    return getattr(_importlib.import_module(f"ndplan.report.{_EXPORTS[name]}"), name)


def __dir__():
    return sorted(set(__all__) | {k for k in globals() if not k.startswith("_")})
