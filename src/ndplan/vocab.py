"""The vocabularies of a strategy, declared once: every module (Strategy, the space
generator, PPB's Pipeline, the CLI choices, readers and writers) imports them from here.

Recompute modes (Korthikanti et al. 2022 Sec. 5): ``none`` keeps every activation,
``selective`` recomputes the attention core, ``full`` keeps only each layer's input.
Schedules: GPipe (Huang et al. 2019), 1F1B (PipeDream-flush, Narayanan et al. 2021),
interleaved 1F1B (Narayanan et al. 2021 Sec. 2.2), zero-bubble ZB-H1 and ZBV (Qi et al.
2024), DualPipe (DeepSeek-AI 2024, DeepSeek-V3 report Sec. 3.2.1) and DualPipeV (its V-shaped
"cut-in-half" form; github.com/deepseek-ai/DualPipe, torch's ScheduleDualPipeV).
"""

from __future__ import annotations

RECOMPUTE_MODES = ("none", "selective", "full")
"""The training formulas' modes, in order of increasing recompute (decreasing memory)."""
PPB_RECOMPUTE_MODES = ("none", "selective", "comm", "selective+comm", "full")
"""The per-layer modes PPB balances: the training modes and MindSpore's communication recompute
(MindFormers ``select_comm_recompute``: the all-gathers of sequence parallelism are run again in
backward; ``selective+comm`` both; SAPP ``Recompute.TYPE`` NONE, SLCT, COMM, BOTH, FULL). Not a
total order: ``selective`` and ``comm`` recompute different things, so none is below both and
both are below ``selective+comm``, which is below ``full`` (``RECOMPUTE_BELOW``). Where PPB needs
one order for a layer (its local search's "one mode deeper / lighter"), it orders that layer's
modes by the activation bytes they keep (ppb/instance.py ``Layer.by_memory``)."""
RECOMPUTE_BELOW = {"none": (), "selective": ("none",), "comm": ("none",),
                   "selective+comm": ("none", "selective", "comm"),
                   "full": ("none", "selective", "comm", "selective+comm")}
"""mode -> the modes that recompute a subset of what it recomputes (the partial order)."""
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipe", "dualpipev")
ONE_CHUNK_SCHEDULES = ("gpipe", "1f1b", "zb-h1")
"""Schedules with one model chunk per stage (vpp must be 1)."""
SPLIT_W_SCHEDULES = ("zb-h1", "zbv", "dualpipe", "dualpipev")
"""Schedules that split the backward into input-gradient B and weight-gradient W."""
V_SCHEDULES = ("zbv", "dualpipev")
"""Schedules whose two chunks per stage form a V: chunk 0 of stage i is virtual stage i, chunk 1
is 2*pp-1-i (Qi et al. 2024 Sec. 6; DualPipeV, torch ``generate_stage_to_rank_mapping`` style "v")."""
HEAD_ON_FIRST_STAGE = V_SCHEDULES
"""Schedules whose last virtual stage runs on stage 0 (the V ends where it starts), so the output
head, loss and MTP sit there, not on stage pp-1."""
BIDIRECTIONAL_SCHEDULES = ("dualpipe",)
"""Schedules that feed micro-batches from both ends: half of them enter at stage 0, half at stage
pp-1, each direction through its own copy of the model, so every stage holds two model slices
(DualPipe's "2x parameters") and both end stages hold the embedding and the head."""
OVERLAPPED_PAIR_SCHEDULES = ("dualpipe", "dualpipev")
"""Schedules whose steady state runs a forward of one chunk and a backward of the other as one
"overlapped forward & backward" op (DualPipe's ``_forward_backward_chunk``)."""
TWO_CHUNK_SCHEDULES = ("zbv",) + OVERLAPPED_PAIR_SCHEDULES
"""Schedules that place exactly two chunks on each stage (vpp must be 2)."""
SCHEDULE_ALIASES = {"dualpipe-v": "dualpipev", "dualpipe_v": "dualpipev"}
"""Other names users give a schedule (a space file, a launch script)."""
ENGINES = ("megatron", "fsdp", "deepspeed", "mindspore", "hf")
"""hf: Hugging Face transformers modules (HF Trainer / Accelerate with FSDP), activations as traced."""
ZERO_LEVELS = (0, 1, 2, 3)
"""0: nothing sharded on dp; 1: optimizer states (+fp32 master); 2: + gradients; 3: + weights."""
GRAD_DTYPES = ("fp32", "bf16")
WEIGHT_DTYPES = ("auto", "fp32", "bf16", "fp8")
STATIC_KEYS = ("mem.weights", "mem.grads", "mem.master", "mem.optimizer", "mem.graph_constants")
"""Memory Terms that are static (held for the whole step); the rest of a stage's Terms are dynamic."""
OUTSIDE_TENSOR_KEYS = ("mem.allocator", "mem.reserve")
"""Terms that are not live tensors: the caching allocator's slack and the memory outside it."""
