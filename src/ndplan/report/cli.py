"""The ``--report`` / ``--csv`` option block of ``ndplan sweep``, ``estimate``, ``balance``
and (``--report`` alone) ``serve``: one decorator and one call per command. Messages go to stderr so that
``--json`` / ``--csv`` output stays clean."""

from __future__ import annotations

import click

from ndplan.report.notes import PLOT_MISSING

def _check_report(ctx, param, value):
    if value is None:
        return None
    from ndplan.report.render import report_path
    return str(report_path(value))


_REPORT = click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None, callback=_check_report,
                       help="Write a report (PATH.md with PNGs beside it, or self-contained PATH.html), "
                            "plus CSV/JSON of every table. Figures need: pip install 'ndplan[plot]'.")
_CSV = click.option("--csv", "report_csv", is_flag=True, help="Print the table as CSV.")


def report_option(fn):
    return _REPORT(fn)


def report_csv_options(fn):
    return _REPORT(_CSV(fn))


def _write(build, path) -> None:
    from ndplan.report import write_report
    rep = build()
    if PLOT_MISSING in rep.notes:
        click.echo(PLOT_MISSING, err=True)
    files = write_report(rep, path)
    click.echo(f"report written to {files[0]} ({len(files) - 1} more files beside it)", err=True)


def sweep(res, space, kw: dict) -> None:
    if kw.get("report_path"):
        from ndplan.report import sweep_report
        _write(lambda: sweep_report(res, space), kw["report_path"])


def estimate(est, kw: dict) -> bool:
    """Write the report if asked; print the per-stage table as CSV if asked (then True)."""
    if kw.get("report_path"):
        from ndplan.report import estimate_report
        _write(lambda: estimate_report(est), kw["report_path"])
    if kw.get("report_csv"):
        from ndplan.report.tables import stage_table
        click.echo(stage_table(est).to_csv(), nl=False)
        return True
    return False


def balance(out: dict, sim, inputs: dict, kw: dict) -> bool:
    """Write the report if asked; print the stage table as CSV if asked (then True)."""
    if kw.get("report_path"):
        from ndplan.report import balance_report
        _write(lambda: balance_report(out, sim, inputs), kw["report_path"])
    if kw.get("report_csv"):
        from ndplan.report.tables import balance_stage_table
        click.echo(balance_stage_table(out).to_csv(), nl=False)
        return True
    return False


def serve(inputs: dict, rows, front, terms, kw: dict) -> None:
    """``ndplan serve --report``."""
    if kw.get("report_path"):
        from ndplan.report import serve_report
        _write(lambda: serve_report(inputs, rows, front, terms), kw["report_path"])
