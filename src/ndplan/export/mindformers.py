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
with vpp > 1); ``select_recompute`` counts selective + full layers (a full recompute also
drops what selective would; MindSpore SAPP's convention, ppb/forms.py).
``vocab_emb_dp`` is False when tp > 1 (the embedding is split over model_parallel).
``gradient_aggregation_group`` = 4 is the value of every SAPP example (a fusion knob).
Schedules other than 1f1b and interleaved are not expressed (NdplanError).
"""

from __future__ import annotations

import yaml

from ndplan.catalog.model import ModelSpec
from ndplan.export.common import cannot, chunk_layers, header, per_stage, recompute_counts
from ndplan.strategy import Strategy

TARGET = "MindFormers"
GRADIENT_AGGREGATION_GROUP = 4
"""Every MindFormers example in shared/validation/mindformers sets 4."""


class _Dumper(yaml.SafeDumper):
    """Block mappings, inline lists (the examples' style: ``offset: [1, 0, 0, -1]``)."""


_Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def _counts(strat: Strategy, counts, layers):
    """False (none), True (every layer) or the per-stage list form."""
    if not max(counts):
        return False
    if all(c == n for c, n in zip(counts, layers)):
        return True
    return per_stage(strat, counts)


def emit(model: ModelSpec, strat: Strategy, *, balance=None) -> str:
    s = strat
    if s.pp > 1 and s.schedule not in ("1f1b", "interleaved"):
        raise cannot(TARGET, "schedule", s.schedule, "use --schedule 1f1b or interleaved")
    layers = chunk_layers(model, s, balance)
    full, sel = recompute_counts(model, s, balance)
    base = sum(layers) // len(layers)
    par = {"data_parallel": s.dp, "model_parallel": s.tp, "pipeline_stage": s.pp, "context_parallel": s.cp}
    if model.is_moe:
        par["expert_parallel"] = s.ep
    par |= {"micro_batch_num": s.m, "vocab_emb_dp": s.tp == 1, "use_seq_parallel": s.sp and s.tp > 1,
            "gradient_aggregation_group": GRADIENT_AGGREGATION_GROUP}
    offset = [n - base for n in layers]
    model_config = {"seq_length": s.seq, "offset": per_stage(s, offset) if any(offset) else 0}
    if s.vpp > 1:
        model_config["pp_interleave_num"] = s.vpp
    doc = {"parallel": {"enable_parallel_optimizer": s.zero >= 1},
           "runner_config": {"batch_size": s.mbs},
           "parallel_config": par,
           "recompute_config": {"recompute": _counts(s, full, layers),
                                "select_recompute": _counts(s, [f + x for f, x in zip(full, sel)], layers)
                                if max(sel) else False},
           "model": {"model_config": model_config}}
    notes = []
    if s.zero >= 2:
        notes.append(f"zero {s.zero}: MindSpore optimizer parallel shards optimizer states (and, by its "
                     "parallel_optimizer_config, weights); check optimizer_weight_shard_size")
    if s.offload_optimizer:
        notes.append("optimizer offload is not expressed here")
    head = header(TARGET, model, s) + [f"# note: {n}" for n in notes]
    return "\n".join(head) + "\n" + yaml.dump(doc, Dumper=_Dumper, sort_keys=False)
