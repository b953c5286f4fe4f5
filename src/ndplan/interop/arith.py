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


class _Parser:
    """Recursive descent over the tokens, one method per bash precedence level:
    additive (+ -) < multiplicative (* / %) < power (**, right-associative) < unary
    (+ -, binding tighter than **: -2**2 is 4) < atom (number, variable, parentheses)."""

    def __init__(self, expr: str, lookup: Callable[[str], str | None]):
        self.expr, self.lookup = expr, lookup
        self.toks, self.pos = _tokens(expr), 0

    def peek(self) -> str | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def take(self) -> str:
        self.pos += 1
        return self.toks[self.pos - 1]

    def check(self, v: int) -> int:
        if abs(v) >= LIMIT:
            raise _refuse(self.expr, "a value leaves bash's 64-bit range")
        return v

    def atom(self) -> int:
        if self.peek() is None:
            raise _refuse(self.expr, "ends early")
        t = self.take()
        if t == "(":
            v = self.additive()
            if self.peek() != ")":
                raise _refuse(self.expr, "unbalanced parentheses")
            self.take()
            return v
        if t.isdigit():
            return self.check(int(t))
        if t[0].isalpha() or t[0] == "_":
            return self.variable(t)
        raise _refuse(self.expr, f"unexpected '{t}'")

    def variable(self, name: str) -> int:
        text = self.lookup(name)
        if text is None:
            raise _refuse(self.expr, f"variable {name} is not set in the script")
        if not re.fullmatch(r"\s*-?\d+\s*", text):
            raise _refuse(self.expr, f"variable {name}={text!r} is not an integer")
        return self.check(int(text))

    def unary(self) -> int:
        if self.peek() in ("+", "-"):
            sign = self.take()
            v = self.unary()
            return -v if sign == "-" else v
        return self.atom()

    def power(self) -> int:
        base = self.unary()
        if self.peek() != "**":
            return base
        self.take()
        exp = self.power()
        if exp < 0:
            raise _refuse(self.expr, "negative exponent")
        if base not in (0, 1, -1) and exp > 63:
            raise _refuse(self.expr, "a value leaves bash's 64-bit range")
        return self.check(base ** exp)

    def multiplicative(self) -> int:
        v = self.power()
        while self.peek() in ("*", "/", "%"):
            op, w = self.take(), self.power()
            if op == "*":
                v = self.check(v * w)
                continue
            if w == 0:
                raise _refuse(self.expr, "division by zero")
            q = abs(v) // abs(w) * (1 if (v >= 0) == (w >= 0) else -1)  # bash truncates toward zero
            v = q if op == "/" else v - q * w
        return v

    def additive(self) -> int:
        v = self.multiplicative()
        while self.peek() in ("+", "-"):
            op = self.take()
            w = self.multiplicative()
            v = self.check(v + w if op == "+" else v - w)
        return v


def evaluate(expr: str, lookup: Callable[[str], str | None]) -> int:
    """The integer value of ``expr``; ``lookup(name)`` gives a variable's text or None."""
    if len(expr) > MAX_LENGTH:
        raise _refuse(expr[:40] + "...", f"longer than {MAX_LENGTH} characters")
    parser = _Parser(expr, lookup)
    if not parser.toks:
        raise _refuse(expr, "empty expression")
    value = parser.additive()
    if parser.pos != len(parser.toks):
        raise _refuse(expr, f"unexpected '{parser.toks[parser.pos]}'")
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
