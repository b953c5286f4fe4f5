"""Kernels shipped with the package: the first run of a catalog model does not wait for SymPy.

``prebuilt_kernels.json.xz`` beside this module holds, for the formula sources it was built
from (``manifest``: ``sources``, kernels._sources_digest), the generated source of every kernel
that the cases of ``ndplan.prebuild`` compile (each catalog model's default sweep and the
README's and ``--help`` examples), under the same digests as the disk cache, and the builders'
read lists (``reads-<base>.json``, kernels.model_kernel): one xz-compressed JSON document
(about 26 MiB of source in under 1 MiB; read in about 0.1-0.3 s). kernels.py looks here only
after the disk cache missed, and writes the compiled code of what it finds into it, so a warm
run never opens it. ``prebuilt_derived.json`` beside it holds each catalog model's @derived read
values (readlog.derived) under the same sources, so that a catalog model runs without SymPy. A store
built from other sources answers nothing (every digest would differ anyway; the manifest check
skips the look-ups), so a stale store costs speed, never a wrong number;
tests/test_prebuilt.py fails while it is stale, and ``python -m ndplan.prebuild`` rebuilds it.

``NDPLAN_PREBUILT=0`` turns the store off (the kernel-cache tests, which build every kernel
they check, and the prebuild itself); kernels an earlier run copied from it into the disk cache
are still served, so to see SymPy build every kernel give it a fresh ``NDPLAN_CACHE_DIR`` too.
"""

from __future__ import annotations

import json
import lzma
import os
from pathlib import Path

STORE = Path(__file__).resolve().parent / "prebuilt_kernels.json.xz"

_MEMBERS: dict[str, str] | None = None
"""The open store's members (name -> JSON text), or {} when missing or stale."""


def enabled() -> bool:
    return os.environ.get("NDPLAN_PREBUILT", "1") != "0"


def _document(path: Path | None = None) -> dict | None:
    try:
        doc = json.loads(lzma.decompress((path or STORE).read_bytes()))
    except (OSError, ValueError, lzma.LZMAError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("members"), dict) else None


def manifest(path: Path | None = None) -> dict | None:
    """The store's manifest, or None when there is no readable store."""
    doc = _document(path)
    return doc.get("manifest") if doc else None


def write(path: Path, manifest_: dict, members: dict[str, str]) -> None:
    """The store: deterministic bytes for the same members (sorted keys, fixed preset)."""
    text = json.dumps({"manifest": manifest_, "members": members}, sort_keys=True, separators=(",", ":"))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(lzma.compress(text.encode(), preset=9 | lzma.PRESET_EXTREME))
    tmp.replace(path)


def _open() -> dict[str, str]:
    global _MEMBERS
    if _MEMBERS is None:
        from ndplan.kernels import _sources_digest
        doc = _document()
        ok = doc is not None and isinstance(doc.get("manifest"), dict) and \
            doc["manifest"].get("sources") == _sources_digest()
        _MEMBERS = doc["members"] if ok else {}
    return _MEMBERS


def _member(name: str):
    if not enabled():
        return None
    text = _open().get(name)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def entry(digest: str) -> dict | None:
    """{"keys": [...], "source": "..."} of the kernel stored under ``digest``, or None."""
    data = _member(f"{digest}.json")
    return data if isinstance(data, dict) and "keys" in data and "source" in data else None


def read_sets(base: str) -> list[tuple[str, ...]]:
    """The builders' read lists stored under the model-free key ``base``."""
    data = _member(f"reads-{base}.json")
    return [tuple(x) for x in data] if isinstance(data, list) else []


DERIVED = Path(__file__).resolve().parent / "prebuilt_derived.json"
"""Each catalog model's @derived read values (readlog.derived) under the sources the store was
built from, by the model's key (kernels._ModelMemo): a catalog model whose kernels are cached
(another model of its class built them) then runs without SymPy. Plain JSON, a few kB."""
_DERIVED: dict | None = None


def derived_values(model_key: str) -> dict[str, str]:
    """The shipped @derived values of the model keyed ``model_key`` (kernels._digest of its
    repr, which names the sources), or {}."""
    global _DERIVED
    if not enabled():
        return {}
    if _DERIVED is None:
        try:
            doc = json.loads(DERIVED.read_text())
            _DERIVED = doc["models"] if isinstance(doc, dict) and isinstance(doc.get("models"), dict) else {}
        except (OSError, ValueError):
            _DERIVED = {}
    values = _DERIVED.get(model_key)
    return {k: v for k, v in values.items() if isinstance(v, str)} if isinstance(values, dict) else {}


def reset() -> None:
    """Forget the open store (after replacing STORE or rebuilding it)."""
    global _MEMBERS, _DERIVED
    _MEMBERS = None
    _DERIVED = None
