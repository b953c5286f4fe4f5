"""A torchtitan 0.3 launch (``torchrun ... -m torchtitan.train --module M --config F
--section.field value ... activation_checkpoint:MODE``) -> model + Strategy: every value the
registered config sets that ndplan reads (export/torchtitan03.py ``REGISTERED``, each cited by its
config_registry.py line in ``from:``), torchtitan's generic defaults for the rest, and the
overrides on top, read as the TOML job config is (interop/torchtitan.py ``read_flat``).
torchtitan itself is not needed.

Options are those of torchtitan 0.3.0's tyro parser (``KNOWN``, ``SWITCHES``): ``--a.b value``,
``--a.b=value``, dashes or underscores, ``--a.switch`` / ``--a.no-switch``. One it does not have
(a typo, a key of a later torchtitan: ``NEWER``, or of the 0.2.x TOML job config) stops
torchtitan ("Unrecognized options"); ndplan lists it as unknown with a one-line note and does
not apply it. ``--loss.num_chunks`` sets the chunked loss, ``--optimizer.param_groups.0.
optimizer_name`` the optimizer (the registered configs' one AdamW group, ``default_adamw``).

The engine is the fsdp profile with torchtitan 0.3.0's module settings (trace/titan.py
``TITAN_SETTINGS``: one fused wqkv, a RoPE table per layer, sdpa without repeat_kv; the
CPU-only norm setting left out) and ChunkedLossWrapper's chunks (``loss_chunks``).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import replace
from pathlib import Path

from ndplan.errors import NdplanError
from ndplan.export import torchtitan03 as X
from ndplan.interop import launcher, shell
from ndplan.interop.base import CheckInput
from ndplan.interop.torchtitan import KEY, TITAN_OPTIMIZERS, read_flat
from ndplan.trace.titan import TITAN_SETTINGS

SETTINGS = {k: v for k, v in TITAN_SETTINGS.items() if k != "norm_input_bytes"}
"""norm_input_bytes 8 is torch's composite rms_norm on the CPU; CUDA runs the fused kernel."""


def detect(text: str) -> bool:
    return "torchtitan.train" in text


KNOWN = {
    "": ("trainer.py:70 Trainer.Config", "dump_folder hf_assets_path"),
    "activation_checkpoint": ("distributed/activation_checkpoint.py:121-307 (the subcommands' Config)",
                              "debug determinism_check force_recompute_mm_shapes_by_fqns memory_budget "
                              "preserve_rng_state visualize_memory_budget_pareto"),
    "checkpoint": ("components/checkpointer/dcp.py:115 CheckpointManager.Config",
                   "async_mode create_seed_checkpoint enable enable_first_step_checkpoint exclude_from_loading "
                   "export_dtype folder initial_load_in_hf initial_load_in_hf_quantized initial_load_model_only "
                   "initial_load_path interval keep_latest_k last_save_in_hf last_save_model_only load_only load_step"),
    "comm": ("config/configs.py:314 CommConfig", "init_timeout_seconds mode save_traces_file_prefix save_traces_folder "
                                                  "trace_buf_size train_timeout_seconds"),
    "compile": ("config/configs.py:291 CompileConfig", "backend components enable enable_async_tensor_parallel"),
    "dataloader": ("hf_datasets/text_datasets.py:246 HuggingFaceTextDataLoader.Config",
                   "dataset dataset_path infinite num_workers persistent_workers pin_memory prefetch_factor"),
    "debug": ("config/configs.py:352 DebugConfig",
              "batch_invariant detect_anomaly deterministic deterministic_warn_only enable_structured_logging "
              "moe_force_load_balance print_config save_config_file seed spmd_typechecking"),
    "loss": ("components/loss.py:609 ChunkedLossWrapper.Config", "num_chunks"),
    "loss.loss_fn": ("components/loss.py:342 CrossEntropyLoss.Config", "global_vocab_size"),
    "lr_scheduler": ("components/optimizer/lr_scheduler.py:51 LRSchedulersContainer.Config",
                     "decay_ratio decay_type min_lr_factor total_steps warmup_steps"),
    "metrics": ("components/metrics.py:278 MetricsProcessor.Config", "disable_color_printing enable_tensorboard "
                                                                      "enable_wandb log_freq save_for_all_ranks "
                                                                      "save_tb_folder"),
    "optimizer": ("components/optimizer/optimizer.py:103 OptimizersContainer.Config", "implementation"),
    "optimizer.param_groups.0": ("components/optimizer/optimizer.py:41 ParamGroupConfig", "optimizer_name pattern"),
    "optimizer.param_groups.0.optimizer_kwargs": ("components/optimizer/optimizer.py:390-396 default_adamw",
                                                  "betas eps lr weight_decay"),
    "override": ("config/override.py:61 OverrideConfig", "imports"),
    "parallelism": ("config/configs.py:112 ParallelismConfig",
                    "context_parallel_degree context_parallel_load_balancer context_parallel_ptrr_mask_key "
                    "data_parallel_replicate_degree data_parallel_shard_degree enable_fsdp_symm_mem "
                    "enable_sequence_parallel expert_parallel_degree fsdp_reshard_after_forward "
                    "module_fqns_per_model_part pipeline_parallel_degree pipeline_parallel_first_stage_less_layers "
                    "pipeline_parallel_last_stage_less_layers pipeline_parallel_layers_per_stage "
                    "pipeline_parallel_microbatch_size pipeline_parallel_schedule pipeline_parallel_schedule_csv "
                    "spmd_backend tensor_parallel_degree"),
    "profiler": ("tools/profiler.py:122 Profiler.Config",
                 "enable_memory_snapshot enable_profiling memory_snapshot_freq memory_snapshot_max_entries "
                 "profile_freq profiler_active profiler_repeat profiler_skip_first profiler_skip_first_wait "
                 "profiler_warmup save_memory_snapshot_folder save_traces_folder"),
    "training": ("config/configs.py:36 TrainingConfig", "disable_cuda_graphs dtype enable_cpu_offload gc_debug gc_freq "
                                                        "global_batch_size local_batch_size max_norm "
                                                        "mixed_precision_param mixed_precision_reduce seq_len steps"),
    "validator": ("components/validate.py:73 Validator.Config", "enable freq steps"),
    "validator.dataloader": ("hf_datasets/text_datasets.py:246 HuggingFaceTextDataLoader.Config",
                             "dataset dataset_path infinite num_workers persistent_workers pin_memory prefetch_factor"),
}
"""The ``--section.field`` options of torchtitan 0.3.0's ConfigManager (tyro over the registered
config's Trainer.Config; file:line of each section's dataclass under torchtitan/), the same for
every config of export/torchtitan03.py REGISTERED; the ``activation_checkpoint`` fields follow the
policy subcommand. tests/test_titan03_reader.py compares the list with torchtitan's own parser."""
SWITCHES = frozenset(
    "activation_checkpoint.debug activation_checkpoint.preserve_rng_state "
    "activation_checkpoint.visualize_memory_budget_pareto checkpoint.create_seed_checkpoint checkpoint.enable "
    "checkpoint.enable_first_step_checkpoint checkpoint.initial_load_in_hf checkpoint.initial_load_in_hf_quantized "
    "checkpoint.initial_load_model_only checkpoint.last_save_in_hf checkpoint.last_save_model_only "
    "checkpoint.load_only compile.enable compile.enable_async_tensor_parallel dataloader.infinite "
    "dataloader.persistent_workers dataloader.pin_memory debug.batch_invariant debug.detect_anomaly "
    "debug.deterministic debug.deterministic_warn_only debug.enable_structured_logging debug.moe_force_load_balance "
    "debug.print_config debug.spmd_typechecking metrics.disable_color_printing metrics.enable_tensorboard "
    "metrics.enable_wandb metrics.save_for_all_ranks parallelism.enable_fsdp_symm_mem "
    "parallelism.enable_sequence_parallel profiler.enable_memory_snapshot profiler.enable_profiling "
    "training.disable_cuda_graphs training.enable_cpu_offload training.gc_debug validator.dataloader.infinite "
    "validator.dataloader.persistent_workers validator.dataloader.pin_memory validator.enable".split())
"""The boolean fields: tyro takes ``--a.b`` (true) and ``--a.no-b`` (false), with no value word."""
BOOL_WORDS = ("true", "false", "0", "1", "yes", "no")
"""Words after a switch that mean to give it a value (tyro refuses them)."""
OPTIMIZER = "optimizer.param_groups.0.optimizer_name"
"""The optimizer of the registered configs' one parameter group (``default_adamw``)."""
OPTIONS = frozenset(f"{sec}.{f}" if sec else f for sec, (_, names) in KNOWN.items() for f in names.split())
NEWER = {
    "training.num_tokens_per_microbatch_per_dp_rank": (37, "training.local_batch_size x training.seq_len tokens"),
    "training.num_tokens_per_train_step": (43, "training.global_batch_size x training.seq_len tokens"),
    "training.max_context_length": (51, "training.seq_len"),
    "parallelism.num_pp_microbatches": (232, "training.local_batch_size / "
                                             "parallelism.pipeline_parallel_microbatch_size"),
}
"""Options of torchtitan after 0.3.0 (main b5bcd76c, config/configs.py line; "fold batch dim",
73aed7f6c) -> how 0.3.0 says the same."""
OLD = {KEY["ac_mode"]: "activation_checkpoint:MODE",
       KEY["ac_option"]: "activation_checkpoint:selective (op-level only)", KEY["etp"]: "none (0.3.0 has no expert TP)",
       KEY["model_name"]: "--module", KEY["model_flavor"]: "--config",
       KEY["split_points"]: KEY["layers_per_stage"], "training.batch_size": KEY["local_batch"],
       "model.converters": "a registered config that converts (llama3_405b: float8)",
       "optimizer.name": "--optimizer.param_groups.0.optimizer_name", "job.config_file": "--module/--config"}
"""Keys of the 0.2.x TOML job config (export/torchtitan.py KEY; pytorch/torchtitan v0.2.2
config/job_config.py) that 0.3.0 does not take -> its form."""
OLD_SECTIONS = {"job": "--module/--config", "model": "--module/--config", "profiling": "the --profiler.* options",
                "validation": "the --validator.* options", "float8": "a registered config that converts",
                "quantize": "a registered config that converts", "memory_estimation": "no such options",
                "fault_tolerance": "no such options", "experimental": "no such options"}
"""0.2.x JobConfig sections 0.3.0 has not (v0.2.2 job_config.py:1005-1023; ``float8`` before
``quantize``) -> 0.3.0's."""


def _value(v):
    if isinstance(v, bool):
        return v
    try:
        return int(v)
    except ValueError:
        return v


def _subcommand(t: str) -> str | None:
    """The policy of an ``activation_checkpoint:MODE`` word (tyro also takes ``activation-checkpoint:``)."""
    head, colon, mode = t.partition(":")
    return mode if colon and head.replace("-", "_") == X.SUBCOMMAND else None


def unknown_note(flag: str, key: str) -> str:
    """One line saying what ``--key`` is, for an option torchtitan 0.3.0 does not have."""
    refused = f"torchtitan {X.VERSION}'s parser stops at it (Unrecognized options); not applied"
    if key in NEWER:
        line, form = NEWER[key]
        return (f"{flag}: an option of torchtitan after {X.VERSION} (main b5bcd76c config/configs.py:{line}); "
                f"{refused}; {X.VERSION} says {form}")
    old = OLD.get(key) or OLD_SECTIONS.get(key.partition(".")[0])
    if old:
        return f"{flag}: a key of torchtitan 0.2.x's TOML job config, not {X.VERSION}'s; {refused}; {X.VERSION}: {old}"
    near = difflib.get_close_matches(key, sorted(OPTIONS), n=1, cutoff=0.8)
    return (f"{flag}: not an option of torchtitan {X.VERSION} (interop/torchtitan03.py KNOWN); {refused}"
            + (f"; did you mean --{near[0]}?" if near else ""))


def _overrides(words: list[shell.Word]) -> tuple[str, str, dict, dict, list]:
    """(module, config, dotted key -> value, dotted key -> 0-based line, [(flag, line, note)] of
    options torchtitan 0.3.0 does not have) after ``torchtitan.train``."""
    texts = [w.text for w in words]
    start = len(texts) - texts[::-1].index("torchtitan.train") if "torchtitan.train" in texts else 0  # the last launch
    module = config = None
    flat, lines, unknown = {}, {}, []
    i = start
    while i < len(words):
        t, line = words[i].text, words[i].line
        mode = _subcommand(t)
        if mode is not None:
            flat[KEY["ac_mode"]], lines[KEY["ac_mode"]] = mode, line
        elif t.startswith("--") and len(t) > 2:
            key, eq, inline = t[2:].partition("=")
            key = key.replace("-", "_")
            section, _, name = key.rpartition(".")
            negated = f"{section}.{name[3:]}" if section else name[3:]
            nxt = words[i + 1].text if i + 1 < len(words) else None
            switch = key if key in SWITCHES else negated if name.startswith("no_") and negated in SWITCHES else None
            if switch and (eq or str(nxt).lower() in BOOL_WORDS):  # tyro's switches take no value
                written = t if eq else f"{t} {nxt}"
                sec, _, field = switch.rpartition(".")
                unknown.append((written, line, f"{written}: a switch takes no value (write --{switch} or "
                                               f"--{sec}.no_{field}); torchtitan {X.VERSION}'s parser stops at the "
                                               "value (Unrecognized options); not applied"))
                i += 1 if eq else 2
                continue
            if key in SWITCHES:
                value = True
            elif switch:
                key, value = negated, False
            elif eq:
                value = inline
            elif nxt is None or nxt.startswith("--") or _subcommand(nxt) is not None:
                value = True  # a switch ndplan does not know
            else:
                value, i = nxt, i + 1
            if key == "module":
                module = value
            elif key == "config":
                config = value
            elif key in OPTIONS:
                flat[key], lines[key] = _value(value), line
            else:
                unknown.append((t, line, unknown_note(t.partition("=")[0], key)))
        i += 1
    return module, config, flat, lines, unknown


def _launched(words: list[shell.Word]) -> int | None:
    """torchrun's --nproc_per_node x --nnodes (1 by default), or None (interop.launcher)."""
    got = launcher.launched(words)
    return got[0] * got[1] if got else None


def read(path: Path, text: str, *, model=None, gpus=None, seq=None, gbs=None) -> CheckInput:
    words = shell.read_words(text, os.environ)
    toml = next((words[k + 1].text for k, w in enumerate(words[:-1]) if w.text in ("--job.config_file",
                                                                                   "--job.config-file")), None)
    module_less = not any(w.text.startswith("--module") for w in words)
    if toml is not None or module_less and any("CONFIG_FILE" in w.text or w.text.endswith(".toml") for w in words):
        raise NdplanError("FILE", path.name, "a torchtitan 0.2.x launcher: its job is the TOML file it passes "
                          f"(--job.config_file {toml or 'CONFIG_FILE'})", "ndplan check that TOML file instead")
    module, config, over, lines, unknown = _overrides(words)
    known_config = (module, config) in X.REGISTERED
    if not known_config and model is None:
        known = ", ".join(f"--module {m} --config {c}" for m, c in X.REGISTERED)
        raise NdplanError("--config", f"{module}/{config}", f"not a torchtitan {X.VERSION} config ndplan knows",
                          f"use one of {known}, or give -m MODEL (then torchtitan's defaults and the launch's "
                          "overrides are read, not the config's own values)")
    registered = dict(X.REGISTERED[(module, config)]) if known_config else {"flavor": (None, 0)}
    flavor = registered.pop("flavor")[0]
    where = f"torchtitan {X.VERSION} models/{module}/config_registry.py"
    given = {k: f"--config {config}: {k} ({where}:{line})" for k, (_, line) in registered.items()}
    flat = {KEY["model_name"]: module, KEY["model_flavor"]: flavor} | {k: v for k, (v, _) in registered.items()} | over
    if KEY["ac_mode"] in over and over[KEY["ac_mode"]] not in ("none", "full", "selective"):
        raise NdplanError(X.SUBCOMMAND, over[KEY["ac_mode"]], "not a policy ndplan models",
                          "use activation_checkpoint:none, :full or :selective")
    chunks = over.get("loss.num_chunks", X.LOSS_CHUNKS)
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise NdplanError("--loss.num_chunks", chunks, "not a whole number >= 1", "give the number of loss chunks")
    if OPTIMIZER in over:
        if over[OPTIMIZER] not in TITAN_OPTIMIZERS:
            raise NdplanError(f"--{OPTIMIZER}", over[OPTIMIZER], f"not an optimizer torchtitan {X.VERSION} "
                              "builds (components/optimizer/optimizer.py:143-147)",
                              f"give one of {', '.join(TITAN_OPTIMIZERS)}")
        flat["optimizer.name"] = over[OPTIMIZER]
    origin = None
    if gpus is None:
        gpus = _launched(words)
        origin = "torchrun --nproc_per_node x --nnodes" if gpus else None
    settings = SETTINGS | {"loss_chunks": chunks}
    tp = flat.get(KEY["tp"], 1)
    head = (f"torchtitan {X.VERSION} --module {module} --config {config}: its registered values with the overrides"
            if known_config else f"torchtitan --module {module} --config {config}, a config ndplan does not know: "
            f"torchtitan's defaults with the overrides, the model -m {getattr(model, 'name', model)} (the config's own "
            "values are not read)")
    notes = ([f"{head}; engine fsdp with torchtitan's modules ({', '.join(settings)})"]
             + (X.registered_notes(module, config, tp if isinstance(tp, int) else 1) if known_config else [])
             + [n for _, _, n in unknown])
    ci = read_flat(path, text, flat, model=model, gpus=gpus, seq=seq, gbs=gbs, settings=settings,
                   fmt="torchtitan-0.3", lines=lines, gpus_origin=origin, given=given,
                   unknown=dict.fromkeys(f for f, _, _ in unknown), notes=tuple(notes))
    refused = None if flat.get(X.NO_CUDA_GRAPHS) else X.cuda_graphs_refused(ci.model, ci.strategy)
    if refused:  # estimated as the launch with CUDA graphs off, which ndplan models (no graph pool)
        ci = replace(ci, notes=ci.notes + (f"torchtitan {X.VERSION} refuses this launch: {refused}; add "
                                           f"{X.DISABLE_CUDA_GRAPHS}",))
    return ci


fields = X.fields


def rewrite(ci: CheckInput, strat) -> str:
    """A proposal as a whole new launch (``check``'s diff is against it): the overrides
    spell out every value, so the launch does not depend on how the old one was written."""
    return X.emit(ci.model, strat)


def edit(text: str, changes: dict) -> str:
    raise NdplanError("--format", "torchtitan-0.3", "editing a torchtitan 0.3 launch is not supported",
                      "emit the proposal with --emit torchtitan-0.3")
