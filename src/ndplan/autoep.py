"""DeepSpeed AutoEP's rules (deepspeed 0.19.8 module_inject/auto_ep*.py, runtime/engine.py): its
presets, the layouts it refuses, one source for the exporter and reader (export/deepspeed.py,
interop/deepspeed.py) and rules.py's sweep rule. Reads no formula (kernels._VALUE_FREE_MODULES):
it rejects layouts, it never changes a Term."""

from __future__ import annotations

from dataclasses import dataclass

KEY = {"cp": "sequence_parallel_size", "tp": "tensor_parallel.autotp_size", "ep": "expert_parallel.autoep_size",
       "etp": "expert_parallel.expert_tensor_parallel_size"}
"""The DeepSpeed JSON keys the rules name (export/deepspeed.py KEY takes them from here)."""


AUTOEP_PRESETS = {"mixtral": ("mixtral",), "qwen3_moe": ("qwen3_moe", "qwen2_moe"),
                  "qwen3_5_moe": ("qwen3_5_moe_text",), "deepseek_v2": ("deepseek_v2",),
                  "deepseek_v3": ("deepseek_v3",), "minimax_m3": ("minimax_m3_vl_text",)}
"""AutoEP's presets -> the Hugging Face model_type values each detects (DeepSpeed 0.19.8
module_inject/auto_ep_presets/registry.py:20-29 PRESET_MODELS, each preset's ``hf_model_types``).
Every preset finds its MoE blocks at ``model.layers.N.mlp`` with ``gate`` and ``experts`` children."""


def autoep_preset(model_type: str) -> str | None:
    """The preset AutoEP picks for a model type (registry.py:87-92 preset_name_for_hf_model_type)."""
    return next((name for name, types in AUTOEP_PRESETS.items() if model_type in types), None)


@dataclass(frozen=True)
class AutoEPLayout:
    """What AutoEP validates: the degrees (``ep`` = ``autoep_size``, ``etp`` =
    ``expert_tensor_parallel_size``, ``cp`` = the Ulysses degree), ZeRO stage, whether a ZeRO
    offload section is set, hpZ and qgZ, and whether MoE layers were replaced (``moe``)."""
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    zero: int
    offload: bool
    hpz: int
    qgz: bool
    moe: bool


AUTOEP_RULES = (  # (refused?, JSON key, DeepSpeed 0.19.8's refusal and where, fix)
    (lambda a: a.etp != 1, KEY["etp"],
     "expert_tensor_parallel_size > 1 is reserved for expert-internal tensor parallelism and refused "
     "(module_inject/auto_ep_folding.py:214-218)",
     "use expert_tensor_parallel_size 1 (etp=1)"),
    (lambda a: (a.tp > 1) & (a.pp > 1), KEY["tp"],
     "AutoEP+AutoTP folding supports pp 1 only (auto_ep_folding.py:206-208)", "use autotp_size 1 or one stage"),
    (lambda a: (a.tp > 1) & (a.cp > 1), KEY["tp"],
     "AutoEP folding refuses AutoTP with Ulysses sequence parallelism (auto_ep_folding.py:210-212)",
     "use autotp_size 1 or sequence_parallel_size 1"),
    (lambda a: (a.tp > 1) & (a.ep == 1), KEY["ep"],
     "AutoEP+AutoTP folding requires autoep_size > 1 (auto_ep_folding.py:240-242)",
     "raise autoep_size, or autotp_size 1"),
    (lambda a: (a.tp > 1) & a.offload, "zero_optimization.offload_optimizer",
     "ZeRO offload with AutoEP+AutoTP folding is refused (auto_ep_folding.py:248-250)",
     "drop offload_optimizer / offload_param, or autotp_size 1"),
    (lambda a: a.moe & (a.zero == 3) & (a.cp > 1), KEY["cp"],
     "AutoEP with ZeRO-3 refuses sequence parallelism (runtime/engine.py:2219-2221)",
     "use sequence_parallel_size 1 or ZeRO stage 1/2"),
    (lambda a: a.moe & (a.zero == 3) & (a.hpz > 1), "zero_optimization.zero_hpz_partition_size",
     "AutoEP with ZeRO-3 refuses hpZ secondary groups (runtime/engine.py:2225-2227)",
     "drop zero_hpz_partition_size"),
    (lambda a: a.moe & (a.zero == 3) & a.qgz, "zero_optimization.zero_quantized_gradients",
     "AutoEP with ZeRO-3 refuses qgZ (runtime/engine.py:2222-2223)", "drop zero_quantized_gradients"),
)
"""AutoEP's refusals of a layout, in the order DeepSpeed checks them (validate_folding_global, then
_validate_zero3_moe_compatibility): the reader raises them naming the key, the exporter naming ep
(etp for the first). The tiling rule (ep*etp divides the ranks of a stage, auto_ep_folding.py:111-115)
is rules.py's for a strategy; the reader checks it on autoep_size, which DeepSpeed validates before it
looks for MoE layers."""


def autoep_refusal(a: AutoEPLayout):
    """The first of AUTOEP_RULES ``a`` breaks, or None."""
    return next((r for r in AUTOEP_RULES if r[0](a)), None)


def _layout(c) -> AutoEPLayout:
    """AutoEPLayout of a strategy context (a Strategy with its model, or the sweep's arrays)."""
    from ndplan.engines import profile
    eng = profile(c.engine)
    return AutoEPLayout(tp=c.tp, pp=c.pp, cp=c.cp, ep=c.ep, etp=c.etp, zero=c.zero,
                        offload=bool(getattr(c, "offload_optimizer", False) or eng.weights_offloaded),
                        hpz=eng.secondary_weight_shard, qgz=False, moe=True)


def autoep_why(c) -> tuple[str, str]:
    """(problem, fix) of ``autoep_refused`` at one point (scalars)."""
    rule = autoep_refusal(_layout(c))
    if rule is not None:
        return f"DeepSpeed AutoEP: {rule[2]}", f"{rule[3]}, or ep=1"
    if autoep_preset(c.model.model_type) is None:
        return (f"DeepSpeed AutoEP has no preset for model_type {c.model.model_type} (presets: "
                f"{', '.join(AUTOEP_PRESETS)})", "use ep=1")
    return ("AutoEP's presets find MoE blocks at model.layers.N.mlp, which the pipeline engine's PipelineModule "
            "names by index (runtime/pipe/module.py:250-255)", "use ep=1 or pp=1")


def autoep_refused(c):
    """Where a strategy context (scalars, or the sweep's arrays: the rules are written with ``&``)
    runs a MoE model's experts over ep or etp, does DeepSpeed AutoEP refuse it: a layout rule of
    AUTOEP_RULES, more than one pipeline stage, or a model type without a preset
    (``_expert_parallel``)? rules.py's deepspeed AutoEP rule."""
    import numpy as np
    a = _layout(c)
    bad = np.zeros(np.shape(c.tp), dtype=bool) | (autoep_preset(c.model.model_type) is None) | (np.asarray(c.pp) > 1)
    for rule in AUTOEP_RULES:
        bad = bad | np.asarray(rule[0](a), dtype=bool)
    return bad
