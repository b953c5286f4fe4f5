"""torchtitan's own Llama 3 modules, activation checkpointing and FSDP2 code, run on the CPU.

The gloo harness (``ndplan.trace.runtime``, ``Case.source = "torchtitan"``) builds the model
with torchtitan's classes and applies torchtitan's functions to it, so what is measured is
torchtitan's code, not a re-implementation of it (torchtitan ``TORCHTITAN_VERSION`` from PyPI;
its import chain needs ``triton``, which imports on a machine without a GPU):

- ``Llama3Model`` from ``torchtitan.models.llama3`` with its ``_build_llama3_layers`` (fused
  wqkv, ``ComplexRoPE``, ``RMSNorm``, SwiGLU ``FeedForward``), sized from a transformers-style
  config (``runtime.CONFIG``);
- the inner attention is torchtitan's own ``ScaledDotProductAttention`` (causal), not its
  default ``FlexAttention``: torch 2.13 raises "FlexAttention does not support backward on
  CPU" (torch/nn/attention/flex_attention.py ``_validate_device``). Both save q, k, v, the
  output and the fp32 log-sum-exp (the CPU flash kernel, as the GPU kernels do);
- activation checkpointing with torchtitan's ``FullAC`` / ``SelectiveAC`` (op-level SAC,
  torchtitan/distributed/activation_checkpoint.py). On CUDA the flash kernel
  ``aten._scaled_dot_product_flash_attention`` is in SAC's save list; its CPU twin
  ``_scaled_dot_product_flash_attention_for_cpu`` is not, so ``_CpuSelectiveAC`` adds it
  through ``get_save_ops``, the override point torchtitan documents for the save set;
- FSDP2 with torchtitan's ``apply_fsdp_to_decoder`` (bf16 parameters, fp32 reduce; its
  "default" reshard policy without PP). It sets ``gradient_divide_factor`` 1.0, which asks the
  reduce-scatter for ``ReduceOp.PREMUL_SUM(1.0)``; gloo has none ("Cannot use ReduceOp.PREMUL_SUM
  with Gloo"), so ``set_force_sum_reduction_for_comms(True)`` makes it a SUM with a divide by 1,
  which ``_div_if_needed`` skips (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py
  ``_get_gradient_divide_factors``): the same buffers, no extra tensor.
"""

from __future__ import annotations

import importlib.util

TORCHTITAN_VERSION = "0.3.0"
"""The torchtitan release this module is written against (.ci/run installs it)."""

TITAN_SETTINGS: dict = {"repeat_kv_always": 0, "fused_qkv": 1, "rope_table_per_layer": 1, "norm_input_bytes": 8}
"""The fsdp profile's settings for torchtitan 0.3.0's modules as they run here (trace.titan): sdpa
with enable_gqa (models/common/attention.py ``Attention.forward``), no repeat_kv; one fused wqkv
linear; a RoPE table per layer; and nn.RMSNorm as torch 2.13 runs it on the CPU: the composite
rms_norm (x.float(), pow, mean, rsqrt, two multiplies) saves the fp32 input and the fp32 normalized
tensor, 8 B per element beside the fp32 1/rms per token (measured with saved_tensors_hooks; even
``aten._fused_rms_norm`` decomposes so on the CPU), where CUDA runs the fused kernel the fsdp
profile counts (2 B input, 4 B per token)."""


def available() -> bool:
    """torchtitan (and the triton its imports need) is installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("torchtitan", "triton"))


def build(config: dict, seq_len: int):
    """torchtitan's ``Llama3Model`` with the sizes of the transformers-style ``config`` (hidden_size,
    intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
    vocab_size), fp32 on the CPU, causal sdpa attention; each layer's RoPE table is precomputed
    for ``seq_len``, as torchtitan's trainer sets it to ``training.seq_len``
    (models/common/decoder.py ``Decoder.Config.update_from_config``)."""
    from torchtitan.models import llama3 as L
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    h, heads = config["hidden_size"], config["num_attention_heads"]
    if config.get("head_dim", h // heads) != h // heads:
        raise ValueError("torchtitan's Llama 3 derives head_dim = hidden_size / num_attention_heads")
    layers = L._build_llama3_layers(
        n_layers=config["num_hidden_layers"], dim=h, n_heads=heads, n_kv_heads=config["num_key_value_heads"],
        hidden_dim=config["intermediate_size"], attn_backend="flex",
        rope=ComplexRoPE.Config(dim=h // heads, max_seq_len=seq_len, theta=500000,
                                scaling="none"))
    for layer in layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    vocab = config["vocab_size"]
    cfg = L.Llama3Model.Config(
        dim=h, vocab_size=vocab, layers=layers,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=h, param_init=L._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=h, param_init=L._NORM_INIT),
        lm_head=Linear.Config(in_features=h, out_features=vocab, param_init=L._output_linear_init(h)))
    return cfg.build()


def _cpu_selective_ac():
    import torch
    from torchtitan.distributed.activation_checkpoint import SelectiveAC

    class _CpuSelectiveAC(SelectiveAC):
        """torchtitan's op-level SAC with the CPU flash-attention kernel saved, as its CUDA kernel is."""

        def get_save_ops(self) -> set:
            return super().get_save_ops() | {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}

    return _CpuSelectiveAC


def parallelize(model, mesh, ac: str = "none"):
    """torchtitan's order (models/llama3/parallelize.py ``parallelize_llama``): activation
    checkpointing (``ac``: none, full or op), then ``apply_fsdp_to_decoder`` on ``mesh``."""
    import torch
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder
    if ac == "full":
        FullAC(FullAC.Config(preserve_rng_state=False)).apply(model)
    elif ac == "op":
        _cpu_selective_ac()(SelectiveAC.Config(preserve_rng_state=False)).apply(model)
    elif ac != "none":
        raise ValueError(f"ac {ac!r}: give none, full or op")
    from torch.distributed.fsdp import FSDPModule
    apply_fsdp_to_decoder(model, mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32, pp_enabled=False)
    for module in model.modules():
        if isinstance(module, FSDPModule):  # gloo has no PREMUL_SUM (module docstring)
            module.set_force_sum_reduction_for_comms(True)
    return model


def chunked_loss(model, chunks: int, vocab: int):
    """torchtitan's ``ChunkedLossWrapper`` over its ``CrossEntropyLoss`` with ``chunks`` chunks, bound
    to ``model``'s output layer, which the model then skips (trainer.py: ``set_lm_head`` and
    ``_skip_lm_head = True``); called as ``loss_fn(hidden, labels, global_valid_tokens)``."""
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    loss_fn = ChunkedLossWrapper.Config(num_chunks=chunks,
                                        loss_fn=CrossEntropyLoss.Config(global_vocab_size=vocab)).build()
    loss_fn.set_lm_head(model.lm_head)
    model._skip_lm_head = True
    return loss_fn


def measure(case, mesh, meter, ids) -> tuple[int, int, int]:
    """(states, base, peak) of a ``runtime.Case`` in ``fsdp`` mode on torchtitan's own model and
    parallelize code; its training step's forward and backward (torchtitan trainer.py forward_backward_step: ``pred = model(inputs)``,
    the loss, ``del pred``, ``loss.backward()``)."""
    import torch
    from ndplan.trace.runtime import _loss, _states_base_peak
    ac = "op" if case.op_sac else ("full" if case.ac_every == 1 else "none")
    with meter.mode:
        model = parallelize(build(case.config, ids.shape[1]), mesh["dp"], ac)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        if case.loss_chunks:
            loss_fn = chunked_loss(model, case.loss_chunks, case.config["vocab_size"])
            tokens = torch.tensor(float(ids.numel()))

        def step():
            if case.loss_chunks:  # the model returns the hidden states; the loss runs the output layer
                loss, _ = loss_fn(model(ids), ids, tokens)
                loss.backward()
            else:
                _loss(model(ids), ids).backward()

        return _states_base_peak(meter, opt, step)
