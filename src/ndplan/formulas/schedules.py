"""In-flight micro-batches per pipeline stage and chunk, per schedule.

``inflight(schedule, stage, chunk, pp, vpp, m)`` is the number of micro-batches whose
forward activations chunk ``chunk`` of stage ``stage`` holds at that stage's memory
peak. Arguments may be ints or SymPy expressions (Min/Max/floor lambdify to numpy).

Derivations (stage i = 0..pp-1, chunk c = 0..vpp-1, m micro-batches):

* gpipe (Huang et al. 2019): all m forwards run before any backward -> ``m``.
* 1f1b (PipeDream-Flush; Narayanan et al. 2021 Sec. 2.2): stage i runs pp-i-1 warm-up
  forwards, then one forward before each backward -> ``min(pp - i, m)``.
* interleaved (Narayanan et al. 2021 Sec. 2.2.2; Megatron-LM
  ``forward_backward_pipelining_with_interleaving``): warm-up forwards
  2*(pp-i-1) + (vpp-1)*pp, plus the first steady-state forward, so at the peak
  W = min(2*(pp-i-1) + (vpp-1)*pp + 1, m*vpp) chunk-forwards are held. Forwards go to
  chunks in groups of pp micro-batches (chunk (k // pp) % vpp for the k-th forward),
  so chunk c holds floor(W / (pp*vpp))*pp + min(max(W mod (pp*vpp) - c*pp, 0), pp).
  Stage 0 therefore holds pp*vpp + pp - 1 chunk-micro-batches = the 1F1B amount times
  (1 + (pp-1)/(pp*vpp)), Korthikanti et al. 2022 Sec. 4.2.3.
* zb-h1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 2, Fig. 3): B and W are
  split but the schedule keeps 1F1B's warm-up, so peak activation memory equals 1F1B:
  ``min(pp - i, m)`` (the paper's stated property of ZB-H1).
* zbv (Qi et al. 2024 Sec. 6, ZB-V; DualPipe-V): two chunks per stage in a V: chunk 0
  of stage i is virtual stage i, chunk 1 is virtual stage 2*pp-1-i. Stage i runs
  2*(pp-i)-1 chunk-0 forwards, then i pairs (chunk-1 forward, chunk-0 forward), then
  F/B/W triples; at its first peak it holds 2*pp-1-i chunk-0 and i+1 chunk-1
  micro-batches (hand timelines in tests/test_schedules.py; the order of the authors'
  handcrafted ZB-V generator). Every stage holds 2*pp chunk-micro-batches = pp
  micro-batches of a whole stage, the paper's "peak memory pM_B on every worker".

* dualpipev (DeepSeek-AI 2024, DualPipe "cut in half", deepseek-ai/DualPipe dualpipev.py;
  torch's ScheduleDualPipeV): the V placement of zbv; stage i runs 2(pp-i-1) chunk-0
  forwards, then i+1 pairs (chunk-0 forward, chunk-1 forward), so it holds 2pp-i-1 and i+1;
  the first overlapped forward & backward starts its chunk-0 forward before the chunk-1
  backward frees: 2pp-i and i+1 at the peak, 2pp+1 chunk-micro-batches on every stage, the
  README table's "PP+1" activations for PP = 2pp chunk-stages.
* dualpipe (DeepSeek-AI 2024, DeepSeek-V3 report Sec. 3.2.1, Fig. 5; dualpipe.py): half the
  micro-batches enter at each end, each direction through its own model copy; with
  h = min(i, pp-1-i), chunk 0 (the slice its micro-batches reach first) holds pp-h and chunk 1
  h+1 at the peak, pp+1 whole-stage micro-batches on every stage ("PP+1").

``held_profiles`` gives, per stage, every per-chunk split of the held micro-batches the
stage passes through (interleaved: chunk 0 refills while the last chunk drains), for
chunks that hold different activations. The memory model (formulas/memory.py
``activation_term``) takes the max over these splits for a given uneven layout under
vpp > 1 (structure.peaks_over_held_vectors), and ``inflight`` otherwise: exact when a
stage's chunks are equal; the embedding/head chunks of an even split differ by one
layer's worth at most, which ``inflight``'s split can under-count by one micro-batch of it.

Activations freed by a zero-bubble B pass but kept until W are not modelled: ZB
schedules keep the inputs of weight-gradient GEMMs slightly longer (Qi et al. report
peak memory equal to 1F1B for ZB-H1 and to pM_B for ZB-V).
"""

from __future__ import annotations

from functools import lru_cache

from ndplan.formulas import dualpipe
from ndplan.vocab import OVERLAPPED_PAIR_SCHEDULES
from ndplan.layouts import virtual_stage  # noqa: F401  (plain Python: layouts.py)

# SymPy (minmax.py) is imported when an argument is symbolic: the op orders and held
# profiles of concrete schedules (ppb/, export/) run without it.


def _min(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    from ndplan.formulas.minmax import Min
    return Min(a, b)


def _max(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    from ndplan.formulas.minmax import Max
    return Max(a, b)


def inflight(schedule: str, stage, chunk, pp, vpp, m):
    """Micro-batches of activations held by (stage, chunk) at the stage's peak."""
    if schedule == "gpipe":
        return m
    if schedule in ("1f1b", "zb-h1"):
        return _min(pp - stage, m)
    if schedule == "interleaved":
        w = _min(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, m * vpp)
        group = pp * vpp
        if isinstance(w, int) and isinstance(group, int):
            full, rem = divmod(w, group)
        else:
            import sympy as sp
            full = sp.floor(w / group)
            rem = w - full * group
        return full * pp + _min(_max(rem - chunk * pp, 0), pp)
    if schedule == "zbv":
        return _min(2 * pp - 1 - stage, m) if chunk == 0 else _min(stage + 1, m)
    if schedule == "dualpipev":
        return _min(2 * pp - stage, m) if chunk == 0 else _min(stage + 1, m)
    if schedule == "dualpipe":
        h = virtual_stage("dualpipe", stage, 0, pp)  # min(stage, pp-1-stage)
        return _min(pp - h, m) if chunk == 0 else _min(h + 1, m)
    raise ValueError(f"unknown schedule {schedule!r}")


def held_after_first_backward(schedule: str, stage, pp, vpp, m):
    """Chunk-micro-batches of activations the stage holds at its largest point after its first
    backward has finished: ``min(W, vpp*m - 1)`` with W the stage total of ``inflight``. Every
    schedule here runs, after its first backward, either another forward that refills the
    peak (1F1B's steady state) or only backwards (gpipe: m - 1 remain), checked against
    ``op_order`` for every schedule, pp <= 8 and m <= 3*pp + 1 (tests/test_schedules.py).
    State that appears with the first backward (FSDP's unsharded gradients under
    pipelining) sits beside this many, not beside the peak."""
    total = sum(inflight(schedule, stage, c, pp, vpp, m) for c in range(vpp))
    return _min(total, vpp * m - 1)


def op_order(schedule: str, stage: int, pp: int, vpp: int, m: int) -> list[tuple[str, int, int]]:
    """(kind, chunk, micro-batch) ops in the order ``stage`` runs them; kind F is a
    forward, B a whole backward (input and weight gradients). Ints only.

    * gpipe: all forwards, then the backwards in reverse micro-batch order.
    * 1f1b: min(pp - stage - 1, m) warm-up forwards, then one forward before each
      backward, then the remaining backwards (so ``inflight`` = min(pp - stage, m)).
    * interleaved (Megatron-LM ``forward_backward_pipelining_with_interleaving``): the
      k-th forward runs chunk (k // pp) % vpp of micro-batch (k // (pp*vpp))*pp + k % pp,
      the k-th backward chunk vpp - 1 - (k // pp) % vpp of the same micro-batch formula;
      warm-up min(2*(pp-stage-1) + (vpp-1)*pp, m*vpp) forwards, then F/B pairs, then the
      remaining backwards. The per-chunk split of the held micro-batches moves during the
      steady state (chunk 0 refills while chunk vpp-1 drains); ``inflight`` gives the split
      at the end of warm-up, the stage total is the same throughout.
    * zb-h1 (Qi et al. 2024 Sec. 2.1): 1F1B's F/B order, kinds F, B (input gradient
      only) and W (weight gradient), stage i running W_k after B_{k+i}.
    * zbv (Qi et al. 2024 Sec. 6, the handcrafted ZB-V schedule; ``_zbv_order``): kinds F,
      B (input gradient only) and W; chunk 0 of stage i is virtual stage i, chunk 1 is
      2*pp-1-i.
    * dualpipe, dualpipev (formulas/dualpipe.py): DeepSeek's eight steps; a full backward is a B
      and its W back to back, an "overlapped forward & backward" a F and the other chunk's B
      (and W) back to back; ``comm_plan`` says what each op waits for and when it sends.
    """
    if schedule == "zbv":
        return _zbv_order(stage, pp, m)
    if schedule in OVERLAPPED_PAIR_SCHEDULES:
        return list(dualpipe.plan(schedule, stage, pp, m)[0])
    if schedule == "zb-h1":
        # 1F1B's order with W apart: stage i runs W_k right after B_{k+i}, the rest at the
        # end (Qi et al. 2024 Sec. 2.1 / Fig. 3; the hand-written pp=3, m=6 order in
        # tests/test_schedules.py)
        ops = []
        for kind, c, j in op_order("1f1b", stage, pp, vpp, m):
            ops.append((kind, c, j))
            if kind == "B" and j - stage >= 0:
                ops.append(("W", c, j - stage))
        return ops + [("W", 0, j) for j in range(max(m - stage, 0), m)]
    if schedule == "gpipe":
        return [("F", 0, j) for j in range(m)] + [("B", 0, j) for j in reversed(range(m))]
    if schedule == "1f1b":
        warm = min(pp - stage - 1, m)
        ops = [("F", 0, j) for j in range(warm)]
        for j in range(m):
            if warm + j < m:
                ops.append(("F", 0, warm + j))
            ops.append(("B", 0, j))
        return ops
    if schedule != "interleaved":
        raise ValueError(f"no fixed op order for {schedule!r}")
    total = m * vpp

    def mb(k):
        return (k // (pp * vpp)) * pp + k % pp

    fwd = [("F", (k // pp) % vpp, mb(k)) for k in range(total)]
    bwd = [("B", vpp - 1 - (k // pp) % vpp, mb(k)) for k in range(total)]
    warm = min(2 * (pp - stage - 1) + (vpp - 1) * pp, total)
    ops = fwd[:warm]
    for i in range(total - warm):
        ops += [fwd[warm + i], bwd[i]]
    return ops + bwd[total - warm:]


@lru_cache(maxsize=4096)
def held_profiles(schedule: str, stage: int, pp: int, vpp: int, m: int) -> tuple[tuple[int, ...], ...]:
    """Per-chunk held micro-batches at every instant the stage may peak, reduced to the
    maximal vectors (none is dominated by another). Ints only.

    The stage's activation memory peaks right after a forward starts; with chunk
    activations a_c its peak is max over these vectors h of sum_c h_c a_c, exact for any
    per-chunk activations. For gpipe/1f1b (one chunk) this is ``inflight``. For
    interleaved the vectors come from ``op_order`` (chunk 0 refills while the last chunk
    drains), every vector summing to the stage total of ``inflight``; ``inflight``'s split
    is the first of them, so with equal chunks the table is exact and with unequal chunks
    it can be low (e.g. pp=16, vpp=2, m=32, stage 8: the table says (16, 15), the
    steady state reaches (31, 0)). zbv: from its order as well (``inflight``'s vector is
    its first peak).
    """
    held = [0] * vpp
    seen = set()
    for kind, chunk, _ in op_order(schedule, stage, pp, vpp, m):
        if kind == "F":
            held[chunk] += 1
            seen.add(tuple(held))
        elif kind == "B":  # activations are freed by the input-gradient pass (W keeps none)
            held[chunk] -= 1
    top = [h for h in seen if not any(g != h and all(x >= y for x, y in zip(g, h)) for g in seen)]
    return tuple(sorted(top, reverse=True))


def _zbv_order(stage: int, pp: int, m: int) -> list[tuple[str, int, int]]:
    """ZB-V order of worker ``stage`` (Qi et al. 2024 Sec. 6 figure; the hand-written
    pp=2, m=4 and pp=3, m=6 orders in tests/test_schedules.py):

    1. 2*(pp-i)-1 chunk-0 forwards;
    2. i pairs (F chunk 1, F chunk 0);
    3. pp-i triples (F, B, W of chunk 1);
    4. while chunk-1 forwards remain: (F chunk 0 if any left), B, W of chunk 0, then
       F, B, W of chunk 1;
    5. cool-down: i pairs (B chunk 0, B chunk 1), then (B chunk 0, W chunk 0) while chunk-0
       backwards remain, then the remaining chunk-1 W's, then the chunk-0 W's.
    Each op is emitted only while its chunk has micro-batches left (small m)."""
    i = stage
    nxt = {(k, c): 0 for k in "FBW" for c in (0, 1)}
    ops: list[tuple[str, int, int]] = []

    def op(kind: str, c: int) -> None:
        j = nxt[kind, c]
        if j < m and (kind == "F" or j < nxt["F" if kind == "B" else "B", c]):
            ops.append((kind, c, j))
            nxt[kind, c] = j + 1

    for _ in range(2 * (pp - i) - 1):
        op("F", 0)
    for _ in range(i):
        op("F", 1)
        op("F", 0)
    for _ in range(pp - i):
        for kind in "FBW":
            op(kind, 1)
    while nxt["F", 1] < m:
        for kind in "FBW":
            op(kind, 0)
        for kind in "FBW":
            op(kind, 1)
    for _ in range(i):
        op("B", 0)
        op("B", 1)
    while nxt["B", 0] < m:
        op("B", 0)
        op("W", 0)
    for c in (1, 0):
        while nxt["B", c] < m:
            op("B", c)
        while nxt["W", c] < m:
            op("W", c)
    return ops


def comm_plan(schedule: str, stage: int, pp: int, vpp: int, m: int) -> tuple[tuple, tuple[int, ...]]:
    """(waits, release) of ``stage``'s ``op_order``: waits[i] are the ops (kind, chunk, micro-batch)
    whose inputs op i waits for before it starts, release[i] the position of the op after whose end
    op i's output is sent. Every schedule: op i waits for its own input. DualPipe/V
    (formulas/dualpipe.py): the F of an overlapped pair waits for its B's input too, and some outputs
    are sent after a later op (a full backward after its W, a pair after both halves, step 2's F0
    after the F1 that follows it); else an output is sent when its op ends."""
    if schedule in OVERLAPPED_PAIR_SCHEDULES:
        _, waits, release = dualpipe.plan(schedule, stage, pp, m)
        return waits, release
    ops = op_order(schedule, stage, pp, vpp, m)
    return tuple((op,) for op in ops), tuple(range(len(ops)))
