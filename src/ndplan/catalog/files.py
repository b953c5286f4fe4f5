"""Locating and reading catalog files (YAML/JSON) with one-line errors."""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

import yaml

from ndplan.errors import NdplanError

#: Repository root (src/ndplan/catalog/files.py -> 3 levels up). Catalog folders
#: live at the top level (models/, hardware/); NDPLAN_HOME overrides.
ROOT = Path(os.environ.get("NDPLAN_HOME", Path(__file__).resolve().parents[3]))


def catalog_dir(kind: str) -> Path:
    return ROOT / kind


def catalog_names(kind: str) -> list[str]:
    d = catalog_dir(kind)
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def read_mapping(path: Path, field: str) -> dict:
    """Parse a YAML or JSON file that must hold a mapping."""
    try:
        text = path.read_text()
    except OSError as e:
        raise NdplanError(field, str(path), f"cannot read file ({e.strerror})") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        where = getattr(e, "problem_mark", None)
        pos = f" at line {where.line + 1}" if where is not None else (
            f" at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else "")
        raise NdplanError(field, str(path), f"malformed {path.suffix.lstrip('.') or 'YAML'}{pos}; fix the syntax") from None
    if not isinstance(data, dict):
        raise NdplanError(field, str(path), "file must contain a mapping of field: value")
    return data


def resolve(kind: str, name: str, field: str) -> Path:
    """A catalog name, or a path to a file (or, for models, an HF model directory)."""
    p = Path(name).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return p / "config.json"
    if p.is_file():
        return p
    cand = catalog_dir(kind) / f"{name.lower()}.yaml"
    if cand.is_file():
        return cand
    names = catalog_names(kind)
    close = difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"see `ndplan {kind}` for the catalog"
    raise NdplanError(field, name, f"unknown {kind[:-1] if kind.endswith('s') else kind}; {hint} (or give a YAML/config.json path)")
