"""Megatron-DeepSpeed scripts (microsoft/Megatron-DeepSpeed@f4157bea): Megatron-LM's arguments
plus ``--deepspeed``, which hands the model to DeepSpeed's engine. Read on top of the
Megatron-LM reader (interop/megatron.py) when the script passes ``--deepspeed``:

* zero <- ``zero_optimization.stage`` of the ``--deepspeed_config`` file when the script
  writes it as a here-document (``cat <<EOT > $config_json``) or it sits beside the script,
  else ``--zero-stage`` (default 1, megatron/arguments.py:1487): the scripts write the same
  stage into both; DeepSpeed's engine takes the file's (training.py:501-506 deletes the
  section only for inference);
* recompute full <- ``--checkpoint-activations``: every ``--checkpoint-num-layers`` (1) layers
  checkpointed in each layer chunk (model/transformer.py:2082-2088, 1888-1921), Megatron's
  own ``--recompute-*`` flags otherwise;
* cp <- ``--ds-sequence-parallel-size`` (DeepSpeed-Ulysses; data parallel = world /
  (tp pp sp), as DeepSpeed's config divides it);
* pp 1 with ``--no-pipeline-parallel`` (arguments.py:94-96 asserts it);
* DeepSpeed's pipeline engine refuses ZeRO-2/3 (deepspeed 0.19.8 runtime/pipe/engine.py:76-77),
  and pretrain_gpt.py builds the pipeline model unless ``--no-pipeline-parallel``
  (pretrain_gpt.py:51-52): refused in one line;
* ``--num-experts`` takes one count per expert layer group (nargs '+', arguments.py:608):
  equal counts are the model's; PR-MoE's pyramid (different counts) is refused.

Not modelled (each a note): ``--enable-zbh1-pipeline`` (Megatron-DeepSpeed's ZB-H1 schedule
inside DeepSpeed's pipeline engine: estimated as 1F1B, whose bubble bounds it from above);
DeepSpeed's own optimizer buffers: the estimate runs the megatron profile (Megatron's model
code and activations) with the ZeRO stage's sharding.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ndplan.errors import NdplanError
from ndplan.interop.base import int_arg

SWITCHES = {"deepspeed": "--deepspeed", "checkpoint_activations": "--checkpoint-activations",
            "ds_activation_checkpointing": "--deepspeed-activation-checkpointing",
            "zbh1": "--enable-zbh1-pipeline", "no_pipeline_parallel": "--no-pipeline-parallel",
            "ds_etp": "--enable-expert-tensor-parallelism", "ds_no_drop": "--disable-moe-token-dropping",
            "ds_kd": "--kd", "ds_mos": "--mos", "ds_flash": "--use-flash-attn", "ds_flash_v1": "--use-flash-attn-v1",
            "ds_flash_v2": "--use-flash-attn-v2", "ds_flash_triton": "--use-flash-attn-triton",
            "ds_flash_builder": "--use-flash-attn-builder"}
FLASH = ("ds_flash", "ds_flash_v1", "ds_flash_v2", "ds_flash_triton", "ds_flash_builder")
"""Megatron-DeepSpeed's flash-attention switches: any of them sets ``args.use_flash_attn``
(megatron/arguments.py:433, 927-935 at f4157bea; --use-flash-attn is --use-flash-attn-v1);
without one, ParallelAttention runs CoreAttention, which materialises the scores
(model/transformer.py:389-409, 541)."""
FLAGS = {"zero_stage": "--zero-stage", "ds_config": "--deepspeed_config", "ds_sp": "--ds-sequence-parallel-size",
         "checkpoint_num_layers": "--checkpoint-num-layers", "ds_ep": "--moe-expert-parallel-size", "ds_topk": "--topk",
         "ds_interval": "--expert-interval", "ds_mlp_type": "--mlp-type", "ds_capacity": "--moe-train-capacity-factor",
         "ds_min_capacity": "--moe-min-capacity"}
NAME_FLAGS = ("--deepspeed_config", "--deepspeed-config")
"""Flags whose value is a file name: read when it can be, never required to be a number."""
TOPK_DEFAULT = "1"
"""``--topk`` default (megatron/arguments.py:612); Megatron-LM's --moe-router-topk defaults to 2."""
ZERO_STAGE_DEFAULT = 1
"""``--zero-stage`` default (megatron/arguments.py:1487: ``default=1.0``)."""


def add_arguments(p) -> None:
    for name, flag in SWITCHES.items():
        p.add_argument(flag, dest=name, action="store_true")
    for name, flag in FLAGS.items():
        p.add_argument(flag, *(["--deepspeed-config"] if name == "ds_config" else []), dest=name, type=str)


def _int(args, name: str, lo: int = 1) -> int | None:
    return int_arg(args, name, FLAGS[name], lo=lo)


def _config_stage(args, heredocs: dict, folder: Path, notes: list) -> tuple[int | None, str]:
    """zero_optimization.stage of the --deepspeed_config file, when the script writes it or it
    exists beside the script; (None, why not) otherwise."""
    name = args.ds_config
    if not name:
        return None, "no --deepspeed_config"
    text = heredocs.get(name)
    where = f"the here-document written to {name}"
    if text is None and (folder / name).is_file():
        text, where = (folder / name).read_text(errors="replace"), f"{name} beside the script"
    if text is None:
        return None, f"{name} is made when the script runs"
    try:
        doc = json.loads(text)
    except ValueError:
        return None, f"{where} is not JSON ndplan can read"
    if not isinstance(doc, dict):
        raise NdplanError(args.ds_config, type(doc).__name__, f"{where} is not a JSON object",
                          "write the DeepSpeed config as an object")
    from ndplan.export.common import flatten
    from ndplan.interop.deepspeed import zero_stage  # DeepSpeed's own reading of the stage, one source
    stage = zero_stage(flatten(doc), notes)
    if "zero_optimization" not in doc:
        where += ", which sets no zero_optimization: DeepSpeed's default stage 0 (zero/config.py:95)"
    return stage, where


EXPERT_INTERVAL_DEFAULT = 2
"""``--expert-interval`` default (megatron/arguments.py:614): layer i (0-based) is MoE when
(i + 1) % interval == 0 (model/transformer.py get_num_experts_per_layer, :1650-1658)."""
CAPACITY_FACTOR_DEFAULT = 1.0
"""``--moe-train-capacity-factor`` default (arguments.py:913)."""
MIN_CAPACITY_DEFAULT = 4
"""``--moe-min-capacity`` default (arguments.py:917)."""


def experts(args) -> None:
    """``--num-experts`` as one count (arguments.py:608: nargs '+', one per expert layer group,
    default [1]: a dense model); under ``--deepspeed`` the expert flags are Megatron-DeepSpeed's:
    ``--moe-expert-parallel-size`` is ep, ``--topk`` (default 1) the routed experts a token takes,
    ``--expert-interval`` the MoE layers (as a --moe-layer-freq pattern), the experts are its
    ParallelMLP(moe=True) (model/transformer.py:1064-1083: the dense MLP's width, gated only with
    --swiglu), split over tp only with --enable-expert-tensor-parallelism (etp, else 1), and
    ``--mlp-type residual`` adds a dense MLP beside them (Residual-MoE: a shared expert of the
    dense width)."""
    v = getattr(args, "experts", None)
    if isinstance(v, list):
        if len(set(v)) > 1:
            raise NdplanError("--num-experts", " ".join(v), "different expert counts per layer group "
                              "(Megatron-DeepSpeed's pyramid MoE) are not modelled", "give one count")
        args.experts = v[0]
    if not args.deepspeed:
        return
    if args.experts is not None and args.experts.strip() == "1":
        args.experts = None  # [1]: no MoE layers (arguments.py:608)
    if args.ds_ep is not None and getattr(args, "ep", None) is None:
        args.ep = args.ds_ep
    if getattr(args, "topk", None) is None:
        args.topk = args.ds_topk or TOPK_DEFAULT
    if args.experts is None:
        return
    interval = _int(args, "ds_interval") or EXPERT_INTERVAL_DEFAULT
    layers = int_arg(args, "layers", "--num-layers")
    if layers and getattr(args, "moe_freq", None) is None:
        args.moe_freq = "[" + ",".join("1" if (i + 1) % interval == 0 else "0" for i in range(layers)) + "]"
    if getattr(args, "etp", None) is None:
        args.etp = getattr(args, "tp", None) if args.ds_etp else "1"
    kind = args.ds_mlp_type or "standard"
    if kind not in ("standard", "residual"):
        raise NdplanError(FLAGS["ds_mlp_type"], kind, "not a Megatron-DeepSpeed MLP type", "give standard or residual")
    args.ds_residual = kind == "residual"  # megatron_model.model: a shared expert of the dense MLP's width


def check_experts(dp: int, ep: int) -> None:
    """DeepSpeed builds its expert groups inside the data-parallel ranks: ep divides dp
    (deepspeed 0.19.8 utils/groups.py:634 ``_ensure_divisibility(dp_world_size, expert_parallel_size_)``)."""
    if dp % ep:
        raise NdplanError(FLAGS["ds_ep"], ep, f"does not divide the data-parallel size {dp} (DeepSpeed "
                          "utils/groups.py:634)", "choose an expert-parallel size that divides dp")


def moe_settings(args, is_moe: bool, notes: list) -> dict:
    """The megatron engine's MoE settings for DeepSpeed's MoE layer: the all-to-all rows of
    ``moe_note`` (moe_capacity_permille = the factor when tokens are dropped and padded)."""
    if not is_moe:
        return {}
    notes.append(moe_note(args))
    if args.ds_no_drop:
        return {}
    text = args.ds_capacity or str(CAPACITY_FACTOR_DEFAULT)
    try:
        cf = float(text)
    except ValueError:
        cf = float("nan")
    if not (cf > 0 and math.isfinite(cf)):
        raise NdplanError(FLAGS["ds_capacity"], text, "not a capacity factor", "give a number above 0, e.g. 1.0")
    permille = round(cf * 1000)
    return {} if permille == 1000 else {"moe_capacity_permille": permille}


def moe_note(args) -> str:
    """What the estimate takes of DeepSpeed's MoE layer (deepspeed 0.19.8 moe/sharded_moe.py
    top1gating/top2gating/topkgating: capacity = ceil(k x tokens / experts x factor), at least
    --moe-min-capacity; every expert's slots padded to it and exchanged by all-to-all)."""
    cf = args.ds_capacity or str(CAPACITY_FACTOR_DEFAULT)
    tp_text = str(getattr(args, "tp", None) or "1")
    if getattr(args, "ds_residual", False) and not args.ds_etp and tp_text.isdigit() and int(tp_text) > 1:
        residual = (f"; the Residual-MoE MLP is ParallelMLP(moe=True), not split over tp without "
                    f"--enable-expert-tensor-parallelism (model/transformer.py:98-141), counted split: "
                    f"under-counted {tp_text}x")
    else:
        residual = ""
    if args.ds_no_drop:
        return ("Megatron-DeepSpeed MoE (DeepSpeed's gating) with --disable-moe-token-dropping: capacity is the "
                "busiest expert's count, counted as balanced routing (tokens x top-k rows)" + residual)
    return (f"Megatron-DeepSpeed MoE (DeepSpeed's gating, moe/sharded_moe.py): every expert padded to capacity "
            f"ceil(top-k x tokens / experts x {cf}) (--moe-train-capacity-factor), at least "
            f"{_int(args, 'ds_min_capacity', lo=0) if args.ds_min_capacity is not None else MIN_CAPACITY_DEFAULT} "
            f"(--moe-min-capacity): counted as {cf} x tokens x top-k rows through an all-to-all" + residual)


SED_STAGE = re.compile(r"^s(.)ZERO_STAGE\1(\d)\1g?$")
"""The Megatron-DeepSpeed examples' template edit, ``sed "s/ZERO_STAGE/N/" TEMPLATE > $config_json``
(e.g. examples_deepspeed/MoE/ds_pretrain_gpt_1.3B_MoE128.sh): the stage written into the config."""


def _sed_stage(words: list[str]) -> int | None:
    found = [int(m.group(2)) for w in words if (m := SED_STAGE.match(w))]
    return found[-1] if found else None


def recompute(args, notes: list) -> dict:
    """``--checkpoint-activations`` (Megatron-LM before --recompute-granularity, v2.5 arguments.py:393,
    and Megatron-DeepSpeed): every ``--checkpoint-num-layers`` (1) layers checkpointed in each
    chunk (Megatron-DeepSpeed model/transformer.py:2082-2088, 1888-1921): full recompute."""
    if not args.checkpoint_activations or getattr(args, "recompute_granularity", None):
        return {}
    n = _int(args, "checkpoint_num_layers") or 1
    notes.append(f"--checkpoint-activations: full recompute, {n} layer(s) a checkpoint "
                 "(model/transformer.py:2082-2088, 1888-1921)")
    return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": str(n)}


ZERO_SOURCES = ("zero_optimization.stage", "--zero-stage", "the script's sed")
"""How ``settings``' zero source starts (interop/megatron.proposal_space reads it)."""


def settings(args, heredocs: dict, folder: Path, notes: list, words: list[str] = ()) -> dict:
    """Strategy fields and their sources the DeepSpeed side sets (module docstring); {} without
    ``--deepspeed``."""
    if not args.deepspeed:
        return {}
    stage, where = _config_stage(args, heredocs, folder, notes)
    flag = _int(args, "zero_stage", lo=0)
    sed = _sed_stage(list(words))
    if stage is None and sed is not None:
        stage, where = sed, f"the script's sed s/ZERO_STAGE/{sed}/ into its config template"
    if stage is None:
        stage = flag if flag is not None else ZERO_STAGE_DEFAULT
        src = f"--zero-stage {stage}" if flag is not None else f"--zero-stage default {ZERO_STAGE_DEFAULT}"
        notes.append(f"Megatron-DeepSpeed: ZeRO stage {stage} from {src} ({where})")
    else:
        src = f"zero_optimization.stage {stage} in {where}"
        if flag is not None and flag != stage:
            notes.append(f"--zero-stage {flag} differs from {src}: DeepSpeed's engine takes the file's")
    if stage not in (0, 1, 2, 3):
        raise NdplanError("--zero-stage", stage, "not a ZeRO stage", "give 0, 1, 2 or 3")
    out = {"zero": stage, "zero_src": src, "flash_attention": any(getattr(args, n) for n in FLASH)}
    if not out["flash_attention"]:
        notes.append("Megatron-DeepSpeed without --use-flash-attn(-v1/-v2/-triton/-builder) runs CoreAttention: "
                     "the attention scores are materialised and saved (megatron/arguments.py:433)")
    pp_text = str(getattr(args, "pp", None) or "1")
    pp = int(pp_text) if pp_text.isdigit() else 1  # the reader checks it
    if args.no_pipeline_parallel and pp != 1:
        raise NdplanError("--pipeline-model-parallel-size", pp, "Megatron-DeepSpeed asserts 1 with "
                          "--no-pipeline-parallel (megatron/arguments.py:94-96)", "give 1, or drop --no-pipeline-parallel")
    gpt_py = any(w.rsplit("/", 1)[-1] == "pretrain_gpt.py" for w in words) or not any(w.endswith(".py") for w in words)
    if stage >= 2 and (pp > 1 or gpt_py and not args.no_pipeline_parallel or getattr(args, "pipe_module", False)):
        # pretrain_gpt.py builds GPTModelPipe, a PipelineModule, unless --no-pipeline-parallel
        # (pretrain_gpt.py:51-52), even at one stage: DeepSpeed's PipelineEngine runs it (the
        # older forks' pretrain_gpt2.py, DeepSpeedExamples Megatron-LM-v1.1.5-ZeRO3, does not)
        raise NdplanError("zero stage", stage, "DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3 (deepspeed "
                          "runtime/pipe/engine.py:76-77), and Megatron-DeepSpeed's pretrain_gpt.py builds its pipeline "
                          "model unless --no-pipeline-parallel (pretrain_gpt.py:51-52)",
                          "use stage 0 or 1, or add --no-pipeline-parallel with pp 1")
    sp = _int(args, "ds_sp")
    if sp and sp > 1:
        out["cp"] = sp
        notes.append(f"--ds-sequence-parallel-size {sp}: DeepSpeed-Ulysses, estimated as cp={sp} (the sequence split "
                     "over the group; its all-to-all traffic as context parallelism's)")
    if args.zbh1:
        notes.append("--enable-zbh1-pipeline: Megatron-DeepSpeed's zero-bubble H1 schedule is estimated as 1F1B "
                     "(its bubble an upper bound; not modelled)")
    if args.ds_kd or args.ds_mos:  # training.py:218-219, pretrain_gpt.py:235-262 load a teacher beside the student
        notes.append(f"{'--kd' if args.ds_kd else '--mos'}: knowledge distillation; not modelled: the teacher model "
                     "(--num-layers-teacher ..., its weights and forward activations) beside the student estimated here")
    notes.append("Megatron-DeepSpeed: the megatron profile (Megatron's model code and activations) with ZeRO "
                 f"stage {stage}'s sharding; DeepSpeed's own optimizer buffers are not modelled")
    return out
