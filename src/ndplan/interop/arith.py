"""Bash ``$(( ))`` integer arithmetic as launch scripts use it, without ``eval``.

Supported: decimal integers, variable names (looked up in the script's assignments, as
bash does inside ``$(( ))``; unset names are 0 in bash and refused here), ``+ - * / %
**``, unary ``+ -`` and parentheses, with bash's precedence (``**`` binds tightest and
groups to the right; ``/`` and ``%`` truncate toward zero). Every intermediate value must
stay within bash's 64-bit range, so ``$((9**9**9))`` is refused in one line instead of
hanging the process. Anything else (shifts, comparisons, ternaries, assignments) is
refused, naming the expression.
"""

from __future__ import annotations

import re
from typing import Callable

from ndplan.errors import NdplanError

LIMIT = 2**63
"""bash arithmetic is 64-bit signed: |value| < 2**63."""
MAX_LENGTH = 256
"""Longest expression evaluated (launch scripts use a few terms)."""
_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_]\w*)|(\*\*|[-+*/%()]))")


def _tokens(expr: str) -> list[str]:
    out, pos = [], 0
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        m = _TOKEN.match(expr, pos)
        if not m:
            raise _refuse(expr, f"'{expr[pos:].strip()[:10]}' is not supported")
        out.append(m.group(m.lastindex))
        pos = m.end()
    return out


def _refuse(expr: str, why: str) -> NdplanError:
    return NdplanError("$((...))", expr, why, "write the number, or use + - * / % ** on integers and variables")


def evaluate(expr: str, lookup: Callable[[str], str | None]) -> int:
    """The integer value of ``expr``; ``lookup(name)`` gives a variable's text or None."""
    if len(expr) > MAX_LENGTH:
        raise _refuse(expr[:40] + "...", f"longer than {MAX_LENGTH} characters")
    toks = _tokens(expr)
    pos = 0

    def peek():
        return toks[pos] if pos < len(toks) else None

    def take():
        nonlocal pos
        pos += 1
        return toks[pos - 1]

    def check(v: int) -> int:
        if abs(v) >= LIMIT:
            raise _refuse(expr, "a value leaves bash's 64-bit range")
        return v

    def atom() -> int:
        t = take() if peek() is not None else None
        if t is None:
            raise _refuse(expr, "ends early")
        if t == "(":
            v = additive()
            if peek() != ")":
                raise _refuse(expr, "unbalanced parentheses")
            take()
            return v
        if t.isdigit():
            return check(int(t))
        if t[0].isalpha() or t[0] == "_":
            text = lookup(t)
            if text is None:
                raise _refuse(expr, f"variable {t} is not set in the script")
            if not re.fullmatch(r"\s*-?\d+\s*", text):
                raise _refuse(expr, f"variable {t}={text!r} is not an integer")
            return check(int(text))
        raise _refuse(expr, f"unexpected '{t}'")

    def unary() -> int:  # bash: unary + - bind tighter than **, so -2**2 is 4
        if peek() in ("+", "-"):
            sign = take()
            v = unary()
            return -v if sign == "-" else v
        return atom()

    def power() -> int:  # right-associative: 2**3**2 = 2**9
        base = unary()
        if peek() != "**":
            return base
        take()
        exp = power()
        if exp < 0:
            raise _refuse(expr, "negative exponent")
        if base not in (0, 1, -1) and exp > 63:
            raise _refuse(expr, "a value leaves bash's 64-bit range")
        return check(base ** exp)

    def multiplicative() -> int:
        v = power()
        while peek() in ("*", "/", "%"):
            op = take()
            w = power()
            if op == "*":
                v = check(v * w)
            else:
                if w == 0:
                    raise _refuse(expr, "division by zero")
                q = abs(v) // abs(w) * (1 if (v >= 0) == (w >= 0) else -1)  # bash truncates toward zero
                v = q if op == "/" else v - q * w
        return v

    def additive() -> int:
        v = multiplicative()
        while peek() in ("+", "-"):
            v = check(v + multiplicative() if take() == "+" else v - multiplicative())
        return v

    if not toks:
        raise _refuse(expr, "empty expression")
    value = additive()
    if pos != len(toks):
        raise _refuse(expr, f"unexpected '{toks[pos]}'")
    return value


def expand(word: str, lookup: Callable[[str], str | None]) -> str:
    """``word`` with every ``$(( ... ))`` replaced by its value (nested parentheses allowed)."""
    out, i = [], 0
    while True:
        j = word.find("$((", i)
        if j < 0:
            out.append(word[i:])
            return "".join(out)
        out.append(word[i:j])
        depth, k = 2, j + 3
        while k < len(word) and depth:
            depth += {"(": 1, ")": -1}.get(word[k], 0)
            k += 1
        if depth:
            raise _refuse(word[j:], "no closing ))")
        inner = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: m.group(1) or m.group(2), word[j + 3:k - 2])
        out.append(str(evaluate(inner, lookup)))
        i = k
