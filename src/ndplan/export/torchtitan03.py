"""torchtitan 0.3 launch (``--emit torchtitan-0.3``): torchrun running ``torchtitan.train``
with a registered config and CLI overrides.

torchtitan 0.3.0 (PyPI, 2026-09) no longer reads TOML: ``ConfigManager.parse_args``
(torchtitan/config/manager.py) imports ``torchtitan.models.<module>.config_registry``, calls
the function ``--config`` names, then applies ``--section.field value`` overrides with tyro;
the activation-checkpoint policy is a tyro subcommand, ``activation_checkpoint:none|full|
selective`` (distributed/activation_checkpoint.py ``ActivationCheckpointingConfig``). The
field names are those of the TOML form (export/torchtitan.py ``KEY``), checked against
torchtitan 0.3.0's dataclasses by running the emitted words through its own ConfigManager
(tests/test_recipes.py).

``REGISTRY`` is the registered config that builds each catalog model, and the values it
sets that ndplan reads (``BASE``: read off torchtitan 0.3.0's config functions, and checked
against them in the same test). Not expressible here (NdplanError): uneven layers (a list of
module lists on the command line), per-layer SAC (0.3.0's SelectiveAC is op-level only),
CPU offload; use the TOML form of torchtitan 0.2.x for those. zero 0 is data_parallel_replicate_degree
= dp with any tp/pp/cp: 0.3.0 has no DDP path, its parallelize functions always apply
``apply_fsdp_to_decoder`` on the (dp_replicate, fsdp) mesh ("with shard_degree=1 it is a no-op for
the all-gather", models/llama3/parallelize.py:69-90).
"""

from __future__ import annotations

import shlex

from ndplan.catalog.model import ModelSpec
from ndplan.export import torchtitan as T
from ndplan.export.common import cannot, header
from ndplan.strategy import Strategy

TARGET = "torchtitan 0.3"
VERSION = "0.3.0"
REGISTRY = {
    "llama3-8b": ("llama3", "llama3_8b"), "llama3.1-8b": ("llama3", "llama3_8b"),
    "llama3-70b": ("llama3", "llama3_70b"), "llama3.1-70b": ("llama3", "llama3_70b"),
    "qwen3-0.6b": ("qwen3", "qwen3_0_6b"), "qwen3-1.7b": ("qwen3", "qwen3_1_7b"), "qwen3-14b": ("qwen3", "qwen3_14b"),
    "qwen3-32b": ("qwen3", "qwen3_32b"), "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b"),
    "deepseek-v2-lite": ("deepseek_v3", "deepseek_v3_16b"), "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"),
}
"""Catalog model -> (``--module``, ``--config``) of torchtitan 0.3.0's config_registry."""
_AC, _SEQ, _LOCAL, _TP, _EP = (T.KEY[k] for k in ("ac_mode", "seq", "local_batch", "tp", "ep"))
BASE = {
    ("llama3", "llama3_8b"): {"flavor": "8B", _AC: "selective", _SEQ: 8192, _LOCAL: 1, _TP: 1, "loss_chunks": 8},
    ("llama3", "llama3_70b"): {"flavor": "70B", _AC: "full", _SEQ: 8192, _LOCAL: 8, _TP: 8, "loss_chunks": 8},
    ("qwen3", "qwen3_0_6b"): {"flavor": "0.6B", _AC: "selective", _SEQ: 4096, _LOCAL: 4, _TP: 1, "loss_chunks": 8},
    ("qwen3", "qwen3_1_7b"): {"flavor": "1.7B", _AC: "selective", _SEQ: 4096, _LOCAL: 4, _TP: 1, "loss_chunks": 8},
    ("qwen3", "qwen3_14b"): {"flavor": "14B", _AC: "full", _SEQ: 4096, _LOCAL: 4, _TP: 1, "loss_chunks": 8},
    ("qwen3", "qwen3_32b"): {"flavor": "32B", _AC: "full", _SEQ: 4096, _LOCAL: 2, _TP: 1, "loss_chunks": 8},
    ("qwen3", "qwen3_30b_a3b"): {"flavor": "30B-A3B", _AC: "full", _SEQ: 4096, _LOCAL: 2, _TP: 1, "loss_chunks": 8},
    ("deepseek_v3", "deepseek_v3_16b"): {"flavor": "16B", _AC: "selective", _SEQ: 4096, _LOCAL: 4, _TP: 1,
                                         _EP: 8, "loss_chunks": 8},
    ("deepseek_v3", "deepseek_v3_671b"): {"flavor": "671B", _AC: "selective", _SEQ: 4096, _LOCAL: 4, _TP: 1,
                                          _EP: 2, "loss_chunks": 8},
}
"""Values each registered config sets (torchtitan 0.3.0 models/*/config_registry.py): the
model flavor, the activation-checkpoint policy, training.seq_len / local_batch_size, the TP
and EP degrees, ChunkedLossWrapper's chunks; the other [parallelism] fields keep
ParallelismConfig's defaults (config/configs.py). llama3_405b is left out: it converts the
linears to float8 when built, which cannot run (or be checked) on the CPU."""
SUBCOMMAND = "activation_checkpoint"
DISABLE_CUDA_GRAPHS = "--training.disable_cuda_graphs"
"""A switch (tyro bool flag): the one word without a value the emitter writes."""


def _words(doc: dict) -> list[str]:
    out = []
    for key, value in doc.items():
        if key in (T.KEY["model_name"], T.KEY["model_flavor"], T.KEY["ac_mode"], T.KEY["ac_option"]):
            continue
        out += [f"--{key}", value if isinstance(value, str) else str(value)]
    return out


def fields(model: ModelSpec, strat: Strategy, *, balance=None) -> tuple[list[str], list[str]]:
    """(the words after ``-m torchtitan.train``; notes)."""
    if model.name not in REGISTRY:
        raise cannot(TARGET, "model", model.name, f"torchtitan {VERSION} registers configs for "
                                                  f"{', '.join(sorted(REGISTRY))}; use --emit torchtitan (0.2.x TOML)")
    doc, notes = T.fields(model, strat, balance=balance, ddp=False)  # 0.3.0: no DDP path (module docstring)
    if T.KEY["fqns"] in doc:
        raise cannot(TARGET, "layers_per_stage", strat.layers_per_stage, "give uneven layers in the 0.2.x TOML form "
                                                                          "(--emit torchtitan)")
    if doc.get(T.KEY["ac_option"], "op") != "op":
        raise cannot(TARGET, "recompute_layers", strat.recompute_layers, f"torchtitan {VERSION} has no per-layer SAC; "
                                                                          "recompute every layer or none")
    if model.is_moe and strat.etp != 1:
        raise cannot(TARGET, "etp", strat.etp, f"torchtitan {VERSION} has no expert_tensor_parallel_degree (0.2.x's); "
                                               "use etp=1")
    doc.pop(T.KEY["etp"], None)
    if doc.get(T.KEY["offload"]):
        raise cannot(TARGET, "offload_optimizer", True, "not expressed in this form; use --emit torchtitan")
    module, config = REGISTRY[model.name]
    # torchtitan 0.3.0 refuses CUDA graphs with a pipeline ("CUDA graphs do not support pipeline
    # parallelism yet. Set --training.disable_cuda_graphs.") and with the all-to-all expert
    # dispatcher ("CUDA graphs support only expert parallel token dispatcher configurations
    # without CPU synchronization ... or set --training.disable_cuda_graphs")
    switches = [DISABLE_CUDA_GRAPHS] if strat.pp > 1 or (model.is_moe and strat.ep > 1) else []
    return (["--module", module, "--config", config] + _words(doc) + switches
            + [f"{SUBCOMMAND}:{doc[T.KEY['ac_mode']]}"], notes)


def emit(model: ModelSpec, strat: Strategy, *, balance=None) -> str:
    words, notes = fields(model, strat, balance=balance)
    head = header(TARGET, model, strat) + [
        f"# torchtitan {VERSION}: a registered config with CLI overrides (torchtitan/config/manager.py)",
        "# note: ndplan check reads this launch with the engine of torchtitan's own modules "
        "(interop/torchtitan03.py SETTINGS: fused qkv, chunked loss, ...), not the engine above"] + [
        f"# note: {n}" for n in notes]
    nodes = max(1, strat.world // 8)
    launch = f"torchrun --nproc_per_node {strat.world // nodes} --nnodes {nodes} -m torchtitan.train"
    return "\n".join(head) + "\n" + launch + " \\\n    " + " \\\n    ".join(
        " ".join(shlex.quote(w) for w in words[i:i + 2]) if words[i].startswith("--") and words[i] != DISABLE_CUDA_GRAPHS
        else shlex.quote(words[i])
        for i in _pairs(words)) + "\n"


def _pairs(words: list[str]):
    """Start index of each flag-value pair (a subcommand word or a switch stands alone)."""
    i = 0
    while i < len(words):
        yield i
        i += 2 if words[i].startswith("--") and words[i] != DISABLE_CUDA_GRAPHS else 1
