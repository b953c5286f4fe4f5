"""The one exception type the library raises for bad input, and warnings.

Every message is one line: ``<field>=<value>: <what is wrong>; <how to fix>``; the
CLI prints it as ``error: ...`` on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import warnings


class NdplanError(ValueError):
    """Bad input: the field, the value, what is wrong with it and how to fix it."""

    def __init__(self, field: str, value, problem: str, fix: str = ""):
        self.field = field
        self.value = value
        self.problem = problem
        self.fix = fix
        text = f"{problem}; {fix}" if fix else problem
        super().__init__(f"{field}={_show(value)}: {' '.join(text.split())}")


def _show(value) -> str:
    """The value as the user wrote it: strings quoted, long ones cut (one line)."""
    text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= 120 else text[:117] + "..."


class NdplanWarning(UserWarning):
    """Valid but suspicious input (e.g. seq above the model's max_position_embeddings);
    the CLI prints it as one ``warning: ...`` line on stderr and goes on."""


def warn(field: str, value, problem: str, fix: str = "") -> None:
    """Issue an NdplanWarning in the error line's form."""
    warnings.warn(NdplanWarning(f"{field}={_show(value)}: {problem}" + (f"; {fix}" if fix else "")), stacklevel=2)
