"""Bash's quoting as a launch-script reader needs it: where comments start, where ``;`` splits
statements, which physical lines one quoted string spans, and here-documents (their bodies are
text, not commands). One scanner (``_scan``) holds the quoting rule for all of them: ``'...'``
literal; ``"..."`` with ``\\`` escaping the next character; ``\\`` outside quotes escaping the
next character; ``#`` at the start of a word (after blank space or a line start) outside quotes
starting a comment to the end of the line.
"""

from __future__ import annotations

import re

from ndplan.errors import warn

HEREDOC = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_][^\s'\"<>|;&()]*)\2(?=[\s;&|)<>]|$)")
"""``<<EOT``, ``<<-EOT``, ``<<'EOT'``; ``<<<`` (a here-string) and ``<<`` inside quotes or
``$(( ))`` are not here-documents (``heredoc_at``)."""
REDIRECT = re.compile(r"(?<![0-9&>])>>?\s*([^\s<>|;&]+)")
"""The file a command writes: ``> path`` or ``>> path`` (not ``2>``, ``&>``)."""


def _scan(text: str, quote: str | None = None, final: list | None = None):
    """(index, character, quote state before it, in a comment) over ``text``, starting in
    ``quote`` (None, "'" or '"'); an escaped character is not reported. ``final``, a list, gets
    the quote state at the end."""
    k, comment = 0, False
    while k < len(text):
        ch = text[k]
        if not comment and quote is None and ch == "#" and (k == 0 or text[k - 1] in " \t\n"):
            comment = True
        if comment:
            comment = ch != "\n"
            yield k, ch, quote, True
            k += 1
            continue
        yield k, ch, quote, False
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
        k += 1
    if final is not None:
        final.append(quote)


def end_quote(text: str, quote: str | None = None) -> str | None:
    """The quote ``text`` leaves open (None: none), starting in ``quote``."""
    if quote is None and "'" not in text and '"' not in text:
        return None
    final: list = []
    for _ in _scan(text, quote, final):
        pass
    return final[0]


def split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of a shell line: a ``#`` outside quotes, at the start or after
    blank space, starts a comment (bash's rule)."""
    if "#" not in line:
        return line, ""
    for k, ch, quote, comment in _scan(line):
        if comment:
            return line[:k].rstrip(), line[k:]
    return line, ""


def statements(line: str) -> list[str]:
    """A shell line split at ``;`` outside quotes (comments removed first); ``;;`` (the end of a
    ``case`` branch) is a statement of its own."""
    code, _ = split_comment(line)
    if ";" not in code:
        return [code]
    out, start = [], 0
    for k, ch, quote, _ in _scan(code):
        if ch == ";" and quote is None and k >= start:
            out.append(code[start:k])
            end = next((e for e in (";;&", ";;", ";&") if code.startswith(e, k)), None)
            if end:  # a case branch's end is a statement of its own
                out.append(end)
                start = k + len(end)
            else:
                start = k + 1
    return out + [code[start:]]


CASE_END = ";;"
CASE_ENDS = (";;", ";&", ";;&")
"""A case branch's terminators: ``;;`` ends the case; ``;&`` falls through, ``;;&`` tests on."""


def heredoc_at(code: str) -> re.Match | None:
    """The here-document operator of a statement, outside quotes and ``$(( ))``."""
    for m in HEREDOC.finditer(code):
        if code[m.start():m.start() + 3] == "<<<" or (m.start() > 0 and code[m.start() - 1] == "<"):
            continue
        before = code[:m.start()]
        if end_quote(before) is not None or before.count("((") > before.count("))"):
            continue
        return m
    return None


def heredoc_target(code: str, m: re.Match) -> str | None:
    """The file a here-document goes to: the command's ``>`` / ``>>`` redirect, before or
    after the operator."""
    rest = code[:m.start()] + " " + code[m.end():]
    found = REDIRECT.search(rest)
    return found.group(1).strip("'\"") if found else None


def logical_lines(lines: list[str]):
    """(first line index, text, here-document body or None, its delimiter quoted) per logical
    line: physical lines joined while a quote is open (the state carried line to line, so a
    long script is read once); a here-document's body follows the line that opens it and is not
    a line of its own. A quote still open at the end is said in a warning."""
    i = 0
    while i < len(lines):
        first, parts, quote = i, [lines[i]], end_quote(lines[i])
        while quote is not None and i + 1 < len(lines):
            i += 1
            parts.append(lines[i])
            quote = end_quote("\n" + lines[i], quote)
        if quote is not None:
            warn(f"line {first + 1}", lines[first].strip()[:60], f"a {quote} quote that never closes",
                 "close it; ndplan reads the rest of the file as that string")
        text = "\n".join(parts)
        i += 1
        m = heredoc_at(split_comment(text)[0]) if "<<" in text else None
        body = None
        if m:
            body, strip = [], m.group(1) == "-"
            while i < len(lines) and (lines[i].lstrip("\t") if strip else lines[i]).rstrip() != m.group(3):
                body.append(lines[i].lstrip("\t") if strip else lines[i])
                i += 1
            if i >= len(lines):
                warn(f"line {first + 1}", m.group(0), f"a here-document whose end line {m.group(3)} never comes",
                     "add the delimiter line; bash reads the rest of the file into it, as ndplan does")
            i += 1  # the delimiter
        yield first, text, (None if body is None else "\n".join(body)), bool(m and m.group(2))
