"""``ndplan profile``: time the planned model's GEMMs and attention, a device-memory copy and the
collectives on the user's own devices, and write a profile YAML (issue 16 part 3).

Launched by the tools users already run, one process per device: ``torchrun --nproc_per_node 8
-m ndplan profile ...`` (or ``srun ... python -m ndplan profile ...`` with MASTER_ADDR and
MASTER_PORT set: SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID stand in for torchrun's RANK,
WORLD_SIZE and LOCAL_RANK). Without those variables it runs alone (no collectives). The
backend is NCCL on CUDA devices (HCCL on Ascend through torch_npu is not wired) and gloo on
CPU, where the same code runs in CI.

Every timing is the median of ``iters`` runs after ``warmup`` runs, each synchronised
(torch.cuda.synchronize on CUDA); a collective's time is the slowest rank's (an all-reduce
with MAX of each rank's median). Bus bandwidth follows nccl-tests' convention: algorithm
bandwidth (bytes / time) x 2(n-1)/n for all-reduce and (n-1)/n for all-gather,
reduce-scatter and all-to-all, bytes being the full (gathered) buffer.

Rank 0 writes the YAML: the device, library versions, date, what was planned, and the raw
timings; profile_file.py reads it (``--profile FILE``).
"""

from __future__ import annotations

import datetime
import os
import statistics
import time
from dataclasses import dataclass

PROFILE_VERSION = 1
DEFAULT_MAX_MIB = 256
"""Largest collective buffer, MiB (sizes double from MIN_BYTES up to it)."""
MIN_BYTES = 4096
CPU_MAX_MIB = 16
"""On CPU (gloo) the sizes stop at 16 MiB: gloo's rings take seconds above that."""


@dataclass(frozen=True)
class Dist:
    rank: int
    world: int
    local_rank: int
    local_world: int

    @property
    def nodes(self) -> int:
        return max(1, self.world // max(1, self.local_world))


def environment() -> Dist:
    """Rank layout from torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) or Slurm."""
    env = os.environ
    if "RANK" not in env and "SLURM_PROCID" in env:
        env = dict(env) | {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": env.get("SLURM_NTASKS", "1"),
                           "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
                           "LOCAL_WORLD_SIZE": env.get("SLURM_NTASKS_PER_NODE", env.get("SLURM_NTASKS", "1"))}
        os.environ.update({k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")})
    world = int(env.get("WORLD_SIZE", "1"))
    return Dist(rank=int(env.get("RANK", "0")), world=world, local_rank=int(env.get("LOCAL_RANK", "0")),
                local_world=int(env.get("LOCAL_WORLD_SIZE", str(world))))


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(torch, device, fn, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    _sync(torch, device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        _sync(torch, device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gemm_shapes(model, seq: int, mbs: int, tp: int) -> list[tuple[str, int, int, int]]:
    """(name, M, K, N) of one layer's GEMMs of ``model`` on one device at (seq, mbs, tp):
    formulas.flops.layer_gemms with the numbers put in (each GEMM once; the router skipped)."""
    import sympy as sp

    from ndplan import symbols as S
    from ndplan.formulas import flops as FL
    from ndplan.formulas.local import act_context
    from ndplan.strategy import Strategy
    from ndplan.structure import structure
    from ndplan.symbols import model_symbols
    strat = Strategy(tp=tp, seq=seq, mbs=mbs, gbs=mbs, ep=1)
    view = structure(model, strat)
    M, c = model_symbols(model), act_context(model, view)
    vals = {S.tp: tp, S.seq: seq, S.mbs: mbs, S.cp: 1, S.ep: 1, S.etp: 1}
    kinds = [k for k in ("dense", "moe") if k in model.layer_kinds] or ["dense"]
    out, seen = [], set()
    for kind in kinds:
        for g in FL.layer_gemms(model, M, c, kind):
            if g.name == "moe.router":
                continue
            dims = tuple(int(sp.ceiling(sp.sympify(x).subs(vals))) for x in (g.rows, g.inner, g.cols))
            if dims not in seen and min(dims) > 0:
                seen.add(dims)
                out.append((g.name, *dims))
    return out


def run(model, hw_name: str, seq: int, mbs: int, tps: list[int], max_mib: int, warmup: int, iters: int,
        progress=None) -> dict | None:
    """Measure on this rank; rank 0 returns the profile document, the others None."""
    import torch
    import torch.distributed as dist
    d = environment()
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{d.local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if cuda else torch.float32
    if d.world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    say = progress if (progress and d.rank == 0) else (lambda msg: None)
    doc = {"ndplan_profile": PROFILE_VERSION, "meta": _meta(torch, d, device, dtype, model, hw_name, seq, mbs, tps)}
    say("GEMMs")
    doc["gemm"] = _gemms(torch, device, dtype, model, seq, mbs, tps, warmup, iters)
    say("attention")
    doc["attention"] = _attention(torch, device, dtype, model, seq, mbs, tps, warmup, iters)
    say("device-memory copy")
    doc["hbm"] = _copy(torch, device, cuda, warmup, iters)
    doc["collectives"] = []
    if d.world > 1:
        say("collectives")
        doc["collectives"] = _collectives(torch, dist, device, d, min(max_mib, max_mib if cuda else CPU_MAX_MIB),
                                          warmup, iters)
        dist.barrier()
    return doc if d.rank == 0 else None


def _meta(torch, d: Dist, device, dtype, model, hw_name, seq, mbs, tps) -> dict:
    cuda = device.type == "cuda"
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "torch": str(torch.__version__), "cuda": torch.version.cuda if cuda else None,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
            "backend": "nccl" if cuda else "gloo", "world": d.world, "devices_per_node": d.local_world,
            "nodes": d.nodes, "dtype": str(dtype).replace("torch.", ""), "hardware": hw_name,
            "model": model.name, "seq": seq, "mbs": mbs, "tp": list(tps)}


def _gemms(torch, device, dtype, model, seq, mbs, tps, warmup, iters) -> list[dict]:
    out = []
    for tp in tps:
        for name, m, k, n in gemm_shapes(model, seq, mbs, tp):
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            t = _median_time(torch, device, lambda: torch.matmul(a, b), warmup, iters)
            out.append({"name": name, "tp": tp, "m": m, "k": k, "n": n, "seconds": t})
    return out


def _attention(torch, device, dtype, model, seq, mbs, tps, warmup, iters) -> list[dict]:
    import torch.nn.functional as F
    out = []
    heads_total, d = model.num_attention_heads, model.head_dim
    for tp in tps:
        heads = max(1, heads_total // tp)
        q, k, v = (torch.randn(mbs, heads, seq, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        fwd = _median_time(torch, device, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                           warmup, iters)

        def both():
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        total = _median_time(torch, device, both, warmup, iters)
        out.append({"tp": tp, "batch": mbs, "heads": heads, "seq": seq, "head_dim": d, "causal": True,
                    "forward_s": fwd, "backward_s": max(total - fwd, 0.0)})
    return out


def _copy(torch, device, cuda: bool, warmup, iters) -> list[dict]:
    nbytes = (256 if cuda else 64) * 2 ** 20
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    t = _median_time(torch, device, lambda: y.copy_(x), warmup, iters)
    return [{"bytes": nbytes, "seconds": t}]


def _groups(dist, d: Dist) -> dict:
    """'world', and across nodes also 'intra' (this node's ranks) and 'inter' (one per node)."""
    out = {"world": None}
    if d.nodes > 1:
        for node in range(d.nodes):
            g = dist.new_group([node * d.local_world + i for i in range(d.local_world)])
            if node == d.rank // d.local_world:
                out["intra"] = g
        for local in range(d.local_world):
            g = dist.new_group([n * d.local_world + local for n in range(d.nodes)])
            if local == d.local_rank:
                out["inter"] = g
    return out


def _collectives(torch, dist, device, d: Dist, max_mib: int, warmup, iters) -> list[dict]:
    # torch >= 2.10 names them *_single; older releases only have the *_tensor forms
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    out = []
    for gname, group in _groups(dist, d).items():
        n = dist.get_world_size(group)
        size = MIN_BYTES
        while size <= max_mib * 2 ** 20:
            elems = size // 4  # fp32 elements of the full buffer
            full = torch.ones(elems - elems % n, device=device)
            shard = torch.empty(full.numel() // n, device=device)
            ops = {"all_reduce": lambda: dist.all_reduce(full, group=group),
                   "all_gather": lambda: gather(full, shard, group=group),
                   "reduce_scatter": lambda: scatter(shard, full, group=group),
                   "all_to_all": lambda: dist.all_to_all_single(torch.empty_like(full), full, group=group)}
            for op, fn in ops.items():
                t = torch.tensor([_median_time(torch, device, fn, warmup, iters)], device=device)
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
                out.append({"op": op, "group": gname, "ranks": n, "bytes": int(full.numel() * 4),
                            "seconds": float(t.item())})
            size *= 4
    return out


def write(doc: dict, path) -> None:
    import yaml
    with open(path, "w", encoding="utf-8") as f:
        f.write("# Written by ndplan profile: use it as --profile FILE with estimate, explain, sweep, compare.\n")
        yaml.safe_dump(doc, f, sort_keys=False, width=120)
