"""Write a Report as Markdown (figures as PNG files beside it) or HTML (figures embedded
as base64). Every table is also written as ``<stem>_<table>.csv`` and ``.json``."""

from __future__ import annotations

import base64
import json
from html import escape
from pathlib import Path

from ndplan.errors import NdplanError
from ndplan.paths import output_file
from ndplan.report.model import Report, Table
from ndplan.units import GIB, fmt_bytes, fmt_count, fmt_seconds

FORMATS = (".md", ".html")
MATHJAX = "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"
"""Typesets the LaTeX when the page is online; offline the LaTeX source shows."""


def _is_bytes(col: str) -> bool:
    return col.endswith("_bytes") or col.startswith("mem.")


def _header(col: str) -> str:
    return col[:-6] + " GiB" if col.endswith("_bytes") else col + " GiB" if col.startswith("mem.") else col


def cell(col: str, v) -> str:
    """Display form of a raw table value (CSV/JSON keep the raw one)."""
    if v is None:
        return ""
    if isinstance(v, bool) or isinstance(v, str):
        return str(v)
    if _is_bytes(col):
        return f"{v / GIB:.2f}"
    if isinstance(v, float):
        if (col.endswith("_s") and not col.endswith("per_s")) or col == "seconds":
            return fmt_seconds(v)
        if col in ("mfu", "share", "gain"):
            return f"{v:.1%}"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


def _value(v: float, unit: str) -> str:
    return {"bytes": fmt_bytes, "s": fmt_seconds, "count": fmt_count}.get(unit, lambda x: f"{x:g} {unit}")(v)


def _table_files(report: Report, path: Path) -> dict[str, tuple[Path, Path]]:
    files = {}
    for t in report.tables:
        c, j = path.with_name(f"{path.stem}_{t.name}.csv"), path.with_name(f"{path.stem}_{t.name}.json")
        c.write_text(t.to_csv())
        j.write_text(json.dumps(t.records(), indent=2, default=str))
        files[t.name] = (c, j)
    return files


def _md_table(t: Table) -> list[str]:
    out = ["| " + " | ".join(_header(c) for c in t.columns) + " |", "|" + "---|" * len(t.columns)]
    out += ["| " + " | ".join(cell(c, v) for c, v in zip(t.columns, r)) + " |" for r in t.rows]
    return out


def to_markdown(report: Report, path: Path) -> list[Path]:
    written = [p for pair in _table_files(report, path).values() for p in pair]
    lines = [f"# {report.title}", "", "## Inputs", "", "| name | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in report.inputs.items()]
    lines += [""] + [f"> {n}" + "\n" for n in report.notes]
    for t in report.tables:
        lines += [f"## {t.title}", "", *_md_table(t), "",
                  f"[CSV]({path.stem}_{t.name}.csv) · [JSON]({path.stem}_{t.name}.json)", ""]
    for f in report.figures:
        png = path.with_name(f"{path.stem}_{f.name}.png")
        png.write_bytes(f.png)
        written.append(png)
        lines += [f"## {f.title}", "", f"![{f.title}]({png.name})", ""]
    if report.formulas:
        lines += [f"## {report.formulas_title}", ""]
        for fm in report.formulas:
            lines += [f"### `{fm.key}` = {_value(fm.value, fm.unit)}", "", "```", fm.formula, "```", "",
                      f"unit: {fm.unit}; source: {fm.source}" + (f"; {fm.note}" if fm.note else ""), ""]
    path.write_text("\n".join(lines))
    return [path, *written]


def _html_table(t: Table) -> str:
    head = "".join(f"<th>{escape(_header(c))}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{escape(cell(c, v))}</td>" for c, v in zip(t.columns, r)) + "</tr>"
                   for r in t.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def to_html(report: Report, path: Path) -> list[Path]:
    written = [p for pair in _table_files(report, path).values() for p in pair]
    h = [f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(report.title)}</title>",
         f"<script async src='{MATHJAX}'></script>",
         "<style>body{font-family:sans-serif;max-width:1300px;margin:auto}table{border-collapse:collapse;"
         "font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
         ".note{background:#fff6d5;padding:6px}pre{white-space:pre-wrap}</style></head><body>",
         f"<h1>{escape(report.title)}</h1><h2>Inputs</h2><table>"]
    h += [f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>" for k, v in report.inputs.items()]
    h.append("</table>")
    h += [f"<p class='note'>{escape(n)}</p>" for n in report.notes]
    for t in report.tables:
        h += [f"<h2>{escape(t.title)}</h2>", _html_table(t),
              f"<p><a href='{path.stem}_{t.name}.csv'>CSV</a> · <a href='{path.stem}_{t.name}.json'>JSON</a></p>"]
    for f in report.figures:
        data = base64.b64encode(f.png).decode()
        h += [f"<h2>{escape(f.title)}</h2>", f"<img alt='{escape(f.title)}' src='data:image/png;base64,{data}'>"]
    if report.formulas:
        h.append(f"<h2>{escape(report.formulas_title)}</h2>")
        for fm in report.formulas:
            h += [f"<h3><code>{escape(fm.key)}</code> = {escape(_value(fm.value, fm.unit))}</h3>",
                  f"<div>\\[{escape(fm.latex)}\\]</div>",
                  f"<details><summary>plain</summary><pre>{escape(fm.formula)}</pre></details>",
                  f"<p>unit: {escape(fm.unit)}; source: {escape(fm.source)}"
                  + (f"; {escape(fm.note)}" if fm.note else "") + "</p>"]
    h.append("</body></html>")
    path.write_text("\n".join(h))
    return [path, *written]


def report_path(path: str | Path) -> Path:
    """The report's path, checked before any work: .md or .html, in a folder that
    exists (ndplan creates no folders for a report)."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise NdplanError("--report", str(path), "not a .md or .html path", "end the path in .md or .html")
    return output_file("--report", path)


def write_report(report: Report, path: str | Path) -> list[Path]:
    """Write ``report`` to ``path`` (.md or .html); returns every file written."""
    path = report_path(path)
    return to_markdown(report, path) if path.suffix.lower() == ".md" else to_html(report, path)
