"""In-place edits of a user's config text: set, add or remove dotted keys, touching only
the lines of the keys that change (comments, order and every other line are kept).

One editor per syntax, each with ``locate(text) -> {dotted key: line index}`` and
``edit(text, changes) -> text`` where ``changes`` maps a dotted key to its new value,
or to ``REMOVE``. Supported layouts: block YAML (MindFormers configs), TOML tables
(torchtitan), and JSON: ``json_locate`` finds keys in any layout; ``json_edit`` edits in
place text with one member per line (``json.dumps(indent=...)`` style), replaces the values of
keys a file has in any layout, and re-serialises other edits (keys added or removed in JSON not
written one member per line) with two-space indentation, key order kept.
"""

from __future__ import annotations

import bisect
import json
import re

from ndplan.export.torchtitan import _value as toml_value

REMOVE = object()
"""Change value: delete the key."""


def _existing_parent(key: str, loc: dict) -> tuple[list[str], int]:
    """(key parts, k): parts[:k] is the deepest ancestor of ``key`` present in ``loc``
    (k = 0: none, add under the root)."""
    parts = key.split(".")
    k = len(parts) - 1
    while k > 0 and ".".join(parts[:k]) not in loc:
        k -= 1
    return parts, k


# --------------------------------------------------------------------------- YAML

_YAML_KEY = re.compile(r"^(\s*)([A-Za-z_][\w\-]*)\s*:(.*)$")


def _split_comment(value: str) -> tuple[str, str]:
    """(value, ' # comment' or '') of a line's value part (quotes are not parsed)."""
    m = re.search(r"\s+#", value)
    return (value[:m.start()], value[m.start():]) if m else (value, "")


def yaml_value(v) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(yaml_value(x) for x in v) + "]"
    return str(v)


def _yaml_lines(text: str):
    """(line index, indent, key, value part) of every ``key:`` line outside list items."""
    in_item = None
    for i, line in enumerate(text.splitlines()):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        ind = len(line) - len(line.lstrip())
        if s.startswith("-"):
            in_item = ind
            continue
        if in_item is not None and ind > in_item:
            continue  # inside a list item's mapping
        in_item = None
        m = _YAML_KEY.match(line)
        if m:
            yield i, ind, m.group(2), m.group(3)


def yaml_locate(text: str) -> dict[str, tuple[int, int]]:
    """Dotted key -> (line index, indent) for every mapping key in block style."""
    out, stack = {}, []  # stack: (indent, key)
    for i, ind, key, _ in _yaml_lines(text):
        while stack and stack[-1][0] >= ind:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key])
        out[path] = (i, ind)
        stack.append((ind, key))
    return out


def _block_end(loc: dict, parent: str, default: int) -> int:
    """Last line index of ``parent``'s block (its deepest last descendant)."""
    lines = [li for k, (li, *_rest) in loc.items() if k.startswith(parent + ".")]
    return max(lines) if lines else default


def yaml_edit(text: str, changes: dict) -> str:
    lines = text.splitlines()
    for key, value in changes.items():
        loc = yaml_locate("\n".join(lines))
        if key in loc:
            i, ind = loc[key]
            m = _YAML_KEY.match(lines[i])
            if value is REMOVE:
                del lines[i]
            else:
                _, comment = _split_comment(m.group(3))
                lines[i] = f"{' ' * ind}{m.group(2)}: {yaml_value(value)}{comment}"
            continue
        if value is REMOVE:
            continue
        parts, k = _existing_parent(key, loc)
        if k == 0:
            at, ind = len(lines), 0
            if lines and lines[-1].strip():
                lines.append("")
                at += 1
        else:
            parent = ".".join(parts[:k])
            pline, pind = loc[parent]
            at = _block_end(loc, parent, pline) + 1
            kids = [ci for c, (_, ci) in loc.items() if c.startswith(parent + ".") and c.count(".") == k]
            ind = kids[0] if kids else pind + 2
        new = []
        for j, name in enumerate(parts[k:]):
            last = j == len(parts) - k - 1
            new.append(f"{' ' * ind}{name}:" + (f" {yaml_value(value)}" if last else ""))
            ind += 2
        lines[at:at] = new
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


# --------------------------------------------------------------------------- TOML

_TOML_TABLE = re.compile(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$")
_TOML_KEY = re.compile(r"^(\s*)([A-Za-z0-9_\-]+)\s*=(.*)$")


def toml_locate(text: str) -> dict[str, int]:
    """Dotted key -> line index of tables (``[parallelism]``) and their keys."""
    out, table = {}, ""
    for i, line in enumerate(text.splitlines()):
        m = _TOML_TABLE.match(line)
        if m:
            table = m.group(1).strip()
            out[table] = i
            continue
        m = _TOML_KEY.match(line)
        if m and not line.lstrip().startswith("#"):
            out[f"{table}.{m.group(2)}" if table else m.group(2)] = i
    return out


def toml_edit(text: str, changes: dict) -> str:
    lines = text.splitlines()
    for key, value in changes.items():
        loc = toml_locate("\n".join(lines))
        table, _, name = key.rpartition(".")
        if key in loc:
            i = loc[key]
            if value is REMOVE:
                del lines[i]
            else:
                m = _TOML_KEY.match(lines[i])
                _, comment = _split_comment(m.group(3))
                lines[i] = f"{m.group(1)}{name} = {toml_value(value)}{comment}"
        elif value is REMOVE:
            continue
        elif table in loc:
            at = max([li for k, li in loc.items() if k.startswith(table + ".")] + [loc[table]]) + 1
            lines.insert(at, f"{name} = {toml_value(value)}")
        else:
            if lines and lines[-1].strip():
                lines.append("")
            lines += [f"[{table}]", f"{name} = {toml_value(value)}"]
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


# --------------------------------------------------------------------------- JSON

_JSON_MEMBER = re.compile(r'^(\s*)"([^"]+)"\s*:\s*(.*?)(,?)\s*$')


def json_locate(text: str) -> dict[str, tuple[int, int, int]] | None:
    """Dotted key -> (line index, column of its opening quote, line index of the closing
    ``}`` for object values else -1) of every member of every object reached through objects,
    in any valid JSON layout (``{"a": 1, "b": {"c": 2,`` and the rest); a key given twice
    takes its last place, as ``json.loads`` keeps the last value. Members of objects inside
    arrays have no dotted key and are not listed. None when the text is not valid JSON."""
    try:
        return _JsonScan(text).members()
    except (ValueError, IndexError):
        return None


class _JsonScan:
    """A JSON scanner (RFC 8259 grammar) that records where each object member's key is:
    ``json`` gives values but not positions."""

    _NUMBER = re.compile(r"NaN|-?Infinity|-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
    """JSON numbers, and the NaN / Infinity Python's json (and so DeepSpeed) reads."""
    _STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"')
    _LITERALS = ("true", "false", "null")

    def __init__(self, text: str):
        self.t, self.i = text, 0
        # line breaks as str.splitlines() makes lines of a JSON text (\n, \r\n, lone \r)
        self.starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]
        self.out: dict[str, tuple[int, int, int]] = {}
        self.spans: dict[str, tuple[int, int]] = {}  # dotted key -> [start, end) offsets of its value

    def members(self) -> dict[str, tuple[int, int, int]]:
        self._value("")
        self._ws()
        if self.i != len(self.t):
            raise ValueError("extra data after the JSON value")
        return self.out

    def _where(self, pos: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.starts, pos) - 1
        return line, pos - self.starts[line]

    def _ws(self) -> None:
        while self.i < len(self.t) and self.t[self.i] in " \t\n\r":
            self.i += 1

    def _expect(self, c: str) -> None:
        self._ws()
        if self.t[self.i] != c:
            raise ValueError(f"expected {c!r} at offset {self.i}")
        self.i += 1

    def _string(self) -> str:
        m = self._STRING.match(self.t, self.i)
        if not m:
            raise ValueError(f"bad string at offset {self.i}")
        self.i = m.end()
        return json.loads(m.group())

    def _value(self, path: str | None) -> None:
        """One value; ``path``: its dotted key when it is a member of an object reached
        through objects ("" for the root), None inside arrays."""
        self._ws()
        c = self.t[self.i]
        if c == "{":
            self._object(path)
        elif c == "[":
            self.i += 1
            self._ws()
            if self.t[self.i] == "]":
                self.i += 1
                return
            while True:
                self._value(None)
                self._ws()
                c = self.t[self.i]
                self.i += 1
                if c == "]":
                    return
                if c != ",":
                    raise ValueError(f"expected ',' or ']' at offset {self.i - 1}")
        elif c == '"':
            self._string()
        else:
            m = self._NUMBER.match(self.t, self.i)
            word = next((w for w in self._LITERALS if self.t.startswith(w, self.i)), None)
            if word:
                self.i += len(word)
            elif m:
                self.i = m.end()
            else:
                raise ValueError(f"unexpected {c!r} at offset {self.i}")

    def _object(self, path: str | None) -> None:
        self.i += 1  # "{"
        self._ws()
        if self.t[self.i] == "}":
            self.i += 1
            return
        while True:
            self._ws()
            at = self.i
            key = self._string()
            self._expect(":")
            dotted = None if path is None else (f"{path}.{key}" if path else key)
            self._ws()
            is_object, start = self.t[self.i] == "{", self.i
            self._value(dotted)
            if dotted is not None:
                line, col = self._where(at)
                self.out.pop(dotted, None)  # the last occurrence wins, and keeps its order
                self.out[dotted] = (line, col, self._where(self.i - 1)[0] if is_object else -1)
                self.spans[dotted] = (start, self.i)
            self._ws()
            c = self.t[self.i]
            self.i += 1
            if c == "}":
                return
            if c != ",":
                raise ValueError(f"expected ',' or '}}' at offset {self.i - 1}")


def _json_line_layout(text: str) -> dict[str, tuple[int, int, int]] | None:
    """json_locate's places when the text holds one member per line (``json.dumps(indent=...)``
    style, objects written on one line kept whole: their members are not listed), which
    json_edit rewrites line by line; None for any other layout (json_edit re-serialises)."""
    out, stack = {}, []  # stack: dotted key of open objects
    lines = text.splitlines()
    for i, line in enumerate(lines):
        s = line.strip()
        if s in ("{", "") and not stack and not out:
            continue
        if s in ("}", "},"):
            if stack:
                k = stack.pop()
                li, ind, _ = out[k]
                out[k] = (li, ind, i)
            continue
        m = _JSON_MEMBER.match(line)
        if not m:
            return None
        path = ".".join(stack + [m.group(2)])
        val = m.group(3)
        out[path] = (i, len(m.group(1)), -1)
        if val == "{":
            stack.append(path)
        elif val.startswith(("{", "[")) and not _closed(val):
            return None
    return out


def _closed(val: str) -> bool:
    try:
        json.loads(val)
        return True
    except ValueError:
        return False


def _ancestors(key: str) -> list[str]:
    parts = key.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _line_editable(key: str, line: dict, spans: dict) -> bool:
    """Can the line editor place ``key``? It is a member line, or a new key under the root or under
    an object written over several lines (not inside an object written on one line)."""
    if key in line:
        return True
    if key in spans:
        return False
    ancestors = [a for a in _ancestors(key) if a in spans]
    return not ancestors or (ancestors[-1] in line and line[ancestors[-1]][2] != -1)


def _json_splice(text: str, changes: dict) -> str | None:
    """``changes`` made in the text as it stands, in any layout: a key's value replaced where it is,
    a new key added first in its deepest existing object (on its own line when that object's members
    are on lines of their own). None when a change removes a key."""
    if any(v is REMOVE for v in changes.values()):
        return None
    for key, value in changes.items():  # one at a time: every edit moves the offsets after it
        scan = _JsonScan(text)
        scan.members()
        if key in scan.spans:
            start, end = scan.spans[key]
            text = text[:start] + json.dumps(value) + text[end:]
            continue
        parts = key.split(".")
        k = len(parts) - 1
        while k > 0 and ".".join(parts[:k]) not in scan.spans:
            k -= 1
        brace = scan.spans[".".join(parts[:k])][0] if k else len(text) - len(text.lstrip())
        if text[brace] != "{":
            return None
        member = value
        for name in reversed(parts[k + 1:]):
            member = {name: member}
        member = f"{json.dumps(parts[k])}: {json.dumps(member)}"
        at = brace + 1
        ws = re.match(r"[ \t\r\n]*", text[at:]).group()
        if text[at + len(ws)] == "}":
            text = text[:at] + member + text[at:]
        elif "\n" in ws or "\r" in ws:
            text = text[:at] + ws + member + "," + text[at:]
        else:
            text = text[:at] + member + ", " + text[at:]
    return text


def json_edit(text: str, changes: dict) -> str:
    """``text`` with ``changes`` made: line by line in a one-member-per-line file, else in place
    (``_json_splice``); re-serialised when a key is removed from another layout or a key is set
    under a member that is not an object."""
    from ndplan.export.common import flatten, nest
    doc = flatten(json.loads(text))
    # a key set under a member that is not an object ("zero_optimization": true, DeepSpeed's deprecated
    # form) replaces that member: re-serialised
    scalar_parent = any(a in doc and not isinstance(doc[a], dict)
                        for k, v in changes.items() if v is not REMOVE for a in _ancestors(k))
    line = None if scalar_parent else _json_line_layout(text)
    if not scalar_parent:
        scan = _JsonScan(text)
        scan.members()
        if line is None or not all(_line_editable(k, line, scan.spans) for k in changes):
            spliced = _json_splice(text, changes)
            if spliced is not None:
                return spliced
            line = None
    if line is None:
        for k, v in changes.items():
            if v is REMOVE:
                doc.pop(k, None)
            else:
                for a in _ancestors(k):
                    doc.pop(a, None)
                doc[k] = v
        return json.dumps(nest(doc), indent=2) + "\n"
    lines = text.splitlines()
    for key, value in changes.items():
        loc = _json_line_layout("\n".join(lines))
        if key in loc:
            i, ind, _ = loc[key]
            if value is REMOVE:
                last = not lines[i].rstrip().endswith(",")
                del lines[i]
                if last and i > 0 and lines[i - 1].rstrip().endswith(","):
                    lines[i - 1] = lines[i - 1].rstrip()[:-1]
            else:
                m = _JSON_MEMBER.match(lines[i])
                lines[i] = f'{m.group(1)}"{m.group(2)}": {json.dumps(value)}{m.group(4)}'
            continue
        if value is REMOVE:
            continue
        parts, k = _existing_parent(key, loc)
        if k == 0:  # the root object closes on the last "}" line
            close = max(i for i, line in enumerate(lines) if line.strip() == "}")
            kids = [ind for p, (_, ind, _) in loc.items() if "." not in p]
            ind = kids[0] if kids else 2
        else:
            _, pind, close = loc[".".join(parts[:k])]
            kids = [ind for p, (_, ind, _) in loc.items() if p.startswith(".".join(parts[:k]) + ".")]
            ind = kids[0] if kids else pind + 2
        member = value
        for name in reversed(parts[k + 1:]):
            member = {name: member}
        body = json.dumps(member, indent=2).splitlines()
        new = [f'{" " * ind}"{parts[k]}": {body[0]}'] + [" " * ind + b for b in body[1:]]
        prev = close - 1
        while prev > 0 and not lines[prev].strip():
            prev -= 1
        if not lines[prev].rstrip().endswith(("{", ",")):
            lines[prev] = lines[prev].rstrip() + ","
        lines[close:close] = new
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")
