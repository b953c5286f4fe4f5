"""Megatron-LM arguments -> model + Strategy (the inverse of export/megatron.py, with
its flag table ``FLAG``).

Input: an argument file (flags one per line or on one line) or a bash launch script,
read into words by interop.shell (arrays, ``${VAR:-default}`` with the environment or the
default, said in a note, ``$(( ))``, the ``if`` branches bash runs when their conditions are
known; not run: case, loops, functions). The words are parsed with
argparse (``parse_known_args``): unknown flags are ignored and listed.

Mapping (Megatron-LM defaults where a flag is absent; arguments.py at
NVIDIA/Megatron-LM@d98e8a64): tp / pp / cp / ep <- the parallel sizes (1), etp <-
``--expert-tensor-parallel-size``, default tp (arguments.py:587-588); dp = gpus / (tp pp
cp), gpus <- ``--gpus`` or torchrun ``--nproc_per_node`` x ``--nnodes``; vpp <-
``--num-virtual-stages-per-pipeline-rank`` or L / (pp ``--num-layers-per-virtual-pipeline-
stage``); sp <- ``--sequence-parallel``; zero <- 3 with ``--use-torch-fsdp2``, the
Megatron-FSDP sharding strategy with ``--use-megatron-fsdp`` (``SHARDING_ZERO``), 1 with
``--use-distributed-optimizer``, else 0; grad_dtype bf16 with ``--bf16
--grad-reduce-in-bf16`` or Megatron-FSDP's main gradients in the parameters' dtype
(``_grad_dtype``); weight_dtype fp8 with ``--fp8-param-gather``; mbs <-
``--micro-batch-size`` (1); gbs <- ``--global-batch-size`` (mbs dp); seq <-
``--seq-length``; recompute <- ``--recompute-granularity`` (``--recompute-activations`` =
selective), ``--recompute-method block --recompute-num-layers N`` -> the first N layers of
each chunk, ``uniform`` -> every layer; uneven layers <- ``--decoder-first/last-pipeline-
num-layers`` or ``--pipeline-model-parallel-layout``; schedule interleaved when vpp > 1;
engine megatron, with the optimizer (``--optimizer``, ``--sgd-momentum``, the
precision-aware optimizer's state dtypes), ``--recompute-modules`` and the MoE capacity
(``--moe-expert-capacity-factor``, ``--moe-pad-expert-input-to-capacity``), DeepEP's
buffer (``--moe-token-dispatcher-type flex`` with the deepep backend) and the fp8 recipe's
saved fp8 inputs and cached fp8 weights as its settings (interop.megatron_memory), and
Megatron-FSDP's main-weight dtype, communication unit and double buffers (interop.megatron_fsdp).
Read and stated in a note, not modelled: the fp8 amax history, the allgather, hybridep and
ncclep dispatchers' buffers.

Architecture (dense, MoE, MLA, MTP, vocabulary) from the flags: interop.megatron_model;
otherwise ``-m MODEL``.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
from pathlib import Path

from ndplan.errors import NdplanError
from ndplan.export import megatron as X
from ndplan.interop import launcher, megatron_deepspeed as MDS, megatron_fsdp as MF, megatron_memory as MX, \
    megatron_model as MM, megatron_validate as MV, shell
from ndplan.interop import megatron_launch as ML, megatron_textedit as MT
from ndplan.interop.base import CheckInput, choice_arg, int_arg, resolve_model, world_dp
from ndplan.interop.textedit import REMOVE
from ndplan.points import default_schedule
from ndplan.layouts import layers_per_stage

FLAG, SWITCHES = X.FLAG, X.SWITCHES
MODEL_FLAGS, MODEL_SWITCHES = MM.FLAGS, MM.SWITCHES | {"recompute_activations": "--recompute-activations"}
MEMORY_FLAGS = {"sharding": "--data-parallel-sharding-strategy", "fsdp_main_grads": "--megatron-fsdp-main-grads-dtype",
                "fp8_amax_history": "--fp8-amax-history-len",
                "fp8_amax_algo": "--fp8-amax-compute-algo"} | MX.FLAGS | MF.FLAGS
"""Flags with a value that change memory and are not parallel degrees (argparse dest -> flag);
the amax flags are read into the fp8 note (their per-tensor history is not modelled)."""
MEMORY_SWITCHES = {"megatron_fsdp": "--use-megatron-fsdp", "fp16": "--fp16",
                   "grads_fp32": "--accumulate-allreduce-grads-in-fp32",
                   "moe_layer_recompute": "--moe-layer-recompute"} | MX.SWITCHES | MF.SWITCHES
FSDP_GRAD_DTYPES = ("fp32", "bf16", "fp16", "auto")
"""--megatron-fsdp-main-grads-dtype choices (arguments.py:3691)."""
FP8_FORMATS = ("e4m3", "hybrid")
"""--fp8-format: TransformerConfig.fp8 Literal['e4m3', 'hybrid'] (transformer_config.py:587-589)."""
SHARDING_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
"""Megatron-FSDP ``--data-parallel-sharding-strategy`` -> ZeRO stage: megatron/core/distributed/fsdp/
src/megatron_fsdp/fully_shard.py ``ShardingStrategy`` (NO_SHARD 0 "similar memory usage to DDP",
OPTIM 1 optimizer states and main weights, OPTIM_GRADS 2 "ZeRO-2", OPTIM_GRADS_PARAMS 3 "ZeRO-3");
the argument's default is optim_grads_params (arguments.py:3190-3192)."""
ZERO_SHARDING = {z: n for n, z in SHARDING_ZERO.items()}
"""ZeRO stage -> Megatron-FSDP sharding strategy (the inverse of SHARDING_ZERO)."""
LAUNCHER = {"nproc": launcher.NPROC, "nnodes": launcher.NODES}
_INT = {"layers", "tp", "pp", "cp", "ep", "etp", "layers_per_vstage", "vstages_per_rank", "first_layers",
        "last_layers", "mbs", "gbs", "seq", "recompute_num_layers"}


class _Parser(argparse.ArgumentParser):
    """argparse that reports a flag without its value as one NdplanError (argparse would
    print its usage and exit)."""

    def error(self, message: str):
        raise NdplanError("FILE", "Megatron-LM arguments", message, "give every flag its value")


@functools.cache
def parser() -> argparse.ArgumentParser:
    """One parser (argparse's parse_known_args leaves it unchanged; ``check`` reads a script
    again for every edit it tries)."""
    p = _Parser(allow_abbrev=False, add_help=False)
    for name, flag in FLAG.items():
        if name in SWITCHES:
            p.add_argument(flag, dest=name, action="store_true")
        else:
            p.add_argument(flag, dest=name, type=str)
    for name, flag in MODEL_FLAGS.items():  # Megatron-DeepSpeed's --num-experts: one per layer group
        p.add_argument(flag, dest=name, type=str, **({"nargs": "+"} if name == "experts" else {}))
    for name, flag in MODEL_SWITCHES.items():
        if flag not in FLAG.values():  # --untie-embeddings-and-output-weights: the exporter writes it too
            p.add_argument(flag, dest=name, action="store_true")
    for name, flag in MEMORY_FLAGS.items():
        p.add_argument(flag, dest=name, type=str)
    for name, flag in (MEMORY_SWITCHES | ML.MULTIMODAL_SWITCHES).items():
        p.add_argument(flag, dest=name, action="store_true")
    for name, flag in (ML.MULTIMODAL_FLAGS | ML.HYBRID_FLAGS | ML.LEGACY_FLAGS).items():
        p.add_argument(flag, dest=name, type=str)
    p.add_argument("--recompute-modules", dest="recompute_modules", nargs="+")
    MDS.add_arguments(p)
    for name, flags in LAUNCHER.items():
        p.add_argument(*flags, dest=name, type=str)
    return p


# --------------------------------------------------------------------------- words

def words(text: str, environ: dict | None = None) -> list[tuple[str, int]]:
    """(word, 0-based line) of the script after variable expansion (interop.shell)."""
    return [(w.text, w.line) for w in shell.read_words(text, environ)]


def locate(text: str) -> dict[str, int]:
    """Known flag -> 0-based line of its last occurrence."""
    known = set(FLAG.values()) | set(MODEL_FLAGS.values()) | set(MODEL_SWITCHES.values()) | set(ML.MULTIMODAL_FLAGS.values())
    out = {}
    for w, i in words(text):
        flag = w.split("=", 1)[0]
        if flag in known:
            out[flag] = i
    return out


# --------------------------------------------------------------------------- model, strategy

_int = int_arg


def _getter(args):
    """``get(dest, default=None, lo=1)``: an integer flag of ``args``."""
    flags = FLAG | MODEL_FLAGS
    return lambda dest, default=None, lo=1: _int(args, dest, flags[dest], default, lo)


def _layers(args, L: int, pp: int, vpp: int):
    """Decoder layers per virtual stage from the layout or the first/last-stage counts, as
    Megatron splits them (NVIDIA/Megatron-LM@d98e8a64 transformer_block.py:103-146: the
    given counts come off L and off the stages, the rest divides evenly over the stages left,
    a count is given to every virtual chunk of its rank; :175-178 each rank's count divisible
    by vpp); layouts.layers_per_stage deals them in model order."""
    first, last = _int(args, "first_layers", FLAG["first_layers"]), _int(args, "last_layers", FLAG["last_layers"])
    if args.layout:
        groups = args.layout.split("|")
        return tuple(g.count("t") for g in groups)
    if first is None and last is None:
        return None
    given = [n for n in (first, last) if n is not None]
    left = pp - len(given)
    rest = L - sum(given)
    if pp < 2 or rest < 0 or (left > 0 and rest % left) or (left == 0 and rest):
        raise NdplanError(FLAG["first_layers"] if first is not None else FLAG["last_layers"], given[0],
                          f"the other {rest} of {L} layers do not split evenly over the {max(left, 0)} other "
                          f"stages of pp={pp}", "change the first/last stage layer counts")
    mid = rest // left if left else 0
    first, last = (mid if first is None else first), (mid if last is None else last)
    for flag, n in ((FLAG["first_layers"], first), (FLAG["last_layers"], last), ("middle stages", mid)):
        if n % vpp and (flag != "middle stages" or pp > 2):
            raise NdplanError(flag, n, f"not divisible by the {vpp} virtual stages per rank",
                              "give layer counts divisible by --num-virtual-stages-per-pipeline-rank")
    return layers_per_stage(L, pp, vpp, default_schedule(vpp), first, last)


def _moe_layer_recompute(args, notes: list) -> None:
    """--moe-layer-recompute, as TransformerConfig takes it (transformer_config.py:2014-2027 at
    d98e8a64): refused with full granularity, else selective with "moe" added to the modules
    (default core_attn)."""
    if not args.moe_layer_recompute:
        return
    flag = MEMORY_SWITCHES["moe_layer_recompute"]
    if args.recompute_granularity == "full":
        raise NdplanError(flag, True, "Megatron-LM refuses it with --recompute-granularity full "
                          "(transformer_config.py:2019-2022)", "drop one of them")
    args.recompute_granularity = "selective"
    mods = list(args.recompute_modules or ["core_attn"])
    args.recompute_modules = mods + ([] if "moe" in mods else ["moe"])
    notes.append(f"{flag}: selective recompute of {' '.join(args.recompute_modules)} (transformer_config.py:2014-2027)")


def _recompute(args, notes: list) -> dict:
    gran = args.recompute_granularity or ("selective" if args.recompute_activations else None)
    if gran is None:
        return {"recompute": "none"}
    if gran not in ("full", "selective"):
        raise NdplanError(FLAG["recompute_granularity"], gran, "unknown granularity", "give full or selective")
    if gran == "selective":
        return {"recompute": "selective"}
    n = _int(args, "recompute_num_layers", FLAG["recompute_num_layers"], 1)
    if args.recompute_method == "block":
        return {"recompute": "full", "recompute_layers": n}
    if n > 1:
        notes.append(f"uniform recompute in groups of {n} layers estimated as full recompute of every layer")
    return {"recompute": "full"}


def _missing_model(args, name: str) -> str:
    """What the script lacks to define the architecture (only the absent flags)."""
    need = [(FLAG["layers"], args.layers), (MODEL_FLAGS["hidden"], args.hidden), (MODEL_FLAGS["heads"], args.heads)]
    lacks = [f for f, v in need if v is None]
    if args.vocab is None:
        lacks.append(MM.missing_vocab_reason(args))
    return f"{name} lacks {', '.join(lacks)} to define the architecture"


def _zero(args, max_connections: str | None = None) -> tuple[int, str]:
    """(ZeRO stage, the flags it came from)."""
    if args.fsdp2:
        MV.fsdp2_refusals(args, max_connections)
        return 3, FLAG["fsdp2"]
    if args.megatron_fsdp:
        strategy = args.sharding or "optim_grads_params"
        if strategy not in SHARDING_ZERO:
            raise NdplanError(MEMORY_FLAGS["sharding"], strategy, "not a Megatron-FSDP sharding strategy",
                              f"give one of {', '.join(SHARDING_ZERO)}")
        return SHARDING_ZERO[strategy], f"--use-megatron-fsdp {MEMORY_FLAGS['sharding']} {strategy}"
    if args.distributed_optimizer:
        return 1, FLAG["distributed_optimizer"]
    return 0, "no --use-distributed-optimizer / --use-torch-fsdp2 / --use-megatron-fsdp"


def _grad_dtype(args, notes: list) -> tuple[str, str]:
    """(grad_dtype, why). Under --bf16 the main gradients are fp32 unless
    --grad-reduce-in-bf16 (arguments.py:1213-1217; param_and_grad_buffer.py:924; under --fp16 they
    are fp16 unless --accumulate-allreduce-grads-in-fp32, :1195-1219
    ``grad_dtype = torch.float if grad_reduce_in_fp32 else param.dtype``); Megatron-FSDP's
    main gradients default to the parameters' dtype (--megatron-fsdp-main-grads-dtype
    auto: distributed_data_parallel_config.py:195-198)."""
    if args.fp16:
        notes.append("--fp16: fp16 weights and loss scaling; estimated with bf16 sizes (same bytes)")
    low = args.bf16 or args.fp16
    if not low and not args.deepspeed:  # Megatron-DeepSpeed may set the precision in its DeepSpeed config
        notes.append("neither --bf16 nor --fp16: Megatron-LM trains in fp32 (params_dtype float, arguments.py:1194 "
                     "at d98e8a64); not modelled: estimated as bf16 training, which under-counts the weights, "
                     "gradients and activations")
    if args.megatron_fsdp:
        d = args.fsdp_main_grads or "auto"
        if d not in FSDP_GRAD_DTYPES:
            raise NdplanError(MEMORY_FLAGS["fsdp_main_grads"], d, "not a dtype Megatron accepts",
                              f"give one of {', '.join(FSDP_GRAD_DTYPES)}")
        if d == "fp32" or (d == "auto" and not low):
            return "fp32", f"{MEMORY_FLAGS['fsdp_main_grads']} {d}"
        return "bf16", f"{MEMORY_FLAGS['fsdp_main_grads']} {d} (the parameters' dtype)"
    if low and args.grad_bf16:
        return "bf16", FLAG["grad_bf16"]
    if low and args.precision_aware and args.main_grads_dtype == "bf16":
        return "bf16", "--main-grads-dtype bf16 with --use-precision-aware-optimizer (arguments.py:1204-1213)"
    if args.fp16 and not args.grads_fp32:
        return "bf16", ("--fp16: fp16 main gradients (the parameters' dtype; only --bf16 or "
                        "--accumulate-allreduce-grads-in-fp32 makes them fp32, arguments.py:1195-1219)")
    return "fp32", "Megatron-LM default (fp32 main gradients)"


def _fp8(args, notes: list) -> str:
    """weight_dtype: fp8 with --fp8-param-gather (Transformer Engine fp8 primary weights,
    arguments.py:2016-2018; the distributed optimizer keeps an fp32 main copy,
    distrib_optimizer.py:421-445), else the engine's."""
    if args.fp8_format is not None and args.fp8_format not in FP8_FORMATS:
        raise NdplanError(FLAG["fp8_format"], args.fp8_format, "not an fp8 format", f"give one of {', '.join(FP8_FORMATS)}")
    recipe = choice_arg(args, "fp8_recipe", MEMORY_FLAGS["fp8_recipe"], MX.FP8_RECIPES, "delayed")  # argparse choices
    if not args.fp8_format:
        return "auto"
    notes.append(f"--fp8-format {args.fp8_format} --fp8-recipe {recipe}: fp8 GEMMs at the FP8 peak, their "
                 "operands quantised every micro-batch, the MLP's output gradient in two fp8 copies in backward; "
                 "the attention core stays 16-bit (the amax history is not modelled"
                 + _FP8_RECIPE_NOTE.get(recipe, "") + ")")
    if args.fp8_param_gather and args.fsdp2:
        notes.append("--fp8-param-gather under --use-torch-fsdp2: Megatron turns it off (Transformer Engine >= 2.0, "
                     "arguments.py:1051-1057): bf16 weights, gathered in bf16")
        return "auto"
    if args.fp8_param_gather:
        notes.append("--fp8-param-gather: the decoder layers' weights held in fp8, the embedding and output layer in "
                     "bf16 (states.FP8_VOCAB_BYTES)")
        return "fp8"
    return "auto"


_FP8_RECIPE_NOTE = {
    "mxfp8": "; Transformer Engine runs MXFP8 on Blackwell only",
    "custom": "; a custom recipe's scales are not read (counted as per-tensor)",
}


def _moe_notes(args, spec, notes: list) -> None:
    if spec.is_moe and not args.dispatcher and not args.deepspeed:  # DeepSpeed's MoE: MDS.moe_note
        notes.append(f"{MEMORY_FLAGS['dispatcher']} not given: Megatron's default allgather (tokens gathered over "
                     "tp x ep; transformer_config.py:891-903)")


def _expansions(ws, notes: list) -> None:
    """One note per value the script took from the environment or a default, for the
    flags the reader uses; a ``$(( ))`` value it could not evaluate is refused with the reason."""
    known = set(FLAG.values()) | set(MODEL_FLAGS.values()) | set(MEMORY_FLAGS.values()) | {
        f for fl in LAUNCHER.values() for f in fl} | set(MDS.FLAGS.values())
    seen = set()
    for k, w in enumerate(ws):
        flag = w.text.split("=", 1)[0]
        if flag not in known:
            continue
        val = w if "=" in w.text else (ws[k + 1] if k + 1 < len(ws) else None)
        text = (val.text.split("=", 1)[-1] if val is w else val.text) if val is not None else ""
        why = [s for s in (val.sources if val is not None else ()) if "not evaluated" in s]
        if why and "$((" in val.text and flag not in MDS.NAME_FLAGS:
            if re.search(r"\$\((?!\()", val.text.replace("$((", "")):  # a $( ) inside: a command's output
                raise NdplanError(flag, text[:60] + ("..." if len(text) > 60 else ""),
                                  "computed from a command the script runs ($( ... ), e.g. nvidia-smi or hostfile "
                                  "counts), known only at run time", "write the number in the script")
            raise NdplanError(flag, text, why[0], "write the number, or use + - * / % ** on "
                              "integers and variables the script sets")
        for src in (val.sources if val is not None else ()):
            if (flag, src) not in seen:
                seen.add((flag, src))
                notes.append(shell.shown(f"{flag} {text}: {src}"))


def _devices(args, ws, gpus, notes: list) -> tuple[int | None, str]:
    """(device count, where it came from): ``--gpus``, else the launcher's (interop.launcher)."""
    got = launcher.launched(ws)
    launched = got[0] * got[1] if got else None
    if gpus is None and launched is None and args.nproc:  # torchrun also takes gpu, cpu, auto, elastic 1:4
        bad = ("--nproc_per_node", args.nproc) if not str(args.nproc).isdigit() or int(args.nproc) < 1 \
            else ("--nnodes", args.nnodes)
        raise NdplanError(*bad, "not a device count ndplan can read (a whole number >= 1)", "give --gpus N")
    if gpus is None and launched is not None:
        return launched, "the launcher (torchrun --nproc_per_node x --nnodes, deepspeed --num_gpus x --num_nodes)"
    if launched is not None and launched != gpus:
        notes.append(f"--gpus {gpus} replaces the script's torchrun count ({launched}); dp follows it")
    return gpus, "--gpus"


def _virtual_stages(args, L: int, pp: int) -> int:
    """vpp from --num-virtual-stages-per-pipeline-rank, or --num-layers-per-virtual-pipeline-stage."""
    vpp = _int(args, "vstages_per_rank", FLAG["vstages_per_rank"])
    per_v = _int(args, "layers_per_vstage", FLAG["layers_per_vstage"])
    if vpp is None and per_v is not None:
        if L % (pp * per_v):
            raise NdplanError(FLAG["layers_per_vstage"], per_v, f"pp*{per_v} does not divide num_layers={L}",
                              "change it or --pipeline-model-parallel-size")
        vpp = L // (pp * per_v)
    return vpp or 1


def _origins(args, loc: dict, tp: int, seq, decoder_seq) -> dict:
    """Where the layout's fields came from: the line of their flag, an old or aliased flag, the default."""
    org = {f: f"line {loc[FLAG[f]] + 1}: {FLAG[f]}" if FLAG[f] in loc else "Megatron-LM default"
           for f in ("tp", "pp", "cp", "mbs", "gbs", "seq", "sp")}
    for old, field in ML.LEGACY_FIELDS:
        if getattr(args, old) is not None and FLAG[field] not in loc:
            org[field] = ML.LEGACY_FLAGS[old]
    if tp == 1 and FLAG["sp"] not in loc:
        org["sp"] = "tp 1 (sequence parallelism is a no-op; ndplan writes it on)"
    if seq is not None:
        org["seq"] = "--seq"
    else:
        flag = ML.MULTIMODAL_FLAGS["decoder_seq" if decoder_seq else "encoder_seq"]
        if decoder_seq or args.encoder_seq is not None and args.seq is None:
            org["seq"] = f"line {loc[flag] + 1}: {flag}" if flag in loc else flag
    return org


def read(path: Path, text: str, *, model=None, gpus=None, seq=None, gbs=None) -> CheckInput:
    script = shell.read_script(text, os.environ)
    ws = script.words
    args, unknown = parser().parse_known_args([w.text for w in ws])
    ML.hf_trainer(ws, path.name)
    if not any(getattr(args, n) is not None and getattr(args, n) is not False for n in FLAG):
        raise NdplanError("FILE", path.name, "no Megatron-LM parallel/batch flag found (e.g. "
                          "--tensor-model-parallel-size)" + (f"; it sources {', '.join(script.sourced)}, which ndplan "
                                                            "does not read" if script.sourced else ""),
                          "give a Megatron launch script, or --format for another framework")
    notes: list[str] = []
    ML.program(ws, path.name)
    MDS.experts(args)
    _expansions(ws, notes)
    notes += [f"read the branch bash runs: {why}" for why in script.decisions]
    MM.default_tokenizer(args, [w.text for w in ws], notes)
    get = _getter(args)
    gas = ML.legacy(args, notes)
    ds = MDS.settings(args, script.heredocs, path.parent, notes, [w.text for w in ws]) | MDS.recompute(args, notes)
    for name in ("recompute_granularity", "recompute_method", "recompute_num_layers"):
        if name in ds:
            setattr(args, name, ds[name])
    ML.hybrid(args)
    _moe_layer_recompute(args, notes)
    tp = get("tp", 1)
    spec, origin = resolve_model(model, MM.model(args, get, get("layers"), tp, path.name, notes),
                                 f"flags in {path.name}", _missing_model(args, path.name))
    spec = ML.script_mtp(spec, get("mtp_layers", None, lo=0), notes)
    pp, cp = get("pp", 1), ds.get("cp", get("cp", 1))
    gpus, gsrc = _devices(args, ws, gpus, notes)
    gpus, dp = world_dp(gpus, tp, pp, cp, "Megatron-LM parallel sizes", path.name)
    L = spec.num_hidden_layers
    vpp = _virtual_stages(args, L, pp)
    mbs = _int(args, "mbs", FLAG["mbs"], 1)
    decoder_seq = ML.multimodal(args, notes)
    seq_ = seq if seq is not None else decoder_seq or ML.sequence(args)
    if seq_ is None:
        raise NdplanError(FLAG["seq"], None, f"missing in {path.name}; add it or give --seq")
    zero, zero_src = _zero(args, script.value("CUDA_DEVICE_MAX_CONNECTIONS", os.environ))
    zero, zero_src = ds.get("zero", zero), ds.get("zero_src", zero_src)
    grad_dtype, grad_src = _grad_dtype(args, notes)
    moe = spec.is_moe
    kw = dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=get("ep", 1) if moe else 1,
              etp=get("etp", tp) if moe else 1,  # ETP defaults to TP (arguments.py:587-588)
              vpp=vpp, mbs=mbs, gbs=gbs or get("gbs", mbs * dp * gas), seq=seq_, zero=zero, sp=bool(args.sp) or tp == 1,
              schedule=default_schedule(vpp), grad_dtype=grad_dtype, weight_dtype=_fp8(args, notes),
              offload_optimizer=bool(args.offload_optimizer), layers_per_stage=_layers(args, L, pp, vpp),
              flash_attention=ds.get("flash_attention", True))
    if "zero" in ds and moe:
        MDS.check_experts(kw["dp"], kw["ep"])
    if not moe and (get("ep", 1) != 1 or args.experts):
        notes.append(f"{FLAG['ep']} / --num-experts ignored: {spec.name} has no experts")
    kw |= _recompute(args, notes)
    kw["engine"] = MX.engine(args, moe, kw.get("recompute") == "selective", notes, kw["ep"] * kw["etp"], zero,
                             deepspeed="zero" in ds)
    _moe_notes(args, spec, notes)
    from ndplan.strategy import Strategy
    strat = Strategy(**kw)
    strat.check(spec, gpus)
    loc = locate(text)
    org = _origins(args, loc, tp, seq, decoder_seq) | {
        "gpus": gsrc, "dp": "gpus / (tp*pp*cp)", "zero": zero_src, "grad_dtype": grad_src,
        "recompute": "--recompute-* flags"}
    return CheckInput(path=path, fmt="megatron", text=text, model=spec, model_origin=origin, strategy=strat,
                      gpus=gpus, origin=org, lines={k: v + 1 for k, v in loc.items()},
                      unknown=tuple(dict.fromkeys(u for u in unknown if u.startswith("--") and not re.search(r"\s", u))),
                      notes=tuple(notes))


# --------------------------------------------------------------------------- edits

fields = X.fields


def proposal_space(ci: CheckInput) -> dict:
    """Dimensions a proposal keeps at the file's value: a Megatron-DeepSpeed script's ZeRO stage,
    which its DeepSpeed config (or --zero-stage) sets and Megatron's flags do not edit, its expert
    degrees and its Ulysses degree (--ds-sequence-parallel-size: Megatron-DeepSpeed has no
    --context-parallel-size, and parses with parse_args, arguments.py:21-60)."""
    if not ci.origin.get("zero", "").startswith(MDS.ZERO_SOURCES):
        return {}
    # its expert flags are DeepSpeed MoE's (--moe-expert-parallel-size), which the export does not write
    return {"zero": [ci.strategy.zero], "ep": [ci.strategy.ep], "etp": [ci.strategy.etp], "cp": [ci.strategy.cp]}


def set_devices(text: str, devices: int) -> str | None:
    """The script with torchrun launching ``devices`` processes (interop.launcher), or None."""
    return launcher.set_devices(text, devices, os.environ)


def current(ci: CheckInput) -> dict:
    """The exporter's flags as the file sets them (its words after expansion): the values a
    proposal compares with when the exporter cannot write the file's own strategy."""
    args, _ = parser().parse_known_args([w.text for w in shell.read_words(ci.text, os.environ)])
    out = {}
    for name, flag in FLAG.items():
        v = getattr(args, name, None)
        if v is not None and v is not False:
            out[flag] = v
    return out | X._engine_flags(ci.model, ci.strategy)[0]  # read from the file as written (megatron_memory)


MAX_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
UNSET_MAX_CONNECTIONS = f"unset {MAX_CONNECTIONS}"
"""An edit key: the line NVIDIA's FSDP scripts run before launching (train_llama3_8b_fsdp_h100_fp8.sh),
for FSDP2, which Megatron refuses under CUDA_DEVICE_MAX_CONNECTIONS=1 (arguments.py:1048-1049)."""


def follow_up(ci: CheckInput, strat) -> dict:
    """A file that runs Megatron-FSDP keeps it: the ZeRO stage is its sharding strategy
    (``SHARDING_ZERO``), not the distributed optimizer / torch FSDP2 flags the exporter writes.
    A proposal that turns FSDP2 on in a script exporting CUDA_DEVICE_MAX_CONNECTIONS=1 unsets it."""
    if "--use-megatron-fsdp" not in {w for w, _ in words(ci.text)}:
        fsdp2 = strat.zero == 3 and ci.strategy.zero != 3
        script = shell.read_script(ci.text, os.environ)
        return {UNSET_MAX_CONNECTIONS: True} if fsdp2 and script.value(MAX_CONNECTIONS, os.environ) == "1" else {}
    name = ZERO_SHARDING[strat.zero]
    out = {FLAG["fsdp2"]: REMOVE, FLAG["no_grad_fusion"]: True, FLAG["distributed_optimizer"]: True}
    return out | ({MEMORY_FLAGS["sharding"]: name} if strat.zero != ci.strategy.zero else {})


def edit(text: str, changes: dict) -> str:
    """Set, add (after the last known flag) or remove flags; ``True`` adds a switch;
    ``UNSET_MAX_CONNECTIONS`` adds that line after the script's last assignment of the
    variable (else after the first line)."""
    lines = text.splitlines()
    changes = dict(changes)
    if changes.pop(UNSET_MAX_CONNECTIONS, None):
        at = max((k for k, ln in enumerate(lines) if re.match(rf"\s*(?:export\s+)?{MAX_CONNECTIONS}=", ln)),
                 default=0 if lines and lines[0].startswith("#!") else -1)
        lines.insert(at + 1, f"{UNSET_MAX_CONNECTIONS}  # FSDP2: Megatron asserts it is not 1 (arguments.py:1048-1049)")
    for flag, value in changes.items():
        loc = locate("\n".join(lines))
        switch = value is True or (value is REMOVE and flag in {FLAG[s] for s in SWITCHES})
        if flag in loc:
            i = loc[flag]
            rx = MT.flag_re(flag, switch)
            if value is REMOVE:
                new = rx.sub("", lines[i], count=1)
                if new.strip() in ("", "\\"):
                    if not lines[i].rstrip().endswith("\\") and i > 0 and lines[i - 1].rstrip().endswith("\\"):
                        lines[i - 1] = lines[i - 1].rstrip()[:-1].rstrip()
                    del lines[i]
                else:
                    indent = re.match(r"[ \t]*", new).group(0)  # keep the line's indentation
                    lines[i] = indent + re.sub(r"[ \t]{2,}", " ", new[len(indent):])
            elif not switch and not isinstance(value, tuple) and rx.search(lines[i]):
                m = rx.search(lines[i])
                lines[i] = lines[i][:m.start(1)] + shlex.quote(str(value)) + lines[i][m.end(1):]
                continue
            elif not switch and not isinstance(value, tuple):
                pass  # the value is not written on the flag's line (a variable set elsewhere): given again, later
            else:
                continue
        if value is REMOVE:
            continue
        MT.add(lines, loc, " ".join(shlex.quote(w) for w in X.flag_words(flag, value)))
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")
