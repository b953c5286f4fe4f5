"""Read a user's framework config into a model + Strategy (``ndplan check``), and edit
that file in place to express another strategy.

One module per format (megatron, torchtitan, torchtitan-0.3, deepspeed, mindformers,
devicemesh), each with ``read(path, text, *, model, gpus, seq, gbs) -> CheckInput`` and
either ``fields(model, strategy)`` (the exporter's: dotted key or flag -> value) with
``edit(text, changes) -> text``, or ``rewrite(ci, strategy)`` (a proposal as a whole new
file: torchtitan 0.3 launches, DeviceMesh modules).
The key names live in the exporters' ``FLAG`` / ``KEY`` tables (export/), used both ways.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ndplan.errors import NdplanError
from ndplan.export.common import HEADER_PHRASE
from ndplan.interop import deepspeed, devicemesh, megatron, mindformers, torchtitan, torchtitan03
from ndplan.interop.base import CheckInput
from ndplan.interop.textedit import REMOVE
from ndplan.paths import read_text

READERS = {"megatron": megatron, "torchtitan": torchtitan, "torchtitan-0.3": torchtitan03, "deepspeed": deepspeed,
           "mindformers": mindformers, "devicemesh": devicemesh}
FORMATS = tuple(READERS)
SUFFIXES = {".json": "deepspeed", ".toml": "torchtitan", ".yaml": "mindformers", ".yml": "mindformers",
            ".sh": "megatron", ".bash": "megatron", ".args": "megatron", ".txt": "megatron", ".py": "devicemesh"}

__all__ = ["CheckInput", "FORMATS", "READERS", "REMOVE", "detect", "read_config"]


def detect(path: Path, text: str) -> str:
    """The format by suffix, else by content (a shell script running torchtitan.train is a
    torchtitan 0.3 launch)."""
    if SUFFIXES.get(path.suffix.lower()) == "megatron" and torchtitan03.detect(text):
        return "torchtitan-0.3"
    if path.suffix.lower() in SUFFIXES:
        return SUFFIXES[path.suffix.lower()]
    s = text.lstrip()
    if devicemesh.detect(text):
        return "devicemesh"
    if torchtitan03.detect(text):
        return "torchtitan-0.3"
    if s.startswith("{"):
        return "deepspeed"
    if re.search(r"^\s*\[parallelism\]", text, re.M):
        return "torchtitan"
    if re.search(r"^parallel_config\s*:", text, re.M):
        return "mindformers"
    if re.search(r"(?<![\w-])--[a-z][\w-]*", text):
        return "megatron"
    raise NdplanError("--format", "auto", f"cannot tell the format of {path.name}",
                      f"give --format {'|'.join(FORMATS)}")


_EMITTED = re.compile(r"^(?:# |\"\"\")?.* " + re.escape(HEADER_PHRASE) + r" (\S+)$", re.M)
"""The first header line every ``--emit`` output carries (export/common.py ``header``)."""


def emitted_model(text: str) -> str | None:
    """The catalog model a file emitted by ndplan names in its header, if any."""
    from ndplan.catalog.files import catalog_names
    m = _EMITTED.search(text[:2000])
    return m.group(1) if m and m.group(1) in catalog_names("models") else None


def read_config(path, fmt: str = "auto", *, model=None, gpus: int | None = None, seq: int | None = None,
                gbs: int | None = None) -> CheckInput:
    """Model, Strategy, device count and the origin of each value of a framework config.

    ``model`` (ModelSpec, catalog name, YAML or HF config path) is needed when the file
    does not carry the architecture; ``gpus``/``seq``/``gbs`` fill or override what the
    file says (a ``gpus`` that disagrees with the file's degrees is an error)."""
    path = Path(path)
    text = read_text("FILE", path, "launch script or config")
    if fmt == "auto":
        fmt = detect(path, text)
    if fmt not in READERS:
        raise NdplanError("--format", fmt, "unknown format", f"choose one of {', '.join(FORMATS)} or auto")
    named = emitted_model(text) if model is None else None
    model = model if named is None else named
    try:
        ci = READERS[fmt].read(path, text, model=model, gpus=gpus, seq=seq, gbs=gbs)
    except RecursionError:
        raise NdplanError("FILE", str(path), "nested too deeply to read", f"give a {fmt} config") from None
    if named is not None:
        ci = dataclasses.replace(ci, model_origin=f"{named}, named in the header ndplan wrote")
    return dataclasses.replace(ci, overrides={"seq": seq, "gbs": gbs})
