"""In-place edits of a user's config text: set, add or remove dotted keys, touching only
the lines of the keys that change (comments, order and every other line are kept).

One editor per syntax, each with ``locate(text) -> {dotted key: line index}`` and
``edit(text, changes) -> text`` where ``changes`` maps a dotted key to its new value,
or to ``REMOVE``. Supported layouts: block YAML (MindFormers configs), TOML tables
(torchtitan), and JSON with one member per line (``json.dumps(indent=...)`` style;
other JSON is re-serialised with two-space indentation, key order kept).
"""

from __future__ import annotations

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
    """Dotted key -> (line index, indent, closing line index for objects else -1), or
    None when the text does not hold one member per line."""
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


def json_edit(text: str, changes: dict) -> str:
    if json_locate(text) is None:
        from ndplan.export.common import flatten, nest
        doc = flatten(json.loads(text))
        for k, v in changes.items():
            if v is REMOVE:
                doc.pop(k, None)
            else:
                doc[k] = v
        return json.dumps(nest(doc), indent=2) + "\n"
    lines = text.splitlines()
    for key, value in changes.items():
        loc = json_locate("\n".join(lines))
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
