"""What Megatron-LM's validate_args refuses that the launch-file reader can see, refused in one
line before any estimate (NVIDIA/Megatron-LM@d98e8a64 megatron/training/arguments.py)."""

from __future__ import annotations

from ndplan.errors import NdplanError
from ndplan.export import megatron as X


def fsdp2_refusals(args, max_connections: str | None) -> None:
    """What validate_args asserts for --use-torch-fsdp2 (Megatron-LM@d98e8a64 training/
    arguments.py:1031-1049) and the reader can see: no distributed optimizer, no gradient
    accumulation fusion (on by default: --no-gradient-accumulation-fusion turns it off), no
    pipeline or expert parallelism, no --fp16, CUDA_DEVICE_MAX_CONNECTIONS not 1. The untied embedding
    (1044-1045) is the exporter's check, which knows the model."""
    fix = "FSDP2 runs alone; or use --use-megatron-fsdp, which takes them (arguments.py:1118-1135)"
    if args.distributed_optimizer:
        raise NdplanError(X.FLAG["fsdp2"], True, "Megatron asserts it is not supported with "
                          f"{X.FLAG['distributed_optimizer']} (arguments.py:1038-1039)", "drop one of the two; " + fix)
    if not args.no_grad_fusion:
        raise NdplanError(X.FLAG["fsdp2"], True, "Megatron asserts it is not supported with gradient accumulation "
                          "fusion, which is on by default (arguments.py:1040-1041)",
                          f"add {X.FLAG['no_grad_fusion']}")
    for name, line in (("pp", "1034-1035"), ("ep", "1036-1037")):
        v = getattr(args, name, None)
        if v is not None and str(v) not in ("1",):
            raise NdplanError(X.FLAG["fsdp2"], True, f"Megatron asserts it is not supported with {X.FLAG[name]} {v} "
                              f"(arguments.py:{line})", fix)
    if args.fp16:
        raise NdplanError(X.FLAG["fsdp2"], True, "Megatron asserts it is not supported with --fp16 "
                          "(arguments.py:1046-1047)", "use --bf16")
    if max_connections == "1":
        raise NdplanError("CUDA_DEVICE_MAX_CONNECTIONS", "1", "Megatron asserts FSDP2 needs a value other than 1 "
                          "(arguments.py:1048-1049)", "unset CUDA_DEVICE_MAX_CONNECTIONS (as NVIDIA's train_llama3_8b_fsdp_h100_fp8.sh "
                          "does) or give it a value other than 1, or drop "
                          f"{X.FLAG['fsdp2']}")
