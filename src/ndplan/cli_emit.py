"""Shared ``--emit FORMAT`` / ``--emit-out PATH`` options of estimate, sweep and balance."""

from __future__ import annotations

import click

from ndplan.errors import NdplanError
from ndplan.export import FORMATS, emit, write
from ndplan.paths import output_dir, output_file


def emit_options(fn):
    fn = click.option("--emit-out", type=click.Path(), default=None,
                      help="Write the --emit form here (default: stdout, instead of the report).")(fn)
    return click.option("--emit", "emit_fmt", type=click.Choice(list(FORMATS)), default=None,
                        help="Export the strategy as a framework config.")(fn)


def emit_cli(fmt: str | None, out: str | None, model, strategy, balance=None, text: str | None = None) -> bool:
    """Emit when asked; True when the form went to stdout (the caller prints no report).
    ``text``: the form already rendered (``emit``, before the work, so that a strategy
    the format cannot express fails first)."""
    if fmt is None:
        return False
    if text is None:
        text = emit(fmt, model, strategy, balance=balance)
    if write(text, out):
        click.echo(f"wrote {fmt} form to {out}", err=True)
        return False
    click.echo(text, nl=False)
    return True


def check_emit_out(fmt: str | None, out: str | None, directory: bool = False) -> None:
    """Before any work: ``--emit-out`` needs ``--emit``, and names a file in an existing
    folder (a folder, created if its parent exists, with ``directory``)."""
    if out is None:
        return
    if fmt is None:
        raise NdplanError("--emit-out", out, "given without --emit", "add --emit FORMAT, or drop --emit-out")
    (output_dir if directory else output_file)("--emit-out", out)


def one_stdout(**given) -> None:
    """Before any work: at most one of the outputs that print to stdout (``--json``,
    ``--csv``, ``--emit`` without ``--emit-out``); the names are the flags without dashes."""
    chosen = [k for k, v in given.items() if v]
    if len(chosen) > 1:
        flags = " and ".join(f"--{k.replace('_', '-')}" for k in chosen)
        raise NdplanError(f"--{chosen[1].replace('_', '-')}", True, f"{flags} both print to stdout",
                          "choose one (--emit-out FILE writes the launch config to a file)")
