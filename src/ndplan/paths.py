"""Reading the user's files and writing ndplan's outputs, with one-line errors.

Every reader (model and hardware catalogs, ``--space``, ``--layers``, ``check FILE``)
reads through ``read_text``: a missing file, a directory, a binary or non-UTF-8 file
or an absurdly large one is an NdplanError naming the option and the path. Every
writer (``--report``, ``--emit-out``, ``--export-layers``, ``--timeline``) resolves its
path through ``output_file`` / ``output_dir``: ndplan creates at most the one folder
it was asked for, never a chain of parents.
"""

from __future__ import annotations

from pathlib import Path

from ndplan.errors import NdplanError
from ndplan.units import MIB

MAX_INPUT_BYTES = 64 * MIB
"""Largest config or layer file read (the biggest real ones are a few hundred KiB)."""


def read_text(field: str, path: str | Path, kind: str = "text") -> str:
    """The file's text; ``kind`` names what was expected (``YAML``, ``JSON``, ...)."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise NdplanError(field, str(p), "is a directory", f"give the path of a {kind} file")
    try:
        size = p.stat().st_size
        if size > MAX_INPUT_BYTES:
            raise NdplanError(field, str(p), f"is {size / MIB:.0f} MiB, larger than any {kind} file ndplan reads "
                                             f"(at most {MAX_INPUT_BYTES // MIB} MiB)", f"give a {kind} file")
        data = p.read_bytes()
    except FileNotFoundError:
        raise NdplanError(field, str(p), "no such file", "check the path") from None
    except OSError as e:
        raise NdplanError(field, str(p), f"cannot read it ({e.strerror})", "check the path and its permissions") from None
    if b"\x00" in data:
        raise NdplanError(field, str(p), "is a binary file", f"give a {kind} text file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise NdplanError(field, str(p), f"is not UTF-8 text (byte {e.start})", f"give a {kind} file saved as UTF-8") from None


def output_file(field: str, path: str | Path) -> Path:
    """Where to write one file: not a directory, in a folder that exists."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise NdplanError(field, str(p), "is a directory", "give a file path, e.g. " + str(p / "out.txt"))
    parent = p.parent
    if not parent.is_dir():
        raise NdplanError(field, str(p), f"folder {parent} does not exist", "create it first or choose another path")
    return p


def output_dir(field: str, path: str | Path) -> Path:
    """A folder to write files into; created when missing, if its parent exists."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise NdplanError(field, str(p), "is a file, not a folder", "give a folder path")
    if not p.exists():
        if not p.parent.is_dir():
            raise NdplanError(field, str(p), f"folder {p.parent} does not exist", "create it first or choose another path")
        p.mkdir()
    return p
