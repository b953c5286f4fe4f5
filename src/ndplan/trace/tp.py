"""The second trace: the same transformers modules under tensor parallelism, one rank measured.

``ndplan trace`` runs on one device; ``formulas.traced`` states how each traced tensor class
divides over tp, with and without SP. This module measures it: torch's fake process group
(``torch.testing._internal.distributed.fake_pg``: collectives are no-ops, DTensor local
shapes are the real per-rank shapes) in this one process, a 1-D device mesh of ``tp`` ranks,
and one forward + backward through ``build.trace_step``, whose recorder counts a DTensor
by its local shard. Two plans:

- ``hf``: transformers' own plan (``transformers.distributed.tensor_parallel.
  apply_tensor_parallelism``: the config's ``base_model_tp_plan``, q/k/v/gate/up colwise,
  o/down rowwise, experts ``moe_tp_experts``, ``lm_head`` colwise with the logits gathered).
  transformers has no sequence parallelism (``DistributedConfig.enable_sequence_parallel``:
  "not wired up yet").
- ``sp``: torchtitan's TP + SP plan (models/llama3/infra/parallelize.py ``apply_tp``) on the
  transformers module names of Llama-style decoders: ``SequenceParallel`` norms,
  ``PrepareModuleInput`` all-gathering the attention and MLP inputs, row-parallel outputs
  reduce-scattered to ``Shard(1)``, the residual stream a sequence-sharded DTensor.

Context parallelism is not measured here: torch 2.13's ``context_parallel`` registers ring
attention only for the CUDA sdpa kernels (``aten._scaled_dot_product_flash_attention_for_cpu``
has no sharding strategy), so on the CPU it raises NotImplementedError.
"""

from __future__ import annotations

import contextlib

PLANS = ("hf", "sp")


@contextlib.contextmanager
def fake_mesh(ranks: int):
    """A 1-D ``tp`` device mesh of ``ranks`` over torch's fake process group (rank 0 measured)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized in this process")
    dist.init_process_group("fake", rank=0, world_size=ranks, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (ranks,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


def parallelize(model, mesh, plan: str, vocab_parallel: bool = False) -> None:
    """Apply ``plan`` (``PLANS``) to a model built by ``build.build``; ``vocab_parallel`` (plan
    sp): the two vocabulary ends as torchtitan shards them, the input embedding row-parallel
    and the logits left vocab-sharded for torch's ``loss_parallel`` (its default)."""
    if plan == "hf":
        from transformers.distributed.tensor_parallel import apply_tensor_parallelism
        apply_tensor_parallelism(model, mesh)
    elif plan == "sp":
        _torchtitan_sp(model, mesh, vocab_parallel)
    else:
        raise ValueError(f"plan {plan!r} is not one of {PLANS}")


def _torchtitan_sp(model, mesh, vocab_parallel: bool = False) -> None:
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module
    body = model.model
    head = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1) if vocab_parallel else Replicate(),
                           use_local_output=not vocab_parallel)
    parallelize_module(model, mesh, {"model.norm": SequenceParallel(), "lm_head": head})

    if vocab_parallel:  # torchtitan apply_tp: tok_embeddings RowwiseParallel(Replicate() -> Shard(1))
        parallelize_module(body, mesh, {"embed_tokens": RowwiseParallel(input_layouts=Replicate(),
                                                                        output_layouts=Shard(1),
                                                                        use_local_output=False)})
        return _layers_sp(body, mesh)

    def shard_sequence(mod, args, out):  # the embedding replicated, its output sequence-sharded
        return DTensor.from_local(out, mesh, [Replicate()], run_check=False).redistribute(mesh, [Shard(1)])

    body.embed_tokens.register_forward_hook(shard_sequence)
    _layers_sp(body, mesh)


def _layers_sp(body, mesh) -> None:
    """torchtitan's decoder-layer plan: SP norms, gathered attention and MLP inputs, row-parallel
    outputs reduce-scattered into the sequence-sharded residual stream."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    row = {"use_local_output": False, "output_layouts": Shard(1)}  # the residual stream stays a Shard(1) DTensor
    for layer in body.layers:
        parallelize_module(layer, mesh, {
            "input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(**row),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel(**row),
        })


def trace_sites(cfg: dict, shape, policy: str, plan: str, ranks: int = 2, attn: str = "sdpa") -> dict[str, int]:
    """Bytes each site keeps for backward on rank 0 of ``ranks`` under ``plan`` (``cfg`` scaled
    to ``shape`` by build.scaled_config); site names as build.trace_step."""
    import torch

    from ndplan.trace import build as B
    with fake_mesh(ranks) as mesh:
        torch.manual_seed(0)
        model = B.build(B.scaled_config(cfg, shape), attn)
        parallelize(model, mesh, plan)
        _, stored = B.trace_step(model, shape, policy, attn)
    return stored
