"""Megatron-FSDP flags (``--use-megatron-fsdp``) read into the megatron engine's settings
(EngineProfile.megatron_fsdp*, formulas/megatron_fsdp.py). The ZeRO level is the sharding
strategy (interop/megatron.py ``SHARDING_ZERO``) and the main gradients' dtype ``grad_dtype``
(``_grad_dtype``); here the rest. Flags at NVIDIA/Megatron-LM@d98e8a64
megatron/training/arguments.py (A below).
"""

from __future__ import annotations

from ndplan.errors import NdplanError
from ndplan.limits import MAX_ELEMENTS
from ndplan.interop.base import choice_arg, int_arg
from ndplan.units import DTYPE_BYTES

FLAGS = {"fsdp_main_params": "--megatron-fsdp-main-params-dtype", "fsdp_grad_comm": "--megatron-fsdp-grad-comm-dtype",
         "fsdp_comm_unit": "--suggested-communication-unit-size", "fsdp_version": "--megatron-fsdp-version",
         "fsdp_instances": "--num-distributed-optimizer-instances", "fsdp_outer": "--outer-dp-sharding-strategy"}
"""Flags with a value (argparse dest -> flag)."""
SWITCHES = {"fsdp_double_buffer": "--fsdp-double-buffer", "nccl_ub": "--use-nccl-ub",
            "fsdp_max_pool": "--megatron-fsdp-max-pool-double-buffer",
            "fsdp_keep_transpose": "--keep-fp8-transpose-cache",
            "fsdp_persist_on_fail": "--fsdp-db-use-persist-buf-on-alloc-fail"}

DTYPE_CHOICES = ("fp32", "bf16", "fp16", "auto")
"""--megatron-fsdp-main-params-dtype / --megatron-fsdp-grad-comm-dtype choices (A:3687-3698)."""
COMM_BYTES = {d: DTYPE_BYTES[d] for d in ("fp32", "bf16", "fp16")}
MAIN_PARAMS_BYTES = COMM_BYTES | {"auto": 0}
"""Main weight bytes per element; ``auto`` maps to None (A:1077-1091), and then no main weight
buffer is made: the model weight buffer is the optimizer's (param_and_grad_buffer.py:2689-2693)."""


def _choice(args, name: str, default: str) -> str:
    return choice_arg(args, name, FLAGS[name], DTYPE_CHOICES, default)


def _count(args, name: str, default: int | None) -> int | None:
    return int_arg(args, name, FLAGS[name], default, most=MAX_ELEMENTS)


OUTER_CHOICES = ("no_shard", "optim")
"""--outer-dp-sharding-strategy choices (arguments.py:3193-3194 at d98e8a64)."""


def settings(args, zero: int, notes: list) -> dict:
    """Engine settings of Megatron-FSDP (empty without ``--use-megatron-fsdp``)."""
    if not args.megatron_fsdp:
        return {}
    out: dict = {"megatron_fsdp": 1}
    version = _count(args, "fsdp_version", 1)
    if version != 1:
        notes.append(f"{FLAGS['fsdp_version']} {version}: estimated with Megatron-FSDP v1's buffers")
    main = _choice(args, "fsdp_main_params", "fp32")
    out["master_bytes"] = MAIN_PARAMS_BYTES[main]
    comm = _choice(args, "fsdp_grad_comm", "auto")
    if comm != "auto":
        out["megatron_fsdp_grad_comm_bytes"] = COMM_BYTES[comm]
        if zero < 2:
            notes.append(f"{FLAGS['fsdp_grad_comm']} {comm}: the unsharded gradients' {comm} copy made for each "
                         "reduction (param_and_grad_buffer.py:4067-4073) is not modelled")
    unit = _count(args, "fsdp_comm_unit", None)
    if unit is not None:
        out["megatron_fsdp_comm_unit_elements"] = unit
    double = [f for n, f in SWITCHES.items() if n in ("fsdp_double_buffer", "nccl_ub", "fsdp_max_pool")
              and getattr(args, n)]
    if double:
        out["megatron_fsdp_double_buffer"] = 1  # A:1172-1181
        notes.append(f"{' '.join(double)}: Megatron-FSDP double buffers, pools of two decoder layers' all-gather and "
                     "gradient buckets kept for the run (mem.zero3_gather)"
                     + ("; the NCCL user-buffer memory pool's own overhead is not modelled" if args.nccl_ub else ""))
    if args.fsdp_keep_transpose:
        notes.append(f"{SWITCHES['fsdp_keep_transpose']}: the fp8 transposes of every gathered layer, kept, are "
                     "not modelled (only the running layer's)")
    if args.fsdp_persist_on_fail and double:
        notes.append(f"{SWITCHES['fsdp_persist_on_fail']}: the embedding's and output layer's gradient buckets, "
                     "then kept for the run, are counted as transient")
    outer = getattr(args, "fsdp_outer", None)
    if outer is not None:
        if outer not in OUTER_CHOICES:  # argparse choices, A:3193-3194
            raise NdplanError(FLAGS["fsdp_outer"], outer, "not a strategy Megatron accepts",
                              f"give one of {', '.join(OUTER_CHOICES)}")
        notes.append(f"{FLAGS['fsdp_outer']} {outer}: the outer data-parallel group of hybrid FSDP, not modelled")
    if (_count(args, "fsdp_instances", 1) or 1) > 1:
        notes.append(f"{FLAGS['fsdp_instances']} {args.fsdp_instances}: hybrid FSDP (sharding inside each "
                     "instance, replicas across them) is not modelled: the states are counted sharded over dp*cp")
    return out


def flags(strat, eng) -> tuple[dict, list[str]]:
    """(flag -> value, notes): the Megatron-FSDP flags that read back as ``strat`` with the engine
    ``eng`` (the inverse of ``settings``, for export/megatron.py); Megatron-FSDP needs the
    fsdp_dtensor checkpoint format (A:1169-1170) and CUDA_DEVICE_MAX_CONNECTIONS unset or above 1
    (A:1166-1167), which no argument sets."""
    from ndplan.interop.megatron import MEMORY_FLAGS, ZERO_SHARDING
    name = ZERO_SHARDING[strat.zero]
    out = {"--use-megatron-fsdp": True, MEMORY_FLAGS["sharding"]: name, "--ckpt-format": "fsdp_dtensor",
           "--no-gradient-accumulation-fusion": True}
    notes = ["Megatron-FSDP: run with CUDA_DEVICE_MAX_CONNECTIONS unset or above 1 (arguments.py:1166-1167)"]
    if strat.grad_dtype == "fp32":
        out[MEMORY_FLAGS["fsdp_main_grads"]] = "fp32"
    main = {b: d for d, b in MAIN_PARAMS_BYTES.items() if d != "fp16"}.get(eng.master_bytes)
    if main is None:
        notes.append(f"main weights of {eng.master_bytes} B: no --megatron-fsdp-main-params-dtype keeps them; "
                     "written as fp32")
    elif main != "fp32":
        out[FLAGS["fsdp_main_params"]] = main
    if eng.megatron_fsdp_comm_unit_elements:
        out[FLAGS["fsdp_comm_unit"]] = eng.megatron_fsdp_comm_unit_elements
    if eng.megatron_fsdp_double_buffer:
        out[SWITCHES["fsdp_double_buffer"]] = True
    comm = {b: d for d, b in COMM_BYTES.items() if d != "fp16"}.get(eng.megatron_fsdp_grad_comm_bytes)
    if comm is not None:
        out[FLAGS["fsdp_grad_comm"]] = comm
    return out, notes
