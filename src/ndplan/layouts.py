"""Uneven pipeline layouts of the form the frameworks run: first and last stage apart,
the middle stages even ("ends" layouts). Plain integers; formulas/placement.py has the
symbolic layer counts, space.py puts the family in the sweep.

A layout is (F, Lst): stage 0 holds F decoder layers, stage pp-1 holds Lst, each of the
pp-2 middle stages M = (L - F - Lst) / (pp - 2); every stage's layers are dealt evenly
over its vpp chunks (F/vpp per chunk of stage 0, ...). This is Megatron-LM's
``--decoder-first/last-pipeline-num-layers`` (NVIDIA/Megatron-LM@d98e8a64
transformer_block.py:104-146 get_num_layers_to_build: the first/last counts are given
to all virtual chunks of that rank, the rest split evenly; transformer_config.py:
2294-2345: each count > 0 and divisible by vpp, the middle layers divisible by the
middle stages, none left over when pp = 2; transformer_block.py:175-178: every rank's
count divisible by vpp), MindFormers ``offset`` lists whose middle entries are equal, and
torchtitan's ``pipeline_parallel_first/last_stage_less_layers`` split at vpp = 1.

The sweep's family (``ends_options``), per chunk (c = count / vpp):

* pp >= 3: M divisible by vpp, and the first and last chunk counts each within
  ``BELOW`` layers under and ``ABOVE`` over the middle chunk count: M/vpp - 2 <=
  F/vpp, Lst/vpp <= M/vpp + 1, both >= 1;
* pp = 2: F + Lst = L, F/vpp and Lst/vpp >= 1 and at most ``BELOW + ABOVE`` apart;
* the even split (F = Lst = M) is not an "ends" layout: it is the sweep's even row.

Why fewer layers at the ends: stage 0 holds the embedding and, under 1F1B, the most
micro-batches in flight; the last stage holds the output head and the loss (Llama 3
405B: one layer fewer on each, Dubey et al. 2024 Sec. 3.3.2). One more is allowed
where a layer count leaves no other choice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ndplan.vocab import BIDIRECTIONAL_SCHEDULES, HEAD_ON_FIRST_STAGE, V_SCHEDULES

if TYPE_CHECKING:
    from ndplan.catalog.model import ModelSpec

BELOW = 2
"""Layers per chunk the first/last stage may hold under the middle count: 2 admits
torchtitan's default split of DeepSeek-V3 (61 layers on 16 stages with embedding and
output counted as layers: 3/4x14/2, the last stage 2 under) and Llama 3 405B's 7/8x14/7."""
ABOVE = 1
"""Layers per chunk the first/last stage may hold over the middle count: 1 admits the
splits whose middle count is rounded down (e.g. 126 layers on 16 stages: 8/8x14/6)."""
RANGE_TEXT = (f"pp >= 3: the middle pp-2 stages even (M layers, M divisible by vpp); the first and last "
              f"stages each between M - {BELOW}*vpp and M + {ABOVE}*vpp layers (multiples of vpp, at least vpp); "
              f"pp = 2: the two stages' counts (multiples of vpp) at most {BELOW + ABOVE}*vpp apart")


def middle(L: int, pp: int, first: int, last: int) -> int:
    """Layers of each middle stage (0 when pp <= 2)."""
    return (L - first - last) // (pp - 2) if pp > 2 else 0


def ends_options(L: int, pp: int, vpp: int) -> list[tuple[int, int]]:
    """Every (F, Lst) of the family (module docstring) for L layers on pp x vpp chunks,
    the even split excluded, in increasing (F, Lst)."""
    out = []
    if pp == 2:
        for f in range(vpp, L, vpp):
            last = L - f
            if last % vpp == 0 and last >= vpp and abs(f - last) <= (BELOW + ABOVE) * vpp and f != last:
                out.append((f, last))
        return out
    if pp < 2:
        return out
    for mc in range(1, L // ((pp - 2) * vpp) + 1):  # middle layers per chunk
        rest = L - (pp - 2) * vpp * mc
        for fc in range(max(1, mc - BELOW), mc + ABOVE + 1):
            lc = rest / vpp - fc
            if lc == int(lc) and max(1, mc - BELOW) <= lc <= mc + ABOVE and (fc, lc) != (mc, mc):
                out.append((fc * vpp, int(lc) * vpp))
    return sorted(out)


def stage_of(schedule: str, v: int, pp: int) -> int:
    """The stage running virtual stage v (virtual_stage inverted; under a bidirectional schedule
    the stage running it for the micro-batches entering at stage 0, stage v)."""
    if schedule in BIDIRECTIONAL_SCHEDULES:
        return v
    for chunk in (0, 1) if schedule in V_SCHEDULES else (v // pp,):
        for s in range(pp):
            if virtual_stage(schedule, s, chunk, pp) == v:
                return s
    raise ValueError(f"virtual stage {v} of pp={pp} under {schedule}")


def layers_per_stage(L: int, pp: int, vpp: int, schedule: str, first: int, last: int) -> tuple[int, ...]:
    """Decoder layers of every virtual stage in model order (Strategy.layers_per_stage)."""
    mid = middle(L, pp, first, last)
    per_stage = [first] + [mid] * (pp - 2) + [last]
    if schedule in BIDIRECTIONAL_SCHEDULES:  # one slice per stage, each held twice
        return tuple(per_stage)
    return tuple(per_stage[stage_of(schedule, v, pp)] // vpp for v in range(pp * vpp))


def ends_of(pp: int, vpp: int, schedule: str, lps: tuple[int, ...] | None) -> tuple[int, int] | None:
    """(F, Lst) when ``lps`` (Strategy.layers_per_stage) is an ends layout (every chunk of a
    stage equal, the middle stages equal, each count at least 1 per chunk), else None."""
    if lps is None or pp < 2 or len(lps) != pp * vpp or schedule in BIDIRECTIONAL_SCHEDULES:
        return None  # a bidirectional schedule's given split is counted concretely
    by_stage: dict[int, set] = {}
    for v, n in enumerate(lps):
        by_stage.setdefault(stage_of(schedule, v, pp), set()).add(n)
    if any(len(counts) != 1 or min(counts) < 1 for counts in by_stage.values()):
        return None
    counts = [by_stage[s].pop() * vpp for s in range(pp)]
    if len(set(counts[1:-1])) > 1:
        return None
    return counts[0], counts[-1]


# Which layout a model and strategy have: plain Python, read by the sweep without SymPy
# (formulas/placement.py, schedules.py and groups.py re-export them for the builders).


def virtual_stage(schedule: str, stage, chunk, pp):
    """Index of the model slice (in layer order) that (stage, chunk) runs.

    * V schedules (zbv, dualpipev): chunk 0 of stage i is slice i, chunk 1 is 2*pp-1-i.
    * dualpipe: pp slices, each held twice (BIDIRECTIONAL_SCHEDULES). Stage i runs slice i for the
      micro-batches entering at stage 0 and slice pp-1-i for those entering at stage pp-1; chunk 0
      is the one of the two that its micro-batches reach first, slice h = min(i, pp-1-i), chunk 1
      is slice pp-1-h (DualPipe's "phase", dualpipe.py ``phase ^= self.is_in_second_half``), so
      the end stages hold the embedding on chunk 0 and the head on chunk 1, and the in-flight
      table is symmetric in i <-> pp-1-i.
    * otherwise chunk c of stage i is slice c*pp + i."""
    if schedule in V_SCHEDULES:
        return stage if chunk == 0 else 2 * pp - 1 - stage
    if schedule in BIDIRECTIONAL_SCHEDULES:
        if isinstance(stage, int) and isinstance(pp, int):
            h = min(stage, pp - 1 - stage)
        else:
            from ndplan.formulas.minmax import Min
            h = Min(stage, pp - 1 - stage)
        return h if chunk == 0 else pp - 1 - h
    return chunk * pp + stage


def slices(schedule: str, pp: int, vpp: int) -> int:
    """Model slices (virtual stages in layer order) of a pipeline: pp * vpp, except pp under a
    bidirectional schedule, whose two chunks per stage are slices of two copies of the model."""
    return pp if schedule in BIDIRECTIONAL_SCHEDULES else pp * vpp


def placements(schedule: str, v: int, pp: int, vpp: int) -> list[tuple[int, int]]:
    """Every (stage, chunk) running slice v: one, or two under a bidirectional schedule."""
    return [(s, c) for s in range(pp) for c in range(vpp) if virtual_stage(schedule, s, c, pp) == v]


def head_stage(view, pp: int) -> int:
    """The pipeline stage holding the output head and loss: the last, or stage 0 under
    a V schedule (vocab.HEAD_ON_FIRST_STAGE; placement.head_device_flag is its symbolic form)."""
    return 0 if view.schedule in HEAD_ON_FIRST_STAGE else pp - 1


def leading_dense(spec: ModelSpec) -> int | None:
    """k if the layers are k dense followed by only MoE (or all dense: k = L), else None."""
    pattern = spec.layer_pattern
    return {"dense": spec.num_hidden_layers if pattern[0] == "dense" else None, "moe": 0,
            "leading": pattern[-1], "mixed": None}[pattern[0]]


def mixed_layers(spec: ModelSpec) -> bool:
    """Do dense and MoE layers interleave (no closed-form layout; leading_dense is None)?"""
    return spec.layer_pattern[0] == "mixed"


def ends_layout(spec: ModelSpec, strat) -> bool:
    """Is the layout an "ends" layout written in the symbols first_layers/last_layers? A
    Structure says so (``ends``); a Strategy when its layers_per_stage is one
    (layouts.ends_of), the layers are leading-dense and vpp is 1. Under vpp > 1 a given
    layout keeps its exact max over held vectors (structure.peaks_over_held_vectors),
    which needs concrete pp and m; the sweep evaluates such rows as ends layouts with the
    in-flight split, as it does even ones (schedules.py docstring: at most one
    micro-batch of the embedding/head chunk's extra under-counted)."""
    if hasattr(strat, "ends"):
        return strat.ends
    return (strat.vpp == 1 and not mixed_layers(spec)
            and ends_of(strat.pp, strat.vpp, strat.schedule, strat.layers_per_stage) is not None)


def symbolic_layout(spec: ModelSpec, strat) -> bool:
    """Can layer counts be written in the symbols pp and stage (even split or an "ends"
    layout, leading-dense layers)?"""
    return not mixed_layers(spec) and (strat.layers_per_stage is None or ends_layout(spec, strat))
