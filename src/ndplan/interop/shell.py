"""The words a bash launch script passes to its program, read without running it.

Handled: ``\\`` continuations, ``#`` comments, ``;`` between statements, ``NAME=value``
/ ``export NAME=value`` / ``NAME+=value`` assignments (quoted values, bash arrays
``NAME=( ... )`` and ``NAME+=( ... )`` on one line or several), ``$NAME`` / ``${NAME}`` /
``${NAME[@]}`` / ``${NAME:-default}`` / ``${NAME:=default}`` (and without the colon),
``$(( ))`` integer arithmetic (interop.arith: no eval).

bash's rules kept (tests/test_check.py holds the words to what bash itself passes):

* a variable the script does not assign is taken from the environment, as bash does;
  ``${NAME:-default}`` takes the default when it is unset (or empty, with the colon).
  Every value that came from the environment or from a default is recorded with the
  word, so the reader can say which was used;
* an array expanded unquoted (``${ARGS[@]}``, as NVIDIA's example scripts do) is split
  into words again, so an element ``"--vocab-size 128256"`` passes two words.

Not run: ``if``/``case``/loops, functions and ``$( )`` command substitution; the script
is read top to bottom, so a variable assigned twice takes its last value, with a warning.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from ndplan.errors import NdplanError, warn
from ndplan.interop import arith

VAR = re.compile(r"\$\{(\w+)(?:\[@\])?(?:(:?[-=])([^}]*))?\}|\$(\w+)")
"""``${NAME}``, ``${NAME[@]}``, ``${NAME:-default}`` / ``${NAME:=default}`` (and without
the colon), ``$NAME``."""
ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)(\+?)=(.*)$")
KEYWORDS = ("export", "then", "else", "fi", "do", "done", "if", "unset")


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


class _Env:
    """The script's variables, falling back to ``environ`` as bash does."""

    def __init__(self, environ: dict):
        self.vars: dict[str, _Var] = {}
        self.environ = environ

    def lookup(self, name: str) -> tuple[str, tuple[str, ...]] | None:
        if name in self.vars:
            v = self.vars[name]
            return v.value, v.sources
        if name in self.environ:
            return self.environ[name], (f"{name}={self.environ[name]} from the environment",)
        return None


def split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of a shell line: a ``#`` outside quotes, at the start or after
    blank space, starts a comment (bash's rule)."""
    quote = None
    for k, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in ("'", '"'):
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1] in " \t"):
            return line[:k].rstrip(), line[k:]
    return line, ""


def statements(line: str) -> list[str]:
    """A shell line split at ``;`` outside quotes (comments removed first)."""
    code, _ = split_comment(line)
    out, cur, quote = [], "", None
    for ch in code:
        if quote:
            quote = None if ch == quote else quote
        elif ch in ("'", '"'):
            quote = ch
        elif ch == ";":
            out.append(cur)
            cur = ""
            continue
        cur += ch
    return out + [cur]


def _substitute(word: str, env: _Env, line: int, sources: list) -> str:
    """Variables replaced (the script's, else the environment's); an unset one with a
    default takes the default (``:=`` also assigns it); other unset ones stay as written."""
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
        return m.group(0)
    return VAR.sub(sub, word)


def _arith(text: str, env: _Env, line: int) -> str:
    """``$(( ))`` integer arithmetic evaluated (interop.arith; no eval); ``line`` is 0-based."""
    if "$((" not in text:
        return text
    try:
        return arith.expand(text, lambda name: (env.lookup(name) or (None,))[0])
    except NdplanError as e:
        raise NdplanError(e.field, e.value, f"{e.problem} (line {line + 1})", e.fix) from None


def _expand(word: str, env: _Env, line: int, sources: list) -> str:
    """Arithmetic evaluated, then variables substituted."""
    return _substitute(_arith(word, env, line), env, line, sources)


class _Reader:
    def __init__(self, environ: dict):
        self.env = _Env(environ)
        self.out: list[Word] = []
        self.array: str | None = None
        self.array_words: list[Word] = []
        self.reassigned: set[str] = set()

    def array_word(self, tok: str, i: int) -> None:
        close = tok.endswith(")")
        tok = tok[:-1] if close else tok
        m = VAR.fullmatch(tok)
        if tok and m and (m.group(1) or m.group(4)) == self.array:
            old = self.env.vars.get(self.array)  # ARGS=( "${ARGS[@]}" --more ): its words are recorded
            self.array_words += [Word(w, old.line, old.sources) for w in old.value.split()] if old else []
        elif tok:
            src: list[str] = []
            w = _expand(tok, self.env, i, src)
            for part in w.split():  # an unquoted ${ARGS[@]} splits each element again
                word = Word(part, i, tuple(src))
                self.array_words.append(word)
                self.out.append(word)
        if close:
            value = " ".join(w.text for w in self.array_words)
            srcs = tuple(dict.fromkeys(s for w in self.array_words for s in w.sources))
            self.env.vars[self.array] = _Var(value, self.array_words[0].line if self.array_words else i, srcs)
            self.array, self.array_words = None, []

    def assign(self, name: str, append: bool, val: str, i: int) -> None:
        if val.startswith("("):  # NAME=( ... ) / NAME+=( ... ), on one line or several
            old = self.env.vars.get(name)
            self.array = name
            self.array_words = [Word(w, old.line, old.sources) for w in old.value.split()] if append and old else []
            if val[1:]:
                self.array_word(val[1:], i)
            return
        src: list[str] = []
        new = _expand(val, self.env, i, src)
        if "--" in new:  # ARGS="--num-layers 32 ...": its flags sit on this line
            self.out += [Word(w, i, tuple(src)) for w in new.split()]
        old = self.env.vars.get(name)
        if append and old:
            new, src = (old.value + " " + new).strip(), list(old.sources) + src
        elif old and old.value != new and old.value and name not in self.reassigned:
            self.reassigned.add(name)
            warn(name, new, f"assigned again on line {i + 1} (first on line {old.line + 1}); "
                 "ndplan reads the script without running if/else or loops, so the last value counts",
                 "check that it is the one your launch uses")
        self.env.vars[name] = _Var(new, i, tuple(src))

    def token(self, tok: str, i: int) -> None:
        if self.array is not None:
            self.array_word(tok, i)
            return
        m = ASSIGN.match(tok)
        if m and not tok.startswith("-"):
            self.assign(m.group(1), m.group(2) == "+", m.group(3), i)
            return
        if tok in KEYWORDS:
            return
        m = VAR.fullmatch(tok)
        name = m and (m.group(1) or m.group(4))
        if name and name in self.env.vars and " " in self.env.vars[name].value:
            return  # $ARGS: its words were recorded at the assignment
        src: list[str] = []
        self.out.append(Word(_expand(tok, self.env, i, src), i, tuple(src)))

    def line(self, raw: str, i: int) -> None:
        line = raw.rstrip()
        if line.endswith("\\"):
            line = line[:-1]
        for stmt in statements(line):
            stmt = _arith(stmt, self.env, i)  # before splitting: $(( 16 * N )) holds spaces
            try:
                toks = shlex.split(stmt, comments=True)
            except ValueError:
                toks = stmt.split()
            for tok in toks:
                self.token(tok, i)


def read_words(text: str, environ: dict | None = None) -> list[Word]:
    """The script's words after variable expansion; a word that comes from a variable
    carries the line of its assignment and the environment values / defaults used."""
    r = _Reader({} if environ is None else dict(environ))
    for i, raw in enumerate(text.splitlines()):
        r.line(raw, i)
    return r.out
