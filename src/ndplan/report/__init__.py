"""Reports: a run's inputs, tables, figures and the formulas behind the chosen plan,
written as Markdown (PNG figures beside it) or self-contained HTML (figures embedded).

model.py     Report / Table / Figure dataclasses (CSV and JSON per table)
tables.py    tables of a sweep, an estimate and a balance run
figures.py   matplotlib figures (optional extra ``ndplan[plot]``), PNG bytes
pipeline.py  PPB balance + discrete-event replay of a candidate for the timeline
build.py     assemble a Report from a SweepResult, an Estimate or a balance run
render.py    Markdown / HTML writers
cli.py       the ``--report`` / ``--csv`` option block shared by the commands
"""

from ndplan.report.build import balance_report, estimate_report, sweep_report
from ndplan.report.figures import PLOT_MISSING, have_matplotlib
from ndplan.report.model import Figure, Report, Table
from ndplan.report.render import write_report

__all__ = ["Report", "Table", "Figure", "sweep_report", "estimate_report", "balance_report",
           "write_report", "have_matplotlib", "PLOT_MISSING"]
