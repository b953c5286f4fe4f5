"""The ``ndplan ...`` commands shown to a user: README.md's code blocks and every command's
``--help`` text. tests/test_examples.py runs each of them; ``ndplan.prebuild`` runs them to
ship the kernels they need."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

EXITS = re.compile(r"#\s*exits\s+(\d)")


def logical_lines(text: str) -> list[str]:
    """Lines with ``\\`` continuations joined."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        out.append((cur + line).strip())
        cur = ""
    return [ln for ln in out if ln]


def commands(lines: list[str]) -> list[tuple[list[str], int]]:
    """(argv after ``ndplan``, expected exit) of every ``ndplan`` command, also after ``&&``;
    a ``# exits N`` comment gives the exit code (0 otherwise)."""
    out = []
    for line in lines:
        m = EXITS.search(line)
        code = int(m.group(1)) if m else 0
        for part in line.split("&&"):
            part = part.strip()
            if part.startswith("ndplan "):
                out.append((shlex.split(part, comments=True)[1:], code))
    return out


def readme_commands(readme: Path) -> list[tuple[list[str], int]]:
    blocks = re.findall(r"```(?:bash|sh|console)?\n(.*?)```", readme.read_text(), re.S)
    return commands([ln for b in blocks for ln in logical_lines(b)])


def command_names() -> list[str]:
    """"" (the group's own help) and every command's name."""
    import click

    from ndplan.cli import main
    return [""] + sorted(main.list_commands(click.Context(main)))


def help_text(name: str) -> tuple[int, str]:
    """(exit code, stdout) of ``ndplan NAME --help``."""
    from click.testing import CliRunner

    from ndplan.cli import main
    r = CliRunner().invoke(main, [name, "--help"] if name else ["--help"])
    return r.exit_code, r.stdout


def help_commands(name: str) -> list[tuple[list[str], int]]:
    return commands(logical_lines(help_text(name)[1]))
