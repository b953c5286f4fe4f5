"""Kernels shipped with the package: the first run of a catalog model does not wait for SymPy.

``prebuilt_kernels.zip`` beside this module holds, for the formula sources it was built
from (``manifest.json``: ``sources``, kernels._sources_digest), the generated source of every
kernel that the cases of ``ndplan.prebuild`` compile (each catalog model's default sweep and
the README's examples), under the same digests as the disk cache, and the builders' read
lists (``reads-<base>.json``, kernels.model_kernel). kernels._load looks here after the disk
cache and copies what it finds into it. A store built from other sources answers nothing
(every digest would differ anyway; the manifest check skips the look-ups), so a stale store
costs speed, never a wrong number; tests/test_prebuilt.py fails while it is stale, and
``python -m ndplan.prebuild`` rebuilds it.

``NDPLAN_PREBUILT=0`` turns the store off (the kernel-cache tests, which build every kernel
they check, and the prebuild itself).
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

STORE = Path(__file__).resolve().parent / "prebuilt_kernels.zip"
MANIFEST = "manifest.json"

_NAMES: dict[str, object] | None = None
"""The open store: {"zip": ZipFile, "names": set of member names}, or {} when off or stale."""


def enabled() -> bool:
    return os.environ.get("NDPLAN_PREBUILT", "1") != "0"


def manifest(path: Path = STORE) -> dict | None:
    """The store's manifest, or None when there is no readable store."""
    try:
        with zipfile.ZipFile(path) as z:
            return json.loads(z.read(MANIFEST))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def _open() -> dict:
    global _NAMES
    if _NAMES is None:
        _NAMES = {}
        from ndplan.kernels import _sources_digest
        try:
            z = zipfile.ZipFile(STORE)
            if json.loads(z.read(MANIFEST)).get("sources") == _sources_digest():
                _NAMES = {"zip": z, "names": set(z.namelist())}
        except (OSError, KeyError, ValueError, zipfile.BadZipFile):
            pass
    return _NAMES


def _member(name: str):
    if not enabled():
        return None
    store = _open()
    if not store or name not in store["names"]:
        return None
    try:
        return json.loads(store["zip"].read(name))
    except (OSError, ValueError, zipfile.BadZipFile):
        return None


def entry(digest: str) -> dict | None:
    """{"keys": [...], "source": "..."} of the kernel stored under ``digest``, or None."""
    data = _member(f"{digest}.json")
    return data if isinstance(data, dict) and "keys" in data and "source" in data else None


def read_sets(base: str) -> list[tuple[str, ...]]:
    """The builders' read lists stored under the model-free key ``base``."""
    data = _member(f"reads-{base}.json")
    return [tuple(x) for x in data] if isinstance(data, list) else []


def reset() -> None:
    """Forget the open store (after replacing STORE or rebuilding it)."""
    global _NAMES
    _NAMES = None
