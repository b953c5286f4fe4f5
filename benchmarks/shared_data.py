"""Where the benchmarks find ``../shared/validation``: beside the project root (the
clone's parent folder), as the developers' guide lays it out; ``NDPLAN_VALIDATION``
names another folder. A missing folder ends the benchmark with one line saying where
it looked."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The project root (benchmarks/ -> ..)."""


def validation_dir() -> Path:
    """``$NDPLAN_VALIDATION``, else ``<project root>/../shared/validation``; exits with
    code 2 and one line when it is not there."""
    env = os.environ.get("NDPLAN_VALIDATION")
    path = Path(env) if env else ROOT.parent / "shared" / "validation"
    if not path.is_dir():
        print(f"error: validation data not found at {path}: put the shared folder beside the project root "
              "(../shared/validation) or set NDPLAN_VALIDATION", file=sys.stderr)
        sys.exit(2)
    return path
