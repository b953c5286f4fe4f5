"""HCCL's communication buffers on Ascend, which sit outside MindSpore's memory pool (the pool
``context.max_device_memory`` caps, and the peaks the MindFormers validation tables measure).

CANN's HCCL_BUFFSIZE (CANN 8.0 / 9.0 environment-variable reference, envref_07_0080: "each
communication domain occupies 2 x HCCL_BUFFSIZE of memory, for sending and receiving"; "the
memory is HCCL's alone and is not reused by other work"; default 200, in MB) makes each
communicator hold 2 x HCCL_BUFFSIZE MiB beside the pool. Which communicators a MindSpore graph
creates is not derived here: the groups counted are the parallel groups of more than one rank
a MindFormers strategy uses plus the world group, so the figure is a statement of scale, said
in a note, not a Term of the peak.
"""

from __future__ import annotations

from ndplan.errors import warn
from ndplan.units import MIB

BUFFSIZE_DEFAULT_MB = 200
"""HCCL_BUFFSIZE default, MB (CANN envref_07_0080)."""
BUFFERS_PER_GROUP = 2
"""Send and receive: 2 x HCCL_BUFFSIZE per communication domain (CANN envref_07_0080)."""


def groups(strat) -> list[str]:
    """The parallel groups of more than one rank the strategy communicates over, and the world."""
    named = [("model_parallel", strat.tp), ("data_parallel", strat.dp), ("context_parallel", strat.cp),
             ("expert_parallel", strat.ep), ("pipeline send/recv", strat.pp)]
    return [name for name, n in named if n > 1] + ["world"]


def note(strat, environ: dict) -> str:
    """One line: the HCCL buffers beside MindSpore's pool for ``strat``."""
    raw = environ.get("HCCL_BUFFSIZE")
    ok = raw is not None and raw.isascii() and raw.isdigit() and int(raw) >= 1  # CANN: an integer >= 1
    if raw is not None and not ok:
        warn("HCCL_BUFFSIZE", raw, "not an integer >= 1 (MB), which HCCL requires (CANN envref_07_0080)",
             f"the note counts HCCL's default {BUFFSIZE_DEFAULT_MB} MB")
    size = int(raw) if ok else BUFFSIZE_DEFAULT_MB
    src = f"HCCL_BUFFSIZE={raw} from the environment" if ok else f"HCCL_BUFFSIZE default {BUFFSIZE_DEFAULT_MB} MB"
    g = groups(strat)
    total = len(g) * BUFFERS_PER_GROUP * size * MIB
    return (f"HCCL buffers outside MindSpore's pool (not in the peak): {BUFFERS_PER_GROUP} x {size} MB ({src}) per "
            f"communication domain, {len(g)} domains here ({', '.join(g)}): up to {total / 2**30:.2f} GiB of device "
            "memory beside max_device_memory (CANN HCCL_BUFFSIZE reference)")
