"""Every example shown to a user runs: each ``ndplan ...`` command in README.md's code
blocks and in every command's ``--help``, verbatim, and README's Python block.

Commands run in process (``CliRunner``) so that the whole test session shares one
kernel cache (memory and disk): compile cost is paid once. Each source's commands run
in order in one scratch folder holding a copy of ``examples/`` (so ``examples/...``
paths resolve and files an example writes, e.g. ``--export-layers l70.yaml`` read by
the next one, stay out of the clone). A command exits 0 unless it carries a
``# exits N`` comment (``check``: 1 = does not fit; ``sweep``: 1 = nothing fits), and
never prints a traceback. A failing example is fixed or removed, never skipped.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from ndplan import doc_examples
from ndplan.cli import main

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[tuple[list[str], int]]:
    return doc_examples.readme_commands(ROOT / "README.md")


def readme_python() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) == 1, "README has one Python block"
    return blocks[0]


def help_commands(name: str) -> list[tuple[list[str], int]]:
    code, out = doc_examples.help_text(name)
    assert code == 0, out
    return doc_examples.commands(doc_examples.logical_lines(out))


command_names = doc_examples.command_names


def _have_trace_extra() -> bool:
    import importlib.util
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


def _have_torch() -> bool:
    import importlib.util
    return importlib.util.find_spec("torch") is not None


def _run_all(cmds, tmp_path, monkeypatch, where: str) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    for argv, code in cmds:
        if argv[0] == "trace" and not _have_trace_extra():
            code = 2  # without ndplan[trace] the command says which extra to install, in one line
        if argv[0] == "profile" and not _have_torch():
            code = 2  # likewise without torch
        r = CliRunner().invoke(main, argv)
        shown = "ndplan " + shlex.join(argv)
        assert "Traceback" not in r.output, (where, shown, r.output[-2000:])
        assert r.exit_code == code, (where, shown, r.exit_code, r.stderr[-2000:] or r.stdout[-2000:])


def test_every_command_has_examples():
    for name in command_names():
        assert help_commands(name), f"`ndplan {name} --help` shows no example"


def test_readme_commands(tmp_path, monkeypatch):
    cmds = readme_commands()
    assert len(cmds) >= 8
    _run_all(cmds, tmp_path, monkeypatch, "README.md")


@pytest.mark.parametrize("name", command_names())
def test_help_examples(name, tmp_path, monkeypatch):
    _run_all(help_commands(name), tmp_path, monkeypatch, f"ndplan {name} --help")


def test_readme_python_block(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    code = compile(readme_python(), "README.md", "exec")
    exec(code, {"__name__": "readme"})  # noqa: S102 - our own README, not user input
