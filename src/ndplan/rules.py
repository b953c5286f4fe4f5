"""Validity rules of a parallel strategy, written once.

``Strategy`` (one point, raising NdplanError), the space generator (numpy arrays of
candidates, counting each rejected candidate under the first rule it fails) and PPB's
``Pipeline`` (the schedule rules) all evaluate this table. A rule reads the attributes
it needs from a context: a Strategy (plus ``model`` and ``gpus`` for the model rules),
space._Ctx (int64 arrays of degrees, the categorical knobs as scalars) or a Pipeline;
``fails`` works on scalars and arrays alike, ``problem`` and ``fix`` are read at one
failing point.

Scopes: ``strategy`` rules read only strategy fields (Strategy.__post_init__);
``schedule`` rules read pp, vpp, m and schedule (also PPB's Pipeline); ``model`` rules
need the model and the device count (Strategy.check); ``engine`` rules are what the
strategy's engine can run (they read ``engine``; Strategy.__post_init__), ``engine_model``
rules those that read the model too (Strategy.check); the exporters refuse what their
framework's engine rules refuse (export/common.refuse_engine_rules); ``canonical`` rules keep one of
several equivalent points (the space generator only). ``group`` is the name the space
generator counts rejections under (``sweep --json``'s ``rejected_by_rule``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ndplan.errors import NdplanError
from ndplan.vocab import BIDIRECTIONAL_SCHEDULES, ONE_CHUNK_SCHEDULES, OVERLAPPED_PAIR_SCHEDULES, TWO_CHUNK_SCHEDULES


@dataclass(frozen=True)
class Rule:
    group: str
    """Rejection counter of the space generator (several rules may share one)."""
    text: str
    """One-line statement of the rule (``sweep --help``)."""
    scope: str
    """strategy | schedule | model | engine | engine_model | canonical (module docstring)."""
    field: str | Callable[[Any], str]
    """The field the error names (a function of the context where it depends on it)."""
    fails: Callable[[Any], Any]
    value: Callable[[Any], Any]
    problem: Callable[[Any], str]
    fix: Callable[[Any], str]
    static: bool = False
    """Reads no categorical knob (vpp, schedule, sp): the space computes its mask once per sweep."""
    reads_zero: bool = False
    """Reads the ZeRO level (the space evaluates it per level, after the other rules)."""

    def error(self, c) -> NdplanError:
        return NdplanError(field_of(self, c), self.value(c), self.problem(c), self.fix(c))


def field_of(rule: Rule, c) -> str:
    return rule.field(c) if callable(rule.field) else rule.field


def _split_given(c):
    """A layer split is given: a Strategy's layers_per_stage, or (space._Ctx) the rows of an
    uneven layout (its ``uneven`` bool array)."""
    uneven = getattr(c, "uneven", None)
    return np.asarray(c.layers_per_stage is not None if uneven is None else uneven, dtype=bool)


def _slices(c):
    """Model slices of the layer split (layouts.slices): pp*vpp, pp under dualpipe."""
    return c.pp if c.schedule in BIDIRECTIONAL_SCHEDULES else c.pp * c.vpp


def _slices_text(c) -> str:
    return f"pp={c.pp} slices (dualpipe)" if c.schedule in BIDIRECTIONAL_SCHEDULES else f"pp*vpp={c.pp * c.vpp}"


def engine_name(engine: str) -> str:
    """The engine profile's name without its settings (``deepspeed[zero3_param_coordinator=0]``)."""
    return engine.partition("[")[0]


def _profile(engine: str):
    from ndplan.engines import profile
    return profile(engine)


def _autoep_refused(c):
    from ndplan.autoep import autoep_refused
    return autoep_refused(c)


def _autoep_why(c) -> tuple[str, str]:
    from ndplan.autoep import autoep_why
    return autoep_why(c)


def _megatron_fsdp2(c) -> bool:
    """The megatron engine without Megatron-FSDP: zero 3 is torch FSDP2 (the rules below)."""
    if engine_name(c.engine) != "megatron":
        return False
    eng = _profile(c.engine)
    return not (eng.megatron_fsdp or eng.megatron_deepspeed)


def _experts_dense(c):
    return (not c.model.is_moe) & ((c.ep != 1) | (c.etp != 1))


RULES: tuple[Rule, ...] = (
    Rule("world", "dp*tp*pp*cp == gpus", "model", "gpus",
         lambda c: c.gpus is not None and c.dp * c.tp * c.pp * c.cp != c.gpus,
         lambda c: c.gpus,
         lambda c: f"dp*tp*pp*cp = {c.dp}*{c.tp}*{c.pp}*{c.cp} = {c.dp * c.tp * c.pp * c.cp}",
         lambda c: "change a degree or --gpus so they match", static=True),
    Rule("batch", "gbs % (dp*mbs) == 0", "strategy", "gbs",
         lambda c: c.gbs % (c.dp * c.mbs) != 0,
         lambda c: c.gbs,
         lambda c: f"not a multiple of dp*mbs = {c.dp}*{c.mbs} = {c.dp * c.mbs}",
         lambda c: f"give a multiple of {c.dp * c.mbs}, or change dp or mbs", static=True),
    Rule("seq", "seq % cp == 0", "strategy", "seq",
         lambda c: c.seq % c.cp != 0,
         lambda c: c.seq,
         lambda c: f"not divisible by cp={c.cp}",
         lambda c: "change seq or cp", static=True),
    # Megatron-core parallel_state.initialize_model_parallel: "pipeline-model-parallel size
    # should be greater than 1 with interleaved schedule" (RuntimeError)
    Rule("schedule", "vpp > 1 needs pp > 1", "schedule", "vpp",
         lambda c: (c.vpp > 1) & (c.pp == 1),
         lambda c: c.vpp,
         lambda c: "virtual chunks need a pipeline (pp=1)",
         lambda c: "set --pp 2 or more, or --vpp 1"),
    Rule("schedule", "gpipe, 1f1b, zb-h1: vpp == 1", "schedule", "vpp",
         lambda c: (c.schedule in ONE_CHUNK_SCHEDULES) & (c.vpp != 1),
         lambda c: c.vpp,
         lambda c: f"schedule {c.schedule} has one chunk per stage",
         lambda c: "use --schedule interleaved, or vpp=1"),
    Rule("schedule", "interleaved: vpp >= 2", "schedule", "vpp",
         lambda c: (c.schedule == "interleaved") & (c.pp > 1) & (c.vpp < 2),
         lambda c: c.vpp,
         lambda c: "the interleaved schedule needs vpp >= 2",
         lambda c: "set --vpp 2 or more"),
    Rule("schedule", "zbv, dualpipe, dualpipev: vpp == 2", "schedule", "vpp",
         lambda c: (c.schedule in TWO_CHUNK_SCHEDULES) & (c.vpp != 2),
         lambda c: c.vpp,
         lambda c: f"{c.schedule} places two chunks per stage"
                   + (" (one of each model copy)" if c.schedule in BIDIRECTIONAL_SCHEDULES else " (a V)"),
         lambda c: "set --vpp 2"),
    # DualPipe (deepseek-ai/DualPipe@3da1bbe dualpipe.py:332-333): "assert num_ranks % 2 == 0";
    # "num_chunks > 0 and num_chunks % 2 == 0 and num_chunks >= num_ranks * 2" (half the
    # micro-batches enter at each end); DualPipeV (dualpipev.py:318) num_chunks >= num_ranks * 2, as
    # torch's ScheduleDualPipeV (n_microbatches >= stages = 2 x ranks; schedules.py:3439-3443, torch 2.13)
    Rule("schedule", "dualpipe: pp even", "schedule", "pp",
         lambda c: (c.schedule == "dualpipe") & (c.pp % 2 != 0),
         lambda c: c.pp,
         lambda c: "DualPipe pairs stage i with stage pp-1-i (deepseek-ai/DualPipe asserts an even rank count)",
         lambda c: "give an even --pp"),
    Rule("schedule", "dualpipe, dualpipev: m >= 2*pp (dualpipe: m even)", "schedule",
         lambda c: "gbs" if hasattr(c, "gbs") else "m",
         lambda c: (c.schedule in OVERLAPPED_PAIR_SCHEDULES) & (c.pp > 1)
         & ((c.m < 2 * c.pp) | ((c.schedule == "dualpipe") & (c.m % 2 != 0))),
         lambda c: c.gbs if hasattr(c, "gbs") else c.m,
         lambda c: f"{c.schedule} needs micro-batches m={c.m} >= 2*pp = {2 * c.pp}"
                   + (", even (half enter at each end)" if c.schedule == "dualpipe" else "")
                   + " (deepseek-ai/DualPipe; torch ScheduleDualPipeV)",
         lambda c: "raise gbs, or lower mbs or dp" if hasattr(c, "gbs")
                   else f"give {'an even ' if c.schedule == 'dualpipe' else ''}--m of {2 * c.pp} or more"),
    # Megatron-core forward_backward_pipelining_with_interleaving: micro-batches run in
    # groups of microbatch_group_size_per_vp_stage (default pp), and a last group smaller
    # than pp is refused ("introduces dependency bubbles"), so m % pp == 0
    Rule("schedule", "interleaved: m a multiple of pp", "schedule", lambda c: "gbs" if hasattr(c, "gbs") else "m",
         lambda c: (c.schedule == "interleaved") & (c.pp > 1) & (c.m % c.pp != 0),
         lambda c: c.gbs if hasattr(c, "gbs") else c.m,
         lambda c: f"interleaved needs micro-batches m={c.m} a multiple of pp={c.pp} "
                   "(Megatron-LM groups micro-batches by pp)",
         lambda c: "change gbs, mbs or dp" if hasattr(c, "gbs") else "give --m a multiple of --pp"),
    Rule("heads", "num_attention_heads % tp == 0", "model", "tp",
         lambda c: c.model.num_attention_heads % c.tp != 0,
         lambda c: c.tp,
         lambda c: f"does not divide num_attention_heads={c.model.num_attention_heads}",
         lambda c: "choose a tp that divides it", static=True),
    Rule("kv_heads", "num_key_value_heads % tp == 0 (Megatron rule; not for MLA)", "model", "tp",
         lambda c: (not c.model.is_mla) & (c.model.num_key_value_heads % c.tp != 0),
         lambda c: c.tp,
         lambda c: f"does not divide num_key_value_heads={c.model.num_key_value_heads} (Megatron rule)",
         lambda c: "choose a tp that divides it", static=True),
    Rule("layers", "pp*vpp <= num_hidden_layers (dualpipe: pp)", "model", "pp",
         lambda c: c.model.num_hidden_layers < _slices(c),
         lambda c: c.pp,
         lambda c: f"{_slices_text(c)} exceeds num_hidden_layers={c.model.num_hidden_layers}",
         lambda c: "lower pp or vpp"),
    Rule("layers", "num_hidden_layers % (pp*vpp) == 0 (even split; dualpipe: pp)", "model", "pp",
         lambda c: ~_split_given(c) & (c.model.num_hidden_layers % _slices(c) != 0),
         lambda c: c.pp,
         lambda c: f"num_hidden_layers={c.model.num_hidden_layers} is not divisible by {_slices_text(c)}",
         lambda c: "give an uneven split (in a launch file: its first/last-stage layer counts, layout or "
                   "offsets; to estimate or sweep: --layers-per-stage / --uneven), or change pp/vpp"),
    Rule("experts", "dense model: ep == etp == 1", "model", "ep",
         _experts_dense,
         lambda c: c.ep,
         lambda c: f"model {c.model.name} has no experts (ep={c.ep}, etp={c.etp})",
         lambda c: "use ep=1, etp=1", static=True),
    Rule("experts", "MoE: num_experts % ep == 0", "model", "ep",
         lambda c: c.model.is_moe & (c.model.num_experts % c.ep != 0),
         lambda c: c.ep,
         lambda c: f"does not divide the expert count {c.model.num_experts}",
         lambda c: "choose an ep that divides it", static=True),
    Rule("experts", "MoE: (dp*cp*tp) % (ep*etp) == 0", "model", "ep",
         lambda c: c.model.is_moe & ((c.dp * c.cp * c.tp) % (c.ep * c.etp) != 0),
         lambda c: c.ep,
         lambda c: f"ep*etp={c.ep * c.etp} does not divide dp*cp*tp={c.dp * c.cp * c.tp} "
                   "(expert parallelism is carved from those ranks)",
         lambda c: "change ep, etp or dp", static=True),
    Rule("duplicate", "canonical form: pp == 1 keeps only schedule 1f1b with vpp 1", "canonical", "schedule",
         lambda c: (c.pp == 1) & ((c.schedule != "1f1b") | (c.vpp != 1)),
         lambda c: c.schedule,
         lambda c: f"pp=1 runs no pipeline schedule; schedule={c.schedule} vpp={c.vpp} duplicates schedule=1f1b vpp=1",
         lambda c: "the equivalent point is in the sweep"),
    Rule("duplicate", "canonical form: tp == 1 keeps only sp=True", "canonical", "sp",
         lambda c: (c.tp == 1) & (not c.sp),
         lambda c: c.sp,
         lambda c: "tp=1 makes sequence parallelism a no-op; sp=False duplicates sp=True",
         lambda c: "the equivalent point is in the sweep"),
    # Engine rules last (the space evaluates the ZeRO ones per level, after all others).
    # DeepSpeed (0.19.8, the CI extra) runs what its engine code allows. PipelineEngine trains with
    # schedule.TrainSchedule, 1F1B with one chunk per stage (runtime/pipe/engine.py:500-501; its
    # DualPipeVEngine keeps each weight gradient inside the backward, schedule.py:340-341, so it is
    # not zbv); it asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
    # (engine.py:76-77); AutoTP's row-parallel linears all-reduce their output (module_inject/
    # layers.py:215-225, 896-900), so the residual stream stays whole: no sequence parallelism.
    Rule("engine", "deepspeed: pp > 1 runs 1f1b (one chunk per stage)", "engine", "schedule",
         lambda c: (engine_name(c.engine) == "deepspeed") & (c.pp > 1) & ((c.schedule != "1f1b") | (c.vpp != 1)),
         lambda c: c.schedule,
         lambda c: "DeepSpeed's pipeline engine runs 1F1B with one chunk per stage (TrainSchedule)",
         lambda c: "use --schedule 1f1b --vpp 1, or another engine"),
    Rule("engine", "deepspeed: pp > 1 needs zero <= 1", "engine", "zero",
         lambda c: (engine_name(c.engine) == "deepspeed") & (c.pp > 1) & (c.zero >= 2),
         lambda c: c.zero,
         lambda c: "DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3",
         lambda c: "use --zero 0 or 1 with pp > 1, or pp=1", reads_zero=True),
    # Megatron-LM (NVIDIA/Megatron-LM@d98e8a64): get_forward_backward_func picks
    # forward_backward_pipelining_with_interleaving when a virtual size is set, else
    # forward_backward_pipelining_without_interleaving (pipeline_parallel/schedules.py:161-165):
    # 1F1B and interleaved 1F1B, no GPipe and no zero-bubble schedule (delay_wgrad_compute defers
    # weight gradients inside the combined 1F1B of EP overlap, not a pipeline schedule).
    # Scope engine_sweep: megatron is also the default profile of what-if estimates, whose
    # schedule model times any schedule; the sweep, `why` and the exports hold this rule.
    Rule("engine", "megatron: pp > 1 runs 1f1b or interleaved", "engine_sweep", "schedule",
         lambda c: (engine_name(c.engine) == "megatron") & (c.pp > 1)
         & ~np.isin(np.asarray(c.schedule), ("1f1b", "interleaved")),
         lambda c: c.schedule,
         lambda c: "Megatron-LM runs 1F1B or interleaved 1F1B only (get_forward_backward_func)",
         lambda c: "use --schedule 1f1b, or interleaved with --vpp 2 or more"),
    # Megatron-LM's data-parallel sharding without Megatron-FSDP (a profile with megatron_fsdp=1 runs
    # every level, interop/megatron_fsdp.py): zero 1 is the distributed optimizer, which shards the
    # optimizer states and main weights but keeps the whole gradient buffer (distributed/
    # param_and_grad_buffer.py; export/megatron.py), so zero 2 is Megatron-FSDP's optim_grads only;
    # zero 3 is torch FSDP2 (--use-torch-fsdp2), which validate_args refuses with a pipeline, with
    # expert parallelism and with tied embeddings (arguments.py:1031-1045 at d98e8a64).
    Rule("engine", "megatron: zero 2 needs Megatron-FSDP (megatron_fsdp=1)", "engine_sweep", "zero",
         lambda c: _megatron_fsdp2(c) & (c.zero == 2),
         lambda c: c.zero,
         lambda c: "Megatron-LM's distributed optimizer keeps the whole gradient buffer (zero 1); sharded "
                   "gradients alone are Megatron-FSDP's optim_grads",
         lambda c: "use --zero 1 or 3, or --set megatron_fsdp=1", reads_zero=True),
    Rule("engine", "megatron: zero 3 (torch FSDP2) needs pp == 1", "engine_sweep", "zero",
         lambda c: _megatron_fsdp2(c) & (c.zero == 3) & (c.pp > 1),
         lambda c: c.zero,
         lambda c: "--use-torch-fsdp2 is not supported with pipeline parallelism (arguments.py:1034-1035)",
         lambda c: "use --zero 1 with pp > 1, pp=1, or --set megatron_fsdp=1", reads_zero=True),
    Rule("engine", "megatron: zero 3 (torch FSDP2) needs ep == 1", "engine_sweep", "zero",
         lambda c: _megatron_fsdp2(c) & (c.zero == 3) & c.model.is_moe & (c.ep > 1),
         lambda c: c.zero,
         lambda c: "--use-torch-fsdp2 is not supported with expert parallelism (arguments.py:1036-1037)",
         lambda c: "use --zero 1 with ep > 1, ep=1, or --set megatron_fsdp=1", reads_zero=True),
    Rule("engine", "megatron: zero 3 (torch FSDP2) needs untied embeddings", "engine_sweep", "zero",
         lambda c: _megatron_fsdp2(c) & (c.zero == 3) & bool(c.model.tie_word_embeddings),
         lambda c: c.zero,
         lambda c: f"--use-torch-fsdp2 requires --untie-embeddings-and-output-weights (arguments.py:1044-1045), "
                   f"which {c.model.name}'s tied embedding cannot take",
         lambda c: "use --zero 1, or --set megatron_fsdp=1", reads_zero=True),
    # torch.distributed.pipelining (torch 2.13, the CI extra), which torchtitan and FSDP2 users
    # run: get_schedule_class knows 1F1B, Interleaved1F1B, GPipe, LoopedBFS, InterleavedZeroBubble,
    # ZBVZeroBubble and DualPipeV (schedules.py:3628-3636): no one-chunk zero-bubble schedule.
    # torchtitan (the fsdp profile's framework) shards routed experts over tp when ep is 1 (v0.1.0
    # experiments/llama4/infra/parallelize.py:173; v0.2.0 models/llama4/infra/parallelize.py:489-490,
    # "experts_mesh = tp_mesh ... TensorParallel()"; 0.3.0 models/common/moe_sharding.py
    # expert_param_placement_dense, "EP disabled, TP > 1"); with ep > 1 it takes etp 1 or tp
    # (v0.2.0 distributed/parallel_dims.py:58, "Currently we only support ETP=TP or ETP=1").
    Rule("engine", "fsdp: MoE experts over tp when ep == 1; etp in {1, tp} when ep > 1", "engine_sweep", "etp",
         lambda c: (engine_name(c.engine) == "fsdp") & c.model.is_moe
         & np.where(c.ep == 1, c.etp != c.tp, (c.etp != 1) & (c.etp != c.tp)),
         lambda c: c.etp,
         lambda c: (f"torchtitan splits the routed experts over tp={c.tp} when ep=1 (etp = tp)" if np.all(c.ep == 1)
                    else f"torchtitan takes etp 1 or tp={c.tp} with ep={c.ep}"),
         lambda c: f"use --etp {c.tp}" if np.all(c.ep == 1) else f"use --etp 1 or {c.tp}"),
    # DualPipe and DualPipeV: torch.distributed.pipelining has ScheduleDualPipeV (torch 2.13
    # schedules.py:3393), which torchtitan 0.3.0 takes (distributed/pipeline_parallel.py:23, 561);
    # DeepSeek's DualPipe library (deepseek-ai/DualPipe) wraps plain PyTorch modules such as
    # torchtitan's. Megatron-LM (no "dualpipe" anywhere at d98e8a64), DeepSpeed's PipelineEngine
    # (its TrainSchedule is 1F1B) and MindSpore's pipeline_scheduler (1f1b, gpipe, seqpipe, seqvpp,
    # seqsmartvpp, zero_bubble_v) run neither.
    Rule("engine", "dualpipe, dualpipev: fsdp engine only", "engine", "schedule",
         lambda c: (engine_name(c.engine) != "fsdp") & (c.schedule in OVERLAPPED_PAIR_SCHEDULES),
         lambda c: c.schedule,
         lambda c: f"the {engine_name(c.engine)} engine runs no DualPipe schedule (Megatron-LM, DeepSpeed's "
                   "PipelineEngine and MindSpore have none)",
         lambda c: "use --engine fsdp (torch pipelining's ScheduleDualPipeV; DeepSeek's DualPipe library wraps "
                   "plain modules), or --schedule zbv --vpp 2"),
    Rule("engine", "fsdp: pp > 1 has no zb-h1 (torch pipelining)", "engine", "schedule",
         lambda c: (engine_name(c.engine) == "fsdp") & (c.pp > 1) & (c.schedule == "zb-h1"),
         lambda c: c.schedule,
         lambda c: "torch.distributed.pipelining has no one-chunk zero-bubble schedule",
         lambda c: "use --schedule 1f1b, or zbv with --vpp 2"),
    # MindSpore / MindFormers (mindspore-lab/mindformers@f52743ca, the mcore models): MindSpore's
    # pipeline_scheduler takes 1f1b, gpipe, seqpipe, seqvpp, seqsmartvpp and zero_bubble_v
    # (mindspore.parallel.auto_parallel AutoParallel.pipeline), so no one-chunk zero bubble;
    # zero_bubble_v needs micro_batch_num >= 2 x stages (parallel_core/transformer_config.py:714-732);
    # the MoE layer refuses tp > 1 without sequence parallelism on both paths since MindFormers 1.6.0
    # (8f4f03c1): the mcore MoELayer (parallel_core/training_graph/transformer/moe/moe_layer.py:142-147)
    # and, for a legacy moe_config, check_rules._check_moe_parallel_valid (tools/check_rules.py:169-176;
    # the 1.5.0 legacy MoEV2 had a non-SP path, moe.py:680-699 at v1.5.0), and lays experts out over
    # dp x tp, which ep must divide (moe/ffn.py:185-195; cp not included).
    Rule("engine", "mindspore: pp > 1 has no zb-h1", "engine", "schedule",
         lambda c: (engine_name(c.engine) == "mindspore") & (c.pp > 1) & (c.schedule == "zb-h1"),
         lambda c: c.schedule,
         lambda c: "MindSpore's pipeline_scheduler has no one-chunk zero-bubble schedule",
         lambda c: "use --schedule 1f1b, or zbv with --vpp 2"),
    Rule("engine", "mindspore: zbv needs m >= 2*pp", "engine", lambda c: "gbs" if hasattr(c, "gbs") else "m",
         lambda c: (engine_name(c.engine) == "mindspore") & (c.schedule == "zbv") & (c.pp > 1) & (c.m < 2 * c.pp),
         lambda c: c.gbs if hasattr(c, "gbs") else c.m,
         lambda c: f"zero_bubble_v needs micro-batches m={c.m} >= 2*pp = {2 * c.pp} (MindFormers TransformerConfig)",
         lambda c: "raise gbs, or lower mbs or dp" if hasattr(c, "gbs") else f"give --m {2 * c.pp} or more"),
    Rule("engine", "mindspore: MoE with tp > 1 needs sp", "engine_model", "sp",
         lambda c: (engine_name(c.engine) == "mindspore") & c.model.is_moe & (c.tp > 1) & ~np.asarray(c.sp, dtype=bool)
         & (not _profile(c.engine).moe_tp_without_sp),
         lambda c: c.sp,
         lambda c: "MindFormers (>= 1.6.0) refuses MoE with tensor parallelism and no sequence parallelism "
                   "(mcore moe_layer.py; a legacy moe_config: tools/check_rules.py)",
         lambda c: "turn sp on (use_seq_parallel: True), or tp=1 (MindFormers <= 1.5.0 runs it: "
                   "--set moe_tp_without_sp=1)"),
    Rule("engine", "mindspore: MoE: (dp*tp) % ep == 0", "engine_model", "ep",
         lambda c: (engine_name(c.engine) == "mindspore") & c.model.is_moe & ((c.dp * c.tp) % c.ep != 0),
         lambda c: c.ep,
         lambda c: f"ep={c.ep} does not divide dp*tp = {c.dp * c.tp} (MindFormers lays the experts over dp x tp)",
         lambda c: "choose an ep that divides dp*tp"),
    # DeepSpeed AutoEP (0.19.8, module_inject/auto_ep*): the layouts autoep.py AUTOEP_RULES
    # lists (auto_ep_folding.py:206-250, runtime/engine.py:2219-2227), one pipeline stage and a preset
    # for the model type (registry.py:20-29); the export and the DeepSpeed reader hold the same table.
    Rule("engine", "deepspeed: MoE with ep/etp > 1 as AutoEP runs it", "engine_sweep", "ep",
         lambda c: (engine_name(c.engine) == "deepspeed") & c.model.is_moe & ((c.ep > 1) | (c.etp > 1))
         & _autoep_refused(c),
         lambda c: c.ep,
         lambda c: _autoep_why(c)[0],
         lambda c: _autoep_why(c)[1], reads_zero=True),
    Rule("engine", "deepspeed: tp > 1 without sp (AutoTP all-reduces)", "engine", "sp",
         lambda c: (engine_name(c.engine) == "deepspeed") & (c.tp > 1) & c.sp,
         lambda c: c.sp,
         lambda c: "DeepSpeed AutoTP all-reduces the row-parallel outputs: no sequence parallelism",
         lambda c: "use --no-sp with --tp > 1, or another engine"),
)

ENGINE_SCOPES = ("engine", "engine_model", "engine_sweep")
"""Scopes of the engine rules: those that read the strategy alone (checked when a Strategy is
built), those that read the model too (Strategy.check), and those the sweep and the exports hold
but a Strategy built by hand does not (the default profile's schedule rule: an estimate may time
a schedule its framework has no code for)."""

GROUPS: tuple[str, ...] = tuple(dict.fromkeys(r.group for r in RULES))
"""Rejection counters in evaluation order."""


def describe() -> list[tuple[str, str]]:
    """(group, its rules' statements) in evaluation order (``sweep --help``)."""
    return [(g, "; ".join(r.text for r in RULES if r.group == g)) for g in GROUPS]


def first_failure(c, scopes: tuple[str, ...], fields: tuple[str, ...] | None = None) -> Rule | None:
    """The first rule of ``scopes`` (naming one of ``fields``, if given: a context that has only
    their attributes) that context ``c`` (one point) fails, or None."""
    for rule in RULES:
        if rule.scope in scopes and (fields is None or field_of(rule, c) in fields) and bool(np.any(rule.fails(c))):
            return rule
    return None


def check(c, scopes: tuple[str, ...]) -> None:
    """Raise the NdplanError of the first rule of ``scopes`` that ``c`` fails."""
    rule = first_failure(c, scopes)
    if rule is not None:
        raise rule.error(c)


class WithModel:
    """A strategy seen with a model and a device count (the context of model rules), and, given
    ``engine``, as that engine would run it (an export checks its target's engine rules)."""

    def __init__(self, strat, model, gpus=None, engine: str | None = None):
        self._strat, self.model, self.gpus = strat, model, gpus
        if engine is not None:
            self.engine = engine

    def __getattr__(self, name):
        return getattr(self._strat, name)
