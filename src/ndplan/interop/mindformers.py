"""MindFormers training YAML -> model + Strategy (the inverse of export/mindformers.py,
with the same key table ``KEY``).

The rules, checked against the measured MindSpore peaks in
shared/validation/mindformers (benchmarks/memory_validation.py calls ``read_doc``):

* model <- ``model.model_config``. mcore style (``use_legacy: False`` or HF keys such as
  num_hidden_layers): the HF config.json keys it holds, with MindFormers' aliases
  (``MCORE_ALIASES``). Legacy: hidden_size, num_layers, num_heads, n_kv_heads (absent:
  num_heads, MHA), intermediate_size, else MindFormers' LlamaFeedForward rule (x = 4h; if
  ffn_dim_multiplier: x = int((ffn_dim_multiplier + 0.01) x); x = int(2x/3); round up to
  multiple_of), vocab_size; llama layout, untied embeddings unless tie_word_embeddings;
  MoE from the top-level ``moe_config`` (``_legacy_moe``), MLA from its rank keys, MTP
  from ``mtp_depth``.
* ep <- ``parallel_config.expert_parallel``; etp <- ``expert_model_parallel``, else tp in
  the legacy MoE and 1 in mcore (``_experts``).
* dp / tp / pp / cp <- ``parallel_config`` data_parallel / model_parallel / pipeline_stage /
  context_parallel; sp <- ``use_seq_parallel`` (on when tp = 1, where it does nothing: the
  sweep's canonical form); vpp <- ``model_config.pp_interleave_num`` when
  ``parallel.pipeline_config.pipeline_interleave``; schedule interleaved when vpp > 1, gpipe or
  zbv under ``pipeline_scheduler`` gpipe or zero_bubble_v.
* mbs <- ``runner_config.batch_size``; micro-batches m <- ``micro_batch_num`` with a
  pipeline, ``runner_config.gradient_accumulation_steps`` (default 1) without one (README
  section 2); gbs = mbs * dp * m (the MindFormers / MemEst convention; CP does not multiply).
* seq <- ``model_config.seq_length``; absent, an mcore model's MindFormers default 4096, which the
  dataset's sample length must equal, and a legacy model's error naming --seq (``seq_length``);
  zero <- 1 when
  ``parallel.enable_parallel_optimizer`` (weights + moments sharded over dp; the mindspore
  engine profile shards weights from zero >= 1); engine mindspore; flash_attention <-
  ``use_flash_attention``; weight_dtype fp32 when ``param_init_type`` (mcore: ``params_dtype``,
  default float32) is float32; offload_optimizer <- ``optimizer.swap``.
* recompute: ``recompute`` True -> full (selective settings then do nothing); a per-stage
  list -> full on that many layers per stage (a VPP list of lists: the stage totals,
  dealt over the chunks); ``select_recompute`` True -> selective, a list -> selective per
  stage (all zero -> none); ``select_comm_recompute`` alone -> none (not modelled).
* layers_per_stage <- ``model_config.offset`` when non-zero: L/(pp vpp) + offset per
  (chunk, stage), model order v = chunk*pp + stage; the legacy DeepSeek model counts its
  MTP layers in L and on the last stage (``_layers_per_stage``).
* memory limit <- ``context.max_device_memory`` ("58GB": MindSpore reads GB as 2^30 bytes).
* engine settings (interop.mindformers_memory, mindformers_optim): ``optimizer.type`` (Adam
  variants, PmaAdamW, CAME, Muon, SGD, Momentum), ``optimizer_weight_shard_size`` (the
  optimizer-parallel group), the legacy MoE ``capacity_factor`` (MoEV2 pads every expert to
  capacity); the mcore capacity keys, which MindFormers' mcore MoE does not apply (a note).

Not modelled (a note each): the CP algorithm, vocab_emb_dp with tp > 1,
fine_grain_interleave, micro_batch_interleave_num, other optimizer types (counted as Adam),
Muon's Newton-Schulz scratch and its unsharded MLA projections, gradient_accumulation_shard,
op-level ``select_recompute`` dicts; seqpipe is estimated as 1f1b with a
note of what that leaves out, and seq_split_num > 1 is refused where MindFormers refuses it
(mindformers_memory.seq_split); pipeline_scheduler gpipe and zero_bubble_v are read as
ndplan's gpipe and zbv (export/mindformers.py SCHEDULER), seqvpp and seqsmartvpp are refused.
The strategy is checked against the model and engine rules as it is read (``read``), a failure
named by its yaml key (``_in_yaml``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from ndplan import limits
from ndplan.errors import NdplanError
from ndplan.export import mindformers as X
from ndplan.interop import hccl
from ndplan.interop.base import CheckInput, make_strategy, positive, resolve_model
from ndplan.interop.textedit import yaml_edit, yaml_locate
from ndplan.interop.mindformers_model import MC, MOE, _mtp_depth, get, is_mcore, missing_keys, model_config, model_of
from ndplan.layouts import virtual_stage
from ndplan.points import default_schedule
from ndplan.units import GIB

KEY = X.KEY
def _flat_counts(v) -> list[int] | None:
    """Layer counts from a yaml list, flattened ((chunk, stage) order with VPP); None if
    ``v`` is not a list."""
    if isinstance(v, list):
        out = []
        for x in v:
            if not isinstance(x, list) and (isinstance(x, bool) or not isinstance(x, int)):
                raise NdplanError("recompute_config/offset", v, f"holds {x!r}, not a whole number",
                                  "write integers, one per stage (a list of lists with VPP)")
            out.extend(_flat_counts(x) if isinstance(x, list) else [x])
        return out
    return None


def _per_stage(counts, pp: int, vpp: int, notes: list, layers: int) -> int | tuple:
    """Per-stage counts (pp ints, or with VPP a list of vpp lists) -> recompute_layers."""
    rows = counts if isinstance(counts[0], list) else [counts]
    if any(len(r) != pp for r in rows):
        raise NdplanError("recompute_config", counts, f"not one count per stage (pipeline_stage={pp})",
                          "give pp counts, or with VPP a list of vpp lists")
    per_stage = tuple(sum(int(r[s]) for r in rows) for s in range(pp))
    if max(per_stage) > layers:
        notes.append(f"recompute counts {list(per_stage)} clamped to {layers} layers (MindFormers clamps)")
        per_stage = tuple(min(x, layers) for x in per_stage)
    if len(rows) > 1:
        notes.append(f"VPP recompute lists {counts}: per stage the total {list(per_stage)}, dealt "
                     "round-robin over the chunks (the explicit per-chunk split is not kept)")
    return per_stage[0] if len(set(per_stage)) == 1 else per_stage


def _recompute(doc: dict, pp: int, vpp: int, L: int, notes: list) -> dict:
    full, sel = get(doc, KEY["full"], False), get(doc, KEY["selective"], False)
    if isinstance(sel, dict):  # op regex -> True or per-stage counts (MindFormers' op-level form)
        notes.append(f"select_recompute lists ops ({', '.join(map(str, sel))}): op-level recompute is not "
                     "modelled; those activations are counted as stored")
        sel = False
    full_list, sel_list = _flat_counts(full), _flat_counts(sel)
    for key, v, flat in ((KEY["full"], full, full_list), (KEY["selective"], sel, sel_list)):
        if v not in (None, True, False) and flat is None:  # MindFormers takes a bool or per-stage counts
            raise NdplanError(key, v, "neither true/false nor a per-stage list of counts",
                              "write true, false, or e.g. [2, 0] (one count per stage)")
    if full is True:
        if sel:
            notes.append("full recompute covers all layers; selective settings ignored (README section 2)")
        return {"recompute": "full"}
    if full_list is not None and any(full_list):
        if sel is True or (sel_list is not None and any(sel_list)):
            notes.append(f"full list {full_list} with selective {sel}: selective on the non-full layers not modelled")
        return {"recompute": "full", "recompute_layers": _per_stage(full, pp, vpp, notes, L)}
    if sel is True:
        return {"recompute": "selective"}
    if sel_list is not None and any(sel_list):
        return {"recompute": "selective", "recompute_layers": _per_stage(sel, pp, vpp, notes, L)}
    if get(doc, KEY["selective_comm"]):
        notes.append("select_comm_recompute: communication recompute is not modelled")
    return {"recompute": "none"}


def _layers_per_stage(doc: dict, L: int, pp: int, vpp: int, schedule: str, notes: list):
    """Decoder layers per (chunk, stage) from ``offset``. MindFormers builds
    ``n // (pp*vpp) + offset`` layers per slice with sum(offset) = n % (pp*vpp)
    (mindformers/models/utils.py ``LayerSetting``). The legacy DeepSeek model counts its
    MTP layers in n (``LayerSetting(num_layers + mtp_depth)``, research/deepseek3/
    deepseek2_model.py L1261-1265) and builds them on the last stage (L1311-1312): those
    offsets sum to (L + mtp) % (pp*vpp), and the last slice's count includes the MTP layers."""
    off = get(doc, KEY["offset"], 0)
    flat = _flat_counts(off)
    if flat is None and off not in (0, None):
        raise NdplanError(KEY["offset"], off, "not an offset list", "give 0, a list of pp ints, or (VPP) a list of vpp lists")
    mtp = 0 if is_mcore(doc) else _mtp_depth(model_config(doc))
    if not (flat and any(flat)) and not mtp:
        return None
    rows = (off if isinstance(off[0], list) else [off]) if flat else [[0] * pp] * vpp
    if len(rows) != vpp or any(len(x) != pp for x in rows):
        raise NdplanError(KEY["offset"], off, f"not vpp={vpp} x pp={pp} entries", "give one offset per stage and chunk")
    n = L + mtp
    lps = [0] * (pp * vpp)  # in layer order; offset rows are per stage (reversed back under zero_bubble_v)
    for ch in range(vpp):
        for s in range(pp):
            lps[virtual_stage(schedule, s, ch, pp)] = n // (pp * vpp) + int(rows[ch][s])
    if sum(lps) != n:
        counted = f"{L} decoder + {mtp} MTP layers" if mtp else f"{L} layers"
        raise NdplanError(KEY["offset"], off, f"gives {sum(lps)} layers, the model has {counted}",
                          f"make the offsets sum to {n % (pp * vpp)}")
    if mtp:
        lps[-1] -= mtp
        if lps[-1] < 0:
            raise NdplanError(KEY["offset"], off, f"leaves the last slice fewer layers than its {mtp} MTP layers",
                              "give the last stage at least the MTP layers")
        notes.append(f"offset counts the {mtp} MTP layer(s) (mtp_depth) on the last stage: decoder layers "
                     f"{lps}")
    return tuple(lps)


def memory_limit(doc: dict) -> int | None:
    """``context.max_device_memory`` in bytes ("58GB" = 58 x 2^30: MindSpore's GB)."""
    v = get(doc, KEY["max_device_memory"])
    if v is None:
        return None
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*GB\s*", str(v), re.IGNORECASE)
    if not m:
        raise NdplanError(KEY["max_device_memory"], v, "not a size", 'write it as MindSpore does, e.g. "58GB"')
    return int(limits.gib(KEY["max_device_memory"], float(m.group(1))) * GIB)


def _scheduler(doc: dict, vpp: int) -> str:
    """The schedule of ``pipeline_scheduler``: 1f1b (interleaved with pp_interleave_num), gpipe and
    zero_bubble_v (export/mindformers.py SCHEDULER) are modelled; seqpipe is estimated as 1f1b
    over whole sequences (mindformers_memory.seq_split says what that leaves out); others are refused."""
    sched = str(get(doc, KEY["scheduler"], "1f1b"))
    known = {v: k for k, v in X.SCHEDULER.items() if k != "interleaved"}
    if sched in known:
        return default_schedule(vpp) if sched == "1f1b" else known[sched]
    if sched == "seqpipe":
        return default_schedule(vpp)
    raise NdplanError(KEY["scheduler"], sched, "not modelled", "ndplan models 1f1b (interleaved), gpipe and "
                      "zero_bubble_v pipelines (and estimates seqpipe as 1f1b)")


MCORE_SEQ_DEFAULT = 4096
"""seq_length of an mcore model whose model_config leaves it out: MFModelConfig.seq_length
(mindformers/parallel_core/mf_model_config.py:349 at f52743ca, :361 at v1.7.0), merged under
every mcore model config's own keys by register_mf_model_parameter (models/model_config_utils.py:
184-211 at f52743ca; no mcore config class overrides it: deepseek3 and telechat3 pass 4096)."""
DATASET_SEQ = "train_dataset.data_loader.config.seq_length"
"""The Megatron GPTDataset's sample length (BlendedMegatronDatasetDataLoader, mindformers/dataset/
dataloader/blended_megatron_dataloader.py:185 at f52743ca)."""
HANDLERS = "train_dataset.data_loader.handler"
"""HFDataLoader's handler list; the last entry with a seq_length (PackingHandler) sets the length
of the samples (configs/qwen3/finetune_qwen3.yaml at f52743ca)."""


def _dataset_seq(doc: dict) -> tuple[str, object] | None:
    """(key, value) of the sample length the training dataset says, or None."""
    if get(doc, DATASET_SEQ) is not None:
        return DATASET_SEQ, get(doc, DATASET_SEQ)
    handlers = get(doc, HANDLERS)
    given = [(i, h["seq_length"]) for i, h in enumerate(handlers) if isinstance(h, dict)
             and h.get("seq_length") is not None] if isinstance(handlers, list) else []
    return (f"{HANDLERS}[{given[-1][0]}].seq_length", given[-1][1]) if given else None


def seq_length(doc: dict, name: str) -> tuple[int, str | None]:
    """(sequence length, note or None) as MindFormers builds the model: ``model_config.seq_length``;
    absent in an mcore model, MindFormers' default ``MCORE_SEQ_DEFAULT``, which the dataset's
    sample length must then equal (the causal mask is built seq_length x seq_length,
    parallel_core/training_graph/transformer/mask_generate.py:66-69 at f52743ca, and the MoE
    reshapes tokens by it, moe/moe_layer.py:195, 230). A legacy model class has its own
    default (LlamaConfig 2048, models/llama/llama_config.py:133): NdplanError naming --seq."""
    v = model_config(doc).get("seq_length")
    if v is not None:
        return positive(KEY["seq"], v, name), None
    ds = _dataset_seq(doc)
    if not is_mcore(doc):
        said = f" ({ds[0]}={ds[1]!r} is the data's length)" if ds else ""
        raise NdplanError(KEY["seq"], None, f"absent, and each legacy model class defaults it its own way (LlamaConfig "
                          f"2048){said}",
                          f"set {KEY['seq']} in the yaml, or pass --seq")
    if ds is not None and ds[1] != MCORE_SEQ_DEFAULT:
        raise NdplanError(KEY["seq"], None, f"absent, so MindFormers builds the model for its default "
                          f"{MCORE_SEQ_DEFAULT} (parallel_core/mf_model_config.py:349), but {ds[0]}={ds[1]!r}",
                          f"set {KEY['seq']}: {ds[1]} in the yaml, or pass --seq")
    agrees = f", the length of {ds[0]}" if ds else ""
    return MCORE_SEQ_DEFAULT, (f"seq {MCORE_SEQ_DEFAULT}: {KEY['seq']} absent, MindFormers' mcore default "
                               f"(parallel_core/mf_model_config.py:349 at f52743ca){agrees}")


def _weight_dtype(doc: dict, mc: dict) -> str:
    """fp32 for float32 parameters, else bf16 (2 bytes). The mcore model's params_dtype (alias
    param_init_type) defaults to float32 (parallel_core/model_parallel_config.py:106 at f52743ca);
    the legacy param_init_type to float16 (models/llama/llama_config.py:153)."""
    names = ("params_dtype", "param_init_type") if is_mcore(doc) else ("param_init_type", "params_dtype")
    v = next((mc[k] for k in names if mc.get(k) is not None), "float32" if is_mcore(doc) else "float16")
    return "fp32" if str(v) in ("float32", "fp32") else "bf16"


def _experts(doc: dict, spec, tp: int, notes: list) -> dict:
    """ep <- parallel_config.expert_parallel; etp <- moe_config.expert_model_parallel, else
    model_parallel in the legacy MoE (experts split over model_parallel: llama_layer.py
    L322-325, moe.py L688-695) and 1 in mcore (``expert_tensor_parallel_size`` None -> 1,
    parallel_core/training_graph/tensor_parallel/batched_layers.py L117)."""
    if not spec.is_moe:
        return {}
    ep = positive(KEY["ep"], get(doc, KEY["ep"], 1), "parallel_config")
    etp_key = "model.model_config.expert_model_parallel" if is_mcore(doc) else f"{MOE}.expert_model_parallel"
    etp = get(doc, etp_key)
    etp = positive(etp_key, etp, "the yaml") if etp is not None else (1 if is_mcore(doc) else tp)
    return {"ep": ep, "etp": etp}


def _file_model(doc: dict, name: str, model):
    """The yaml's own architecture; with -m, one the yaml cannot define is no error (-m replaces it)."""
    try:
        return model_of(doc, name, name)
    except NdplanError:
        if model is None:
            raise
        return None


def read_doc(doc: dict, *, model=None, name: str = "mindformers.yaml", seq: int | None = None,
             gbs: int | None = None) -> tuple:
    """(model, model origin, strategy kwargs, notes) of a parsed MindFormers yaml."""
    if not isinstance(doc, dict) or not isinstance(doc.get("parallel_config"), dict):
        raise NdplanError("parallel_config", None, f"{name} has no parallel_config mapping",
                          "give a MindFormers training yaml, or --format for another framework")
    notes: list[str] = []
    spec, origin = resolve_model(model, _file_model(doc, name, model), f"{MC} in {name}",
                                 f"{name} has no complete {MC} (lacks {', '.join(missing_keys(doc)) or 'none'})")
    if (get(doc, KEY["ep"], 1) or 1) != 1 and not spec.is_moe:
        raise NdplanError(KEY["ep"], get(doc, KEY["ep"]), "expert parallelism on a dense model", "set 1")
    dp, tp, pp = (positive(KEY[k], get(doc, KEY[k], 1), name) for k in ("dp", "tp", "pp"))
    cp = positive(KEY["cp"], get(doc, KEY["cp"], 1), name)
    vpp = positive(KEY["vpp"], get(doc, KEY["vpp"], 1), name) if get(doc, KEY["interleave"], False) else 1
    schedule = _scheduler(doc, vpp)
    mbs = positive(KEY["mbs"], get(doc, KEY["mbs"], 1), name)
    if pp > 1:
        m = positive(KEY["m"], get(doc, KEY["m"], 1), name)
    else:
        m = positive(KEY["grad_accum"], get(doc, KEY["grad_accum"], 1), name)
        notes.append(f"pp=1: micro-batches = gradient_accumulation_steps = {m} (micro_batch_num ignored)")
    from ndplan.interop import mindformers_memory as MFM
    mc = model_config(doc)
    seq_, seq_note = (seq, None) if seq is not None else seq_length(doc, name)
    if seq_note:
        notes.append(seq_note)
    MFM.seq_split(doc, pp, notes)
    kw = dict(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, mbs=mbs, gbs=gbs if gbs is not None else mbs * dp * m,
              seq=seq_, zero=1 if get(doc, KEY["zero"], False) else 0, sp=bool(get(doc, KEY["sp"], False)) or tp == 1,
              engine="mindspore", flash_attention=bool(mc.get("use_flash_attention", False)),
              weight_dtype=_weight_dtype(doc, mc), schedule=schedule)
    L = spec.num_hidden_layers
    lps = _layers_per_stage(doc, L, pp, vpp, schedule, notes)
    if lps is not None:
        kw["layers_per_stage"] = lps
        notes.append(f"offset -> layers_per_stage={list(lps)}")
    kw |= _experts(doc, spec, tp, notes)
    kw |= _recompute(doc, pp, vpp, L, notes)
    if cp > 1:
        notes.append(f"context_parallel_algo={get(doc, KEY['cp_algo'], 'colossalai_cp')}: "
                     "ndplan has one CP activation model")
    if get(doc, KEY["vocab_emb_dp"], True) and tp > 1:
        notes.append("vocab_emb_dp=True: embedding/head replicated over TP in MindFormers, sharded by tp in ndplan")
    if (mc.get("fine_grain_interleave") or 1) > 1:
        notes.append(f"fine_grain_interleave={mc['fine_grain_interleave']} not modelled")
    pet = model_config(doc).get("pet_config")
    if pet is not None and not isinstance(pet, dict):
        raise NdplanError(f"{MC}.pet_config", pet, "not a mapping", "write it as keys (pet_type: lora, ...)")
    if pet:  # MindFormers' parameter-efficient tuning (pet/ : LoRA, P-tuning, ...)
        notes.append(f"{MC}.pet_config {pet.get('pet_type', '(no pet_type)')}: not modelled: the frozen base is counted with "
                     "gradients and optimizer states (over-counted), the adapters' own are not")
    if (doc.get("micro_batch_interleave_num") or 1) > 1:
        notes.append(f"micro_batch_interleave_num={doc['micro_batch_interleave_num']} not modelled")
    if kw["zero"]:
        notes.append(f"{KEY['zero']} -> zero=1 (MindSpore optimizer parallel: weights and optimizer states "
                     "sharded over data_parallel); the format has no ZeRO-2/3 level, so zero 2 or 3 reads back as 1")
    kw["offload_optimizer"] = MFM.MFO.swap(doc, notes)
    kw["engine"] = MFM.engine(doc, spec, dp=dp, cp=cp, zero=kw["zero"], mcore=is_mcore(doc), notes=notes,
                              weight_bytes=4 if kw["weight_dtype"] == "fp32" else 2,
                              moe_tp_without_sp=spec.is_moe and not is_mcore(doc) and tp > 1 and not kw["sp"])
    return spec, origin, kw, notes


def _in_yaml(e: NdplanError, kw: dict) -> NdplanError:
    """A strategy rule's error (rules.py names Strategy fields and CLI flags) as the yaml key to
    change, with the yaml's value; other errors as they are. The pipeline fields' fix names the
    scheduler too; the others keep the rule's fix."""
    pp1 = kw["pp"] == 1
    m = kw["gbs"] // (kw["dp"] * kw["mbs"])
    pipeline = {"vpp": (KEY["vpp"], kw["vpp"]), "schedule": (KEY["scheduler"], kw["schedule"]),
                "gbs": (KEY["grad_accum"] if pp1 else KEY["m"], m), "m": (KEY["grad_accum"] if pp1 else KEY["m"], m)}
    degrees = {f: (KEY[f], kw.get(f, 1)) for f in ("sp", "tp", "pp", "ep")}
    if e.field in pipeline:
        key, value = pipeline[e.field]
        return NdplanError(key, value, e.problem, f"change {key} (or {KEY['scheduler']}) in the yaml")
    if e.field in degrees:
        return NdplanError(*degrees[e.field], e.problem, e.fix)
    return e


def read(path: Path, text: str, *, model=None, gpus=None, seq=None, gbs=None) -> CheckInput:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise NdplanError("FILE", path.name, f"malformed YAML{f' at line {mark.line + 1}' if mark else ''}: "
                                             f"{getattr(e, 'problem', e)}", "fix the syntax") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("parallel_config"), dict):
        raise NdplanError("FILE", path.name, "has no parallel_config mapping",
                          "give a MindFormers training yaml, or --format for another framework")
    name = f"{path.parent.name}/{path.stem}" if path.parent.name else path.stem
    spec, origin, kw, notes = read_doc(doc, model=model, name=name, seq=seq, gbs=gbs)
    world = kw["dp"] * kw["tp"] * kw["pp"] * kw["cp"]
    try:
        strat = make_strategy(kw, notes)
        strat.check(spec, world)  # the model and engine_model rules (MoE with tp > 1 needs SP, ...)
    except NdplanError as e:
        raise _in_yaml(e, kw) from None
    if gpus is not None and gpus != world:
        raise NdplanError("gpus", gpus, f"{path.name} uses data_parallel*model_parallel*pipeline_stage*"
                                        f"context_parallel = {world} devices; drop --gpus or change the yaml")
    loc = {k: v[0] + 1 for k, v in yaml_locate(text).items()}
    where = {f: KEY[f] for f in ("dp", "tp", "pp", "cp", "mbs", "seq", "vpp", "sp", "zero")}
    origin_ = {f: (f"line {loc[k]}: {k}" if k in loc else f"default ({k} absent)") for f, k in where.items()}
    m_key = KEY["m"] if strat.pp > 1 else KEY["grad_accum"]
    origin_["m"] = f"line {loc[m_key]}: {m_key}" if m_key in loc else f"default 1 ({m_key} absent)"
    origin_["recompute"] = ", ".join(f"line {loc[KEY[k]]}: {KEY[k]}" for k in ("full", "selective") if KEY[k] in loc)
    origin_["gpus"] = "dp*tp*pp*cp of the yaml"
    if seq is not None:
        origin_["seq"] = "--seq"
    elif KEY["seq"] not in loc:
        origin_["seq"] = f"MindFormers' mcore default ({KEY['seq']} absent; parallel_core/mf_model_config.py:349)"
    limit = memory_limit(doc)
    notes.append(hccl.note(strat, os.environ))
    return CheckInput(path=path, fmt="mindformers", text=text, model=spec, model_origin=origin, strategy=strat,
                      gpus=world, origin=origin_, lines={k: v for k, v in loc.items()}, notes=tuple(notes),
                      mem_limit_bytes=limit,
                      mem_limit_origin=(f"line {loc[KEY['max_device_memory']]}: " if KEY["max_device_memory"] in loc
                                        else "") + "context.max_device_memory"
                      if limit else None)


fields = X.fields
edit = yaml_edit


def follow_up(ci: CheckInput, strat) -> dict:
    """Keys ndplan does not model whose shape must follow a new pipeline: a per-stage
    ``select_comm_recompute`` list has one entry per stage (per chunk and stage with
    VPP), so when pp or vpp changes it is switched off rather than left the wrong length
    (ndplan's estimate does not count communication recompute either way). A
    ``seq_split_num`` > 1, which MindFormers refuses with full recompute or without a pipeline
    (mindformers_memory.seq_split), is set to 1 (and seqpipe to 1f1b) for such a strategy: the
    estimate was 1f1b over whole sequences already."""
    doc = yaml.safe_load(ci.text) or {}
    out = {}
    if isinstance(get(doc, KEY["selective_comm"]), list) and (strat.pp, strat.vpp) != (ci.strategy.pp, ci.strategy.vpp):
        out[KEY["selective_comm"]] = False
    if get(doc, KEY["seq_split"], 1) != 1 and (strat.pp == 1 or strat.recompute == "full"):
        out[KEY["seq_split"]] = 1
        if str(get(doc, KEY["scheduler"])) == "seqpipe" and strat.schedule == "1f1b":
            out[KEY["scheduler"]] = "1f1b"
    return out
