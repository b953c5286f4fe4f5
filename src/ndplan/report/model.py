"""Report content, independent of the output format."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

from ndplan.explain import Explained


@dataclass(frozen=True)
class Table:
    name: str
    """File-name part: ``<report stem>_<name>.csv`` / ``.json``."""
    title: str
    columns: list[str]
    rows: list[list]
    """Raw values (bytes, seconds, counts in base units)."""

    def records(self) -> list[dict]:
        return [dict(zip(self.columns, r)) for r in self.rows]

    def to_csv(self) -> str:
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(self.columns)
        w.writerows(self.rows)
        return out.getvalue()


@dataclass(frozen=True)
class Figure:
    name: str
    """File-name part: ``<report stem>_<name>.png``."""
    title: str
    png: bytes


@dataclass
class Report:
    title: str
    inputs: dict
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    formulas: list[Explained] = field(default_factory=list)
    """Terms behind the plan as ndplan.explain renders them (closed form, LaTeX, value)."""
    formulas_title: str = ""
    notes: list[str] = field(default_factory=list)
    """Free-text remarks (missing matplotlib, which candidate the timeline shows, ...)."""
