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

``REGISTRY`` is the registered config that builds each catalog model, and ``REGISTERED`` the
values it sets that ndplan reads (read off torchtitan 0.3.0's config functions, each with its
line, and checked against them: tests/test_titan03_reader.py). The emitted overrides restate
every degree, batch and policy, so what a registered config sets beyond them stays in force
(llama3_405b's float8 linears and compile, deepseek_v3's compiled loss; ``registered_notes``).
Not expressible here (NdplanError): uneven layers (a list of
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
    "llama3.1-405b": ("llama3", "llama3_405b"),
    "qwen3-0.6b": ("qwen3", "qwen3_0_6b"), "qwen3-1.7b": ("qwen3", "qwen3_1_7b"), "qwen3-14b": ("qwen3", "qwen3_14b"),
    "qwen3-32b": ("qwen3", "qwen3_32b"), "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b"),
    "deepseek-v2-lite": ("deepseek_v3", "deepseek_v3_16b"), "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"),
}
"""Catalog model -> (``--module``, ``--config``) of torchtitan 0.3.0's config_registry."""
_AC, _SEQ, _LOCAL, _TP, _EP = (T.KEY[k] for k in ("ac_mode", "seq", "local_batch", "tp", "ep"))
_SHARD, _CP, _PP, _SCHED = (T.KEY[k] for k in ("dp_shard", "cp", "pp", "schedule"))
COMPILE, COMPONENTS, ASYNC_TP, CONVERTERS = ("compile.enable", "compile.components",
                                             "compile.enable_async_tensor_parallel", "model.converters")
NO_CUDA_GRAPHS = "training.disable_cuda_graphs"
FLOAT8 = "float8"
"""``model.converters`` as the TOML reader names torchtitan's float8 linear converter (0.3.0:
``Float8LinearConverter.Config`` passed to ``model_registry``)."""
REGISTERED = {
    ("llama3", "llama3_8b"): {"flavor": ("8B", 185), _LOCAL: (1, 203), _SEQ: (8192, 204), _AC: ("selective", 211)},
    ("llama3", "llama3_70b"): {"flavor": ("70B", 258), _LOCAL: (8, 276), _SEQ: (8192, 277), _TP: (8, 284),
                               _AC: ("full", 287)},
    ("llama3", "llama3_405b"): {COMPILE: (True, 297), ASYNC_TP: (True, 298), "flavor": ("405B", 301),
                                CONVERTERS: ([FLOAT8], 302), _LOCAL: (2, 329), _SEQ: (8192, 330), _TP: (8, 337),
                                _AC: ("full", 340)},
    ("qwen3", "qwen3_0_6b"): {"flavor": ("0.6B", 177), _LOCAL: (4, 193), _SEQ: (4096, 194), _AC: ("selective", 202)},
    ("qwen3", "qwen3_1_7b"): {"flavor": ("1.7B", 207), _LOCAL: (4, 222), _SEQ: (4096, 223), _AC: ("selective", 231)},
    ("qwen3", "qwen3_14b"): {"flavor": ("14B", 261), _LOCAL: (4, 276), _SEQ: (4096, 277), _SHARD: (-1, 281),
                             _TP: (1, 282), _CP: (1, 283), _PP: (1, 284), _AC: ("full", 291)},
    ("qwen3", "qwen3_30b_a3b"): {"flavor": ("30B-A3B", 296), _LOCAL: (2, 311), _SEQ: (4096, 312), _SHARD: (-1, 316),
                                 _TP: (1, 317), _CP: (1, 318), _PP: (1, 319), _AC: ("full", 326)},
    ("qwen3", "qwen3_32b"): {"flavor": ("32B", 331), _LOCAL: (2, 346), _SEQ: (4096, 347), _SHARD: (-1, 351),
                             _TP: (1, 352), _CP: (1, 353), _PP: (1, 354), _AC: ("full", 361)},
    ("deepseek_v3", "deepseek_v3_16b"): {"flavor": ("16B", 139), _LOCAL: (4, 158), _SEQ: (4096, 159),
                                         NO_CUDA_GRAPHS: (True, 161), _SCHED: ("Interleaved1F1B", 164), _EP: (8, 165),
                                         _AC: ("selective", 168), COMPILE: (True, 169), COMPONENTS: (["loss"], 169)},
    ("deepseek_v3", "deepseek_v3_671b"): {"flavor": ("671B", 208), _LOCAL: (4, 230), _SEQ: (4096, 231),
                                          NO_CUDA_GRAPHS: (True, 233), _SCHED: ("Interleaved1F1B", 236),
                                          _EP: (2, 237), _AC: ("selective", 240), COMPILE: (True, 241),
                                          COMPONENTS: (["loss"], 241)},
}
"""Every value each registered config sets (torchtitan 0.3.0 models/<module>/config_registry.py)
among the keys ndplan reads, with its line there: the flavor given to ``model_registry``, the
``TrainingConfig`` / ``ParallelismConfig`` / ``CompileConfig`` arguments, the
activation-checkpoint policy (``SelectiveAC.Config()``: selective, ``FullAC.Config()``: full),
the float8 converter, and ``disable_cuda_graphs`` (``cuda_graphs_refused``). A key not here keeps
torchtitan's generic default (config/configs.py; interop/torchtitan.py ``DEFAULTS``). Each entry's
keys, values and lines are checked against the config function's source, and its values against
the built config (tests/test_titan03_reader.py)."""
LOSS_CHUNKS = 8
"""``ChunkedLossWrapper.Config.num_chunks`` (components/loss.py:610), the loss of every config here."""
CPU_UNBUILDABLE = {("llama3", "llama3_405b")}
"""Configs whose function raises on a machine without an SM89 GPU: llama3_405b builds
``Float8LinearConverter`` (components/quantization/float8.py:85-96)."""
BASE = {key: {"flavor": values["flavor"][0], "loss_chunks": LOSS_CHUNKS}
        | {k: v for k, (v, _) in values.items() if k in (_AC, _SEQ, _LOCAL, _TP, _EP)}
        for key, values in REGISTERED.items() if key not in CPU_UNBUILDABLE}
"""The part of REGISTERED that tests/test_recipes.py compares with the built configs (the model
flavor, the activation-checkpoint policy, training.seq_len / local_batch_size, the TP and EP
degrees, ChunkedLossWrapper's chunks), without the configs that cannot be built on the CPU."""


def registered_notes(module: str, config: str, tp: int) -> list[str]:
    """What the registered config sets that ndplan's estimate does not follow (float8 GEMMs,
    async TP); the reader and the emitter say it."""
    got, where = REGISTERED[(module, config)], f"models/{module}/config_registry.py"
    notes = []
    if CONVERTERS in got:
        notes.append(f"--config {config} trains the linears in float8 ({where}:{got[CONVERTERS][1]}: "
                     "Float8LinearConverter, rowwise, lm_head left bf16), which no command-line option turns off "
                     "(Trainer.Config.model_spec is tyro.conf.Suppress, trainer.py:77): memory as bf16, as the TOML "
                     "form's float8 converter without the float8 all-gather (Float8Linear saves its bf16 input and "
                     "weight; 0.3.0 has no enable_fsdp_float8_all_gather); check on this launch times the GEMMs at "
                     "the FP8 peak (engine setting fp8_gemm_compute)")
    if got.get(ASYNC_TP, (False,))[0] and tp > 1:
        notes.append(f"--config {config} sets {ASYNC_TP} ({where}:{got[ASYNC_TP][1]}): torchtitan overlaps the TP "
                     "collectives with the GEMMs; ndplan's estimate leaves them exposed")
    return notes


def cuda_graphs_refused(model: ModelSpec, strat: Strategy) -> str | None:
    """Why torchtitan 0.3.0 refuses to start ``strat`` with CUDA graphs on (its default,
    config/configs.py:66), or None: ``Trainer.Config._validate_cuda_graphs`` (trainer.py:179-208)
    raises with a pipeline, and with expert parallelism over a dispatcher that synchronizes with
    the host (every MoE config of REGISTRY: the standard all-to-all one)."""
    if strat.pp > 1:
        return "CUDA graphs do not support pipeline parallelism yet (trainer.py:183-187)"
    if model.is_moe and strat.ep > 1:
        return ("CUDA graphs support only expert parallel token dispatchers without CPU synchronization "
                "(trainer.py:189-208)")
    return None


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
        raise cannot(TARGET, "layers_per_stage", strat.layers_per_stage, "torchtitan's own split (first/last_stage_"
                     "less_layers) does not give these layers and a launch cannot list module_fqns_per_model_part; "
                     "use first and last stages no larger than the rest, or the 0.2.x TOML form (--emit torchtitan)")
    if doc.get(T.KEY["ac_option"], "op") != "op":
        raise cannot(TARGET, "recompute_layers", strat.recompute_layers, f"torchtitan {VERSION} has no per-layer SAC; "
                                                                          "recompute every layer or none")
    if model.is_moe and strat.ep > 1 and strat.etp != 1:  # with ep 1 the experts are over tp (T._check)
        raise cannot(TARGET, "etp", strat.etp, f"torchtitan {VERSION} has no expert_tensor_parallel_degree (0.2.x's): "
                                               "with expert parallelism the experts are not split over tp; use etp=1")
    doc.pop(T.KEY["etp"], None)
    if doc.get(T.KEY["offload"]):
        raise cannot(TARGET, "offload_optimizer", True, "not expressed in this form; use --emit torchtitan")
    module, config = REGISTRY[model.name]
    notes += registered_notes(module, config, strat.tp)
    switches = [DISABLE_CUDA_GRAPHS] if cuda_graphs_refused(model, strat) else []
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
