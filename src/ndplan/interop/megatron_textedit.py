"""Text edits of a Megatron-LM launch script: where a flag's value sits and where a flag is added
(interop/megatron.py ``edit`` decides what changes). Bash is the oracle of the tests: the edited
script passes the flag, whichever branch runs (tests/test_check.py)."""

from __future__ import annotations

import os
import re

from ndplan.interop import shell


def flag_re(flag: str, switch: bool) -> re.Pattern:
    val = "" if switch else r"(?:=|[ \t]+)(\"[^\"]*\"|'[^']*'|[^\s\\;)\"']+)"
    return re.compile(r"(?<![\w-])" + re.escape(flag) + val + r"(?![\w-])")


def _in_array(lines: list[str], i: int) -> bool:
    """Is line ``i`` inside a bash array written over several lines (``NAME=(`` above it, its
    ``)`` not yet)?"""
    for k in range(i - 1, -1, -1):
        code = shell.split_comment(lines[k])[0].strip()
        if code.endswith(")") or code == ")":
            return False
        if re.fullmatch(r"(?:export\s+)?[A-Za-z_]\w*\+?=\(", code):
            return True
    return False


_LAUNCHER = re.compile(r"(?:^|\s)(?:torchrun|python3?|srun|deepspeed|mpirun)\s|pretrain_\w+\.py")
"""A line that runs a command (its flags are arguments of that line, not of the next)."""


def add(lines: list[str], loc: dict, words_: str) -> None:
    """``words_`` after the last known flag that bash passes whatever the branches (not one inside
    an if or case: NVIDIA's train_llama3_8b_h100_fp8.sh ends its arguments in a mock-data branch)."""
    import warnings
    with warnings.catch_warnings():  # the script's warnings were said when it was read
        warnings.simplefilter("ignore")
        cond = shell.read_script("\n".join(lines), os.environ).conditional
    plain = [v for v in loc.values() if v not in cond]
    i = max(plain or loc.values()) if loc else len(lines) - 1
    line, comment = shell.split_comment(lines[i].rstrip())
    tail = f"  {comment}" if comment else ""  # the words go before a trailing comment
    indent = re.match(r"\s*", line).group(0) or ("    " if "\\" in "".join(lines) else "")
    if shell.ASSIGN.match(line.strip()) and line.endswith(("'", '"')):  # ARGS="... --flag v"
        lines[i] = line[:-1] + f" {words_}" + line[-1] + tail
    elif line.endswith(")") and line.count(")") > line.count("("):  # last word of an array (not $((2*2048)))
        lines[i] = line[:-1].rstrip() + f" {words_} )" + tail
    elif _in_array(lines, i) and not line.endswith("\\"):  # an element line of NAME=( ... ): a new element line
        lines.insert(i + 1, f"{indent}{words_}")
    elif line.endswith("\\"):
        lines.insert(i + 1, f"{indent}{words_} \\")
    elif comment or (_LAUNCHER.search(line) and not any(x.rstrip().endswith("\\") for x in lines)):
        lines[i] = f"{line} {words_}{tail}"  # on the command's own line ("\\" cannot follow a comment)
    elif any(x.rstrip().endswith("\\") for x in lines):  # last line of a continued command
        lines[i] = line + " \\"
        lines.insert(i + 1, f"{indent}{words_}")
    else:  # argument file: one flag per line
        lines.insert(i + 1, f"{indent}{words_}")
