"""What a Megatron-LM launch runs, beside its parallel layout (interop/megatron.py reads that): the
program (refused when it is not decoder-only LM training), the flags of Megatron-LM v1.1.5 and
DeepSpeed's fork of it, the multimodal (LLaVA) and encoder sequence lengths, hybrid Mamba
patterns, the script's MTP layers, and Hugging Face Trainer launches read as Megatron ones.
Sources at NVIDIA/Megatron-LM@d98e8a64 unless named."""

from __future__ import annotations

import dataclasses
import re

from ndplan.errors import NdplanError
from ndplan.export.megatron import FLAG
from ndplan.interop.base import int_arg as _int


MULTIMODAL_FLAGS = {"decoder_seq": "--decoder-seq-length", "vision_model": "--vision-model-type",
                    "encoder_seq": "--encoder-seq-length", "img_h": "--img-h"}
MULTIMODAL_SWITCHES = {"freeze_lm": "--freeze-LM", "freeze_vit": "--freeze-ViT"}
LEGACY_FLAGS = {"legacy_tp": "--model-parallel-size", "legacy_mbs": "--batch-size", "legacy_pp": "--pipe-parallel-size",
                "legacy_gas": "--gas"}
"""Megatron-LM v1.1.5's tensor-parallel size and per-GPU batch (and, in DeepSpeed's 3D fork of it,
DeepSpeedExamples Megatron-LM-v1.1.5-3D_parallelism, the pipeline size and gradient accumulation
steps): read as that version runs them; Megatron-LM@d98e8a64 refuses the first two
(arguments.py:591-599)."""
LEGACY_FIELDS = (("legacy_tp", "tp"), ("legacy_mbs", "mbs"), ("legacy_pp", "pp"))
"""LEGACY_FLAGS -> the strategy field each one sets."""
HYBRID_FLAGS = {"hybrid_pattern": "--hybrid-layer-pattern", "hybrid_override": "--hybrid-override-pattern"}
"""A hybrid (Mamba) model's layer pattern; --hybrid-override-pattern is its deprecated name
(arguments.py:743-755 at d98e8a64). Its layers are not modelled: refused in one line."""
"""Megatron-LM's multimodal (LLaVA) launch (examples/multimodal/train.py; NVIDIA/Megatron-LM@d98e8a64)."""
"""(--bf16, --grad-reduce-in-bf16, --fp8-format, --fp8-param-gather are in the exporter's FLAG.)"""


OTHER_PROGRAMS = re.compile(r"(?:^|/)(?:pretrain_(?:bert|t5|retro|ict|vision_\w+|mamba)\.py|tasks/main\.py|"
                            r"\w*text_generation\w*\.py|tools/\w+\.py)$")
"""Megatron-LM programs that are not decoder-only language-model training (BERT, T5, RETRO, ICT,
vision, Mamba pretraining; downstream tasks; text generation and inference servers; tools)."""


def program(ws, name: str) -> None:
    """Refuse, in one line, a launch of a program ndplan does not model (OTHER_PROGRAMS)."""
    progs = [w.text for w in ws if w.text.endswith(".py")]  # a script may run tools/ before its training program
    prog = progs[0] if progs else None
    if progs and all(OTHER_PROGRAMS.search(p) for p in progs):
        raise NdplanError("FILE", name, f"runs {prog}: not decoder-only language-model training, which is what "
                          "ndplan models", "check a pretrain_gpt.py (or LLaVA train.py) launch")


def legacy(args, notes: list) -> int:
    """LEGACY_FLAGS as Megatron-LM v1.1.5 (and DeepSpeed's fork) took them, where the current flag is
    absent; returns the gradient accumulation steps (--gas, 1). The fork's pretrain_gpt2.py builds
    its PipelineModule whenever --pipe-parallel-size > 0 (pretrain_gpt2.py:40-43), 0 being none:
    ``args.pipe_module`` (megatron_deepspeed.settings refuses ZeRO-2/3 under it)."""
    stages = _int(args, "legacy_pp", LEGACY_FLAGS["legacy_pp"], lo=0)
    args.pipe_module = bool(stages)
    if stages is not None:  # the fork's default 0: no pipeline
        args.legacy_pp = str(stages or 1)
    for old, new in LEGACY_FIELDS:
        if getattr(args, old) is not None and getattr(args, new) is None:
            setattr(args, new, getattr(args, old))
            notes.append(f"{LEGACY_FLAGS[old]} {getattr(args, old)}: Megatron-LM v1.1.5's {FLAG[new]} (read as that "
                         "version and DeepSpeed's fork of it run it; today's Megatron-LM refuses it)")
    gas = _int(args, "legacy_gas", LEGACY_FLAGS["legacy_gas"], 1)
    if args.legacy_gas is not None:
        notes.append(f"--gas {gas}: gradient accumulation steps (DeepSpeed's Megatron-LM v1.1.5 fork)")
    return gas


def hybrid(args) -> None:
    for name, flag in HYBRID_FLAGS.items():
        pattern = getattr(args, name)
        if pattern is not None:
            raise NdplanError(flag, pattern[:40], "the layer pattern of a hybrid model (M Mamba, * attention, - MLP, "
                              "E MoE; it also sets the layer count), which ndplan does not model",
                              "check a transformer launch; Mamba and hybrid layers are not estimated")


def script_mtp(spec, mtp: int | None, notes: list):
    """The model as the script builds it: Megatron-LM adds MTP layers only with --mtp-num-layers
    (default None: none, arguments.py _add_mtp_args), whatever the -m model's config has."""
    if (mtp or 0) == spec.mtp_layers:
        return spec
    n = mtp or 0
    notes.append(f"{spec.name}'s {spec.mtp_layers} MTP layer(s) replaced by the script's {FLAG['mtp_layers']} {n}"
                 + ("" if mtp is not None else " (not given: Megatron-LM builds none)"))
    return dataclasses.replace(spec, mtp_layers=n)


def sequence(args) -> int | None:
    """--seq-length, else --encoder-seq-length, which Megatron-LM takes as it (arguments.py:1346-1351
    at d98e8a64: it asserts the two are not both given)."""
    enc = _int(args, "encoder_seq", MULTIMODAL_FLAGS["encoder_seq"])
    if enc is not None and args.seq is not None:
        raise NdplanError(MULTIMODAL_FLAGS["encoder_seq"], enc, f"Megatron-LM asserts it is not given with {FLAG['seq']} "
                          "(arguments.py:1346-1351)", "give one of them")
    return _int(args, "seq", FLAG["seq"]) if enc is None else enc


def multimodal(args, notes: list) -> int | None:
    """A multimodal (LLaVA) launch: the language model's sequence, or None. examples/multimodal/
    model.py sets --seq-length to the image embeddings (:48-70, the vision encoder's length) and
    builds the language model at --decoder-seq-length (:81-87, 234); ``freeze`` sets
    requires_grad False on the frozen parts (:276-279; llava_model.py:553-586)."""
    seq = _int(args, "decoder_seq", MULTIMODAL_FLAGS["decoder_seq"])
    if seq is not None and args.encoder_seq is not None:
        raise NdplanError(MULTIMODAL_FLAGS["encoder_seq"], args.encoder_seq, "with --decoder-seq-length: an "
                          "encoder-decoder (T5) launch (pretrain_t5.py), which ndplan does not model",
                          "check a decoder-only launch")
    frozen = [f for n, f in MULTIMODAL_SWITCHES.items() if getattr(args, n)]
    if seq is None and not frozen and args.vision_model is None and args.img_h is None:  # --img-h: pretrain_vlm.py
        return None
    notes.append("multimodal (LLaVA) launch: the language model alone is estimated"
                 + (f", at --decoder-seq-length {seq} tokens (--seq-length is the vision encoder's image "
                    "embeddings, examples/multimodal/model.py:48-87)" if seq else "")
                 + "; not modelled: the vision encoder and projection (weights, gradients, activations)"
                 + (f", and {' '.join(frozen)} (frozen parameters hold no gradients or optimizer states, "
                    "llava_model.py:553-586: those are over-counted)" if frozen else ""))
    return seq


HF_TRAINER_FLAGS = ("--per_device_train_batch_size", "--per-device-train-batch-size", "--model_name_or_path")
"""Flags of a Hugging Face Trainer script (TrainingArguments), which a Megatron script does not take."""


def hf_trainer(ws, name: str) -> None:
    """A Hugging Face Trainer launch (DeepSpeedExamples training/*, DeepSpeed-Chat): its layout is
    the DeepSpeed JSON it passes with --deepspeed; say so in one line."""
    texts = [w.text for w in ws]
    if not any(t.split("=", 1)[0] in HF_TRAINER_FLAGS for t in texts):
        return
    cfg = next((texts[k + 1] for k, t in enumerate(texts[:-1]) if t == "--deepspeed" and texts[k + 1].endswith(".json")),
               None)
    raise NdplanError("FILE", name, "a Hugging Face Trainer launch (--per_device_train_batch_size / "
                      "--model_name_or_path), not a Megatron-LM one", f"check its DeepSpeed JSON"
                      + (f" ({cfg})" if cfg else "") + " with -m MODEL --gpus N --seq N --gbs N (per-device batch x "
                      "accumulation steps x ranks)")
