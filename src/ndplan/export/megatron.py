"""Megatron-LM command-line arguments (``--emit megatron``).

Flag names are those of NVIDIA/Megatron-LM:megatron/training/arguments.py
(``_add_distributed_args``: ``--tensor-model-parallel-size``,
``--pipeline-model-parallel-size``, ``--context-parallel-size``,
``--num-layers-per-virtual-pipeline-stage``, ``--num-virtual-stages-per-pipeline-rank``,
``--decoder-first-pipeline-num-layers``, ``--decoder-last-pipeline-num-layers``,
``--pipeline-model-parallel-layout``, ``--sequence-parallel``,
``--use-distributed-optimizer``, ``--use-torch-fsdp2`` ("not currently working with
Pipeline Parallel"); ``_add_moe_args``: ``--expert-model-parallel-size``,
``--expert-tensor-parallel-size``; ``_add_training_args``: ``--micro-batch-size``,
``--global-batch-size``, ``--recompute-granularity full|selective``,
``--recompute-method uniform|block``, ``--recompute-num-layers``,
``--optimizer-cpu-offload``; ``_add_network_size_args``: ``--num-layers``;
``_add_data_args``: ``--seq-length``; ``_add_mtp_args``: ``--mtp-num-layers``).

Mapping: zero 1 -> the distributed optimizer (it shards optimizer states and fp32
master weights over dp and reduce-scatters gradients into a whole-model buffer); zero 3
-> torch FSDP2 (pp = 1, ep = 1, untied embeddings); zero 2, and zero 3 beyond those, only
under Megatron-FSDP (an engine with megatron_fsdp=1): rules.py's megatron ZeRO rules. Full recompute of every layer -> ``uniform`` with one layer per group
(only each layer's input is kept, ndplan's ``full``); of the first N layers of each
chunk -> ``block`` N. Megatron-LM takes one count for every chunk and one granularity:
a PPB plan with differing counts gets the largest count and a ``# note``. Uneven
layers: first/last-stage flags when vpp = 1 and the middle stages are even (with pp = 2
both flags and no middle stage: Megatron-LM's ``get_num_layers_to_build`` then takes
0 middle layers), else a layout (E embedding, t decoder layer, m MTP layer, L loss, ``|``
between virtual stages; from a PPB plan, each layer's own kind). A model with MTP layers
gets ``--mtp-num-layers`` and its m's in the layout: ``validate_layer_layout``
(megatron/core/transformer/pipeline_parallel_layer_layout.py) asserts that the layout's
m count equals mtp_num_layers, and that the layout starts with E and ends with L.

Schedules: 1f1b (pp > 1, vpp = 1) and interleaved (vpp > 1) are Megatron-LM's; gpipe,
zb-h1 and zbv are not expressible (NdplanError).

The output is comment lines (``# ...``) and one line of arguments, readable with
``shlex.split(text, comments=True)``.
"""

from __future__ import annotations

import shlex

from ndplan.catalog.model import ModelSpec
from ndplan.export.common import cannot, layers_per_chunk, header, recompute_counts, refuse_engine_rules
from ndplan.strategy import Strategy

TARGET = "Megatron-LM"
FLAG = {
    "layers": "--num-layers", "tp": "--tensor-model-parallel-size", "pp": "--pipeline-model-parallel-size",
    "cp": "--context-parallel-size", "ep": "--expert-model-parallel-size", "etp": "--expert-tensor-parallel-size",
    "layers_per_vstage": "--num-layers-per-virtual-pipeline-stage",
    "vstages_per_rank": "--num-virtual-stages-per-pipeline-rank",
    "first_layers": "--decoder-first-pipeline-num-layers", "last_layers": "--decoder-last-pipeline-num-layers",
    "layout": "--pipeline-model-parallel-layout", "sp": "--sequence-parallel",
    "distributed_optimizer": "--use-distributed-optimizer", "fsdp2": "--use-torch-fsdp2",
    "offload_optimizer": "--optimizer-cpu-offload", "mbs": "--micro-batch-size", "gbs": "--global-batch-size",
    "seq": "--seq-length", "recompute_granularity": "--recompute-granularity",
    "recompute_method": "--recompute-method", "recompute_num_layers": "--recompute-num-layers",
    "mtp_layers": "--mtp-num-layers", "bf16": "--bf16", "grad_bf16": "--grad-reduce-in-bf16",
    "no_grad_fusion": "--no-gradient-accumulation-fusion", "untie": "--untie-embeddings-and-output-weights",
    "overlap_grad": "--overlap-grad-reduce", "overlap_param": "--overlap-param-gather",
    "fp8_format": "--fp8-format", "fp8_param_gather": "--fp8-param-gather",
}
"""Strategy knob -> Megatron-LM flag: the one table the exporter and the reader
(interop/megatron.py) use."""
SWITCHES = ("sp", "distributed_optimizer", "fsdp2", "offload_optimizer", "bf16", "grad_bf16", "no_grad_fusion",
            "untie", "overlap_grad", "overlap_param", "fp8_param_gather")
"""Flags without a value (``store_true``)."""


def _check_schedule(p) -> None:
    """rules.py's megatron schedule rule (1F1B or interleaved 1F1B) for ``p``: anything with pp,
    vpp, m and schedule (a Strategy, a PPB Pipeline)."""
    from types import SimpleNamespace
    c = SimpleNamespace(engine="megatron", pp=p.pp, vpp=p.vpp, m=p.m, schedule=p.schedule)
    refuse_engine_rules(TARGET, c, ("schedule",))


def _megatron_fsdp(strat: Strategy) -> bool:
    """Does the strategy's engine run Megatron-FSDP (interop/megatron_fsdp.py)? Then every ZeRO
    level is its sharding strategy, with pipelining, tied embeddings and experts alike."""
    from ndplan.engines import profile
    return profile(strat.engine).megatron_fsdp


def _check(model: ModelSpec, strat: Strategy) -> None:
    _check_schedule(strat)
    if _megatron_fsdp(strat):
        return
    from ndplan import rules  # zero 2 is Megatron-FSDP's; zero 3 (torch FSDP2) without pp, ep or tied embeddings
    engine = strat.engine if rules.engine_name(strat.engine) == "megatron" else "megatron"
    refuse_engine_rules(TARGET, rules.WithModel(strat, model, engine=engine), ("zero",))
    if strat.weight_dtype == "fp8" and strat.zero == 3:
        raise cannot(TARGET, "weight_dtype", "fp8", "Megatron turns --fp8-param-gather off under --use-torch-fsdp2 "
                                                   "(Transformer Engine >= 2.0, arguments.py:1051-1057); use zero<=2, "
                                                   "or Megatron-FSDP (--use-megatron-fsdp)")
    if strat.weight_dtype == "fp8" and strat.zero == 0:
        raise cannot(TARGET, "weight_dtype", "fp8", "--fp8-param-gather needs the distributed optimizer or FSDP "
                                                   "(arguments.py validate_args); use zero>=1")
    if strat.offload_optimizer and strat.zero not in (1, 2):
        raise cannot(TARGET, "offload_optimizer", True, "--optimizer-cpu-offload needs the distributed "
                                                        "optimizer; use zero 1")


def _groups(model: ModelSpec, strat: Strategy, balance=None) -> list[str]:
    """Layout group of every virtual stage: from the PPB plan's layer kinds, else the
    even (or ``layers_per_stage``) split with E first and the MTP layers and L last."""
    if balance is not None:
        return balance.layout_groups()
    groups = ["t" * n for n in layers_per_chunk(model, strat)]
    groups[0], groups[-1] = "E" + groups[0], groups[-1] + "m" * model.mtp_layers + "L"
    return groups


def _layout(p, groups: list[str]) -> dict:
    """Layer placement flags of ``groups`` (``_groups``); ``p`` has pp and vpp."""
    layers = [g.count("t") for g in groups]
    if len(set(layers)) == 1:
        if p.vpp > 1:
            return {FLAG["layers_per_vstage"]: layers[0]}
        return {}
    middle = layers[1:-1]
    if p.vpp == 1 and len(set(middle)) <= 1:
        return {FLAG["first_layers"]: layers[0], FLAG["last_layers"]: layers[-1]}
    out = {FLAG["layout"]: "|".join(groups)}
    if p.vpp > 1:
        out[FLAG["vstages_per_rank"]] = p.vpp
    return out


def plan_args(p, balance) -> dict:
    """{"args": [...], "notes": [...]}: the layout, MTP and recompute flags of a PPB plan
    alone (``ndplan balance``); ``p`` is its Pipeline."""
    _check_schedule(p)
    args = _layout(p, balance.layout_groups())
    if balance.mtp_layers():
        args[FLAG["mtp_layers"]] = balance.mtp_layers()
    rec, notes = _recompute(balance.decoder_layers(), *balance.recompute_counts(), uniform=False)
    return {"args": [f"{k} {shlex.quote(str(v))}" for k, v in (args | rec).items()], "notes": notes}


def _recompute(layers, full, sel, uniform: bool) -> tuple[dict, list[str]]:
    """Recompute flags of (``full``, ``sel``) counts per virtual stage; ``uniform``: an
    all-layers full recompute may be given as ``uniform`` 1 (not for per-layer plans)."""
    args, notes = {}, []
    gran, method, num = FLAG["recompute_granularity"], FLAG["recompute_method"], FLAG["recompute_num_layers"]
    if max(full):
        every = all(f == n for f, n in zip(full, layers))
        if every and uniform:
            args |= {gran: "full", method: "uniform", num: 1}
        else:
            args |= {gran: "full", method: "block", num: max(full)}
            if len(set(full)) > 1:
                notes.append(f"full recompute of {list(full)} layers per virtual stage; Megatron-LM takes one "
                             f"count for every chunk, {max(full)} given")
        if max(sel):
            notes.append("Megatron-LM runs one recompute granularity: the selective layers are not expressed")
    elif max(sel):
        args[gran] = "selective"
        if any(s < n for s, n in zip(sel, layers)):
            notes.append(f"selective recompute of {list(sel)} layers per virtual stage; Megatron-LM's "
                         "selective recompute covers every layer")
    return args, notes


def _muon_flags(eng) -> dict:
    """--muon-tp-mode, --muon-fp32-matmul-prec and --muon-no-split-qkv where they differ from
    Megatron's defaults (interop.megatron_memory.muon_settings reads them back)."""
    from ndplan.interop import megatron_memory as MX
    out = {}
    mode = next((k for k, v in MX.MUON_TP_MODES.items() if v == eng.muon_tp_mode), "duplicated")
    if mode != "duplicated":
        out["--muon-tp-mode"] = mode
    if eng.muon_ns_fp32:
        out["--muon-fp32-matmul-prec"] = "high"
    if not eng.muon_split_qkv:
        out["--muon-no-split-qkv"] = True
    return out


def _memory_flags(model: ModelSpec, s: Strategy) -> dict:
    """The precision and overlap flags the estimate assumes (arguments.py at
    NVIDIA/Megatron-LM@d98e8a64): bf16 weights; main gradients in bf16 only with
    --grad-reduce-in-bf16 (L1213-1217); gradient reduce overlapped with backward and, with
    the distributed optimizer, the parameter all-gather with forward (--overlap-param-gather
    requires it, L1024-1027); FSDP2 asserts no gradient-accumulation fusion and untied
    embeddings (L1031-1049); fp8 weights as --fp8-format hybrid --fp8-param-gather
    (L2016-2018, which needs the distributed optimizer or FSDP, L1095-1097)."""
    out = {FLAG["bf16"]: True}
    if s.grad_dtype == "bf16":
        out[FLAG["grad_bf16"]] = True
    if s.dp * s.cp > 1:
        out[FLAG["overlap_grad"]] = True
        if s.zero in (1, 2):
            out[FLAG["overlap_param"]] = True
    if s.zero == 3:
        out[FLAG["no_grad_fusion"]] = True
    if not model.tie_word_embeddings:
        out[FLAG["untie"]] = True
    if s.weight_dtype == "fp8":
        out |= {FLAG["fp8_format"]: "hybrid", FLAG["fp8_param_gather"]: True}
    return out


def _engine_flags(model: ModelSpec, s: Strategy) -> tuple[dict, list[str]]:
    """The megatron engine's settings as the flags interop.megatron_memory reads them from:
    --recompute-modules (selective only), the optimizer and its state dtypes, the MoE capacity, the
    token dispatcher (DeepEP's, allgather's, else alltoall)."""
    from ndplan.engines import MEGATRON, profile
    from ndplan.interop import megatron_memory as MX
    eng, out, notes = profile(s.engine), {}, []
    if s.recompute == "selective":
        mods = ([] if eng.keep_core_attn else ["core_attn"]) + [m for m, k in MX.MODULE_SETTING.items() if getattr(eng, k)]
        if mods != ["core_attn"]:
            out["--recompute-modules"] = tuple(mods)  # nargs="+": one word per module
            if "moe_act" in mods:
                out["--moe-grouped-gemm"] = True
    states = (eng.optimizer_bytes, eng.non_matrix_optimizer_bytes, eng.master_bytes)
    if eng.megatron_fsdp:  # its flags, the main weights' dtype among them (interop/megatron_fsdp.py)
        from ndplan.interop import megatron_fsdp as MF
        fsdp_args, fsdp_notes = MF.flags(s, eng)
        out, notes = out | fsdp_args, notes + fsdp_notes
        states = states[:2] + (MEGATRON.master_bytes,)
    if states == (4, 8, MEGATRON.master_bytes):
        out["--optimizer"] = "muon"
        out |= _muon_flags(eng)
        if not eng.muon_tp_mode:
            notes.append("Muon's states without its Newton-Schulz scratch (muon_tp_mode 0): Megatron runs it "
                         "(--muon-tp-mode duplicated), so the estimate left out that transient")
    elif states[1:] == (0, 2) and eng.optimizer_bytes in (2, 3, 4, 5, 6, 8):
        avg = {2: ("fp8", "fp8"), 3: ("fp8", "bf16"), 4: ("bf16", "bf16"), 5: ("fp8", "fp32"), 6: ("bf16", "fp32"),
               8: ("fp32", "fp32")}[eng.optimizer_bytes]
        out |= {"--use-precision-aware-optimizer": True, "--exp-avg-dtype": avg[0], "--exp-avg-sq-dtype": avg[1]}
    elif states == (4, 0, MEGATRON.master_bytes):
        out["--optimizer"] = "sgd"
        notes.append("one optimizer state per parameter is written as --optimizer sgd (momentum 0.9); Lion keeps "
                     "the same bytes")
    elif states == (0, 0, MEGATRON.master_bytes):
        out |= {"--optimizer": "sgd", "--sgd-momentum": 0}
    elif states != (MEGATRON.optimizer_bytes, 0, MEGATRON.master_bytes):
        notes.append(f"optimizer states of {eng.optimizer_bytes} B (master {eng.master_bytes} B) per parameter: no "
                     "Megatron-LM optimizer keeps them; written as Adam")
    if eng.fp8_linear_inputs:
        out[FLAG["fp8_format"]] = "hybrid"
        scales = {k: getattr(eng, k) for k in ("fp8_scale_bytes", "fp8_act_block", "fp8_weight_block")}
        recipe = next((r for r, v in MX.FP8_RECIPE_SCALES.items() if v == scales), None)
        if recipe:
            out[MX.FLAGS["fp8_recipe"]] = recipe
        elif any(scales.values()):
            notes.append(f"fp8 block scales {scales}: no Megatron-LM recipe keeps them; written as the default "
                         "(delayed) recipe")
        if not eng.fp8_weight_cache_bytes and s.zero < 3:
            out[MX.SWITCHES["no_transpose_cache"]] = True
    elif s.weight_dtype == "fp8":
        notes.append("fp8 weights mean fp8 GEMMs in Megatron-LM: check on this file adds the fp8 copies of linear "
                     "inputs and weight transposes (--set fp8_linear_inputs=1 --set fp8_weight_cache_bytes=1)")
    if eng.deepep_sms and model.is_moe:
        out |= {MX.FLAGS["dispatcher"]: "flex", MX.FLAGS["flex_backend"]: "deepep",
                MX.FLAGS["flex_sms"]: eng.deepep_sms}
    elif model.is_moe:  # the dispatcher the settings model: allgather (Megatron's default) or alltoall
        out[MX.FLAGS["dispatcher"]] = "allgather" if eng.moe_allgather_dispatch else "alltoall"
    dispatch = ("moe_rows_saved", "moe_dispatch_rows", "megatron_alltoall_rows")
    if model.is_moe and any(getattr(eng, k) != getattr(MEGATRON, k) for k in dispatch):
        notes.append(", ".join(f"{k}={int(getattr(eng, k))}" for k in dispatch) + ": no Megatron-LM flag sets "
                     f"them; its alltoall dispatcher saves {MEGATRON.moe_rows_saved} row and holds the rows of "
                     "megatron_alltoall_rows (engine_fields.py)")
    if eng.moe_capacity_permille and model.is_moe:
        out |= {MX.FLAGS["capacity"]: f"{eng.moe_capacity_permille / 1000:g}", MX.SWITCHES["pad_capacity"]: True}
    return out, notes


def fields(model: ModelSpec, strat: Strategy, *, balance=None) -> tuple[dict, list[str]]:
    """(flag -> value, True for a switch; notes) expressing ``strat``."""
    _check(model, strat)
    s = strat
    layers = layers_per_chunk(model, s, balance)
    full, sel = recompute_counts(model, s, balance)
    args = {FLAG["layers"]: model.num_hidden_layers, FLAG["tp"]: s.tp, FLAG["pp"]: s.pp, FLAG["cp"]: s.cp}
    if model.is_moe:
        args |= {FLAG["ep"]: s.ep, FLAG["etp"]: s.etp}
    args |= _layout(s, _groups(model, s, balance))
    if model.mtp_layers:
        args[FLAG["mtp_layers"]] = model.mtp_layers
    if s.sp and s.tp > 1:
        args[FLAG["sp"]] = True
    from ndplan.engines import profile
    zero_notes = []
    if profile(s.engine).megatron_deepspeed:  # DeepSpeed's engine shards (interop/megatron_deepspeed.py)
        zero_notes.append(f"zero {s.zero} is DeepSpeed's under Megatron-DeepSpeed: its config's zero_optimization.stage "
                     f"(or --zero-stage {s.zero}), which these flags do not set")
    elif s.zero in (1, 2) or _megatron_fsdp(s):  # Megatron-FSDP v1 runs on it (arguments.py:1128-1135)
        args[FLAG["distributed_optimizer"]] = True
    elif s.zero == 3:
        args[FLAG["fsdp2"]] = True
    if s.offload_optimizer:
        args[FLAG["offload_optimizer"]] = True
    args |= _memory_flags(model, s)
    args |= {FLAG["mbs"]: s.mbs, FLAG["gbs"]: s.gbs, FLAG["seq"]: s.seq}
    rec, notes = _recompute(layers, full, sel, uniform=s.recompute_layers is None and balance is None)
    args |= rec
    engine_args, engine_notes = _engine_flags(model, s)
    args |= engine_args
    notes += engine_notes + zero_notes
    return args, notes


def flag_words(flag: str, value) -> tuple[str, ...]:
    """The words of one flag: a switch (True) alone, a tuple as one word per element."""
    if value is True:
        return (flag,)
    return (flag, *map(str, value)) if isinstance(value, tuple) else (flag, str(value))


def emit(model: ModelSpec, strat: Strategy, *, balance=None) -> str:
    args, notes = fields(model, strat, balance=balance)
    words = [w for k, v in args.items() for w in flag_words(k, v)]
    lines = header(TARGET, model, strat) + [f"# note: {n}" for n in notes]
    return "\n".join(lines) + "\n" + " ".join(shlex.quote(a) for a in words) + "\n"
