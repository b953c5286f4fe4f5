"""Helpers shared by several test modules (import as ``from tests.helpers import ...``;
no test module imports another)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ndplan.formulas.schedules import op_order, virtual_stage
from ndplan.ppb.instance import Instance, Layer, Pipeline
from ndplan.ppb.plan import Plan
from ndplan.units import GIB

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


def oracle_time(inst: Instance, plan: Plan) -> float:
    """Step time by the schedule's definition, written here apart from the model: the
    longest path through the op DAG, each stage running ``op_order`` (zb-h1, zbv: W is
    its own op after B; elsewhere B includes W)."""
    p = inst.pipeline
    V = p.chunks
    split_w = p.schedule in ("zb-h1", "zbv")
    F, B, W = [0.0] * V, [0.0] * V, [0.0] * V
    for v in range(V):
        for i in plan.layers(v):
            x = inst.layers[i]
            F[v] += x.forward_s
            B[v] += x.backward_input_s + x.recompute_s.get(plan.recompute[i], 0.0)
            W[v] += x.backward_weight_s
    dur = {"F": F, "B": [b + (0.0 if split_w else w) for b, w in zip(B, W)], "W": W}
    # relax ops in each stage's order until every op has run (tiny sizes)
    end: dict = {}
    orders = [[(k, virtual_stage(p.schedule, s, c, p.pp), j) for k, c, j in op_order(p.schedule, s, p.pp, p.vpp, p.m)]
              for s in range(p.pp)]
    pos = [0] * p.pp
    while any(pos[s] < len(orders[s]) for s in range(p.pp)):
        moved = False
        for s in range(p.pp):
            while pos[s] < len(orders[s]):
                k, v, j = orders[s][pos[s]]
                dep = {"F": ("F", v - 1, j) if v > 0 else None,
                       "B": ("B", v + 1, j) if v < V - 1 else ("F", v, j),
                       "W": ("B", v, j)}[k]
                if dep is not None and dep not in end:
                    break
                prev = end[orders[s][pos[s] - 1]] if pos[s] else 0.0
                end[(k, v, j)] = max(prev, end[dep] if dep else 0.0) + dur[k][v]
                pos[s] += 1
                moved = True
        assert moved, "op order deadlocks"
    return max(end.values())


def oracle_memory(inst: Instance, plan: Plan) -> list[float]:
    """Static + the largest activation sum over the instants right after each forward
    starts, walking each stage's op order (a chunk's micro-batch is held from its F to
    its B)."""
    p = inst.pipeline
    mem = []
    for s in range(p.pp):
        static, act = 0.0, [0.0] * p.vpp
        for c in range(p.vpp):
            for i in plan.layers(virtual_stage(p.schedule, s, c, p.pp)):
                static += inst.layers[i].static_bytes
                act[c] += inst.layers[i].activation_bytes[plan.recompute[i]]
        held, peak = [0] * p.vpp, 0.0
        for kind, c, _ in op_order(p.schedule, s, p.pp, p.vpp, p.m):
            held[c] += {"F": 1, "B": -1, "W": 0}[kind]
            peak = max(peak, sum(h * a for h, a in zip(held, act)))
        mem.append(static + peak)
    return mem


def llm_instance(n_layers, pp, vpp, m, schedule, budget_gib):
    emb = layer(1, 1, 1, 2000, {"none": 100}, {}, "embedding")
    dec = layer(4, 4, 4, 1000, {"none": 800, "selective": 500, "full": 100}, {"selective": 1, "full": 4}, "decoder")
    head = layer(6, 6, 6, 3000, {"none": 600}, {}, "head")
    return Instance(layers=(emb,) + (dec,) * n_layers + (head,),
                    pipeline=Pipeline(pp=pp, vpp=vpp, m=m, schedule=schedule, budget_bytes=int(budget_gib * GIB)))


def runnable(engine: str, pp: int, schedule: str, tp: int, zero: int, sp: bool, *, m: int = 1, moe: bool = False,
             dp: int = 1, ep: int = 1) -> tuple[str, int, bool]:
    """(engine, zero, sp) of a drawn strategy, changed so that its engine runs it, as the
    frameworks' code says (the lines rules.py cites; written out here, not read from rules.py):
    DeepSpeed's pipeline runs 1F1B with ZeRO <= 1 and its AutoTP has no SP; torch pipelining
    (fsdp) has no one-chunk zero-bubble schedule; MindSpore has no one-chunk zero bubble either,
    runs zero_bubble_v with at least 2 pp micro-batches, a MoE layer with tp > 1 only under SP
    and lays experts over dp x tp. A pipeline or layout neither runs goes to megatron."""
    if engine == "deepspeed":
        engine = "megatron" if pp > 1 and schedule != "1f1b" else engine
        zero, sp = (min(zero, 1) if pp > 1 else zero), sp and tp == 1
    if engine == "fsdp" and pp > 1 and schedule == "zb-h1":
        engine = "megatron"
    if engine == "mindspore":
        if pp > 1 and (schedule == "zb-h1" or (schedule == "zbv" and m < 2 * pp)) or moe and dp * tp % ep:
            engine = "megatron"
        elif moe and tp > 1:
            sp = True
    return engine, zero, sp
