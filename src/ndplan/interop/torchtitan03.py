"""A torchtitan 0.3 launch (``torchrun ... -m torchtitan.train --module M --config F
--section.field value ... activation_checkpoint:MODE``) -> model + Strategy: the registered
config's values (export/torchtitan03.py ``BASE``) overlaid with the overrides, read as the
TOML job config is (interop/torchtitan.py ``read_flat``). torchtitan itself is not needed.

The engine is the fsdp profile with torchtitan 0.3.0's module settings (trace/titan.py
``TITAN_SETTINGS``: one fused wqkv, a RoPE table per layer, sdpa without repeat_kv; the
CPU-only norm setting left out) and ChunkedLossWrapper's chunks (``loss_chunks``).
"""

from __future__ import annotations

import os
from pathlib import Path

from ndplan.errors import NdplanError
from ndplan.export import torchtitan03 as X
from ndplan.interop import launcher, shell
from ndplan.interop.base import CheckInput
from ndplan.interop.torchtitan import KEY, read_flat
from ndplan.trace.titan import TITAN_SETTINGS

SETTINGS = {k: v for k, v in TITAN_SETTINGS.items() if k != "norm_input_bytes"}
"""norm_input_bytes 8 is torch's composite rms_norm on the CPU; CUDA runs the fused kernel."""


def detect(text: str) -> bool:
    return "torchtitan.train" in text


def _value(v):
    if v is True:
        return v
    try:
        return int(v)
    except ValueError:
        return v


def _overrides(words: list[shell.Word], name: str) -> tuple[str, str, dict, dict]:
    """(module, config, dotted key -> value, dotted key -> 0-based line) after ``torchtitan.train``."""
    texts = [w.text for w in words]
    start = len(texts) - texts[::-1].index("torchtitan.train") if "torchtitan.train" in texts else 0  # the last launch
    module = config = None
    flat, lines = {}, {}
    i = start
    while i < len(words):
        t = words[i].text
        if t.startswith(f"{X.SUBCOMMAND}:"):
            flat[KEY["ac_mode"]], lines[KEY["ac_mode"]] = t.split(":", 1)[1], words[i].line
            i += 1
            continue
        if t.startswith("--"):
            key, _, inline = t[2:].partition("=")
            if not inline:
                nxt = words[i + 1].text if i + 1 < len(words) else None
                if nxt is None or nxt.startswith("--") or nxt.startswith(f"{X.SUBCOMMAND}:"):
                    inline = True  # a tyro switch (--training.disable_cuda_graphs)
                else:
                    inline, i = nxt, i + 1
            if key == "module":
                module = inline
            elif key == "config":
                config = inline
            else:
                flat[key.replace("-", "_")], lines[key.replace("-", "_")] = _value(inline), words[i].line
        i += 1
    return module, config, flat, lines


def _launched(words: list[shell.Word]) -> int | None:
    """torchrun's --nproc_per_node x --nnodes (1 by default), or None (interop.launcher)."""
    got = launcher.launched(words)
    return got[0] * got[1] if got else None


def read(path: Path, text: str, *, model=None, gpus=None, seq=None, gbs=None) -> CheckInput:
    words = shell.read_words(text, os.environ)
    module, config, over, lines = _overrides(words, path.name)
    if (module, config) not in X.BASE:
        known = ", ".join(f"--module {m} --config {c}" for m, c in X.BASE)
        raise NdplanError("--config", f"{module}/{config}", f"not a torchtitan {X.VERSION} config ndplan knows",
                          f"use one of {known}, or give the values as overrides with -m MODEL")
    base = dict(X.BASE[(module, config)])
    chunks, flavor = base.pop("loss_chunks", None), base.pop("flavor")
    flat = {KEY["model_name"]: module, KEY["model_flavor"]: flavor} | base | over
    if KEY["ac_mode"] in over and over[KEY["ac_mode"]] not in ("none", "full", "selective"):
        raise NdplanError(X.SUBCOMMAND, over[KEY["ac_mode"]], "not a policy ndplan models",
                          "use activation_checkpoint:none, :full or :selective")
    origin = None
    if gpus is None:
        gpus = _launched(words)
        origin = "torchrun --nproc_per_node x --nnodes" if gpus else None
    settings = SETTINGS | ({"loss_chunks": chunks} if chunks else {})
    return read_flat(path, text, flat, model=model, gpus=gpus, seq=seq, gbs=gbs, settings=settings,
                     fmt="torchtitan-0.3", lines=lines, gpus_origin=origin,
                     notes=(f"torchtitan {X.VERSION} --module {module} --config {config}: its registered values "
                            f"with the overrides; engine fsdp with torchtitan's modules ({', '.join(settings)})",))


fields = X.fields


def rewrite(ci: CheckInput, strat) -> str:
    """A proposal as a whole new launch (``check``'s diff is against it): the overrides
    spell out every value, so the launch does not depend on how the old one was written."""
    return X.emit(ci.model, strat)


def edit(text: str, changes: dict) -> str:
    raise NdplanError("--format", "torchtitan-0.3", "editing a torchtitan 0.3 launch is not supported",
                      "emit the proposal with --emit torchtitan-0.3")
