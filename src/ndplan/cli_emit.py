"""Shared ``--emit FORMAT`` / ``--emit-out PATH`` options of estimate, sweep and balance."""

from __future__ import annotations

import click

from ndplan.export import EMITTERS, emit, write


def emit_options(fn):
    fn = click.option("--emit-out", type=click.Path(), default=None,
                      help="Write the --emit form here (default: stdout, instead of the report).")(fn)
    return click.option("--emit", "emit_fmt", type=click.Choice(list(EMITTERS)), default=None,
                        help="Export the strategy as a framework config.")(fn)


def emit_cli(fmt: str | None, out: str | None, model, strategy, balance=None) -> bool:
    """Emit when asked; True when the form went to stdout (the caller prints no report)."""
    if fmt is None:
        return False
    text = emit(fmt, model, strategy, balance=balance)
    if write(text, out):
        click.echo(f"wrote {fmt} form to {out}", err=True)
        return False
    click.echo(text, nl=False)
    return True
