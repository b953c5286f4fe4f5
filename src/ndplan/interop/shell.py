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
* ``if``/``elif``/``else``/``fi``: a condition bash's rules decide on the values known here
  (interop.shell_test) reads only the branch bash runs, and the condition, with the
  environment values or defaults it used, is a note; any other condition (file tests,
  commands, values made at run time) reads every branch, with a warning when they hold flags;
* ``case WORD in pattern) ... ;; esac``: with WORD known here, only the first branch whose
  glob pattern matches (quoted patterns literally) is read, as bash runs it; else every branch;
* a variable that holds flags (``ARGS=(--a 1)``, ``OPTS="--b 2"``) passes them from the lines
  they are written on (edits go there); one that holds a value passes it where it is used.

Not read: a ``source``d file (a warning). Not run: loops (their bodies are read once; a loop's variable, like ``read``'s and
``$( )``'s values, is known only at run time), functions and ``$( )`` command substitution; ``$(( ))`` that ndplan cannot evaluate stays as written, with a note on the
word; the script is read top to bottom, so a variable assigned twice takes its last value,
with a warning.
"""

from __future__ import annotations

import re
import shlex
import warnings
from dataclasses import dataclass

from ndplan.errors import warn
from ndplan.interop.shell_lex import CASE_ENDS, heredoc_at, heredoc_target, logical_lines, split_comment, statements
from ndplan.interop.shell_test import alternatives, decide, glob_match, pattern_end
from ndplan.interop.shell_vars import FLAG_WORD, VAR, Word, _arith, _Env, _expand, _substitute, _Var, commands, shown

__all__ = ["Word", "Script", "read_script", "read_words", "split_comment", "statements"]

ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)(\+?)=(.*)$", re.S)
KEYWORDS = ("export", "then", "else", "fi", "do", "done", "if", "unset", "esac")
LEADING = ("then", "do", "else", "{")
"""Words after which a statement starts again (``then if ...``, ``do if ...``)."""
NO_ARGUMENTS = "0"
"""``$#`` in a ``while`` condition: the script is read as run without arguments."""
RUNTIME_VALUE = "$(runtime:{})"
"""The value of a variable only the running script knows (a loop's, ``read``'s)."""


class _Block:
    """One ``if`` ... ``fi``: whether the branch being read is read, whether a branch was
    taken (the rest are skipped), whether the conditions could not be decided."""

    def __init__(self, outer_active: bool, line: int):
        self.outer = outer_active
        self.line = line
        self.active = False
        self.taken = not outer_active
        self.undecided = False
        self.why = ""
        """The condition that chose the branch being read, with the values it used."""
        self.opened = ("", "")
        """(where, what) of the first undecided condition (warned at ``fi`` if its branches held flags)."""
        self.flags = 0
        """Flags passed inside this block (decisions and warnings name only blocks that hold some)."""
        self.used: list[str] = []
        """The values its conditions used (environment, defaults, unset)."""
        self.case: str | None = None
        """A ``case`` block's word as bash expands it (None: an ``if``, or a word not known here)."""
        self.is_case = False
        self.fall = False
        """A case branch ended by ``;&`` ran: the next one runs without testing its pattern."""
        self.is_loop = False
        """A ``while``/``until``/``for`` body (closed by ``done``)."""
        self.expect = False
        """A ``case`` block before a pattern (after ``in`` or ``;;``)."""


class _Reader:
    def __init__(self, environ: dict):
        self.env = _Env(environ)
        self.out: list[Word] = []
        self.array: str | None = None
        self.array_words: list[Word] = []
        self.array_new: list[Word] = []
        """The elements the open array's own lines write (not those of arrays it includes)."""
        self.array_append = False
        self.reassigned: set[str] = set()
        self.blocks: list[_Block] = []
        self.heredocs: dict[str, str] = {}
        self.decisions: list[str] = []
        """Decided conditions whose branches held flags (``Script.decisions``)."""
        self.loops = 0
        """Open ``do ... done`` bodies (read once; what they assign is known only at run time)."""
        self.uncertain: set[str] = set()
        """Names assigned inside a loop or a branch not decided: a condition on them is not decided."""
        self.sourced: list[str] = []
        """Files the script sources (not read)."""
        self.conditional: set[int] = set()
        """Lines of words passed inside an if, case or loop (an edit adds flags elsewhere)."""

    @property
    def reading(self) -> bool:
        return all(b.active for b in self.blocks)

    # ----------------------------------------------------------------- if / elif / else / fi

    def keyword(self, toks: list[str], i: int, text: str) -> list[str]:
        """``if``/``elif``/``else``/``fi`` (after any ``then``/``do``/``else``/``{``) at the start
        of a statement: the block state updated; returns the tokens left to read as words."""
        while toks and toks[0] in LEADING and toks[0] != "else":
            toks = toks[1:]
        if not toks:
            return []
        head = toks[0]
        if head == "if":
            b = _Block(self.reading, i)
            self.blocks.append(b)
            self._branch(b, text, i)
            return []
        if head in ("elif", "else", "fi") and not self.blocks:
            warn(f"line {i + 1}", head, "closes no if (bash refuses the script)", "remove it or add the if")
            return toks[1:]
        if head == "elif":
            self._branch(self.blocks[-1], text, i)
            return []
        if head == "else":
            b = self.blocks[-1]
            b.active = b.outer and (b.undecided or not b.taken)
            b.why = f"line {i + 1}: else" + (f" ({'; '.join(b.used)})" if b.used else "") \
                if b.active and not b.undecided else b.why
            b.taken = True
            return self.keyword(toks[1:], i, text.strip().split(None, 1)[1]) if toks[1:2] == ["if"] else toks[1:]
        if head == "fi":
            self._close(self.blocks.pop())
            return toks[1:]
        return toks

    def _close(self, b: _Block) -> None:
        if self.blocks:
            self.blocks[-1].flags += b.flags
        if not b.flags or not b.outer:
            return
        if b.undecided:
            what = "case" if b.is_case else "loop" if b.is_loop else "if"
            warn(*b.opened, "a condition ndplan does not decide (a file test, a command, a value made at run time "
                 f"or a form it does not read): the flags of every branch of this {what} are read",
                 "set the variables it tests, or edit the script to the branch you launch")
        elif b.why:
            self.decisions.append(b.why)

    def _branch(self, b: _Block, text: str, i: int) -> None:
        if not b.outer or (b.taken and not b.undecided):
            b.active = False
            return
        cond = text.strip()
        cond = cond.split(None, 1)[1] if " " in cond else ""  # after if / elif
        known = not any((m.group(1) or m.group(4)) in self.uncertain for m in VAR.finditer(cond))
        r, used = (None, []) if b.undecided or not known else decide(cond, lambda w, src: _expand(w, self.env, i, src))
        if r is None:
            if not b.undecided:
                b.opened = (f"line {i + 1}", text.strip()[:60])
            b.undecided = b.active = True
            return
        b.active, b.taken = r, r
        used = list(dict.fromkeys(used))
        b.used = list(dict.fromkeys(b.used + used))
        b.why = f"line {i + 1}: {'' if r else 'not '}{text.strip()[:60]}" + (f" ({'; '.join(used)})" if used else "")

    # ----------------------------------------------------------------- loops

    def loop_open(self, kind: str, text: str, i: int) -> None:
        """``while COND`` / ``until COND`` / ``for``: a body bash never enters (a ``while`` whose
        condition is false on the values known here, as ``[[ $# -gt 0 ]]`` of an argument-parsing
        loop with no arguments) is skipped; any other is read once (module docstring)."""
        b = _Block(self.reading, i)
        b.is_loop, b.active = True, self.reading
        self.blocks.append(b)
        if kind not in ("while", "until") or not self.reading:
            return
        cond = text.strip().split(None, 1)[1] if " " in text.strip() else ""
        known = not any((m.group(1) or m.group(4)) in self.uncertain for m in VAR.finditer(cond))
        r, used = (None, []) if not known else decide(
            cond.replace("${#}", NO_ARGUMENTS).replace("$#", NO_ARGUMENTS),
            lambda w, src: _expand(w, self.env, i, src))
        if r is None:
            return
        enters = r if kind == "while" else not r
        b.active = enters
        b.why = (f"line {i + 1}: {'' if enters else 'never enters '}{text.strip()[:60]}"
                 + (" (the script read as run without arguments)" if "$#" in cond or "${#}" in cond else "")
                 + (f" ({'; '.join(dict.fromkeys(used))})" if used else ""))

    def loop_close(self) -> bool:
        """``done``: the innermost loop closed; True when its body was skipped."""
        b = self.blocks.pop()
        self._close(b)
        return not b.active and b.outer

    # ----------------------------------------------------------------- case / esac

    def case_open(self, word: str, text: str, i: int) -> None:
        """``case WORD in``: decided when WORD's value is known here (not made at run time)."""
        b = _Block(self.reading, i)
        b.is_case, b.expect = True, True
        self.blocks.append(b)
        known = not any((m.group(1) or m.group(4)) in self.uncertain for m in VAR.finditer(word))
        used: list[str] = []
        unset = [n for m in VAR.finditer(word) if self.env.lookup(n := m.group(1) or m.group(4)) is None
                 and m.group(2) is None]
        value = _substitute(_arith(word, self.env, i, used), self.env, i, used, unset_empty=True)  # as bash gives them
        used += [f"{n} unset" for n in unset]
        if not known or "$" in value or "`" in value:  # run time, or a form not expanded here (${X,,})
            b.undecided, b.opened = True, (f"line {i + 1}", text.strip()[:60])
        else:
            b.case, b.used = value, list(dict.fromkeys(used))

    def case_branch(self, stmt: str, i: int) -> str:
        """A ``pattern)`` of the open case block: its branch read when bash would run it (the first
        pattern that matches, by glob; a quoted pattern literally). Returns the statement after ``)``."""
        b = self.blocks[-1]
        b.expect = False
        close = pattern_end(stmt)
        head, rest = stmt[:close].strip(), stmt[close + 1:]
        head = head[1:] if head.startswith("(") else head
        pats = [_expand(p.strip(), self.env, i, []) for p in alternatives(head)]
        if not b.undecided and not b.taken and any("$" in p or "`" in p for p in pats):
            b.undecided, b.opened = True, (f"line {i + 1}", head[:60])  # a pattern not known here
        if b.undecided:
            b.active = b.outer
            return rest
        if b.fall:
            b.fall = False
            b.active = b.outer
            return rest
        hit = any(glob_match(p, b.case) for p in pats)
        b.active = b.outer and hit and not b.taken
        if b.active:
            b.taken = True
            b.why = f"line {b.line + 1}: case {b.case!r} -> {head}" + (f" ({'; '.join(b.used)})" if b.used else "")
        return rest

    # ----------------------------------------------------------------- words

    def emit(self, word: Word) -> None:
        self.out.append(word)
        if self.blocks:
            self.conditional.add(word.line)
        if word.text.startswith("--"):
            for b in self.blocks:
                b.flags += 1

    def array_word(self, tok: str, i: int, sources: list) -> None:
        close = tok.endswith(")")
        tok = tok[:-1] if close else tok
        m = VAR.fullmatch(tok)
        old = self.env.vars.get(m.group(1) or m.group(4)) if tok and m else None
        self._use(tok)
        if old is not None and old.words:
            self.array_words += list(old.words)  # ALL+=( "${DDP[@]}" ): DDP's elements, from their lines
        elif old is not None and not old.value:
            pass  # an empty array or value: no element
        elif tok:
            src: list[str] = list(sources)
            for part in _expand(tok, self.env, i, src).split():  # an unquoted ${ARGS[@]} splits each element again
                word = Word(part, i, tuple(src))
                self.array_words.append(word)
                self.array_new.append(word)
        if close:
            value = " ".join(w.text for w in self.array_words)
            srcs = tuple(dict.fromkeys(s for w in self.array_words for s in w.sources))
            var = _Var(value, self.array_words[0].line if self.array_words else i, srcs, tuple(self.array_words))
            if var.holds_flags:
                for word in self.array_new:
                    self.emit(word)
                var.emitted = tuple(self.array_new)
            self._replace(self.array, var, append=self.array_append)
            self.env.unset.discard(self.array)
            self.array, self.array_words, self.array_new = None, [], []

    def assign(self, name: str, append: bool, val: str, i: int, sources: list) -> None:
        if val.startswith("("):  # NAME=( ... ) / NAME+=( ... ), on one line or several
            old = self.env.vars.get(name)
            self.array, self.array_append = name, append
            self.array_words = (list(old.words) or [Word(w, old.line, old.sources) for w in old.value.split()]) \
                if append and old else []
            self.array_new = []
            if val[1:]:
                self.array_word(val[1:], i, sources)
            return
        self._use(val)
        parts, srcs, emitted = [], [], []
        for k, part in enumerate(val.split("\n")):
            src: list[str] = list(sources)
            parts.append(_expand(part, self.env, i + k, src))
            srcs.append(src)
            # words of variables that hold flags were passed where those are written
            own = VAR.sub(lambda m: "" if (v := self.env.vars.get(m.group(1) or m.group(4))) is not None
                          and (v.holds_flags or v.words) else m.group(0), part)
            emitted.append(_expand(own, self.env, i + k, []))
        new = " ".join(p for p in parts if p.strip()) if len(parts) > 1 else parts[0]
        old = self.env.vars.get(name)
        own: list[Word] = []
        if FLAG_WORD.search(new):  # ARGS="--num-layers 32 ...": its flags sit on these lines
            for k, p in enumerate(emitted):
                for w in p.split():
                    own.append(Word(w, i + k, tuple(srcs[k])))
                    self.emit(own[-1])
        all_src = [s for src in srcs for s in src]
        if append and old:
            new, all_src = (old.value + " " + new).strip(), list(old.sources) + all_src
        elif old and old.value != new and old.value and old.value not in new and name not in self.reassigned \
                and (not self.blocks or self.blocks[-1].undecided):
            self.reassigned.add(name)
            warn(name, new, f"assigned again on line {i + 1} (first on line {old.line + 1}); "
                 "ndplan reads this part without deciding it (a loop, or an if or case it cannot decide), so the last "
                 "value counts", "check that it is the one your launch uses")
        self._replace(name, _Var(new, i, tuple(all_src), emitted=tuple(own)), append)

    def _replace(self, name: str, var: _Var, append: bool) -> None:
        """``name`` set to ``var``: a value assigned before and never expanded takes its passed words
        back (``O="--a 1"; O="--b 2"; torchrun $O`` passes ``--b 2``), unless ``var`` appends to it."""
        old = self.env.vars.get(name)
        if old is not None and append:
            var.emitted = old.emitted + var.emitted
        elif old is not None and old.emitted and not old.used:
            self._drop(old.emitted)
        if self.loops or any(b.undecided for b in self.blocks):
            self.uncertain.add(name)
        self.env.vars[name] = var
        self.env.unset.discard(name)

    def _use(self, text: str) -> None:
        """Mark the variables ``text`` expands as used (their passed words stay)."""
        for ref in VAR.finditer(text):
            if (v := self.env.vars.get(ref.group(1) or ref.group(4))) is not None:
                v.used = True

    def _drop(self, words) -> None:
        gone = {id(w) for w in words}
        self.out = [w for w in self.out if id(w) not in gone]

    def token(self, tok: str, i: int, sources: list) -> None:
        if self.array is not None:
            self.array_word(tok, i, sources)
            return
        m = ASSIGN.match(tok)
        if m and not tok.startswith("-"):
            self.assign(m.group(1), m.group(2) == "+", m.group(3), i, sources)
            return
        if tok in KEYWORDS:
            return
        self._use(tok)
        m = VAR.fullmatch(tok)
        var = self.env.vars.get(m.group(1) or m.group(4)) if m else None
        if var is not None and var.holds_flags:
            return  # $ARGS: its words were passed where they are written
        if var is not None and var.words:
            for w in var.words:  # a value array: its elements here
                self.emit(Word(w.text, i, w.sources))
            return
        if var is not None and not var.value and "[@]" in tok:
            return  # an empty array passes no word
        src: list[str] = list(sources)
        self.emit(Word(_expand(tok, self.env, i, src), i, tuple(src)))

    def runtime(self, toks: list[str], i: int) -> None:
        """``for NAME in`` / ``select NAME in`` / ``read NAME ...``: values only the run knows."""
        names = toks[1:2] if toks[0] in ("for", "select") else [t for t in toks[1:] if not t.startswith("-")]
        for name in names:
            if re.fullmatch(r"[A-Za-z_]\w*", name):
                self.env.vars[name] = _Var(RUNTIME_VALUE.format(name), i)

    def statement(self, stmt: str, i: int) -> None:
        src: list[str] = []
        stmt = _arith(commands(stmt), self.env, i, src)  # before splitting: $(( 16 * N )) holds spaces
        if any(c in stmt for c in "'\"\\#"):
            try:
                toks = shlex.split(stmt)  # statements() cut the comments: a # inside a word stays
            except ValueError:
                toks = stmt.split()
        else:  # nothing to unquote: bash's word splitting is str.split's
            toks = stmt.split()
        if stmt.strip() in CASE_ENDS and self.blocks and self.blocks[-1].is_case:
            b = self.blocks[-1]
            b.expect = True
            b.fall = stmt.strip() == ";&" and b.active  # ;& runs the next branch's body as well
            if stmt.strip() == ";;&":  # ;;& tests the later patterns too
                b.taken = not b.outer
            return
        if toks and self.array is None and self.blocks and self.blocks[-1].is_case and self.blocks[-1].expect \
                and toks[0] != "esac":
            self.statement(self.case_branch(stmt, i), i)
            return
        if toks and self.array is None:
            lead = [t for t in toks if t not in LEADING or t == "else"]
            if lead and lead[0] in ("while", "until", "for", "select"):
                self.loop_open(lead[0], stmt.strip()[stmt.strip().index(lead[0]):], i)
                if lead[0] in ("for", "select") and self.reading:
                    self.runtime(lead, i)
                return
            if lead and lead[0] == "done" and self.blocks and self.blocks[-1].is_loop:
                if self.loop_close():
                    return  # its "do" was not counted either
            if lead and lead[0] == "case" and len(lead) >= 3 and lead[2] == "in":
                self.case_open(lead[1], stmt, i)
                rest = re.match(r"\s*(?:(?:then|do|else|\{)\s+)*case\s+\S+\s+in\b(.*)$", stmt, re.S)
                if rest and rest.group(1).strip():  # case $M in a) X=1;; ...: the first pattern on the line
                    self.statement(rest.group(1), i)
                return
            if lead and lead[0] == "esac" and self.blocks and self.blocks[-1].is_case:
                self._close(self.blocks.pop())
                toks = lead[1:]
            if lead and lead[0] in ("if", "elif", "else", "fi"):
                body = stmt.strip()
                while body.split(None, 1)[0] in LEADING and body.split(None, 1)[0] != "else":
                    body = body.split(None, 1)[1]
                toks = self.keyword(toks, i, body)
        if not self.reading:
            for blk in self.blocks:  # flags a branch bash does not run would pass
                blk.flags += len(re.findall(r"(?<![\w-])--[A-Za-z]", stmt))
            return
        if not toks:
            return
        if toks[0] == "unset" and self.array is None:
            for name in toks[1:]:
                var = self.env.vars.pop(name, None)
                if var is not None and var.emitted and not var.used:  # never expanded: its words go with it
                    self._drop(var.emitted)
                self.env.unset.add(name)
            return
        if toks[0] in ("source", ".") and len(toks) > 1 and self.array is None:
            self.sourced.append(shown(_expand(toks[1], self.env, i, [])))
            warn(f"line {i + 1}", f"{toks[0]} {toks[1]}", "is not read (ndplan reads this script alone): the variables "
                 "and flags that file sets are missing here", "give them in the environment or on ndplan's command line, "
                 "or check a script with the values written in")
            return
        self.loops += toks.count("do") - toks.count("done")
        if toks[0] == "read" and self.array is None:
            self.runtime(toks, i)
            return
        for tok in toks:
            self.token(tok, i, src)

    def line(self, text: str, i: int) -> None:
        """A logical line (physical lines joined inside a quote) starting on line ``i``."""
        text = text.replace("\\\n", " \n")  # backslash-newline inside a quote continues the line
        lines = text.split("\n")
        for offset, raw in enumerate(lines if len(lines) == 1 else [text]):
            line = raw.rstrip()
            if line.endswith("\\"):
                line = line[:-1]
            for stmt in statements(line):
                self.statement(stmt, i + offset)

    def heredoc(self, opener: str, body: str, quoted: bool, i: int) -> None:
        """A here-document written to a file (``cat <<EOT > path``): kept by that path, its body
        expanded as bash does when the delimiter is not quoted (``\\$`` a dollar sign)."""
        code = split_comment(opener)[0]
        m = heredoc_at(code)
        target = heredoc_target(code, m) if m else None
        if target is None or not self.reading:
            return
        target = _expand(target, self.env, i, [])
        if not quoted:
            keep = "\0"
            body = _substitute(_arith(body.replace("\\$", keep), self.env, i, []), self.env, i, [],
                               unset_empty=True).replace(keep, "$")
        self.heredocs[target] = body

    def finish(self, lines: int) -> None:
        for b in self.blocks:
            what, end = ("case", "esac") if b.is_case else ("loop", "done") if b.is_loop else ("if", "fi")
            warn(f"line {b.line + 1}", what, f"has no {end} (bash refuses the script)", f"close it with {end}")


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
    """The ``if`` conditions ndplan decided whose branches held flags, with the values used."""
    conditional: frozenset[int] = frozenset()
    """0-based lines whose words are passed inside an ``if``, ``case`` or loop."""
    sourced: tuple[str, ...] = ()
    """Files the script ``source``s, which are not read."""

    def value(self, name: str, environ: dict) -> str | None:
        """``name`` as the launched program sees it: the script's value, else the environment's
        (None when the script unsets it)."""
        return None if name in self.unset else self.variables.get(name, environ.get(name))


def read_script(text: str, environ: dict | None = None) -> Script:
    """The script's words after variable expansion (a word that comes from a variable carries
    the line of its assignment and the environment values / defaults used), its
    here-documents and the conditions decided. The last reads are kept (``check`` reads one
    script again for every edit it tries)."""
    env = {} if environ is None else {str(k): str(v) for k, v in environ.items()}
    key = (text, tuple(sorted(env.items())))
    if key not in _READ:
        if len(_READ) >= READ_CACHE:
            _READ.pop(next(iter(_READ)))
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            script = _read(text, env)
        _READ[key] = (script, [w.message for w in said])
    got, said = _READ[key]
    for message in said:  # a read from the cache says what the first read said
        warnings.warn(message, stacklevel=2)
    return Script(list(got.words), dict(got.heredocs), dict(got.variables), got.unset, got.decisions, got.conditional,
                  got.sourced)


READ_CACHE = 64
_READ: dict[tuple, tuple[Script, list]] = {}


def _read(text: str, environ: dict) -> Script:
    r = _Reader(environ)
    lines = text.splitlines()
    for i, joined, body, quoted in logical_lines(lines):
        r.line(joined, i)
        if body is not None:
            r.heredoc(joined, body, quoted, i)
    r.finish(len(lines))
    return Script(r.out, r.heredocs, {k: v.value for k, v in r.env.vars.items()}, frozenset(r.env.unset),
                  tuple(dict.fromkeys(r.decisions)), frozenset(r.conditional), tuple(r.sourced))


def read_words(text: str, environ: dict | None = None) -> list[Word]:
    """``read_script``'s words."""
    return read_script(text, environ).words
