"""A launch script's variables as interop.shell reads them: the words it passes (``Word``),
the values it assigns (``_Var``, an array's elements with their own lines), the environment it
falls back to (``_Env``), and expansion: ``${NAME}``, ``${NAME[@]}``, ``${NAME:-default}`` /
``${NAME:=default}``, ``$NAME`` and ``$(( ))`` integer arithmetic (interop.arith, no eval)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ndplan.errors import NdplanError
from ndplan.interop import arith

VAR = re.compile(r"\$\{(\w+)(?:\[@\])?(?:(:?[-=])([^}]*))?\}|\$(\w+)")
"""``${NAME}``, ``${NAME[@]}``, ``${NAME:-default}`` / ``${NAME:=default}`` (and without
the colon), ``$NAME``."""
FLAG_WORD = re.compile(r"(?:^|\s)--[A-Za-z]")


@dataclass(frozen=True)
class Word:
    text: str
    line: int
    """0-based line of the word (of its variable's assignment when it came from one)."""
    sources: tuple[str, ...] = ()
    """Values taken from the environment or from a ``${NAME:-default}`` default."""


@dataclass
class _Var:
    value: str
    line: int
    sources: tuple[str, ...] = ()
    words: tuple[Word, ...] = ()
    """An array's elements, each with the line it was written on."""
    emitted: tuple[Word, ...] = ()
    """The words its own assignment passed (``_Reader.emit``)."""
    used: bool = False
    """Expanded since it was assigned (a reassignment or unset before that takes its words back)."""

    @property
    def holds_flags(self) -> bool:
        """Its words were passed where they are written (``_Reader.emit``), not where it is used."""
        return FLAG_WORD.search(self.value) is not None


class _Env:
    """The script's variables, falling back to ``environ`` as bash does."""

    def __init__(self, environ: dict):
        self.vars: dict[str, _Var] = {}
        self.environ = environ
        self.unset: set[str] = set()
        """Names the script unsets (``unset NAME``): neither its value nor the environment's."""

    def lookup(self, name: str) -> tuple[str, tuple[str, ...]] | None:
        if name in self.unset:
            return None
        if name in self.vars:
            v = self.vars[name]
            return v.value, v.sources
        if name in self.environ:
            return self.environ[name], (f"{name}={self.environ[name]} from the environment",)
        return None


def _substitute(word: str, env: _Env, line: int, sources: list, unset_empty: bool = False) -> str:
    """Variables replaced (the script's, else the environment's); an unset one with a
    default takes the default (``:=`` also assigns it); other unset ones stay as written
    (empty with ``unset_empty``, as bash gives them)."""
    def sub(m: re.Match) -> str:
        name, op = m.group(1) or m.group(4), m.group(2)
        found = env.lookup(name)
        empty_counts = op is not None and op.startswith(":")
        if found is not None and not (empty_counts and found[0] == ""):
            sources.extend(found[1])
            return found[0]
        if op is not None:
            default = m.group(3)
            what = f"${name} (argument {name} of the script)" if name.isdigit() else name
            sources.append(f"{what} unset: its default {default!r}")
            if op.endswith("="):
                env.vars[name] = _Var(default, line, (sources[-1],))
            return default
        return "" if unset_empty else m.group(0)
    return VAR.sub(sub, word)


def _arith(text: str, env: _Env, line: int, sources: list) -> str:
    """``$(( ))`` integer arithmetic evaluated (interop.arith; no eval); ``line`` is 0-based.
    What it cannot evaluate (``$( )`` inside, ternaries, unset names) stays as written, the
    reason recorded in ``sources``: a flag that needs the value says so when it is read."""
    if "$((" not in text:
        return text
    try:
        return arith.expand(text, lambda name: (env.lookup(name) or (None,))[0])
    except NdplanError as e:
        sources.append(f"line {line + 1}: {e.value} not evaluated ({e.problem})")
        return _one_word(text)


def paren_end(text: str, dollar: int) -> int:
    """The index after the ``)`` that closes the ``$(`` (or ``$((``) at ``dollar`` (the end when none does)."""
    depth, j = 0, dollar + 1
    while j < len(text):
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        j += 1
        if depth == 0:
            break
    return j


def _one_word(text: str) -> str:
    """``text`` with the blank space inside each ``$(( ))`` (and the ``$( )`` it holds) removed:
    an expression left as written stays one word."""
    out, k = [], 0
    while k < len(text):
        start = text.find("$((", k)
        if start < 0:
            out.append(text[k:])
            break
        out.append(text[k:start])
        j = paren_end(text, start)
        out.append(re.sub(r"\s+", "", text[start:j]))
        k = j
    return "".join(out)


def _expand(word: str, env: _Env, line: int, sources: list) -> str:
    """Arithmetic evaluated, then variables substituted."""
    return _substitute(_arith(word, env, line, sources), env, line, sources)


COMMAND_VALUE = "$(runtime:command)"
"""What a command substitution gives here: its output exists only when the script runs."""


def shown(text: str) -> str:
    """``text`` for a message: COMMAND_VALUE as ``$( )``, a run-time variable as ``$NAME``."""
    return re.sub(r"\$\(runtime:(\w+)\)", lambda m: "$( )" if m.group(1) == "command" else f"${m.group(1)}", text)


def commands(stmt: str) -> str:
    """``$( ... )`` and backquoted commands (not ``$(( ))``, not inside single quotes) replaced by
    COMMAND_VALUE: their options are the command's, not the launch's (N=$(nvidia-smi --query-gpu=...)),
    and their output is known only at run time."""
    if "$(" not in stmt and "`" not in stmt:
        return stmt
    out, k, quote = [], 0, None
    while k < len(stmt):
        ch = stmt[k]
        if quote == "'":
            quote = None if ch == "'" else quote
        elif ch == "\\":  # an escaped character is itself (\$( is no command)
            out.append(stmt[k:k + 2])
            k += 2
            continue
        elif ch == "'" and quote is None:
            quote = "'"
        elif ch == '"':
            quote = None if quote == '"' else '"'
        elif ch == "`":
            end = stmt.find("`", k + 1)
            if end > k:
                out.append(COMMAND_VALUE)
                k = end + 1
                continue
        elif stmt.startswith("$(", k) and not stmt.startswith("$((", k):
            out.append(COMMAND_VALUE)
            k = paren_end(stmt, k)
            continue
        out.append(ch)
        k += 1
    return "".join(out)
