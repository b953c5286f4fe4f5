"""Megatron-LM flags that change memory without changing the parallel degrees, read into
engine settings (engines.derive on the megatron profile): the optimizer and its state
dtypes, the per-module recompute list, the MoE capacity, the DeepEP dispatcher and the fp8
recipe's saved inputs and weight copies. Sources are at
NVIDIA/Megatron-LM@d98e8a64 (arguments.py, transformer_config.py, optimizer/).
"""

from __future__ import annotations

from ndplan import optimizers as O
from ndplan.errors import NdplanError
from ndplan.interop.base import choice_arg

FLAGS = {"optimizer": "--optimizer", "sgd_momentum": "--sgd-momentum", "muon_scalar": "--muon-scalar-optimizer",
         "main_params_dtype": "--main-params-dtype", "exp_avg_dtype": "--exp-avg-dtype",
         "exp_avg_sq_dtype": "--exp-avg-sq-dtype", "main_grads_dtype": "--main-grads-dtype",
         "capacity": "--moe-expert-capacity-factor", "dispatcher": "--moe-token-dispatcher-type",
         "flex_backend": "--moe-flex-dispatcher-backend", "flex_sms": "--moe-flex-dispatcher-num-sms",
         "deepep_sms": "--moe-deepep-num-sms", "fp8_recipe": "--fp8-recipe", "muon_tp_mode": "--muon-tp-mode",
         "muon_prec": "--muon-fp32-matmul-prec"}
"""Flags with a value (argparse dest -> flag)."""
SWITCHES = {"precision_aware": "--use-precision-aware-optimizer", "pad_capacity": "--moe-pad-expert-input-to-capacity",
            "grouped_gemm": "--moe-grouped-gemm", "enable_deepep": "--moe-enable-deepep",
            "no_transpose_cache": "--disable-parameter-transpose-cache", "muon_no_split_qkv": "--muon-no-split-qkv"}

OPTIMIZER_CHOICES = ("adam", "sgd", "muon", "dist_muon", "lion", "soap", "adaptive_muon")
"""--optimizer choices (arguments.py:2913-2917)."""
MUON_TP_MODES = {"duplicated": 1, "blockwise": 2, "distributed": 3}
"""--muon-tp-mode choices (arguments.py:2650-2655) -> EngineProfile.muon_tp_mode."""
MUON_PRECISIONS = ("low", "medium", "high")
"""--muon-fp32-matmul-prec choices (arguments.py:2640-2642); only medium casts Newton-Schulz to bf16."""
STATE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
"""--exp-avg-dtype / --exp-avg-sq-dtype choices (arguments.py:3675-3684) in bytes."""
MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
           "gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc")
"""--recompute-modules names TransformerConfig accepts (transformer_config.py:1943-1962)."""
MODULE_SETTING = {"layernorm": "recompute_layernorm", "mla_up_proj": "recompute_mla_up_proj", "mlp": "recompute_mlp",
                  "moe": "recompute_moe", "moe_act": "recompute_moe_act", "shared_experts": "recompute_shared_experts"}
"""Modules ndplan models, each an EngineProfile setting citing the lines that wrap it."""


def _float(args, name: str):
    v = getattr(args, name)
    if v is None:
        return None
    try:
        x = float(v)
    except ValueError:
        raise NdplanError(FLAGS[name], v, "not a number", "write the number, or set the variable it uses") from None
    if x != x or abs(x) > 1e6:
        raise NdplanError(FLAGS[name], v, "not a usable number", "give a finite value such as 1.0")
    return x


def _choice(args, name: str, choices, default: str) -> str:
    return choice_arg(args, name, FLAGS[name], choices, default)


def muon_settings(args, notes: list) -> dict:
    """The Muon step's Newton-Schulz scratch settings (formulas/muon.py): --muon-tp-mode,
    --muon-fp32-matmul-prec, --muon-no-split-qkv."""
    mode = _choice(args, "muon_tp_mode", tuple(MUON_TP_MODES), "duplicated")
    prec = _choice(args, "muon_prec", MUON_PRECISIONS, "medium")
    notes.append(f"--optimizer muon: the step's Newton-Schulz scratch of the largest matrix, --muon-tp-mode {mode}, "
                 f"{'bf16' if prec == 'medium' else 'fp32'} iterations (formulas/muon.py)")
    return {"muon_tp_mode": MUON_TP_MODES[mode], "muon_ns_fp32": int(prec != "medium"),
            "muon_split_qkv": int(not args.muon_no_split_qkv)}


def optimizer_settings(args, notes: list) -> dict:
    """optimizer_bytes / master_bytes / non_matrix_optimizer_bytes of the recipe's optimizer.
    Megatron keeps fp32 main params (distrib_optimizer.py:445) and the optimizer's states on
    them; --use-precision-aware-optimizer (adam only, optimizer_config.py:433-436) hands TE's
    FusedAdam the moment dtypes and its own master weights: int16 remainders beside bf16
    parameters (store_param_remainders, default True, optimizer_config.py:192;
    distrib_optimizer.py:1007-1013) or --main-params-dtype fp16, 2 bytes either way."""
    name = _choice(args, "optimizer", OPTIMIZER_CHOICES, "adam")
    out: dict = {}
    if name == "adam":
        opt = O.states("adam")
    elif name == "sgd":
        momentum = _float(args, "sgd_momentum")
        momentum = 0.9 if momentum is None else momentum  # --sgd-momentum default (arguments.py:2626)
        opt = O.states("sgd_momentum" if momentum else "sgd")
    elif name == "lion":
        opt = O.states("lion")  # one exp_avg (optimizer/__init__.py:602-619)
    elif name in ("muon", "dist_muon"):
        # momentum on 2-D non-embedding weights; the rest with --muon-scalar-optimizer, adam by
        # default (optimizer/emerging_optimizers.py:140-147, 579-590; arguments.py:2661)
        scalar = getattr(args, "muon_scalar") or "adam"
        opt = O.states("muon")
        out |= muon_settings(args, notes)
        if scalar != "adam":
            notes.append(f"--muon-scalar-optimizer {scalar}: the embedding and output layer are counted with "
                         "Adam's two moments")
    else:
        opt = O.states("adam")
        notes.append(f"--optimizer {name}: its states are counted as Adam's two fp32 moments (not modelled)")
    state = 4
    if args.precision_aware:
        if name != "adam":
            raise NdplanError(SWITCHES["precision_aware"], name, "needs --optimizer adam (optimizer_config.py:433-436)",
                              "drop it or use adam")
        avg = STATE_BYTES[_choice(args, "exp_avg_dtype", tuple(STATE_BYTES), "fp32")]
        avg_sq = STATE_BYTES[_choice(args, "exp_avg_sq_dtype", tuple(STATE_BYTES), "fp32")]
        _choice(args, "main_params_dtype", ("fp32", "fp16"), "fp32")
        out["optimizer_bytes"] = avg + avg_sq
        out["master_bytes"] = 2
        notes.append(f"--use-precision-aware-optimizer: TE FusedAdam keeps moments of {avg} + {avg_sq} bytes and "
                     "2-byte master weights (bf16 parameters + int16 remainders, or fp16)")
        return out
    for f in ("exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype", "main_grads_dtype"):
        if (getattr(args, f) or "fp32") != "fp32":
            raise NdplanError(FLAGS[f], getattr(args, f), "needs --use-precision-aware-optimizer "
                              "(optimizer_config.py:468-479)", f"add it or drop {FLAGS[f]}")
    return out | O.engine_settings(opt, state)


def recompute_settings(args, selective: bool, notes: list) -> dict:
    """Engine settings of --recompute-modules under --recompute-granularity selective (the
    list's default is core_attn, transformer_config.py:1940-1941; other granularities ignore it)."""
    mods = args.recompute_modules
    if not selective or not mods:
        return {}
    bad = [m for m in mods if m not in MODULES]
    if bad:
        raise NdplanError("--recompute-modules", bad[0], "not a module Megatron-LM recomputes",
                          f"give some of {', '.join(MODULES)} (transformer_config.py:1943-1962)")
    if "moe_act" in mods and not args.grouped_gemm:
        raise NdplanError("--recompute-modules", "moe_act", "needs --moe-grouped-gemm (transformer_config.py:1964-1967)",
                          "add --moe-grouped-gemm or drop moe_act")
    out = {MODULE_SETTING[m]: 1 for m in mods if m in MODULE_SETTING}
    if "core_attn" not in mods:
        out["keep_core_attn"] = 1
    other = [m for m in mods if m not in MODULE_SETTING and m != "core_attn"]
    if other:
        notes.append(f"--recompute-modules {' '.join(other)}: modules of hybrid (GDN/GDP/mHC) models, not modelled")
    return out


def capacity_settings(args, is_moe: bool, notes: list) -> dict:
    """moe_capacity_permille from --moe-expert-capacity-factor (a negative factor means
    dropless, transformer_config.py:1836-1840) and --moe-pad-expert-input-to-capacity
    (which needs a factor, transformer_config.py:1862-1866)."""
    cf = _float(args, "capacity")
    if cf is not None and cf < 0:
        cf = None
    if args.pad_capacity and cf is None:
        raise NdplanError(SWITCHES["pad_capacity"], True, "needs --moe-expert-capacity-factor "
                          "(transformer_config.py:1862-1866)", "give the capacity factor or drop the flag")
    if cf is None or not is_moe:
        return {}
    rows = cf if args.pad_capacity else min(cf, 1.0)
    if rows <= 0:
        raise NdplanError(FLAGS["capacity"], cf, "keeps no token", "give a capacity factor above 0")
    if not args.pad_capacity:
        notes.append(f"{FLAGS['capacity']} {cf:g}: tokens over capacity are dropped; counted as "
                     f"{rows:g} x tokens x top-k rows (balanced routing)")
    permille = round(rows * 1000)
    return {} if permille == 1000 else {"moe_capacity_permille": permille}


DISPATCHERS = ("allgather", "alltoall", "flex")
FLEX_BACKENDS = ("deepep", "hybridep", "ncclep")
"""TransformerConfig.moe_token_dispatcher_type and moe_flex_dispatcher_backend Literals
(transformer_config.py:891-903; the flags are generated from the dataclass, arguments.py:2373)."""


def _sms(args) -> int:
    """moe_flex_dispatcher_num_sms, else the deprecated moe_deepep_num_sms (transformer_config.py:
    1792-1810), else 20 (token_dispatcher.py:1287-1292)."""
    for name in ("flex_sms", "deepep_sms"):
        v = getattr(args, name)
        if v is not None:
            try:
                n = int(v)
            except ValueError:
                raise NdplanError(FLAGS[name], v, "not a whole number", "give an even SM count such as 20") from None
            if not 2 <= n <= 1024:
                raise NdplanError(FLAGS[name], v, "not an SM count DeepEP can split into channels",
                                  "give an even number of SMs such as 20")
            return n
    return 20


def dispatcher_settings(args, is_moe: bool, ep_ranks: int, notes: list) -> dict:
    """moe_allgather_dispatch for the allgather dispatcher (the default), deepep_sms for the flex
    dispatcher with the deepep backend, with Megatron's refusals:
    --moe-enable-deepep needs flex (transformer_config.py:1743-1745), deepep cannot pad to
    capacity (:1755-1761), the group tp_ep = etp x ep must have more than one rank
    (token_dispatcher.py:1836), and DeepEP takes only the group sizes of its config table
    (deep_ep/buffers/legacy.py:259)."""
    from ndplan.formulas import deepep
    kind = _choice(args, "dispatcher", DISPATCHERS, "allgather")
    backend = _choice(args, "flex_backend", FLEX_BACKENDS, "deepep")
    if args.enable_deepep:
        if kind != "flex":
            raise NdplanError(SWITCHES["enable_deepep"], True, "needs --moe-token-dispatcher-type flex "
                              "(transformer_config.py:1743-1745)", "add --moe-token-dispatcher-type flex")
        if getattr(args, "flex_backend") == "hybridep":
            raise NdplanError(FLAGS["flex_backend"], "hybridep", "conflicts with --moe-enable-deepep "
                              "(transformer_config.py:1746-1747)", "drop one of them")
        backend = "deepep"
    if is_moe and kind == "allgather":  # the tokens gathered over tp x ep (EngineProfile.moe_allgather_dispatch)
        return {"moe_allgather_dispatch": 1}
    if not is_moe or kind != "flex":
        return {}
    if backend != "deepep":
        notes.append(f"{FLAGS['flex_backend']} {backend}: its buffers are not modelled (estimated as the "
                     "all-to-all's)")
        return {}
    if args.pad_capacity:
        raise NdplanError(SWITCHES["pad_capacity"], True, "is refused by the flex dispatcher with the deepep "
                          "backend (transformer_config.py:1755-1761)", "drop it or use --moe-token-dispatcher-type alltoall")
    if ep_ranks not in deepep.CONFIGS:
        raise NdplanError("--expert-model-parallel-size", ep_ranks, "DeepEP has no config for this many "
                          "expert-tensor x expert-parallel ranks (deep_ep/buffers/legacy.py:259)",
                          f"give etp x ep one of {', '.join(map(str, deepep.CONFIGS))}")
    sms = _sms(args)
    notes.append(f"DeepEP buffer for {ep_ranks} ranks with {sms} SMs (mem.dispatch_buffers)")
    return {"deepep_sms": sms}


FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise", "custom")
"""--fp8-recipe choices (Fp8Recipe, megatron/core/enums.py:12-19 at d98e8a64)."""
FP8_RECIPE_SCALES = {"mxfp8": {"fp8_scale_bytes": 1, "fp8_act_block": 32, "fp8_weight_block": 32},
                     "blockwise": {"fp8_scale_bytes": 4, "fp8_act_block": 128, "fp8_weight_block": 128 * 128}}
"""The block scales of ``--fp8-recipe`` (Fp8Recipe, megatron/core/enums.py:12-19: delayed,
tensorwise, mxfp8, blockwise, custom) as Transformer Engine stores them (EngineProfile
fp8_scale_bytes, fp8_act_block, fp8_weight_block cite TE's lines): MXFP8BlockScaling, one E8M0
byte per 32 elements of every copy; Float8BlockScaling, one fp32 scale per 128 input elements
and per 128 x 128 weight block. delayed and tensorwise keep one fp32 scale per tensor (nothing
per element); custom recipes are not read."""


def fp8_settings(args, zero: int, notes: list) -> dict:
    """fp8_linear_inputs, fp8_weight_cache_bytes and the recipe's block scales (FP8_RECIPE_SCALES)
    under ``--fp8-format`` (Transformer Engine fp8
    GEMMs in every transformer-layer linear; EngineProfile documents both with TE's lines): 2 bytes
    of cached fp8 weight and transpose per layer weight, 1 with fp8 primary weights
    (``--fp8-param-gather``: the transpose only), none with ``--disable-parameter-transpose-cache``
    (transformer_engine.py:1338-1339) or under ZeRO-3. The TN-only fp8 GEMMs of Hopper are
    assumed (a transpose per weight)."""
    if not args.fp8_format:
        return {}
    scales = FP8_RECIPE_SCALES.get(args.fp8_recipe or "delayed", {})
    cache = 0 if args.no_transpose_cache else (1 if args.fp8_param_gather else 2)
    if args.no_transpose_cache:
        notes.append(f"{SWITCHES['no_transpose_cache']}: each forward quantizes the weights anew; those fp8 "
                     "copies, saved for the backward, are not modelled")
    elif zero >= 3 and args.megatron_fsdp and args.fp8_param_gather:
        notes.append("Megatron-FSDP with fp8 primary weights: each gathered layer in fp8 and the running layer's "
                     "transpose in backward (mem.zero3_gather, formulas/megatron_fsdp.py)")
    elif zero >= 3:
        notes.append("fp8 weight copies under ZeRO-3 / Megatron-FSDP are not modelled")
    elif scales:
        notes.append(f"fp8 GEMMs: linear inputs saved in fp8; {cache} cached fp8 cop{'y' if cache == 1 else 'ies'} "
                     f"of each layer weight (row-wise and column-wise on every GPU), all with {args.fp8_recipe}'s "
                     "block scales")
    else:
        notes.append(f"fp8 GEMMs: linear inputs saved in fp8; {cache} B per layer weight of cached fp8 "
                     "weight copies (Hopper's transposes; on Blackwell give --set fp8_weight_cache_bytes="
                     f"{cache - 1})")
    return {"fp8_linear_inputs": 1, "fp8_weight_cache_bytes": cache} | scales


def engine(args, is_moe: bool, selective: bool, notes: list, ep_ranks: int = 1, zero: int = 0,
           deepspeed: bool = False) -> str:
    """The megatron engine with all of the above (engines.derive; settings equal to the
    profile's are left out); ``deepspeed``: a Megatron-DeepSpeed launch (its ZeRO is DeepSpeed's)."""
    from ndplan.engines import MEGATRON, derive
    from ndplan.interop import megatron_fsdp
    from ndplan.interop import megatron_deepspeed as MDS
    moe = (MDS.moe_settings(args, is_moe, notes) if deepspeed else
           capacity_settings(args, is_moe, notes) | dispatcher_settings(args, is_moe, ep_ranks, notes))
    settings = (optimizer_settings(args, notes) | recompute_settings(args, selective, notes) | moe
                | fp8_settings(args, zero, notes) | megatron_fsdp.settings(args, zero, notes)
                | {"megatron_deepspeed": deepspeed})
    return derive("megatron", {k: v for k, v in settings.items() if getattr(MEGATRON, k) != v})
