"""PyTorch DeviceMesh code (``--emit devicemesh``): a runnable module that builds the
mesh with ``torch.distributed.device_mesh.init_device_mesh`` and a ``parallelize``
stub on a model the user supplies.

Mesh dims: every axis is kept, size-1 ones included, so that ``mesh["tp"]`` and the
others always exist whatever the strategy (torchtitan's ParallelDims drops them
instead; pytorch/torchtitan:torchtitan/distributed/parallel_dims.py). Names:
``pp``, ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``; dp is all replicate for zero 0
(DDP) and all shard otherwise (FSDP2 ``fully_shard``, zero 1/2 as
``reshard_after_forward=False``, zero 3 as True; see export/torchtitan.py). Order:
``Strategy.order`` read outermost first (ep is carved from dp*cp*tp, not a mesh dim),
dp_replicate outside dp_shard; the default tp-cp-ep-dp-pp gives
(pp, dp_replicate, dp_shard, cp, tp), torchtitan's order. FSDP2 (and DDP) run over dp x cp
flattened (``data_mesh``): CP ranks hold parts of one sequence, so their gradients must be
reduced together, as torchtitan's ``dp_shard_cp`` mesh does.

APIs: pytorch/pytorch:torch/distributed/device_mesh.py (``init_device_mesh``,
``mesh_dim_names``), torch/distributed/fsdp/_fully_shard/_fully_shard.py
(``fully_shard(module, mesh=..., reshard_after_forward=...)``),
torch/distributed/tensor/parallel/api.py (``parallelize_module``),
torch/distributed/pipelining/schedules.py (schedule classes, see torchtitan.py).
"""

from __future__ import annotations

from ndplan.catalog.model import ModelSpec
from ndplan.export.common import cannot, layers_per_chunk, header
from ndplan.export.torchtitan import SCHEDULES
from ndplan.strategy import Strategy
from ndplan.vocab import BIDIRECTIONAL_SCHEDULES

TARGET = "PyTorch DeviceMesh"
SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
                    "zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}


def mesh_dims(strat: Strategy) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(names, sizes) outermost first."""
    s = strat
    size = {"pp": s.pp, "cp": s.cp, "tp": s.tp, "dp_replicate": s.dp if s.zero == 0 else 1,
            "dp_shard": 1 if s.zero == 0 else s.dp}
    names: list[str] = []
    for axis in reversed(s.order.split("-")):
        if axis == "dp":
            names += ["dp_replicate", "dp_shard"]
        elif axis != "ep":
            names.append(axis)
    return tuple(names), tuple(size[n] for n in names)


def emit(model: ModelSpec, strat: Strategy, *, balance=None) -> str:
    s = strat
    if s.pp > 1 and s.schedule in BIDIRECTIONAL_SCHEDULES:
        raise cannot(TARGET, "schedule", s.schedule, "torch.distributed.pipelining has DualPipeV but not the "
                     "two-direction DualPipe (github.com/deepseek-ai/DualPipe wraps the modules itself); "
                     "use --schedule dualpipev")
    names, sizes = mesh_dims(s)
    layers = layers_per_chunk(model, s, balance)
    sched = SCHEDULE_CLASSES.get(s.schedule)
    lines = ['"""' + header(TARGET, model, s, prefix="")[0] + ".", "", header(TARGET, model, s, prefix="")[1],
             f"Run under torchrun with {s.world} processes; fill in parallelize() for your model.",
             "The code below runs the mesh, the pipeline split, the batch and FSDP2's resharding; ep, etp,",
             "recompute, schedule, sp and engine in the line above are for parallelize() to apply (ndplan",
             "check reads them from that line; zero 1 runs as FSDP2's zero 2).", '"""', "",
             "from torch.distributed.device_mesh import init_device_mesh", "",
             f"MESH_SHAPE = {sizes!r}", f"MESH_DIM_NAMES = {names!r}",
             f"LAYERS_PER_VIRTUAL_STAGE = {list(layers)!r}  # decoder layers, model order, pp*vpp={s.pp * s.vpp}",
             f"MICRO_BATCH_SIZE = {s.mbs}", f"MICRO_BATCHES = {s.m}", f"SEQ_LEN = {s.seq}", "", "",
             'def build_mesh(device_type="cuda"):',
             "    return init_device_mesh(device_type, MESH_SHAPE, mesh_dim_names=MESH_DIM_NAMES)", "", "",
             "def data_mesh(mesh):",
             '    """The ranks that reduce gradients: data parallel and context parallel together (each CP',
             '    rank holds a slice of the sequence, so its gradients are partial; torchtitan flattens',
             '    dp_shard and cp, distributed/parallel_dims.py "dp_shard_cp")."""',
             f'    dims = ("{"dp_shard" if s.zero >= 1 else "dp_replicate"}", "cp")',
             '    return mesh[dims]._flatten(mesh_dim_name="_".join(dims))', "", "",
             "def parallelize(model, mesh):",
             '    """Apply TP/SP, CP, PP and FSDP2 on the user\'s model (module names are model-specific)."""']
    if s.tp > 1:
        lines += ["    # TP" + (" + SP" if s.sp else "") + ': from torch.distributed.tensor.parallel import '
                  'parallelize_module, ColwiseParallel, RowwiseParallel' + (", SequenceParallel" if s.sp else ""),
                  '    # for block in model.layers: parallelize_module(block, mesh["tp"], {...column/row-wise plan...})']
    if s.cp > 1:
        lines += ["    # CP: torch.distributed.tensor.experimental.context_parallel("
                  'mesh["cp"], buffers=[...]) around each training step']
    if s.ep > 1:
        lines += [f"    # EP={s.ep} (etp={s.etp}): experts sharded over a flattened sub-mesh of dp_shard/cp/tp ranks"]
    if s.pp > 1:
        lines += [f"    # PP: split model into {s.pp * s.vpp} stages with LAYERS_PER_VIRTUAL_STAGE; "
                  'torch.distributed.pipelining.PipelineStage(chunk, stage_index, num_stages, device, '
                  'group=mesh["pp"].get_group())',
                  f"    # schedule: torch.distributed.pipelining.{sched}(stages, n_microbatches=MICRO_BATCHES, "
                  f"loss_fn=...)  # torchtitan name {SCHEDULES.get(s.schedule)!r}" if sched else
                  f"    # schedule {s.schedule}: no torch.distributed.pipelining class"]
    if s.zero >= 1:
        rs = "True" if s.zero == 3 else "False"
        lines += ["    from torch.distributed.fsdp import fully_shard",
                  '    dp_mesh = data_mesh(mesh)  # dp_shard x cp',
                  '    for block in getattr(model, "layers", []):',
                  f"        fully_shard(block, mesh=dp_mesh, reshard_after_forward={rs})",
                  f"    fully_shard(model, mesh=dp_mesh, reshard_after_forward={rs})"]
    elif s.dp > 1:
        lines += ['    # DDP over dp_replicate x cp: torch.distributed._composable.replicate(model, '
                  'device_mesh=data_mesh(mesh))']
    if s.recompute != "none":
        lines += [f"    # recompute {s.recompute}: torch.distributed.algorithms._checkpoint.checkpoint_wrapper on "
                  "each block (full), or a selective policy"]
    lines += ["    return model", "", "", 'if __name__ == "__main__":', "    mesh = build_mesh()",
              "    print(mesh)"]
    return "\n".join(lines) + "\n"
