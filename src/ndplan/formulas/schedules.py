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
    * dualpipe, dualpipev (``_dualpipe_plan``): DeepSeek's eight steps; a full backward is a B
      and its W back to back, an "overlapped forward & backward" a F and the other chunk's B
      (and W) back to back; ``comm_plan`` says what each op waits for and when it sends.
    """
    if schedule == "zbv":
        return _zbv_order(stage, pp, m)
    if schedule in ("dualpipe", "dualpipev"):
        return list(_dualpipe_plan(schedule, stage, pp, m)[0])
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
    (``_dualpipe_plan``): the F of an overlapped pair waits for its B's input too, and some outputs
    are sent after a later op (a full backward after its W, a pair after both halves, step 2's F0
    after the F1 that follows it); else an output is sent when its op ends."""
    if schedule in ("dualpipe", "dualpipev"):
        _, waits, release = _dualpipe_plan(schedule, stage, pp, m)
        return waits, release
    ops = op_order(schedule, stage, pp, vpp, m)
    return tuple((op,) for op in ops), tuple(range(len(ops)))


@lru_cache(maxsize=4096)
def _dualpipe_plan(schedule: str, stage: int, pp: int, m: int) -> tuple[tuple, tuple, tuple[int, ...]]:
    """(ops, waits, release) of DualPipe / DualPipeV on ``stage`` (``comm_plan``): the eight
    steps of deepseek-ai/DualPipe@3da1bbe ``DualPipe.step`` (dualpipe.py:358-420) and
    ``DualPipeV.step`` (dualpipev.py:330-396), which torch's ScheduleDualPipeV writes out in the
    same order (``_calculate_single_rank_operations``, torch 2.13 schedules.py:3461-3620). With
    n = pp/2 half ranks, r = min(stage, pp-1-stage) and M = m/2 micro-batches per direction
    (DualPipe), or n = pp, r = stage, M = m (DualPipeV):

    1. 2(n-r-1) F0;  2. r+1 x (F0, F1);  3. n-r-1 x (B1 input-gradient, W, F1);
    4. M-2n+r+1 x ((F0 & B1), (F1 & B0)), each pair overlapped, except the first (F0, B1) of
       the last rank (DualPipeV) or of the middle ranks (DualPipe), run apart;
    5. n-r-1 x (B1, (F1 & B0));  6. r+1 x (B1, B0), input-gradient only from the middle
       iteration on (from B1 when r is odd, from B0 when even);  7. n-r-1 x (W, B0
       input-gradient);  8. r+1 x W.

    A backward is full (B then its W, sent after the W) unless input-gradient; a W op runs the
    oldest pending weight gradient (``WeightGradStore``, FIFO); a pair (F&B) runs its F, then its
    B and W, and sends both outputs after them (``_forward_backward_chunk``). Receives and sends
    follow the code's recv/send flags (step 2 sends F0 after F1; the last/middle rank keeps its
    last F1 until step 4). Chunk c is DualPipe's phase: under DualPipe the slice this stage's
    micro-batches reach first is chunk 0 (layouts.virtual_stage), whose micro-batches are 0..M-1
    on stages < pp/2 and M..2M-1 (those entering at stage pp-1) on the others."""
    if schedule == "dualpipe":
        n, r, M = pp // 2, min(stage, pp - 1 - stage), m // 2
        base = (0, M) if stage < pp // 2 else (M, 0)  # micro-batch ids of chunk 0 and chunk 1
    else:
        n, r, M, base = pp, stage, m, (0, 0)
    special = r == n - 1  # DualPipeV's last rank, DualPipe's two middle ranks
    count = {(k, c): 0 for k in ("F", "B", "rF", "rB") for c in (0, 1)}
    ops: list[tuple[str, int, int]] = []
    waits: list[tuple] = []
    release: dict[int, int] = {}
    posted: list[tuple[str, int, int]] = []
    unsent = {("F", 0): [], ("F", 1): [], ("B", 0): [], ("B", 1): []}
    pending: list[tuple[int, int]] = []  # weight gradients deferred by input-gradient B's

    def emit(op, also=None):
        # wait for the op's own input (and its pair partner's), then compute. DualPipe's code
        # waits for every receive posted since its previous compute (``_commit_and_wait_comm``:
        # step 3's W also waits for the next F1's input); torch's runtime and the published
        # figures wait for an op's own inputs (tests/test_dualpipe.py: both give the figures'
        # 66-unit step, the figures' op starts need this form)
        mine = [k for k in posted if k == (op[0], op[1], op[2]) or k == also]
        waits.append(tuple(mine))
        for k in mine:
            posted.remove(k)
        ops.append(op)

    if schedule == "dualpipe":  # the end stages: chunk 0 is the first slice, chunk 1 the last
        no_recv = {("F", 0), ("B", 1)} if r == 0 else set()
    else:  # stage 0 runs the first and last slice, the last rank hands chunk 0 to chunk 1 itself
        no_recv = ({("F", 0), ("B", 1)} if stage == 0 else set()) | ({("F", 1), ("B", 0)} if stage == pp - 1 else set())

    def recv(kind, c):  # _recv_forward / _recv_backward: nothing to receive at a slice's own end
        if (kind, c) not in no_recv:
            posted.append((kind, c, base[c] + count["r" + kind, c]))
        count["r" + kind, c] += 1

    def send(kind, c):
        release[unsent[kind, c].pop(0)] = len(ops) - 1

    def f(c, rcv=True, snd=True, also=None):
        if rcv:
            recv("F", c)
        emit(("F", c, base[c] + count["F", c]), also)
        count["F", c] += 1
        unsent["F", c].append(len(ops) - 1)
        if snd:
            send("F", c)

    def b(c, zb=False, rcv=True, snd=True, compute_only=False):
        if rcv and not compute_only:
            recv("B", c)
        j = base[c] + count["B", c]
        count["B", c] += 1
        if compute_only:  # inside a pair: no commit of its own
            ops.append(("B", c, j))
            waits.append(())
        else:
            emit(("B", c, j))
        unsent["B", c].append(len(ops) - 1)
        if zb:
            pending.append((c, j))
        else:
            ops.append(("W", c, j))
            waits.append(())
        if snd:
            send("B", c)

    def w():
        if pending:
            c, j = pending.pop(0)
            emit(("W", c, j))

    def pair(c_f, c_b, rcv_f=True):
        if rcv_f:
            recv("F", c_f)
        recv("B", c_b)
        f(c_f, rcv=False, snd=False, also=("B", c_b, base[c_b] + count["B", c_b]))
        b(c_b, snd=False, compute_only=True)
        send("F", c_f)
        send("B", c_b)

    for _ in range(2 * (n - r - 1)):
        f(0)
    recv("F", 0)
    for i in range(r + 1):
        send_f0 = special if schedule == "dualpipe" else False
        f(0, rcv=False, snd=send_f0)
        recv("F", 0)
        f(1, snd=(not special) or i < r)
        if not send_f0:
            send("F", 0)
    for _ in range(n - r - 1):
        b(1, zb=True)
        recv("F", 1)
        w()
        f(1, rcv=False)
    for i in range(M - 2 * n + r + 1):
        if i == 0 and special:  # "We don't overlap these two chunks to further reduce bubble size."
            f(0, rcv=False, snd=False)
            send("F", 1)
            b(1, snd=False)
            send("F", 0)
            send("B", 1)
        else:
            pair(0, 1, rcv_f=i > 0)
        pair(1, 0)
    for _ in range(n - r - 1):
        b(1)
        pair(1, 0)
    zb = False
    for i in range(r + 1):
        if i == (r + 1) // 2 and r % 2 == 1:
            zb = True
        b(1, zb)
        if i == (r + 1) // 2 and r % 2 == 0:
            zb = True
        b(0, zb)
    for _ in range(n - r - 1):
        w()
        b(0, zb=True)
    for _ in range(r + 1):
        w()
    return tuple(ops), tuple(waits), tuple(release.get(i, i) for i in range(len(ops)))
