"""Locating and reading catalog files (YAML/JSON) with one-line errors."""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

import yaml

from ndplan.errors import NdplanError
from ndplan.paths import read_text

PACKAGE = Path(__file__).resolve().parents[1]
"""The installed ``ndplan`` package folder."""
SOURCE_ROOT = PACKAGE.parents[1]
"""The repository root when running from a clone (src/ndplan -> ../..)."""
USER_ENV = "NDPLAN_HOME"
"""Environment variable naming a folder with the user's own ``models/`` and
``hardware/`` YAMLs; they are found before (and can replace) the built-in entries."""
KINDS = ("models", "hardware")


def builtin_dir(kind: str) -> Path:
    """The catalog shipped with ndplan: ``ndplan/_catalog/<kind>`` inside an installed
    wheel, else the top-level ``<kind>/`` folder of the source tree (editable install)."""
    shipped = PACKAGE / "_catalog" / kind
    return shipped if shipped.is_dir() else SOURCE_ROOT / kind


def catalog_dirs(kind: str) -> list[Path]:
    """Folders searched for catalog entries, first match wins: $NDPLAN_HOME/<kind>, then
    the built-in catalog. The built-in one must exist and hold entries (an empty catalog
    is a broken install, never an empty list)."""
    if kind not in KINDS:
        raise NdplanError("catalog", kind, "unknown catalog", f"choose one of {', '.join(KINDS)}")
    builtin = builtin_dir(kind)
    if not any(builtin.glob("*.yaml")):
        raise NdplanError("catalog", str(builtin), f"the built-in {kind} catalog is missing or empty",
                          "reinstall ndplan (pip install --force-reinstall ndplan) or set "
                          f"{USER_ENV} to a folder holding {kind}/*.yaml")
    dirs = [builtin]
    home = os.environ.get(USER_ENV)
    if home:
        user = Path(home).expanduser() / kind
        if not Path(home).expanduser().is_dir():
            raise NdplanError(USER_ENV, home, "is not a folder", f"create it with a {kind}/ subfolder or unset it")
        if user.is_dir():
            dirs.insert(0, user)
    return dirs


def catalog_names(kind: str) -> list[str]:
    """Entry names of every catalog folder, sorted (a user entry hides a built-in one)."""
    return sorted({p.stem for d in catalog_dirs(kind) for p in d.glob("*.yaml")})


def catalog_file(kind: str, name: str) -> Path | None:
    for d in catalog_dirs(kind):
        cand = d / f"{name.lower()}.yaml"
        if cand.is_file():
            return cand
    return None


def parse_mapping(text: str, path: Path, field: str) -> dict:
    """Parse YAML (JSON by suffix) text that must hold a mapping."""
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        data = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        where = getattr(e, "problem_mark", None)
        pos = f" at line {where.line + 1}" if where is not None else (
            f" at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else "")
        raise NdplanError(field, str(path), f"malformed {kind}{pos}", "fix the syntax") from None
    except RecursionError:
        raise NdplanError(field, str(path), f"{kind} nested too deeply", "give a flat mapping of field: value") from None
    if data is None:
        raise NdplanError(field, str(path), "is empty", "write field: value lines")
    if not isinstance(data, dict):
        kind = {list: "a list", str: "plain text", int: "a number", float: "a number", bool: "a boolean"}.get(
            type(data), type(data).__name__)
        raise NdplanError(field, str(path), f"holds {kind}, not a mapping", "write field: value lines")
    return data


NOT_YAML = {".toml": "a TOML file (torchtitan: `ndplan check`)", ".sh": "a shell script (`ndplan check`)",
            ".bash": "a shell script (`ndplan check`)", ".py": "Python code", ".md": "Markdown text"}
"""Suffixes of files that are surely not the YAML/JSON a catalog, space or layer file is."""


def read_mapping(path: Path, field: str) -> dict:
    """Read and parse a YAML or JSON file that must hold a mapping."""
    if path.suffix.lower() in NOT_YAML:
        raise NdplanError(field, str(path), f"is {NOT_YAML[path.suffix.lower()]}", "give a YAML or JSON file")
    return parse_mapping(read_text(field, path, "JSON" if path.suffix == ".json" else "YAML"), path, field)


def resolve(kind: str, name: str, field: str) -> Path:
    """A catalog name, or a path to a file (or, for models, an HF model directory)."""
    p = Path(name).expanduser()
    if p.is_dir():
        if (p / "config.json").is_file():
            return p / "config.json"
        if catalog_file(kind, name) is not None:
            return catalog_file(kind, name)
        if kind != "models":
            raise NdplanError(field, name, "is a folder", f"give a catalog name (`ndplan {kind}`) or a YAML file")
        raise NdplanError(field, name, "is a folder without config.json",
                          "give a catalog name, a YAML file or a Hugging Face model folder")
    if p.is_file() or (p.exists() and not p.is_dir()):
        return p
    if "/" in name or "\\" in name or p.suffix.lower() in (".yaml", ".yml", ".json"):
        raise NdplanError(field, name, "no such file", f"check the path, or give a catalog name (`ndplan {kind}`)")
    cand = catalog_file(kind, name)
    if cand is not None:
        return cand
    names = catalog_names(kind)
    close = difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"see `ndplan {kind}` for the catalog"
    raise NdplanError(field, name, f"unknown {kind[:-1] if kind.endswith('s') else kind}",
                      f"{hint} (or give a YAML/config.json path)")
