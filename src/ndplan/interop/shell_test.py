"""``if``/``elif`` conditions of a launch script decided as bash decides them, or left undecided.

Decided: ``[ ... ]``, ``[[ ... ]]`` and ``test ...`` with ``= == != -eq -ne -lt -le -gt -ge -z -n``
or one operand, ``!`` before an expression or inside it, and ``&&`` / ``||`` between them
(bash evaluates the list left to right, with equal precedence). Bash's rules kept: an unset
variable is empty; ``[[ a == b ]]`` matches ``b`` as a glob unless it is quoted (bash manual,
Conditional Constructs); ``[`` splits an unquoted expansion into words, so an unquoted operand
that expands to nothing or to several words is left undecided, as is an operand whose value the
script computes at run time (``$( )``, a loop variable, ``read``, a value set in a loop or a
branch not decided), a ``${...}`` form other than a default, a leading-zero number under ``[[``
(octal), a pattern with brackets, escapes or extglobs, single-quoted text, a list continued on
the next line, and every other test (files, regexes, commands).
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from typing import Callable

OPS = ("=", "==", "!=", "-eq", "-ne", "-lt", "-le", "-gt", "-ge")
MAX_OPERAND = 256
"""Longest operand decided: a guard, not a bash rule (a launch script compares names and small
numbers; a longer operand is left undecided)."""
RUNTIME = ("$(", "`")
"""Text in a value that only the running script knows."""


def _raw_words(text: str) -> list[str] | None:
    """Words of ``text`` with their quotes kept (None: not splittable)."""
    lex = shlex.shlex(text, posix=False)
    lex.whitespace_split = True
    lex.commenters = ""
    try:
        return list(lex)
    except ValueError:
        return None


def _unquoted(raw: str) -> str:
    try:
        out = shlex.split(raw)
    except ValueError:
        return raw
    return out[0] if len(out) == 1 else " ".join(out)


def _fully_quoted(raw: str) -> bool:
    return len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"" and end_quoted(raw)


def end_quoted(raw: str) -> bool:
    """The quote that opens ``raw`` closes only at its end."""
    try:
        return len(shlex.split(raw)) == 1 and raw.count(raw[0]) == 2 + raw[1:-1].count("\\" + raw[0])
    except ValueError:
        return False


Expand = Callable[[str, list], str]
"""(word, sources) -> its value after the script's variables (an unset one left as written)."""


def _operand(raw: str, expand: Expand, single: bool, sources: list) -> str | None:
    """The value of one operand, or None when bash's value cannot be known here."""
    quoted = _fully_quoted(raw)
    if raw.startswith("'") or len(raw) > MAX_OPERAND:
        return None  # single quotes keep $ literal; a huge operand is not a launch setting
    value = expand(_unquoted(raw), sources)
    if any(r in value for r in RUNTIME) or "$((" in value or "${" in value:
        return None  # run-time values, and ${...} forms ndplan does not expand (${A,,}, ${A%x}, ...)
    unset = re.findall(r"\$(\w+)", value)
    if unset:
        sources.append(f"{', '.join(dict.fromkeys(unset))} unset: empty, as in bash")
    value = re.sub(r"\$\w+", "", value)
    if single and not quoted and ("$" in raw or "`" in raw) and (value == "" or re.search(r"\s", value)):
        return None  # [ ]: the unquoted expansion is split into 0 or several words
    return value


def _test(words: list[str], raws: list[str], double: bool) -> bool | None:
    if words[:1] == ["!"]:
        r = _test(words[1:], raws[1:], double)
        return None if r is None else not r
    if len(words) == 1:
        return words[0] != ""
    if len(words) == 2 and words[0] in ("-z", "-n"):
        return (words[1] == "") == (words[0] == "-z")
    if len(words) == 3 and words[1] in OPS:
        a, op, b = words
        if op in ("=", "==", "!="):
            if double and not _fully_quoted(raws[2]):
                if re.search(r"[\\\[\]]|[@!+*?]\(", raws[2]):
                    return None  # bracket classes, escapes and extglobs: bash's matching, not fnmatch's
                same = fnmatch.fnmatchcase(a, b)
            else:
                same = a == b
            return same if op != "!=" else not same
        if double:  # [[ ]] evaluates -eq ... operands arithmetically: an empty (unset) one is 0
            a, b = a or "0", b or "0"
        if not (re.fullmatch(r"-?[0-9]{1,18}", a) and re.fullmatch(r"-?[0-9]{1,18}", b)):
            return None
        if double and any(re.fullmatch(r"-?0[0-9]+", v) for v in (a, b)):
            return None  # [[ ]] reads a leading zero as octal
        x, y = int(a), int(b)
        return {"-eq": x == y, "-ne": x != y, "-lt": x < y, "-le": x <= y, "-gt": x > y, "-ge": x >= y}[op]
    return None


def decide(text: str, expand: Expand) -> tuple[bool | None, list[str]]:
    """(the condition's value, or None when undecided; the sources of the values it used)
    for ``text``, what follows ``if`` / ``elif`` in one statement."""
    raws = _raw_words(text)
    sources: list[str] = []
    if not raws or raws[-1] in ("&&", "||", "\\"):
        return None, sources  # nothing, or a list continued on the next line
    result, op, k = None, None, 0
    while k < len(raws):
        neg = raws[k] == "!"
        k += neg
        if k >= len(raws):
            return None, sources
        if raws[k] in ("[", "[["):
            close = "]" if raws[k] == "[" else "]]"
            if close not in raws[k + 1:]:
                return None, sources
            end = raws.index(close, k + 1)
            args, double, k = raws[k + 1:end], raws[k] == "[[", end + 1
        elif raws[k] == "test":
            end = next((j for j in range(k + 1, len(raws)) if raws[j] in ("&&", "||")), len(raws))
            args, double, k = raws[k + 1:end], False, end
        else:
            return None, sources
        words = []
        for i, raw in enumerate(args):
            if raw in OPS or raw in ("!", "-z", "-n"):
                words.append(raw)
                continue
            v = _operand(raw, expand, not double, sources)
            if v is None:
                return None, sources
            words.append(v)
        r = _test(words, args, double)
        if r is None:
            return None, sources
        r = r != neg
        result = r if op is None else (result and r if op == "&&" else result or r)
        if k < len(raws):
            if raws[k] not in ("&&", "||"):
                return None, sources
            op, k = raws[k], k + 1
    return result, sources


# --------------------------------------------------------------------------- case patterns

def pattern_end(stmt: str) -> int:
    """Index of the ``)`` that ends a case pattern (outside quotes), or len(stmt)."""
    quote = None
    for k, ch in enumerate(stmt):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == ")":
            return k
    return len(stmt)


def alternatives(head: str) -> list[str]:
    """``a|"b c"|*`` -> its patterns (the ``|`` outside quotes)."""
    out, cur, quote = [], "", None
    for ch in head:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "|":
            out.append(cur)
            cur = ""
            continue
        cur += ch
    return out + [cur]


def glob_match(pattern: str, value: str) -> bool:
    """bash's case match: a glob (``*``, ``?``, ``[...]`` with ``!`` or ``^`` negating); quoted parts
    match literally."""
    out, k, quote = [], 0, None
    while k < len(pattern):
        ch = pattern[k]
        if quote:
            if ch == quote:
                quote = None
            else:
                out.append(re.escape(ch))
        elif ch in "'\"":
            quote = ch
        elif ch == "\\" and k + 1 < len(pattern):
            k += 1
            out.append(re.escape(pattern[k]))
        elif ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        elif ch == "[" and "]" in pattern[k + 2:]:
            end = pattern.index("]", k + 2)
            body = pattern[k + 1:end]
            neg = body[:1] in ("!", "^")
            out.append("[" + ("^" if neg else "") + re.escape(body[1:] if neg else body).replace("\\-", "-") + "]")
            k = end
        else:
            out.append(re.escape(ch))
        k += 1
    return re.fullmatch("".join(out), value, re.S) is not None
