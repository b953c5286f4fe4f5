"""MindFormers ``parallel_config`` / ``recompute_config`` YAML (``--emit mindformers``).

Key names as in the MindFormers training configs of MindSpore SAPP
(NikoLaFerrari/huawei_paris:memory_estimation/test_cases/llama3/*.yaml, copied in
shared/validation/mindformers/llama3/): ``parallel_config`` (``data_parallel``,
``model_parallel``, ``pipeline_stage``, ``context_parallel``, ``expert_parallel``,
``micro_batch_num``, ``vocab_emb_dp``, ``use_seq_parallel``,
``gradient_aggregation_group``), ``recompute_config`` (``recompute``,
``select_recompute``: a bool, one count per stage, or with vpp > 1 one list per chunk),
``parallel.enable_parallel_optimizer`` (MindSpore optimizer parallel = ZeRO over dp),
``runner_config.batch_size`` (the micro-batch), ``model.model_config`` (``seq_length``,
``offset``, ``pp_interleave_num``).

``offset`` = decoder layers of the slice - L // (pp*vpp), per stage (per chunk and stage
with vpp > 1): MindFormers builds ``L // (pp * pp_interleave_num) + offset[chunk][stage]``
layers per slice and requires sum(offset) = L % (pp * pp_interleave_num)
(mindspore-lab/mindformers:mindformers/models/utils.py, ``LayerSetting.__init__`` and
``_check_inputs``). ``recompute`` and ``select_recompute`` count from the slice's first
layer, and a fully recomputed layer skips select recompute (``LayerSetting.set``:
``if not is_full_recompute``), so ``select_recompute`` counts selective + full layers
for the plan's "full first, then selective" order (also MindSpore SAPP's convention).
``vocab_emb_dp`` is False when tp > 1 (the embedding is split over model_parallel).
``gradient_aggregation_group`` = 4 is the value of every SAPP example (a fusion knob).
Schedules other than 1f1b and interleaved are not expressed (NdplanError). Said in a comment
instead: zero 2 and 3 (MindFormers has one optimizer-parallel switch, read back as zero=1) and
optimizer settings with no MindFormers ``optimizer`` keys here (``_optimizer_keys``).
"""

from __future__ import annotations

import yaml

from ndplan import rules
from ndplan.catalog.model import ModelSpec
from ndplan.export.common import cannot, layers_per_chunk, header, nest, per_stage, recompute_counts, refuse_engine_rules
from ndplan.strategy import Strategy

TARGET = "MindFormers"
GRADIENT_AGGREGATION_GROUP = 4
"""Every MindFormers example in shared/validation/mindformers sets 4."""
KEY = {"zero": "parallel.enable_parallel_optimizer", "mbs": "runner_config.batch_size",
       "grad_accum": "runner_config.gradient_accumulation_steps",
       "dp": "parallel_config.data_parallel", "tp": "parallel_config.model_parallel",
       "pp": "parallel_config.pipeline_stage", "cp": "parallel_config.context_parallel",
       "cp_algo": "parallel_config.context_parallel_algo",
       "ep": "parallel_config.expert_parallel", "m": "parallel_config.micro_batch_num",
       "seq_split": "parallel_config.seq_split_num", "etp": "moe_config.expert_model_parallel",
       "vocab_emb_dp": "parallel_config.vocab_emb_dp", "sp": "parallel_config.use_seq_parallel",
       "grad_group": "parallel_config.gradient_aggregation_group",
       "full": "recompute_config.recompute", "selective": "recompute_config.select_recompute",
       "selective_comm": "recompute_config.select_comm_recompute",
       "seq": "model.model_config.seq_length", "offset": "model.model_config.offset",
       "vpp": "model.model_config.pp_interleave_num",
       "scheduler": "parallel.pipeline_config.pipeline_scheduler",
       "interleave": "parallel.pipeline_config.pipeline_interleave",
       "max_device_memory": "context.max_device_memory"}
"""Strategy knob -> dotted YAML key: the one table the exporter and the reader
(interop/mindformers.py) use."""


class _Dumper(yaml.SafeDumper):
    """Block mappings, inline lists (the examples' style: ``offset: [1, 0, 0, -1]``)."""


_Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def _counts(p, counts, layers):
    """False (none), True (every layer) or the per-stage list form."""
    if not max(counts):
        return False
    if all(c == n for c, n in zip(counts, layers)):
        return True
    return per_stage(p, counts)


SCHEDULER = {"1f1b": "1f1b", "interleaved": "1f1b", "gpipe": "gpipe", "zbv": "zero_bubble_v"}
"""ndplan schedule -> MindSpore ``pipeline_scheduler`` (1f1b runs interleaved with
pp_interleave_num > 1; zero_bubble_v places a V over two chunks: mindformers@f52743ca
parallel_core/training_graph/transformer/utils.py:163-167, 410-419, the second chunk's stages
and its offset and recompute rows reversed, :465-500, the output layer on stage 0,
base_models/gpt/gpt_model.py:746-757)."""


def _check_schedule(p) -> None:
    """rules.py's mindspore rules on the pipeline (no one-chunk zero bubble; zero_bubble_v with
    m >= 2 pp) for ``p``: anything with pp, vpp, m and schedule (a Strategy, a PPB Pipeline)."""
    from types import SimpleNamespace
    c = SimpleNamespace(engine="mindspore", pp=p.pp, vpp=p.vpp, m=p.m, schedule=p.schedule)
    refuse_engine_rules(TARGET, c, ("schedule", "m"))


def pipeline_fields(p, layers, full, sel, comm=None, both=None) -> dict:
    """recompute, select_recompute (select_comm_recompute) and offset (dotted keys) of decoder
    ``layers`` and recompute counts per virtual stage (``comm``: communication recompute alone,
    ``both``: selective + communication); ``p`` has pp, vpp, schedule. A fully recomputed layer
    counts in every list and a ``both`` layer in both select lists, SAPP's ``yaml_from_internal``
    (toolkit/pipeline_balance/utils/recompute.py at v1.6.0-beta1)."""
    offset = [n - sum(layers) // len(layers) for n in layers]
    both = both or [0] * len(layers)
    doc = {KEY["full"]: _counts(p, full, layers),
           KEY["selective"]: (_counts(p, [f + b + x for f, b, x in zip(full, both, sel)], layers)
                              if max(sel) or max(both) else False),
           KEY["offset"]: per_stage(p, offset) if any(offset) else 0}
    if comm is not None and (max(comm) or max(both)):
        doc[KEY["selective_comm"]] = _counts(p, [f + b + c for f, b, c in zip(full, both, comm)], layers)
    return doc


def plan_fields(p, balance) -> dict:
    """``pipeline_fields`` of a PPB plan alone (``ndplan balance``), by leaf name."""
    _check_schedule(p)
    count = balance.mode_counts
    doc = pipeline_fields(p, balance.decoder_layers(), count("full"), count("selective"), count("comm"),
                          count("selective+comm"))
    out = {k.rsplit(".", 1)[1]: doc[k] for k in (KEY["offset"], KEY["full"], KEY["selective"], KEY["selective_comm"])
           if k in doc}
    if p.pp > 1 and SCHEDULER[p.schedule] != "1f1b":
        out[KEY["scheduler"].rsplit(".", 1)[1]] = SCHEDULER[p.schedule]
    return out


def _engine_keys(model: ModelSpec, s: Strategy, notes: list) -> dict:
    """The mindspore engine's settings as the keys interop.mindformers_memory reads them from:
    the MoE capacity factor (-1, dynamic, when the engine routes dropless), the optimizer
    shard group, the optimizer (``_optimizer_keys``) and optimizer offload (``optimizer.swap``)."""
    from ndplan.engines import profile
    from ndplan.interop import mindformers_memory as MFM
    eng, doc = profile(s.engine), {}
    if model.is_moe:
        doc[f"{MFM.MOE}.capacity_factor"] = eng.moe_capacity_permille / 1000 if eng.moe_capacity_permille else -1
    if eng.optimizer_shard_size:
        doc[MFM.SHARD_SIZE] = eng.optimizer_shard_size
    doc |= _optimizer_keys(eng, notes)
    if s.offload_optimizer:  # AdamW and PmaAdamW keep their states on the host (mindformers_optim.swap)
        doc = {MFM.OPTIMIZER: "AdamW"} | doc | {"optimizer.swap": True}
    return doc


WRITTEN_OPTIMIZERS = ({"optimizer.type": "AdamW", "optimizer.use_fused": True},
                      {"optimizer.type": "AdamW", "optimizer.use_fused": True, "optimizer.amsgrad": True},
                      {"optimizer.type": "PmaAdamW"},
                      {"optimizer.type": "PmaAdamW", "optimizer.use_fused": True},
                      {"optimizer.type": "PmaAdamW", "optimizer.use_fused": True, "optimizer.amsgrad": True})
"""The ``optimizer`` blocks this form writes, tried in order (the profile's default, the
composite AdamW, writes none)."""


def _optimizer_state(eng) -> tuple[int, int, int]:
    return eng.optimizer_bytes, eng.non_matrix_optimizer_bytes, eng.optimizer_step_temp_bytes


def _optimizer_keys(eng, notes: list) -> dict:
    """``optimizer`` keys of the engine's optimizer settings: the first block of
    WRITTEN_OPTIMIZERS that interop.mindformers_optim reads back as them (one source for what
    each block means: the fused AdamW in place, PmaAdamW's third fp32 state, amsgrad's fourth).
    Other settings (Came, Muon, SGD, Momentum: states in the parameter dtype, Muon only on mcore
    MLA models, which this form does not write) are named in a note."""
    from dataclasses import replace

    from ndplan.engines import MINDSPORE
    from ndplan.interop.mindformers_optim import optimizer_settings
    want = _optimizer_state(eng)
    if want == _optimizer_state(MINDSPORE):
        return {}
    for keys in WRITTEN_OPTIMIZERS:
        read = optimizer_settings(nest(keys), None, MINDSPORE.weight_bytes, mcore=False, dp=1, zero=1, notes=[])
        if _optimizer_state(replace(MINDSPORE, **read)) == want:
            return dict(keys)
    notes.append(f"optimizer states of {eng.optimizer_bytes} B per parameter"
                 + (f" ({eng.non_matrix_optimizer_bytes} B on the embedding and output layer)"
                    if eng.non_matrix_optimizer_bytes else "")
                 + f", step temporaries {eng.optimizer_step_temp_bytes} B: not written (optimizer.type is yours "
                 "to set: Came, Muon, SGD and Momentum keep states in the parameter dtype)")
    return {}


def fields(model: ModelSpec, strat: Strategy, *, balance=None) -> tuple[dict, list[str]]:
    """(dotted key -> value; notes) expressing ``strat``. Without a pipeline MindFormers
    accumulates ``runner_config.gradient_accumulation_steps`` micro-batches (micro_batch_num
    is a pipeline setting), so pp = 1 writes both."""
    s = strat
    refuse_engine_rules(TARGET, rules.WithModel(s, model, engine="mindspore"))  # what MindFormers refuses
    pipe = pipeline_fields(s, layers_per_chunk(model, s, balance), *recompute_counts(model, s, balance))
    doc = {KEY["zero"]: s.zero >= 1, KEY["mbs"]: s.mbs}
    if s.pp == 1:
        doc[KEY["grad_accum"]] = s.m
    doc |= {KEY["dp"]: s.dp, KEY["tp"]: s.tp, KEY["pp"]: s.pp, KEY["cp"]: s.cp}
    if model.is_moe:
        if s.etp not in (1, s.tp):
            raise cannot(TARGET, "etp", s.etp, f"MindFormers splits experts over 1 or model_parallel={s.tp} ranks "
                                              "(moe_config.expert_model_parallel); use etp=1 or etp=tp")
        # without the key a legacy moe_config splits the experts over model_parallel (etp = tp, the reader's
        # default); MindFormers 1.3.0's MoEConfig takes no expert_model_parallel (moe.py:122-130 at v1.3.0)
        doc |= {KEY["ep"]: s.ep} | ({KEY["etp"]: s.etp} if s.etp != s.tp else {})
    notes = []
    doc |= _engine_keys(model, s, notes)
    doc |= {KEY["m"]: s.m, KEY["vocab_emb_dp"]: s.tp == 1, KEY["sp"]: s.sp and s.tp > 1,
            KEY["grad_group"]: GRADIENT_AGGREGATION_GROUP}
    doc |= {KEY["full"]: pipe[KEY["full"]], KEY["selective"]: pipe[KEY["selective"]]}
    doc |= {KEY["seq"]: s.seq, KEY["offset"]: pipe[KEY["offset"]]}
    if s.vpp > 1:
        doc |= {KEY["vpp"]: s.vpp, KEY["interleave"]: True}
    if s.pp > 1 and SCHEDULER[s.schedule] != "1f1b":
        doc[KEY["scheduler"]] = SCHEDULER[s.schedule]
    if s.zero >= 2:
        notes.append(f"zero={s.zero} is not expressed: MindFormers names no ZeRO level, only "
                     f"{KEY['zero']} (MindSpore optimizer parallel: weights and optimizer states sharded over "
                     "data_parallel, gathered once a step), which reads back as zero=1")
    return doc, notes


def emit(model: ModelSpec, strat: Strategy, *, balance=None) -> str:
    doc, notes = fields(model, strat, balance=balance)
    head = header(TARGET, model, strat) + [f"# note: {n}" for n in notes]
    return "\n".join(head) + "\n" + yaml.dump(nest(doc), Dumper=_Dumper, sort_keys=False)
