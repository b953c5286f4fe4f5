"""torchtitan job config TOML (``--emit torchtitan``), the form of torchtitan 0.2.x
(v0.2.0 .. v0.2.2 read ``--job.config_file X.toml``; 0.3 replaced it by Python configs).

Key names are those of pytorch/torchtitan:torchtitan/config/job_config.py
(``Parallelism``: ``data_parallel_replicate_degree``, ``data_parallel_shard_degree``,
``fsdp_reshard_after_forward``, ``tensor_parallel_degree``, ``context_parallel_degree``,
``pipeline_parallel_degree``, ``pipeline_parallel_schedule``,
``pipeline_parallel_microbatch_size``, ``pipeline_parallel_layers_per_stage``,
``pipeline_parallel_first/last_stage_less_layers`` (written 0, so that torchtitan's split
is ndplan's: ``titan_split``), ``module_fqns_per_model_part`` (uneven layers),
``expert_parallel_degree``,
``expert_tensor_parallel_degree`` (1 or tp only); ``Training``: ``local_batch_size``
(was ``batch_size`` in older versions), ``global_batch_size``, ``seq_len``,
``enable_cpu_offload``; ``ActivationCheckpoint``: ``mode`` none|selective|full,
``selective_ac_option``). Schedule names are the classes registered in
pytorch/pytorch:torch/distributed/pipelining/schedules.py (``get_schedule_class``):
gpipe -> GPipe, 1f1b -> 1F1B, interleaved -> Interleaved1F1B, zbv -> ZBVZeroBubble, dualpipev ->
DualPipeV (torch 2.13 ScheduleDualPipeV; dualpipe is refused: no torch pipelining class);
zb-h1 (one chunk per stage) has no torch schedule (NdplanError).

Data-parallel mapping (FSDP2 shards over ``dp_shard``; HSDP = replicate x shard):
zero 0 -> DDP, ``data_parallel_replicate_degree = dp`` (torchtitan 0.2.x runs DDP only
without other parallelism, so tp/pp/cp must be 1; 0.3 has no DDP path and replicates through
``fully_shard`` on a (dp_replicate, fsdp) mesh of shard degree 1, with any other degree:
export/torchtitan03.py); zero 1 and 2 -> FSDP2 over dp with
``fsdp_reshard_after_forward = "never"`` (weights stay gathered from forward to
backward; gradients and optimizer states sharded: ZeRO-2; FSDP2 has no optimizer-only
sharding, so zero 1 is given as ZeRO-2); zero 3 -> FSDP2 with ``"always"``. ndplan's dp
is never split into replicas x shards, so HSDP is not emitted.

Batch: without pp, ``local_batch_size = mbs`` and torchtitan accumulates
global / (local x dp) = m micro-batches; with pp, ``local_batch_size = gbs/dp`` split
into m pipeline micro-batches of ``pipeline_parallel_microbatch_size = mbs``.

torchtitan applies one activation-checkpoint mode to every layer: a per-layer count
(``recompute_layers`` or a PPB plan) is given as the deepest mode used, with a comment.
"""

from __future__ import annotations

import json

from ndplan.catalog.model import ModelSpec
from ndplan.export.common import cannot, layers_per_chunk, header, nest, recompute_counts, recompute_mode, \
    refuse_engine_rules
from ndplan.strategy import Strategy

TARGET = "torchtitan"
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zbv": "ZBVZeroBubble",
             "dualpipev": "DualPipeV"}
RESHARD = {1: "never", 2: "never", 3: "always"}
"""zero stage -> fsdp_reshard_after_forward."""
KEY = {"dp_replicate": "parallelism.data_parallel_replicate_degree",
       "dp_shard": "parallelism.data_parallel_shard_degree", "reshard": "parallelism.fsdp_reshard_after_forward",
       "tp": "parallelism.tensor_parallel_degree", "cp": "parallelism.context_parallel_degree",
       "pp": "parallelism.pipeline_parallel_degree", "schedule": "parallelism.pipeline_parallel_schedule",
       "mbs": "parallelism.pipeline_parallel_microbatch_size",
       "layers_per_stage": "parallelism.pipeline_parallel_layers_per_stage",
       "split_points": "parallelism.pipeline_parallel_split_points",
       "ep": "parallelism.expert_parallel_degree", "etp": "parallelism.expert_tensor_parallel_degree",
       "local_batch": "training.local_batch_size", "gbs": "training.global_batch_size", "seq": "training.seq_len",
       "param_dtype": "training.mixed_precision_param", "offload": "training.enable_cpu_offload",
       "ac_mode": "activation_checkpoint.mode", "ac_option": "activation_checkpoint.selective_ac_option",
       "model_name": "model.name", "model_flavor": "model.flavor",
       "first_less": "parallelism.pipeline_parallel_first_stage_less_layers",
       "last_less": "parallelism.pipeline_parallel_last_stage_less_layers",
       "fqns": "parallelism.module_fqns_per_model_part"}
"""Strategy knob -> dotted TOML key: the one table the exporter and the reader
(interop/torchtitan.py) use."""


FLAVORS = {
    ("llama3", "1B"): "llama3.2-1b", ("llama3", "3B"): "llama3.2-3b", ("llama3", "8B"): "llama3.1-8b",
    ("llama3", "70B"): "llama3.1-70b", ("llama3", "405B"): "llama3.1-405b",
    ("qwen3", "0.6B"): "qwen3-0.6b", ("qwen3", "1.7B"): "qwen3-1.7b", ("qwen3", "4B"): "qwen3-4b",
    ("qwen3", "8B"): "qwen3-8b", ("qwen3", "14B"): "qwen3-14b", ("qwen3", "32B"): "qwen3-32b",
    ("qwen3", "30B-A3B"): "qwen3-30b-a3b", ("qwen3", "235B-A22B"): "qwen3-235b-a22b",
    ("deepseek_v3", "16B"): "deepseek-v2-lite", ("deepseek_v3", "236B"): "deepseek-v2",
    ("deepseek_v3", "671B"): "deepseek-v3",
    ("llama4", "17bx16e"): "llama4-scout", ("llama4", "17bx128e"): "llama4-maverick",
}
"""torchtitan ([model] name, flavor) -> catalog model. The flavors of torchtitan v0.2.0 and
0.3.0 for the catalog's families (models/<name>/__init__.py ``*_args`` / ``*_configs``; 1B
and 3B are 0.3.0's, llama4 is 0.2.x's only: removed by d92336fee). Each 0.3.0 flavor's
torchtitan-built parameter count equals the catalog model's Hugging Face count
(tests/test_recipes.py); llama3 8B/70B/405B are Llama 3.1's (hf_assets_path
Llama-3.1-*), deepseek_v3 16B and 236B DeepSeek-V2-Lite's and DeepSeek-V2's
architectures."""
_TITAN = "pytorch/torchtitan"
_V020, _V021 = "v0.2.0@29624e37", "v0.2.1@81af8833"
_LLAMA3_ATTN = {
    "8B_flex": ("flex", "models/llama3/__init__.py:60-70"),
    "8B_varlen": ("varlen", "models/llama3/__init__.py:71-81"),
}
_LLAMA4_IROPE = {"17bx16e_irope": ("17bx16e", "models/llama4/__init__.py:73-88"),
                 "17bx128e_irope": ("17bx128e", "models/llama4/__init__.py:89-100")}
FLAVOR_VARIANTS: dict[tuple[str, str], tuple[str, str]] = {
    **{("llama3", f): (FLAVORS[("llama3", "8B")],
                       f"llama3/{f} is 8B with attn_type \"{kind}\" and attn_mask_type \"block_causal\" ({_TITAN} "
                       f"{_V021}, also v0.2.2: torchtitan/{where}): estimated as 8B's causal attention; not modelled: "
                       f"the {'FlexAttention' if kind == 'flex' else 'varlen (packed-document)'} kernel and the "
                       "per-document mask (attention FLOPs are counted over the whole causal triangle; the saved "
                       "attention tensors are taken as flash attention's: output and log-sum-exp)")
       for f, (kind, where) in _LLAMA3_ATTN.items()},
    **{("llama4", f): (FLAVORS[("llama4", base)],
                       f"llama4/{f} is {base} with every_n_layers_nope=4 and FlexAttention under a block_causal mask "
                       f"({_TITAN} {_V020}, also v0.2.1/v0.2.2: torchtitan/{where}): every 4th layer has no RoPE "
                       "and the "
                       "other layers attend only within blocks of fixed_attn_block_size = 8192 tokens "
                       "(models/llama4/model/args.py:49-57); estimated as the full causal attention of every layer; "
                       "not modelled: the chunked attention (its FLOPs are over-counted past 8192 tokens) and the "
                       "flex kernel (saved attention tensors taken as flash attention's)")
       for f, (base, where) in _LLAMA4_IROPE.items()},
}
"""torchtitan 0.2.x flavors that differ from a FLAVORS entry only in how attention is computed
(same parameters): ([model] name, flavor) -> (catalog model, the note saying what is not
modelled). Read, never emitted (the emit writes the FLAVORS entry)."""
for _f in ("8B", "8B_flex", "8B_varlen", "70B", "405B"):
    _model, _why = FLAVOR_VARIANTS.get(("llama3", _f), (FLAVORS.get(("llama3", _f)), ""))
    FLAVOR_VARIANTS[("llama3_ft", _f)] = (
        _model, (_why + "; " if _why else "")
        + f"llama3_ft/{_f} is llama3's model (torchtitan/models/llama3_ft/__init__.py reuses llama3_args, {_TITAN} "
        f"{_V020}..v0.2.2) under torchft's FaultTolerantTrainSpec: the [fault_tolerance] replica groups and the "
        "semi-sync (DiLoCo) fragments' extra parameter copies are not modelled")
DEBUG_FLAVORS = {("llama3", "debugmodel"), ("llama3", "debugmodel_flex_attn"), ("llama3", "debugmodel_varlen_attn"),
                 ("llama3_ft", "debugmodel"), ("llama3_ft", "debugmodel_flex_attn"),
                 ("llama3_ft", "debugmodel_varlen_attn"), ("llama4", "debugmodel"), ("llama4", "debugmodel_irope"),
                 ("qwen3", "debugmodel"), ("qwen3", "debugmodel_moe"), ("deepseek_v3", "debugmodel"),
                 ("deepseek_v3", "debugmodel_flex_attn")}
"""The remaining 0.2.x flavors of these families: torchtitan's test models (dim 256, 6 layers,
vocabulary 2048 for llama3/llama4; models/<name>/__init__.py at v0.2.0..v0.2.2), not catalog
models: check asks for -m (a model YAML of their sizes)."""
CATALOG_FLAVOR = {v: k for k, v in FLAVORS.items()} | {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B")}
"""Catalog model -> the flavor that builds it (Llama 3 8B/70B have Llama 3.1's architecture)."""
LESS_LAYERS_DEFAULT = 1
"""``pipeline_parallel_first/last_stage_less_layers`` default (config/job_config.py L335/341 at
v0.2.0; config/configs.py L191/197 in 0.3.0): the embedding and the output count as a layer."""
OUTPUT_FQNS = {"0.2": ["norm", "output"], "0.3": ["norm", "lm_head"]}
"""The modules after the last decoder layer (v0.2.0 ``generate_llm_fqn_per_model_part``: "output";
0.3.0 ``_generate_llm_fqn_per_model_part``: "lm_head")."""
TARGET_VERSION = "0.2"
"""The TOML job config is torchtitan 0.2.x's (v0.2.0 .. v0.2.2); 0.3 reads Python configs."""


def titan_split(layers: int, stages: int, first_less: int = LESS_LAYERS_DEFAULT,
                last_less: int = LESS_LAYERS_DEFAULT) -> list[int]:
    """Decoder layers per pipeline stage as torchtitan assigns them (v0.2.0
    distributed/pipeline_parallel.py ``generate_llm_fqn_per_model_part`` L226-330; 0.3.0
    ``_generate_llm_fqn_per_model_part``): the embedding counts ``first_less`` layers and the
    output ``last_less``; (layers + both) // stages each, the first (layers + both) % stages
    stages one more, the first and last stage less their weight; ValueError as torchtitan raises."""
    if stages == 1:
        return [layers]
    effective = layers + first_less + last_less
    base, extra = divmod(effective, stages)
    if stages > effective or base == 0 or first_less > base or last_less > base:
        raise ValueError(f"{stages} stages over {layers} layers + {first_less} + {last_less}: torchtitan refuses")
    out, left = [], layers
    for i in range(stages):
        n = base + (1 if i < extra else 0) - (first_less if i == 0 else last_less if i == stages - 1 else 0)
        n = min(max(n, 0), left)
        out.append(n)
        left -= n
    return out


def less_layers(layers: list[int]) -> tuple[int, int, int] | None:
    """(first_less, last_less, pipeline_parallel_layers_per_stage) for which torchtitan's split of sum(layers) over len(layers)
    stages (``titan_split``) is ``layers``, with pipeline_parallel_layers_per_stage giving the
    same stage count (``stage_count``); the smallest such pair, or None (then the stages are
    written as module_fqns_per_model_part)."""
    total, n = sum(layers), len(layers)
    for first_less in range(max(layers) + 1):
        for last_less in range(max(layers) + 1):
            try:
                split = titan_split(total, n, first_less, last_less)
            except ValueError:
                continue
            per = -(-(total + first_less + last_less) // n)
            if split == layers and stage_count(total, per, first_less, last_less) == n:
                return first_less, last_less, per
    return None


def stage_count(layers: int, per_stage: int, first_less: int = LESS_LAYERS_DEFAULT,
                last_less: int = LESS_LAYERS_DEFAULT) -> int:
    """ceil((layers + first_less + last_less) / pipeline_parallel_layers_per_stage)
    (``_get_pipeline_metadata`` / v0.2.0 ``pipeline_llm`` L41-113)."""
    return -(-(layers + first_less + last_less) // per_stage)


def fqns(layers: list[int], version: str = TARGET_VERSION) -> list[list[str]]:
    """``module_fqns_per_model_part`` of decoder ``layers`` per stage: the embedding first,
    the norm and output last."""
    out, k = [], 0
    for i, n in enumerate(layers):
        part = (["tok_embeddings"] if i == 0 else []) + [f"layers.{j}" for j in range(k, k + n)]
        out.append(part + (OUTPUT_FQNS[version] if i == len(layers) - 1 else []))
        k += n
    return out


def layer_sac_count(layers: int, every: int) -> int:
    """Decoder layers of one rank that torchtitan's per-layer SAC (``mode = "selective"``,
    ``selective_ac_option = "N"``) wraps in full activation checkpointing: one per-process
    counter over the rank's blocks, incremented before the test, wraps a block when
    count % N == 0, so blocks N, 2N, ... (1-based) of the rank, floor(layers / N) of them; N = 0
    or 1 wraps every block (models/llama3/infra/parallelize.py _apply_ac_to_transformer_block,
    6fc499f6 lines 323-331)."""
    return layers if every <= 1 else layers // every


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    return "[" + ", ".join(_value(x) for x in v) + "]"


def _toml(sections: dict[str, dict]) -> list[str]:
    lines = []
    for name, table in sections.items():
        lines += ["", f"[{name}]"] + [f"{k} = {_value(v)}" for k, v in table.items()]
    return lines


OFFLOAD_SETTINGS = {"weights_offloaded": 1, "grads_offloaded": 1}
"""``training.enable_cpu_offload``: FSDP2's CPUOffloadPolicy (v0.2.2 job_config.py:270-273,
parallelize.py:315-317) keeps the sharded parameters, gradients and optimizer states on the host:
these engine settings with Strategy.offload_optimizer; the export writes the key only with all three."""


def _check(model: ModelSpec, s: Strategy, ddp: bool) -> None:
    """What torchtitan refuses; ``ddp``: the version has a DDP path that runs alone (0.2.x)."""
    from ndplan import rules
    # torch pipelining's schedules; the routed experts' tp (etp = tp when ep is 1, else 1 or tp)
    refuse_engine_rules(TARGET, rules.WithModel(s, model, engine="fsdp"), ("schedule", "etp"))
    if s.pp > 1 and s.schedule not in SCHEDULES:  # dualpipe: DeepSeek's library, not torch pipelining
        raise cannot(TARGET, "schedule", s.schedule, "torch.distributed.pipelining (torchtitan's schedules) has "
                     "DualPipeV but not the two-direction DualPipe (github.com/deepseek-ai/DualPipe wraps the "
                     "modules itself); use --schedule dualpipev")
    if ddp and s.zero == 0 and s.dp > 1 and (s.tp > 1 or s.pp > 1 or s.cp > 1):
        raise cannot(TARGET, "zero", 0, "torchtitan runs DDP only without tp/pp/cp; use zero>=1 (FSDP2)")


def fields(model: ModelSpec, strat: Strategy, *, balance=None, ddp: bool = True) -> tuple[dict, list[str]]:
    """(dotted key -> value; notes) expressing ``strat``; ``ddp``: zero 0 is torchtitan 0.2.x's DDP,
    which runs without tp/pp/cp (torchtitan 0.3 replicates through fully_shard instead)."""
    s = strat
    _check(model, s, ddp)
    layers = layers_per_chunk(model, s, balance)
    full, sel = recompute_counts(model, s, balance)
    doc = {}
    if model.name in CATALOG_FLAVOR:
        doc |= dict(zip((KEY["model_name"], KEY["model_flavor"]), CATALOG_FLAVOR[model.name]))
    doc |= {KEY["dp_replicate"]: s.dp if s.zero == 0 else 1, KEY["dp_shard"]: 1 if s.zero == 0 else s.dp}
    if s.zero:
        doc[KEY["reshard"]] = RESHARD[s.zero]
    doc |= {KEY["tp"]: s.tp, KEY["cp"]: s.cp, KEY["pp"]: s.pp}
    notes = []
    if s.pp > 1:
        doc |= {KEY["schedule"]: SCHEDULES[s.schedule], KEY["mbs"]: s.mbs}
        less = less_layers(list(layers))
        if less is not None:  # torchtitan's own split gives ndplan's (titan_split)
            first_less, last_less, per = less
            doc |= {KEY["first_less"]: first_less, KEY["last_less"]: last_less, KEY["layers_per_stage"]: per}
        else:
            doc |= {KEY["first_less"]: 0, KEY["last_less"]: 0, KEY["fqns"]: fqns(layers)}
    if model.is_moe:
        doc |= {KEY["ep"]: s.ep, KEY["etp"]: s.etp}
    if s.zero == 1 and s.dp > 1:
        notes.append("zero 1 is given as FSDP2 without resharding after forward (ZeRO-2: gradients sharded too)")
    if s.tp > 1 and not s.sp:
        notes.append("torchtitan's tensor parallelism always shards norms/dropout on the sequence (sp on)")
    doc |= {KEY["local_batch"]: s.gbs // s.dp if s.pp > 1 else s.mbs, KEY["gbs"]: s.gbs, KEY["seq"]: s.seq,
            KEY["param_dtype"]: "bfloat16"}
    if s.offload_optimizer:
        from ndplan.engines import profile
        eng = profile(s.engine)
        if not all(getattr(eng, k) for k in OFFLOAD_SETTINGS):
            raise cannot(TARGET, "offload_optimizer", True, "torchtitan's enable_cpu_offload (FSDP2 CPUOffloadPolicy) "
                         "moves the parameters and gradients to the host too; estimate that with --set "
                         + " --set ".join(f"{k}=1" for k in OFFLOAD_SETTINGS))
        doc[KEY["offload"]] = True
        notes.append("enable_cpu_offload: the host optimizer step and the host-device copies are not in the step time")
    mode = recompute_mode(full, sel)
    doc[KEY["ac_mode"]] = mode
    if mode == "selective":
        doc[KEY["ac_option"]] = "op"
    used = full if mode == "full" else sel
    every = _layer_sac_every(full, sel, layers, s.vpp)
    if every:
        doc |= {KEY["ac_mode"]: "selective", KEY["ac_option"]: str(every)}
        notes.append(f"full recompute of {full[0]} of {layers[0]} layers per chunk as torchtitan's per-layer SAC: "
                     f"every {every}-th block of a rank checkpointed (the same activation total)")
    elif mode != "none" and any(u < n for u, n in zip(used, layers)):
        notes.append(f"{mode} recompute of {list(used)} layers per virtual stage; torchtitan applies "
                     f"mode {mode!r} to every layer")
    return doc, notes


def _layer_sac_every(full, sel, layers, vpp: int) -> int:
    """N where per-layer SAC every N (layer_sac_count) wraps exactly the fully recomputed layers:
    every chunk the same k of n layers, 0 < k < n, none selective; 0 when it cannot."""
    k, n = full[0], layers[0]
    if max(sel) or len(set(full)) > 1 or len(set(layers)) > 1 or not 0 < k < n:
        return 0
    every = n // k
    return every if layer_sac_count(vpp * n, every) == vpp * k else 0


def emit(model: ModelSpec, strat: Strategy, *, balance=None) -> str:
    doc, notes = fields(model, strat, balance=balance)
    head = header(TARGET, model, strat) + [
        f"# torchtitan {TARGET_VERSION}.x job config (--job.config_file); torchtitan 0.3 takes Python configs with "
        "CLI overrides instead"] + [f"# note: {n}" for n in notes]
    return "\n".join(head + _toml(nest(doc))) + "\n"
