"""Helpers shared by several test modules (import as ``from tests.helpers import ...``;
no test module imports another)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ndplan.ppb.instance import Layer

ROOT = Path(__file__).resolve().parents[1]
"""The project root (tests/ -> ..)."""


def validation_dir() -> Path:
    """The shared validation data by the rule benchmarks/shared_data.py uses:
    ``$NDPLAN_VALIDATION``, else ``<project root>/../shared/validation``.

    Not there: the calling test skips, saying where it looked, unless NDPLAN_VALIDATION
    is set (then it fails: a CI that names the folder must not skip quietly)."""
    env = os.environ.get("NDPLAN_VALIDATION")
    path = Path(env) if env else ROOT.parent / "shared" / "validation"
    if not path.is_dir():
        if env:
            pytest.fail(f"NDPLAN_VALIDATION={env} is not a folder")
        pytest.skip(f"validation data not found at {path}: set NDPLAN_VALIDATION or put shared/ beside the clone")
    return path


# ---------------------------------------------------------------- PPB instances

MS = 1e-3  # test times are whole milliseconds: no rounding at the 1 us resolution
MB = 2**20  # test memory is whole MiB: no rounding at the 1 MiB unit


def layer(f, b, w, static, acts, recs, name="x"):
    """A PPB layer from whole milliseconds (forward, backward-input, backward-weight),
    MiB of static memory, MiB of activations per recompute mode and ms of recompute."""
    return Layer(name=name, kind="dense", forward_s=f * MS, backward_input_s=b * MS, backward_weight_s=w * MS,
                 static_bytes=static * MB, activation_bytes={k: a * MB for k, a in acts.items()},
                 recompute_s={k: r * MS for k, r in recs.items()})
