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

* a quoted string may span lines (``OPTS=" ... \n ... "``); a here-document's body is not
  read as commands (``cat <<EOT > ds_config.json``): ``heredocs`` of the result keeps each
  body by its redirect target, variables expanded unless the delimiter is quoted;
* ``if``/``elif``/``else``/``fi``: a condition made of ``[ ]``, ``[[ ]]`` or ``test`` with
  ``= == != -eq -ne -lt -le -gt -ge -z -n`` (and ``!``, ``&&``, ``||`` between them) on known
  values is decided, and only the branch bash runs is read (an unset variable is empty, as
  in bash); any other condition (file tests, commands) reads every branch, with a warning.

Not run: ``case``/loops (their bodies are read once), functions and ``$( )`` command
substitution; ``$(( ))`` that ndplan cannot evaluate stays as written, with a note on the
word; the script is read top to bottom, so a variable assigned twice takes its last value,
with a warning.
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
ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)(\+?)=(.*)$", re.S)
KEYWORDS = ("export", "then", "else", "fi", "do", "done", "if", "unset")
HEREDOC = re.compile(r"(?<![\w)])<<(-?)\s*(['\"]?)([A-Za-z_]\w*)\2")
"""``<<EOT``, ``<<-EOT``, ``<<'EOT'`` (not ``<<<``, a here-string, nor a shift ``$((1<<N))``)."""
REDIRECT = re.compile(r">\s*(\S+)")


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
        return text


def _expand(word: str, env: _Env, line: int, sources: list) -> str:
    """Arithmetic evaluated, then variables substituted."""
    return _substitute(_arith(word, env, line, sources), env, line, sources)


def _quote_open(text: str) -> bool:
    """Whether ``text`` ends inside a quoted string (comments outside quotes skipped)."""
    quote, k = None, 0
    while k < len(text):
        ch = text[k]
        if quote == "'":
            quote = None if ch == "'" else quote
        elif quote == '"':
            if ch == "\\":
                k += 1
            elif ch == '"':
                quote = None
        elif ch == "\\":
            k += 1
        elif ch in ("'", '"'):
            quote = ch
        elif ch == "#" and (k == 0 or text[k - 1] in " \t\n"):
            nl = text.find("\n", k)
            if nl < 0:
                return False
            k = nl
        k += 1
    return quote is not None


def logical_lines(lines: list[str]):
    """(first line index, text, here-document body or None, its delimiter quoted) per logical
    line: physical lines joined while a quote is open; a here-document's body follows the line
    that opens it and is not a line of its own."""
    i = 0
    while i < len(lines):
        first, text = i, lines[i]
        while _quote_open(text) and i + 1 < len(lines):
            i += 1
            text += "\n" + lines[i]
        i += 1
        m = HEREDOC.search(split_comment(text)[0]) if "<<" in text and "<<<" not in text else None
        body = None
        if m:
            body, strip = [], m.group(1) == "-"
            while i < len(lines) and (lines[i].lstrip("\t") if strip else lines[i]).rstrip() != m.group(3):
                body.append(lines[i].lstrip("\t") if strip else lines[i])
                i += 1
            i += 1  # the delimiter
        yield first, text, (None if body is None else "\n".join(body)), bool(m and m.group(2))


_COND_OPS = ("=", "==", "!=", "-eq", "-ne", "-lt", "-le", "-gt", "-ge")


def _test(args: list[str], glob: bool) -> bool | None:
    """``[ args ]`` / ``[[ args ]]`` on expanded words; None: not a form ndplan decides."""
    import fnmatch
    if args[:1] == ["!"]:
        r = _test(args[1:], glob)
        return None if r is None else not r
    if len(args) == 1:
        return args[0] != ""
    if len(args) == 2 and args[0] in ("-z", "-n"):
        return (args[1] == "") == (args[0] == "-z")
    if len(args) == 3 and args[1] in _COND_OPS:
        a, op, b = args
        if op in ("=", "==", "!="):
            same = fnmatch.fnmatchcase(a, b) if glob else a == b
            return same if op != "!=" else not same
        if not (re.fullmatch(r"-?\d+", a) and re.fullmatch(r"-?\d+", b)):
            return None
        x, y = int(a), int(b)
        return {"-eq": x == y, "-ne": x != y, "-lt": x < y, "-le": x <= y, "-gt": x > y, "-ge": x >= y}[op]
    return None


class _Block:
    """One ``if`` ... ``fi``: whether the branch being read is read, whether a branch was
    taken (the rest are skipped), whether the conditions could not be decided."""

    def __init__(self, outer_active: bool):
        self.outer = outer_active
        self.active = False
        self.taken = not outer_active
        self.undecided = False
        self.why = ""
        """The condition that chose the branch being read (a source of its words)."""
        self.opened = ""
        """Where the first undecided condition is (warned at ``fi`` if its branches held flags)."""
        self.flags = 0


class _Reader:
    def __init__(self, environ: dict):
        self.env = _Env(environ)
        self.out: list[Word] = []
        self.array: str | None = None
        self.array_words: list[Word] = []
        self.reassigned: set[str] = set()
        self.blocks: list[_Block] = []
        self.heredocs: dict[str, str] = {}
        self.decisions: list[str] = []
        """Decided conditions whose branch bash runs held flags (``Script.decisions``)."""

    @property
    def reading(self) -> bool:
        return all(b.active for b in self.blocks)


    def condition(self, toks: list[str], i: int) -> bool | None:
        """An ``if``/``elif`` condition decided (module docstring), else None."""
        result, op, k = None, None, 0
        while k < len(toks):
            neg = toks[k] == "!"
            k += neg
            if k >= len(toks):
                return None
            if toks[k] in ("[", "[["):
                close = "]" if toks[k] == "[" else "]]"
                if close not in toks[k + 1:]:
                    return None
                end = toks.index(close, k + 1)
                args, glob, k = toks[k + 1:end], toks[k] == "[[", end + 1
            elif toks[k] == "test":
                end = next((j for j in range(k + 1, len(toks)) if toks[j] in ("&&", "||")), len(toks))
                args, glob, k = toks[k + 1:end], False, end
            else:
                return None
            if any("$(" in a or "`" in a for a in args):
                return None
            src: list[str] = []
            words = [VAR.sub("", _expand(a, self.env, i, src)) for a in args]  # unset: empty, as bash
            r = _test(words, glob)
            if r is None:
                return None
            r = r != neg
            result = r if op is None else (result and r if op == "&&" else result or r)
            if k < len(toks):
                if toks[k] not in ("&&", "||"):
                    return None
                op, k = toks[k], k + 1
        return result

    def keyword(self, toks: list[str], i: int, text: str) -> list[str]:
        """``if``/``elif``/``else``/``fi``/``then`` at the start of a statement: the block
        state updated; returns the tokens left to read as words."""
        head = toks[0]
        if head == "if":
            b = _Block(self.reading)
            self.blocks.append(b)
            self._branch(b, toks[1:], i, text)
            return []
        if head in ("elif", "else", "fi") and not self.blocks:
            return toks[1:]
        if head == "elif":
            self._branch(self.blocks[-1], toks[1:], i, text)
            return []
        if head == "else":
            b = self.blocks[-1]
            b.active = b.outer and (b.undecided or not b.taken)
            b.why = f"line {i + 1}: else" if b.active else ""
            b.taken = True
            return toks[1:]
        if head == "fi":
            b = self.blocks.pop()
            if not b.undecided and b.flags and b.why:
                self.decisions.append(b.why)
            if b.undecided and b.flags:
                warn(*b.opened.split("\0"), "a condition ndplan does not decide (a file test, a command or a form it "
                     "does not read): the flags of every branch of this if are read",
                     "set the variables it tests, or edit the script to the branch you launch")
            return toks[1:]
        return toks[1:]  # then

    def _branch(self, b: _Block, cond: list[str], i: int, text: str) -> None:
        if not b.outer or (b.taken and not b.undecided):
            b.active = False
            return
        r = None if b.undecided else self.condition(cond, i)
        if r is None:
            if not b.undecided:
                b.opened = f"line {i + 1}\0{text.strip()[:60]}"
            b.undecided = b.active = True
            return
        b.active, b.taken = r, r
        b.why = f"line {i + 1}: {text.strip()[:60]}" if r else ""

    def array_word(self, tok: str, i: int) -> None:
        close = tok.endswith(")")
        tok = tok[:-1] if close else tok
        m = VAR.fullmatch(tok)
        old = self.env.vars.get(m.group(1) or m.group(4)) if tok and m else None
        if old is not None and (old.words or not old.value):
            # ARGS=( "${ARGS[@]}" --more ), ALL+=( "${DDP_ARGS[@]}" ): the elements keep the lines
            # they were written on, and were recorded there
            self.array_words += list(old.words)
        elif tok and m and (m.group(1) or m.group(4)) == self.array:
            self.array_words += [Word(w, old.line, old.sources) for w in old.value.split()] if old else []
        elif tok:
            src: list[str] = []
            w = _expand(tok, self.env, i, src)
            for part in w.split():  # an unquoted ${ARGS[@]} splits each element again
                word = Word(part, i, tuple(src))
                self.array_words.append(word)
                self.emit(word)
        if close:
            value = " ".join(w.text for w in self.array_words)
            srcs = tuple(dict.fromkeys(s for w in self.array_words for s in w.sources))
            self.env.vars[self.array] = _Var(value, self.array_words[0].line if self.array_words else i, srcs,
                                             tuple(self.array_words))
            self.array, self.array_words = None, []

    def assign(self, name: str, append: bool, val: str, i: int) -> None:
        if val.startswith("("):  # NAME=( ... ) / NAME+=( ... ), on one line or several
            old = self.env.vars.get(name)
            self.array = name
            self.array_words = (list(old.words) or [Word(w, old.line, old.sources) for w in old.value.split()]) \
                if append and old else []
            if val[1:]:
                self.array_word(val[1:], i)
            return
        src: list[str] = []
        parts = [_expand(part, self.env, i + k, src) for k, part in enumerate(val.split("\n"))]
        new = " ".join(p for p in parts if p.strip()) if len(parts) > 1 else parts[0]
        if "--" in new:  # ARGS="--num-layers 32 ...": its flags sit on these lines
            for word in [Word(w, i + k, tuple(src)) for k, p in enumerate(parts) for w in p.split()]:
                self.emit(word)
        old = self.env.vars.get(name)
        if append and old:
            new, src = (old.value + " " + new).strip(), list(old.sources) + src
        elif old and old.value != new and old.value and name not in self.reassigned \
                and (not self.blocks or self.blocks[-1].undecided):
            self.reassigned.add(name)
            warn(name, new, f"assigned again on line {i + 1} (first on line {old.line + 1}); "
                 "ndplan reads this part without deciding it (a loop, or an if it cannot decide), so the last value counts",
                 "check that it is the one your launch uses")
        self.env.vars[name] = _Var(new, i, tuple(src))
        self.env.unset.discard(name)

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
        var = self.env.vars.get(name) if name else None
        if var is not None and (var.words or " " in var.value or not var.value):
            return  # $ARGS: its words were recorded at the assignment (an empty one passes none)
        src: list[str] = []
        self.emit(Word(_expand(tok, self.env, i, src), i, tuple(src)))

    def emit(self, word: Word) -> None:
        self.out.append(word)
        if word.text.startswith("-"):
            for b in self.blocks:
                b.flags += 1

    def statement(self, stmt: str, i: int) -> None:
        src: list[str] = []
        stmt = _arith(stmt, self.env, i, src)  # before splitting: $(( 16 * N )) holds spaces
        try:
            toks = shlex.split(stmt, comments=True)
        except ValueError:
            toks = stmt.split()
        if toks and toks[0] in ("if", "elif", "else", "fi", "then") and self.array is None:
            toks = self.keyword(toks, i, stmt)
        if not self.reading:
            return
        if toks and toks[0] == "unset" and self.array is None:
            for name in toks[1:]:
                self.env.vars.pop(name, None)
                self.env.unset.add(name)
            return
        for tok in toks:
            self.token(tok, i)

    def line(self, text: str, i: int) -> None:
        """A logical line (physical lines joined inside a quote) starting on line ``i``."""
        offset = 0
        text = text.replace("\\\n", " \n")  # backslash-newline inside a quote continues the line
        for raw in text.split("\n") if not _quote_open(text.split("\n")[0]) else [text]:
            line = raw.rstrip()
            if line.endswith("\\"):
                line = line[:-1]
            for stmt in statements(line):
                self.statement(stmt, i + offset)
            offset += 1

    def heredoc(self, opener: str, body: str, quoted: bool, i: int) -> None:
        """A here-document written to a file (``cat <<EOT > path``): kept by that path."""
        m = REDIRECT.search(split_comment(opener)[0].split("<<", 1)[1])
        if m and self.reading:
            target = _expand(m.group(1).strip("'\""), self.env, i, [])
            self.heredocs[target] = body if quoted else _substitute(body, self.env, i, [])


@dataclass(frozen=True)
class Script:
    words: list[Word]
    heredocs: dict[str, str]
    """Here-document bodies by the file they are written to (``cat <<EOT > path``)."""
    variables: dict[str, str]
    """The script's variables at its end (their last value), e.g. what it exports."""
    unset: frozenset[str] = frozenset()
    """Names the script unsets."""
    decisions: tuple[str, ...] = ()
    """The ``if`` conditions ndplan decided whose branch (the one bash runs) passed flags."""

    def value(self, name: str, environ: dict) -> str | None:
        """``name`` as the launched program sees it: the script's value, else the environment's
        (None when the script unsets it)."""
        return None if name in self.unset else self.variables.get(name, environ.get(name))


def read_script(text: str, environ: dict | None = None) -> Script:
    """The script's words after variable expansion (a word that comes from a variable carries
    the line of its assignment and the environment values / defaults / branches used) and its
    here-documents."""
    r = _Reader({} if environ is None else dict(environ))
    for i, joined, body, quoted in logical_lines(text.splitlines()):
        r.line(joined, i)
        if body is not None:
            r.heredoc(joined, body, quoted, i)
    return Script(r.out, r.heredocs, {k: v.value for k, v in r.env.vars.items()}, frozenset(r.env.unset),
                  tuple(dict.fromkeys(r.decisions)))


def read_words(text: str, environ: dict | None = None) -> list[Word]:
    """``read_script``'s words."""
    return read_script(text, environ).words
