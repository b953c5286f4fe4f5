"""The device count a shell launch states: torchrun's ``--nproc_per_node`` x ``--nnodes``
(``--nnodes`` 1 when absent, torch/distributed/run.py ``--nnodes`` default "1:1"), read
and rewritten where the script sets it.

A value written on the flag's own line is replaced there; a value that comes from a
script variable (``NNODES=2``, ``NNODES=${SLURM_NNODES:-2}``) is replaced at the
variable's assignment (the literal, or the ``${...:-default}`` default); a value taken
from the environment cannot be written into the file (``None``: the caller says how to
launch instead). Every rewrite is checked by reading the words again. A Slurm batch script's ``#SBATCH --nodes`` / ``-N`` follows the new
node count.
"""

from __future__ import annotations

import re

from ndplan.interop import shell

NPROC = ("--nproc_per_node", "--nproc-per-node", "--num_gpus", "--num_accelerators")
"""torchrun's processes per node, and the deepspeed launcher's (deepspeed 0.19.8
launcher/runner.py:84-95: ``--num_nodes``, ``--num_gpus`` (or ``--num_accelerators``); -1, its default, means every
device of the hostfile, which the script does not state)."""
NNODES = "--nnodes"
NODES = (NNODES, "--num_nodes")
DEEPSPEED_NODES = {"--num_gpus": "--num_nodes", "--num_accelerators": "--num_nodes"}


def _flag_value(ws: list[shell.Word], flags: tuple[str, ...]) -> tuple[int, shell.Word, bool] | None:
    """(index of the flag word, value word, joined by ``=``) of the last occurrence of ``flags``."""
    found = None
    for k, w in enumerate(ws):
        name, eq, _ = w.text.partition("=")
        if name in flags:
            if eq:
                found = (k, w, True)
            elif k + 1 < len(ws):
                found = (k, ws[k + 1], False)
    return found


def launched(ws: list[shell.Word]) -> tuple[int, int] | None:
    """(processes per node, nodes) torchrun starts, or None when the script does not say
    (no ``--nproc_per_node``, or a value that is not a whole number >= 1, e.g. ``gpu`` or 0)."""
    p = _flag_value(ws, NPROC)
    if p is None:
        return None
    n = _flag_value(ws, NODES)
    per = p[1].text.partition("=")[2] if p[2] else p[1].text
    nodes = "1" if n is None else (n[1].text.partition("=")[2] if n[2] else n[1].text)
    if not (per.isdigit() and nodes.isdigit()) or int(per) < 1 or int(nodes) < 1:
        return None  # not a count this can rewrite (the readers name a bad one in their own error)
    return int(per), int(nodes)


def _number(name: str) -> str:
    """A whole number, bare or quoted (groups ``{name}q`` the quote, ``{name}`` the digits)."""
    return rf"(?P<{name}q>[\"']?)(?P<{name}>\d+)(?P={name}q)"


def _replace_value(lines: list[str], ws: list[shell.Word], flags: tuple[str, ...], new: int) -> bool:
    """Write ``new`` where the script sets the value of ``flags``: on the flag's line, or at
    the last assignment of the variable written there; False when it cannot."""
    k, value, joined = _flag_value(ws, flags)
    if any("from the environment" in s for s in value.sources):
        return False
    line = ws[k].line
    alts = "|".join(re.escape(f) for f in flags)
    literal = re.compile(r"(?<![\w-])(?:" + alts + r")(?:=|[ \t]+)" + _number("v") + r"(?![\w-])")
    if literal.search(lines[line]):
        lines[line] = _sub_digits(literal, lines[line], "v", new)
        return True
    ref = re.search(r"(?<![\w-])(?:" + alts + r")(?:=|[ \t]+)\"?\$\{?(\w+)\}?\"?(?![\w-])", lines[line])
    if not ref:
        return False
    assign = re.compile(r"^\s*(?:export\s+)?" + re.escape(ref.group(1)) + r"=(?:" + _number("v") + r"|\$\{\w+:?[-=]"
                        + _number("d") + r"\})\s*(?:#.*)?$")
    at = next((i for i in range(line, -1, -1) if re.match(r"^\s*(?:export\s+)?" + re.escape(ref.group(1)) + "=",
                                                          lines[i])), None)
    m = assign.match(lines[at]) if at is not None else None
    if not m:
        return False
    lines[at] = _sub_digits(assign, lines[at], "v" if m.group("v") is not None else "d", new)
    return True


def _sub_digits(rx: re.Pattern, line: str, group: str, new: int) -> str:
    """``line`` with the digits of ``group`` of ``rx``'s first match replaced by ``new``."""
    m = rx.search(line)
    return line[:m.start(group)] + str(new) + line[m.end(group):]


def _add_nnodes(lines: list[str], ws: list[shell.Word], nodes: int) -> bool:
    """``--nnodes N`` written just before ``--nproc_per_node`` (inside the same quoted string,
    array or command, wherever that flag stands)."""
    k, value, joined = _flag_value(ws, NPROC)
    line = ws[k].line
    rx = re.compile(r"(?<![\w-])(" + "|".join(re.escape(f) for f in NPROC) + r")(?=[= \t])")
    if not rx.search(lines[line]):
        return False
    lines[line] = rx.sub(lambda m: f"{DEEPSPEED_NODES.get(m.group(1), NNODES)} {nodes} {m.group(1)}", lines[line],
                         count=1)
    return True


SBATCH_NODES = re.compile(r"^(#SBATCH\s+(?:--nodes[= ]|-N\s*))(\d+)(\s*(?:#.*)?)$")
"""A Slurm batch script's node count (sbatch ``--nodes`` / ``-N``), kept equal to torchrun's."""


def _sbatch_nodes(lines: list[str], nodes: int) -> None:
    for i, ln in enumerate(lines):
        m = SBATCH_NODES.match(ln)
        if m:
            lines[i] = f"{m.group(1)}{nodes}{m.group(3)}"


def set_devices(text: str, devices: int, environ: dict | None = None) -> str | None:
    """``text`` with torchrun launching ``devices`` processes: whole nodes of the script's
    per-node count when it divides ``devices``, else one node of ``devices``; None when
    the script does not state its count or states it somewhere this cannot write (the
    environment, a computed value)."""
    ws = shell.read_words(text, environ)
    now = launched(ws)
    if now is None:
        return None
    per, nodes = now
    new_per, new_nodes = (per, devices // per) if devices % per == 0 else (devices, 1)
    lines = text.splitlines()
    if new_per != per and not _replace_value(lines, ws, NPROC, new_per):
        return None
    ws_nodes = _flag_value(ws, NODES)
    if new_nodes != nodes:
        ok = _replace_value(lines, ws, NODES, new_nodes) if ws_nodes else _add_nnodes(lines, ws, new_nodes)
        if not ok:
            return None
    _sbatch_nodes(lines, new_nodes)
    out = "\n".join(lines) + ("\n" if text.endswith("\n") else "")
    again = launched(shell.read_words(out, environ))
    return out if again is not None and again[0] * again[1] == devices else None
