"""PyTorch DeviceMesh form of an ndplan strategy for llama3-8b.

dp=8 tp=2 pp=1 vpp=1 cp=1 ep=1 etp=1 mbs=1 gbs=64 m=8 seq=8192 zero=3 sp=on recompute=none schedule=1f1b engine=fsdp
Run under torchrun with 16 processes; fill in parallelize() for your model.
The code below runs the mesh, the pipeline split, the batch and FSDP2's resharding; ep, etp,
recompute, schedule, sp and engine in the line above are for parallelize() to apply (ndplan
check reads them from that line; zero 1 runs as FSDP2's zero 2).
"""

from torch.distributed.device_mesh import init_device_mesh

MESH_SHAPE = (1, 1, 8, 1, 2)
MESH_DIM_NAMES = ('pp', 'dp_replicate', 'dp_shard', 'cp', 'tp')
LAYERS_PER_VIRTUAL_STAGE = [32]  # decoder layers, model order, pp*vpp=1
MICRO_BATCH_SIZE = 1
MICRO_BATCHES = 8
SEQ_LEN = 8192


def build_mesh(device_type="cuda"):
    return init_device_mesh(device_type, MESH_SHAPE, mesh_dim_names=MESH_DIM_NAMES)


def data_mesh(mesh):
    """The ranks that reduce gradients: data parallel and context parallel together (each CP
    rank holds a slice of the sequence, so its gradients are partial; torchtitan flattens
    dp_shard and cp, distributed/parallel_dims.py "dp_shard_cp")."""
    dims = ("dp_shard", "cp")
    return mesh[dims]._flatten(mesh_dim_name="_".join(dims))


def parallelize(model, mesh):
    """Apply TP/SP, CP, PP and FSDP2 on the user's model (module names are model-specific)."""
    # TP + SP: from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel, SequenceParallel
    # for block in model.layers: parallelize_module(block, mesh["tp"], {...column/row-wise plan...})
    from torch.distributed.fsdp import fully_shard
    dp_mesh = data_mesh(mesh)  # dp_shard x cp
    for block in getattr(model, "layers", []):
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=True)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=True)
    return model


if __name__ == "__main__":
    mesh = build_mesh()
    print(mesh)
