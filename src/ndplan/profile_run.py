"""``ndplan profile``: time the planned model's GEMMs and attention, a device-memory copy and the
collectives on the user's own devices, and write a profile YAML (issue 16 part 3).

Launched by the tools users already run, one process per device: ``torchrun --nproc_per_node 8
-m ndplan profile ...`` (or ``srun ... python -m ndplan profile ...`` with MASTER_ADDR and
MASTER_PORT set: inside an srun step SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID and
SLURM_STEP_NUM_NODES stand in for torchrun's RANK, WORLD_SIZE, LOCAL_RANK and the node count).
Without those variables it runs alone (no collectives). Ranks are laid out node by node, the
same number on each node (torchrun's and srun's block distribution); the device is the local
rank modulo the visible devices (one visible device per task when Slurm binds them). The
backend is NCCL on CUDA devices, HCCL on Ascend NPUs (torch_npu registers ``torch.npu``, whose
device, event and synchronisation calls mirror ``torch.cuda``'s; ``accelerator``) and gloo on
CPU, where the same code runs in CI.

Every timing is the median of ``iters`` samples after ``warmup`` runs. On a GPU or NPU a sample times
K back-to-back launches between device events, K chosen so that a sample lasts about
SAMPLE_S (a single launch would carry 10-20 us of dispatch and synchronisation: a tp-8
projection on an H100 takes about 25 us), divided by K; on CPU one run by the host clock. A
collective's time is the slowest rank's (an all-reduce with MAX of each rank's median). The
collectives are all-reduce, all-gather, reduce-scatter, all-to-all and send/recv (each rank
sends the buffer to the next rank of its group and receives the previous one's, the pipeline's
exchange). The file keeps raw seconds and bytes (the full, gathered buffer; send/recv: the
buffer one rank sends); profile_file.py turns the all-gathers into bus bandwidth, nccl-tests'
(n-1)/n x bytes / time, and keeps the others as raw timings.

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
"""Largest collective buffer, MiB (sizes grow 4x from MIN_BYTES up to it)."""
MIN_BYTES = 4096
SAMPLE_S = 1e-3
"""Target length of one GPU or NPU timing sample, seconds."""
CPU_MAX_MIB = 16
"""On CPU (gloo) the sizes stop at 16 MiB: gloo's rings take seconds above that."""


@dataclass(frozen=True)
class Accelerator:
    """The device kind the profile runs on: ``kind`` is torch's device type, ``backend`` the
    process-group backend, ``module`` torch.cuda or torch.npu (None on CPU)."""

    kind: str
    backend: str
    module: object = None


def accelerator(torch) -> Accelerator:
    """CUDA (NCCL) when torch sees a GPU, else an Ascend NPU (HCCL) when torch_npu is installed and
    sees one, else the CPU (gloo)."""
    if torch.cuda.is_available():
        return Accelerator("cuda", "nccl", torch.cuda)
    npu = getattr(torch, "npu", None)
    if npu is None:
        try:
            import torch_npu  # noqa: F401 (registers torch.npu)
        except ImportError:
            return Accelerator("cpu", "gloo")
        npu = getattr(torch, "npu", None)
    if npu is not None and npu.is_available():
        return Accelerator("npu", "hccl", npu)
    return Accelerator("cpu", "gloo")


@dataclass(frozen=True)
class Dist:
    rank: int
    world: int
    local_rank: int
    local_world: int

    @property
    def nodes(self) -> int:
        return max(1, self.world // max(1, self.local_world))


def _env_int(env, key: str, default: int) -> int:
    from ndplan.errors import NdplanError
    try:
        return int(env.get(key, default))
    except ValueError:
        raise NdplanError(key, env.get(key), "not an integer", "launch with torchrun or srun") from None


def environment(env=None) -> Dist:
    """Rank layout from torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) or an srun step
    (SLURM_STEP_NUM_TASKS and SLURM_STEP_NUM_NODES exist only inside one, not in a batch script);
    one-line errors for a layout that is not the same number of ranks on every node, and for a
    multi-rank run without MASTER_ADDR / MASTER_PORT."""
    from ndplan.errors import NdplanError
    env = dict(os.environ if env is None else env)
    if "RANK" not in env and "SLURM_STEP_NUM_TASKS" in env:
        tasks, nodes = _env_int(env, "SLURM_STEP_NUM_TASKS", 1), _env_int(env, "SLURM_STEP_NUM_NODES", 1)
        env |= {"RANK": env.get("SLURM_PROCID", "0"), "WORLD_SIZE": str(tasks),
                "LOCAL_RANK": env.get("SLURM_LOCALID", "0"), "LOCAL_WORLD_SIZE": str(max(1, tasks // max(1, nodes)))}
    world = _env_int(env, "WORLD_SIZE", 1)
    local_world = _env_int(env, "LOCAL_WORLD_SIZE", world)
    if world < 1 or local_world < 1 or world % local_world:
        raise NdplanError("WORLD_SIZE", world, f"not a whole number of nodes of {local_world} ranks",
                          "launch the same number of ranks on every node")
    if world > 1 and not (env.get("MASTER_ADDR") and env.get("MASTER_PORT")):
        raise NdplanError("MASTER_ADDR", env.get("MASTER_ADDR"), "needed by a multi-rank run",
                          "torchrun sets it; under srun export MASTER_ADDR and MASTER_PORT")
    rank = _env_int(env, "RANK", 0)
    if not 0 <= rank < world:
        raise NdplanError("RANK", rank, f"outside 0..{world - 1} (WORLD_SIZE={world})",
                          "launch with torchrun or srun, which set both")
    return Dist(rank=rank, world=world, local_rank=rank % local_world, local_world=local_world)


def _sync(acc: Accelerator, device) -> None:
    if acc.module is not None:
        acc.module.synchronize(device)


def _median_time(acc: Accelerator, device, fn, warmup: int, iters: int) -> float:
    """Median seconds of one ``fn`` over ``iters`` samples (module docstring)."""
    for _ in range(warmup):
        fn()
    _sync(acc, device)
    if acc.module is None:
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    t0 = time.perf_counter()
    fn()
    _sync(acc, device)
    k = max(1, min(10_000, int(SAMPLE_S / max(time.perf_counter() - t0, 1e-7))))
    times = []
    for _ in range(iters):
        start, end = acc.module.Event(enable_timing=True), acc.module.Event(enable_timing=True)
        start.record()
        for _ in range(k):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / k)
    return statistics.median(times)


def gemm_shapes(model, seq: int, mbs: int, tp: int, cp: int = 1) -> list[tuple[str, int, int, int, int]]:
    """(name, M, K, N, count) of one layer's GEMMs of ``model`` on one device at (seq, mbs, tp,
    cp): formulas.flops.layer_gemms with the numbers put in (the router skipped; ``count``: how
    many such products, e.g. the local experts, and the layers of each kind that run it)."""
    import sympy as sp

    from ndplan import symbols as S
    from ndplan.formulas import flops as FL
    from ndplan.formulas.local import act_context
    from ndplan.strategy import Strategy
    from ndplan.structure import structure
    from ndplan.symbols import model_symbols
    strat = Strategy(tp=tp, cp=cp, seq=seq, mbs=mbs, gbs=mbs, ep=1)
    view = structure(model, strat)
    M, c = model_symbols(model), act_context(model, view)
    vals = {S.tp: tp, S.seq: seq, S.mbs: mbs, S.cp: cp, S.ep: 1, S.etp: 1}
    out = []
    for kind in ("dense", "moe"):
        layers = model.layer_kinds.count(kind)
        for g in FL.layer_gemms(model, M, c, kind) if layers else ():
            if g.name == "moe.router":
                continue
            dims = tuple(int(sp.ceiling(sp.sympify(x).subs(vals))) for x in (g.rows, g.inner, g.cols, g.count))
            if min(dims) > 0:
                out.append((g.name, dims[0], dims[1], dims[2], dims[3] * layers))
    return out


def run(model, hw_name: str, seq: int, mbs: int, tps: list[int], max_mib: int, warmup: int, iters: int,
        progress=None) -> dict | None:
    """Measure on this rank; rank 0 returns the profile document, the others None."""
    import torch
    import torch.distributed as dist
    d = environment()
    acc = accelerator(torch)
    on_device = acc.module is not None
    device = torch.device(f"{acc.kind}:{d.local_rank % acc.module.device_count()}" if on_device else "cpu")
    if on_device:
        acc.module.set_device(device)
    dtype = torch.bfloat16 if on_device else torch.float32
    if d.world > 1 and not dist.is_initialized():
        dist.init_process_group(acc.backend)
    say = progress if (progress and d.rank == 0) else (lambda msg: None)
    doc = {"ndplan_profile": PROFILE_VERSION,
           "meta": _meta(torch, acc, d, device, dtype, model, hw_name, seq, mbs, tps)}
    say("GEMMs")
    doc["gemm"] = _gemms(torch, acc, device, dtype, model, seq, mbs, tps, warmup, iters)
    say("attention")
    doc["attention"] = _attention(torch, acc, device, dtype, model, seq, mbs, tps, warmup, iters)
    say("device-memory copy")
    doc["hbm"] = _copy(torch, acc, device, warmup, iters)
    doc["collectives"] = []
    if d.world > 1:
        say("collectives")
        doc["collectives"] = _collectives(torch, dist, acc, device, d, max_mib if on_device else min(max_mib, CPU_MAX_MIB),
                                          warmup, iters)
        dist.barrier()
        dist.destroy_process_group()
    return doc if d.rank == 0 else None


def _meta(torch, acc: Accelerator, d: Dist, device, dtype, model, hw_name, seq, mbs, tps) -> dict:
    cuda = acc.kind == "cuda"
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": acc.module.get_device_name(device) if acc.module is not None else "cpu",
            "torch": str(torch.__version__), "cuda": torch.version.cuda if cuda else None,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
            "torch_npu": _torch_npu_version() if acc.kind == "npu" else None,
            "backend": acc.backend, "world": d.world, "devices_per_node": d.local_world,
            "nodes": d.nodes, "dtype": str(dtype).replace("torch.", ""), "hardware": hw_name,
            "model": model.name, "seq": seq, "mbs": mbs, "tp": list(tps)}


def _torch_npu_version() -> str | None:
    try:
        import torch_npu
    except ImportError:
        return None
    return str(getattr(torch_npu, "__version__", "unknown"))


def _gemms(torch, acc: Accelerator, device, dtype, model, seq, mbs, tps, warmup, iters) -> list[dict]:
    out = []
    for tp in tps:
        seen = set()
        for name, m, k, n, _ in gemm_shapes(model, seq, mbs, tp):
            if (m, k, n) in seen:
                continue
            seen.add((m, k, n))
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            t = _median_time(acc, device, lambda: torch.matmul(a, b), warmup, iters)
            out.append({"name": name, "tp": tp, "m": m, "k": k, "n": n, "seconds": t})
    return out


def _attention(torch, acc: Accelerator, device, dtype, model, seq, mbs, tps, warmup, iters) -> list[dict]:
    import torch.nn.functional as F
    out = []
    heads_total, d = model.num_attention_heads, model.head_dim
    for tp in tps:
        heads = max(1, heads_total // tp)
        q, k, v = (torch.randn(mbs, heads, seq, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        fwd = _median_time(acc, device, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                           warmup, iters)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        g = torch.randn_like(o)
        bwd = _median_time(acc, device, lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True),
                           warmup, iters)
        out.append({"tp": tp, "batch": mbs, "heads": heads, "seq": seq, "head_dim": d, "causal": True,
                    "forward_s": fwd, "backward_s": bwd})
    return out


def _copy(torch, acc: Accelerator, device, warmup, iters) -> list[dict]:
    nbytes = (256 if acc.module is not None else 64) * 2 ** 20
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    t = _median_time(acc, device, lambda: y.copy_(x), warmup, iters)
    return [{"bytes": nbytes, "seconds": t}]


def _groups(dist, d: Dist) -> dict:
    """name -> (group, its global ranks): 'world', and across nodes also 'intra' (this node's
    ranks) and 'inter' (one per node)."""
    out = {"world": (None, list(range(d.world)))}
    if d.nodes > 1:
        for node in range(d.nodes):
            ranks = [node * d.local_world + i for i in range(d.local_world)]
            g = dist.new_group(ranks)
            if node == d.rank // d.local_world:
                out["intra"] = (g, ranks)
        for local in range(d.local_world):
            ranks = [n * d.local_world + local for n in range(d.nodes)]
            g = dist.new_group(ranks)
            if local == d.local_rank:
                out["inter"] = (g, ranks)
    return out


def _send_recv(dist, full, received, group, ranks: list[int], rank: int) -> None:
    """Send ``full`` to the next rank of ``ranks`` and receive the previous one's (global ranks),
    posted together (batch_isend_irecv: NCCL's blocking sends would deadlock a ring whose ranks
    all send first)."""
    i = ranks.index(rank)
    ops = [dist.P2POp(dist.isend, full, ranks[(i + 1) % len(ranks)], group),
           dist.P2POp(dist.irecv, received, ranks[(i - 1) % len(ranks)], group)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()


def _collectives(torch, dist, acc: Accelerator, device, d: Dist, max_mib: int, warmup, iters) -> list[dict]:
    # torch >= 2.10 names them *_single; older releases only have the *_tensor forms
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    out = []
    for gname, (group, ranks) in _groups(dist, d).items():
        n = dist.get_world_size(group)
        size = MIN_BYTES
        while size <= max_mib * 2 ** 20:
            elems = size // 4  # fp32 elements of the full buffer
            full = torch.ones(elems - elems % n, device=device)
            shard = torch.empty(full.numel() // n, device=device)
            received = torch.empty_like(full)
            ops = {"all_reduce": lambda: dist.all_reduce(full, group=group),
                   "all_gather": lambda: gather(full, shard, group=group),
                   "reduce_scatter": lambda: scatter(shard, full, group=group),
                   "all_to_all": lambda: dist.all_to_all_single(received, full, group=group),
                   "send_recv": lambda: _send_recv(dist, full, received, group, ranks, d.rank)}
            if n < 2:  # one rank per node: nobody to send to
                del ops["send_recv"]
            for op, fn in ops.items():
                t = torch.tensor([_median_time(acc, device, fn, warmup, iters)], device=device)
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
