"""Independent check of ``ndplan.formulas.schedules.inflight`` against hand-written timelines.

Every timeline below is a literal, per-stage op order written by hand from the figure /
definition cited next to it. Nothing here re-implements the module's formula: the small
helpers only (a) check that a literal timeline is a complete, deadlock-free schedule and
(b) replay it to count in-flight micro-batches.

Token grammar (one stage = one string of space-separated ops):
    F<k>      forward of micro-batch k            (single-chunk schedules)
    B<k>      backward of micro-batch k           (for zb-*: input-gradient pass only)
    W<k>      weight-gradient pass of micro-batch k (zb-* only)
    F<k>.<c>  the same op on model chunk c of that stage (interleaved, zbv)

Memory convention: a micro-batch's activations on (stage, chunk) are "in flight" from its F
until its B. For 1f1b/gpipe/interleaved B is the full backward, so this is exact. For
zb-h1/zbv we ASSUME, like the module, that the B (input-gradient) pass frees them; the
zero-bubble paper actually keeps the W-GEMM inputs (M_W < M_B, Qi et al. 2024 Table 1)
until W. ``test_zero_bubble_counts_if_w_frees`` records what the same literal timelines
give under the other convention (documentation only, no module call).

"Peak" = max over time of the total over chunks of one stage. The per-chunk split is taken
at the FIRST instant that total is reached; other instants reaching the same total can have
different splits, which ``ALT_SPLITS`` lists explicitly.
"""

from __future__ import annotations

import re

import pytest

from ndplan.formulas.schedules import held_after_first_backward, held_profiles, inflight, op_order, virtual_stage

# --------------------------------------------------------------------------------------
# Literal timelines
# --------------------------------------------------------------------------------------

# GPipe, Huang et al. 2019, Fig. 2(c): every device runs all m forwards, then the m
# backwards (in reverse micro-batch order, as drawn in the figure).
GPIPE_PP2_M3 = [
    "F0 F1 F2 B2 B1 B0",
    "F0 F1 F2 B2 B1 B0",
]

# 1F1B = PipeDream-Flush, Narayanan et al. 2021 Sec. 2.2.1 / Fig. 4 (top): stage i runs
# min(pp-i-1, m) warm-up forwards, then alternates F,B, then drains the remaining B's.
ONEF1B_PP2_M4 = [
    "F0 F1 B0 F2 B1 F3 B2 B3",
    "F0 B0 F1 B1 F2 B2 F3 B3",
]
ONEF1B_PP4_M8 = [
    "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
    "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
    "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
    "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
]
# m < pp: warm-up is capped at m, so stages 0 and 1 both do "F0 F1" then drain.
ONEF1B_PP4_M2 = [
    "F0 F1 B0 B1",
    "F0 F1 B0 B1",
    "F0 F1 B0 B1",
    "F0 B0 F1 B1",
]

# Interleaved 1F1B, Narayanan et al. 2021 Sec. 2.2.2 / Fig. 4 (bottom), in Megatron-LM's
# ordering (forward_backward_pipelining_with_interleaving): forwards go to chunks in groups
# of pp micro-batches (chunk 0 for mb 0..pp-1, chunk 1 for mb 0..pp-1, chunk 0 for mb
# pp..2pp-1, ...); backwards use the same grouping starting with the LAST chunk; stage i
# runs 2*(pp-i-1) + (vpp-1)*pp warm-up forwards, then (F, B) pairs, then drains B's.
# Virtual stage of (stage s, chunk c) = c*pp + s.
INTERLEAVED_PP2_V2_M4 = [
    # warm-up 4 forwards
    "F0.0 F1.0 F0.1 F1.1  F2.0 B0.1  F3.0 B1.1  F2.1 B0.0  F3.1 B1.0  B2.1 B3.1 B2.0 B3.0",
    # warm-up 2 forwards
    "F0.0 F1.0  F0.1 B0.1  F1.1 B1.1  F2.0 B0.0  F3.0 B1.0  F2.1 B2.1  F3.1 B3.1  B2.0 B3.0",
]
INTERLEAVED_PP4_V2_M8 = [
    # stage 0: warm-up 2*3 + 4 = 10 forwards
    "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 "
    "F6.0 B0.1 F7.0 B1.1 F4.1 B2.1 F5.1 B3.1 F6.1 B0.0 F7.1 B1.0 "
    "B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0",
    # stage 1: warm-up 2*2 + 4 = 8 forwards
    "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 "
    "F4.0 B0.1 F5.0 B1.1 F6.0 B2.1 F7.0 B3.1 F4.1 B0.0 F5.1 B1.0 F6.1 B2.0 F7.1 B3.0 "
    "B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0",
    # stage 2: warm-up 2*1 + 4 = 6 forwards
    "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 "
    "F2.1 B0.1 F3.1 B1.1 F4.0 B2.1 F5.0 B3.1 F6.0 B0.0 F7.0 B1.0 F4.1 B2.0 F5.1 B3.0 "
    "F6.1 B4.1 F7.1 B5.1 "
    "B6.1 B7.1 B4.0 B5.0 B6.0 B7.0",
    # stage 3: warm-up 0 + 4 = 4 forwards
    "F0.0 F1.0 F2.0 F3.0 "
    "F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4.0 B0.0 F5.0 B1.0 F6.0 B2.0 F7.0 B3.0 "
    "F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 "
    "B4.0 B5.0 B6.0 B7.0",
]

# ZB-H1, Qi et al. 2024 ("Zero Bubble Pipeline Parallelism") Sec. 2.1 / Fig. 3 (top):
# 1F1B's F/B order and warm-up (pp-i-1 forwards) is kept; B passes are pulled forward and
# W passes are deferred to fill the tail. With T_F = T_B = T_W, stage i defers its W's
# by i backwards (W_k runs after B_{k+i}); stage 0 runs B,W back to back. Leftover W's
# fill the tail of the later stages.
ZBH1_PP3_M6 = [
    "F0 F1 F2 B0 W0 F3 B1 W1 F4 B2 W2 F5 B3 W3 B4 W4 B5 W5",
    "F0 F1 B0 F2 B1 W0 F3 B2 W1 F4 B3 W2 F5 B4 W3 B5 W4 W5",
    "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 F4 B4 W2 F5 B5 W3 W4 W5",
]

# ZB-V, Qi et al. 2024 Sec. 6 / ZB-V figure (the handcrafted V schedule: "each device is
# assigned exactly 2 chunks ... V shape"). Chunk 0 of stage i is virtual stage i, chunk 1
# is virtual stage 2*pp-1-i. The figure's per-worker phases (worker i):
#   1. 2*(pp-i)-1 chunk-0 forwards;
#   2. i pairs (F chunk 1, F chunk 0);
#   3. pp-i triples (F, B, W on chunk 1);
#   4. steady state: (F chunk 0 if any left), B, W chunk 0, then F, B, W chunk 1;
#   5. cool-down: i pairs (B chunk 0, B chunk 1), pp-i pairs (B chunk 0, W chunk 0),
#      then the remaining chunk-1 W's, then the remaining chunk-0 W's.
ZBV_PP2_M4 = [
    "F0.0 F1.0 F2.0  F0.1 B0.1 W0.1  F1.1 B1.1 W1.1  "
    "F3.0 B0.0 W0.0 F2.1 B2.1 W2.1  B1.0 W1.0 F3.1 B3.1 W3.1  "
    "B2.0 W2.0 B3.0 W3.0",
    "F0.0  F0.1 F1.0  F1.1 B0.1 W0.1  "
    "F2.0 B0.0 W0.0 F2.1 B1.1 W1.1  F3.0 B1.0 W1.0 F3.1 B2.1 W2.1  "
    "B2.0 B3.1  B3.0 W2.0  W3.1 W3.0",
]
ZBV_PP3_M6 = [
    "F0.0 F1.0 F2.0 F3.0 F4.0  "
    "F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 F2.1 B2.1 W2.1  "
    "F5.0 B0.0 W0.0 F3.1 B3.1 W3.1  B1.0 W1.0 F4.1 B4.1 W4.1  B2.0 W2.0 F5.1 B5.1 W5.1  "
    "B3.0 W3.0 B4.0 W4.0 B5.0 W5.0",
    "F0.0 F1.0 F2.0  F0.1 F3.0  "
    "F1.1 B0.1 W0.1 F2.1 B1.1 W1.1  "
    "F4.0 B0.0 W0.0 F3.1 B2.1 W2.1  F5.0 B1.0 W1.0 F4.1 B3.1 W3.1  B2.0 W2.0 F5.1 B4.1 W4.1  "
    "B3.0 B5.1  B4.0 W3.0 B5.0 W4.0  W5.1 W5.0",
    "F0.0  F0.1 F1.0 F1.1 F2.0  "
    "F2.1 B0.1 W0.1  "
    "F3.0 B0.0 W0.0 F3.1 B1.1 W1.1  F4.0 B1.0 W1.0 F4.1 B2.1 W2.1  "
    "F5.0 B2.0 W2.0 F5.1 B3.1 W3.1  "
    "B3.0 B4.1 B4.0 B5.1  B5.0 W3.0  W4.1 W5.1 W4.0 W5.0",
]

# --------------------------------------------------------------------------------------
# Expected values, counted by hand from the timelines above (per stage: per-chunk counts
# at the first instant the stage's total peak is reached). The replay helper re-checks
# these hand counts; the module is then compared against them.
# --------------------------------------------------------------------------------------

# (schedule, pp, vpp, m) -> (timeline, [per-stage tuple of per-chunk counts])
CASES = {
    ("gpipe", 2, 1, 3): (GPIPE_PP2_M3, [(3,), (3,)]),
    ("1f1b", 2, 1, 4): (ONEF1B_PP2_M4, [(2,), (1,)]),
    ("1f1b", 4, 1, 8): (ONEF1B_PP4_M8, [(4,), (3,), (2,), (1,)]),
    ("1f1b", 4, 1, 2): (ONEF1B_PP4_M2, [(2,), (2,), (2,), (1,)]),
    ("interleaved", 2, 2, 4): (INTERLEAVED_PP2_V2_M4, [(3, 2), (2, 1)]),
    ("interleaved", 4, 2, 8): (
        INTERLEAVED_PP4_V2_M8,
        [(7, 4), (5, 4), (4, 3), (4, 1)],
    ),
    ("zb-h1", 3, 1, 6): (ZBH1_PP3_M6, [(3,), (2,), (1,)]),
    # ZB-V: every stage peaks at 2*pp chunk-micro-batches (= pp whole-stage micro-batches),
    # but the split is (2*pp-1-i, i+1), not the module's (2*(pp-i)-1, 2*i+1).
    ("zbv", 2, 2, 4): (ZBV_PP2_M4, [(3, 1), (2, 2)]),
    ("zbv", 3, 2, 6): (ZBV_PP3_M6, [(5, 1), (4, 2), (3, 3)]),
}

# Other per-chunk splits reached at the SAME total peak later in the timeline (hand count).
# The module's "per-chunk count at the peak" is only defined up to this choice; it matters
# when chunks carry different activation sizes (e.g. embedding in chunk 0, head in last).
ALT_SPLITS = {
    ("interleaved", 2, 2, 4): [{(3, 2), (4, 1)}, {(2, 1), (3, 0)}],
    ("interleaved", 4, 2, 8): [{(7, 4), (8, 3)}, {(5, 4), (6, 3), (7, 2), (8, 1)},
                               {(4, 3), (5, 2), (6, 1), (7, 0)}, {(4, 1), (5, 0)}],
    ("zbv", 2, 2, 4): [{(3, 1), (4, 0)}, {(2, 2), (3, 1)}],
    ("zbv", 3, 2, 6): [{(5, 1), (6, 0)}, {(4, 2), (5, 1)}, {(3, 3), (4, 2)}],
}

# --------------------------------------------------------------------------------------
# Helpers (replay only; no schedule generation)
# --------------------------------------------------------------------------------------

_TOKEN = re.compile(r"^([FBW])(\d+)(?:\.(\d+))?$")


def parse(line: str) -> list[tuple[str, int, int]]:
    ops = []
    for tok in line.split():
        mt = _TOKEN.match(tok)
        assert mt, f"bad token {tok!r}"
        ops.append((mt.group(1), int(mt.group(2)), int(mt.group(3) or 0)))
    return ops


def n_chunks(schedule: str, vpp: int) -> int:
    return {"interleaved": vpp, "zbv": 2}.get(schedule, 1)


def my_virtual_stage(schedule: str, stage: int, chunk: int, pp: int) -> int:
    # V shape for zbv (Qi et al. Sec. 6); Megatron's round-robin for interleaved.
    if schedule == "zbv":
        return stage if chunk == 0 else 2 * pp - 1 - stage
    return chunk * pp + stage


def replay(line: str, nch: int, free_on: str = "B"):
    """Return (peak_total, split_at_first_peak, all_splits_at_peak) for one stage."""
    held = [set() for _ in range(nch)]
    best, first, splits = -1, None, set()
    for op, mb, c in parse(line):
        if op == "F":
            held[c].add(mb)
        elif op == free_on:
            held[c].remove(mb)
        split = tuple(len(h) for h in held)
        total = sum(split)
        if total > best:
            best, first, splits = total, split, {split}
        elif total == best:
            splits.add(split)
    return best, first, splits


def simulate(timelines: list[str], schedule: str, pp: int, vpp: int) -> None:
    """Assert the per-stage orders are realizable: run each stage's next op whenever its
    cross-stage dependencies are done; fail on deadlock."""
    nch = n_chunks(schedule, vpp)
    nv = pp * nch
    seqs = [parse(t) for t in timelines]
    pos = [0] * pp
    done: set[tuple[str, int, int]] = set()  # (op, virtual stage, mb)

    def ready(stage, op, mb, c):
        v = my_virtual_stage(schedule, stage, c, pp)
        if op == "F":
            return v == 0 or ("F", v - 1, mb) in done
        if op == "B":
            return ("F", v, mb) in done and (v == nv - 1 or ("B", v + 1, mb) in done)
        return ("B", v, mb) in done  # W

    while any(pos[s] < len(seqs[s]) for s in range(pp)):
        progressed = False
        for s in range(pp):
            if pos[s] < len(seqs[s]):
                op, mb, c = seqs[s][pos[s]]
                if ready(s, op, mb, c):
                    done.add((op, my_virtual_stage(schedule, s, c, pp), mb))
                    pos[s] += 1
                    progressed = True
        assert progressed, f"deadlock at {[seqs[s][pos[s]] if pos[s] < len(seqs[s]) else None for s in range(pp)]}"


def _ids(key):
    return "{}-pp{}-v{}-m{}".format(*key)


# --------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", list(CASES), ids=_ids)
def test_timeline_is_complete_and_feasible(key):
    schedule, pp, vpp, m = key
    timelines, _ = CASES[key]
    assert len(timelines) == pp
    nch = n_chunks(schedule, vpp)
    kinds = "FBW" if schedule.startswith("zb") else "FB"
    for stage, line in enumerate(timelines):
        ops = parse(line)
        want = sorted((k, mb, c) for k in kinds for mb in range(m) for c in range(nch))
        assert sorted(ops) == want, f"stage {stage}: ops missing or duplicated"
        # within a stage, per chunk: F_k before B_k before W_k
        idx = {op: i for i, op in enumerate(ops)}
        for mb in range(m):
            for c in range(nch):
                assert idx[("F", mb, c)] < idx[("B", mb, c)]
                if "W" in kinds:
                    assert idx[("B", mb, c)] < idx[("W", mb, c)]
    simulate(timelines, schedule, pp, vpp)


@pytest.mark.parametrize("key", list(CASES), ids=_ids)
def test_hand_counts_match_replay(key):
    """Guards the hand-written expectations against counting slips."""
    schedule, pp, vpp, m = key
    timelines, expected = CASES[key]
    nch = n_chunks(schedule, vpp)
    for stage, line in enumerate(timelines):
        total, first, splits = replay(line, nch)
        assert first == expected[stage], f"stage {stage}"
        assert total == sum(expected[stage])
        if key in ALT_SPLITS:
            assert splits == ALT_SPLITS[key][stage], f"stage {stage}"


@pytest.mark.parametrize("key", list(CASES), ids=_ids)
def test_module_stage_total_matches_timeline(key):
    schedule, pp, vpp, m = key
    _, expected = CASES[key]
    nch = n_chunks(schedule, vpp)
    for stage in range(pp):
        got = sum(inflight(schedule, stage, c, pp, vpp, m) for c in range(nch))
        assert got == sum(expected[stage]), f"stage {stage}"


@pytest.mark.parametrize("key", list(CASES), ids=_ids)
def test_module_per_chunk_matches_timeline(key):
    schedule, pp, vpp, m = key
    _, expected = CASES[key]
    nch = n_chunks(schedule, vpp)
    got = [tuple(inflight(schedule, s, c, pp, vpp, m) for c in range(nch)) for s in range(pp)]
    assert got == expected


def test_virtual_stage_matches_definition():
    for pp in range(1, 6):
        for s in range(pp):
            for c in range(2):
                assert virtual_stage("zbv", s, c, pp) == my_virtual_stage("zbv", s, c, pp)
                assert virtual_stage("interleaved", s, c, pp) == c * pp + s


def test_korthikanti_identity_on_hand_timelines():
    # Korthikanti et al. 2022 Sec. 4.2.3: with interleaving, stage 0 holds
    # pp*vpp + pp - 1 chunk-micro-batches, i.e. (1 + (pp-1)/(pp*vpp)) x the 1F1B amount.
    for key in [("interleaved", 2, 2, 4), ("interleaved", 4, 2, 8)]:
        _, pp, vpp, _ = key
        total, _, _ = replay(CASES[key][0][0], vpp)
        assert total == pp * vpp + pp - 1


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
@pytest.mark.parametrize("vpp", [2, 3, 4])
def test_korthikanti_identity_module(pp, vpp):
    m = 4 * pp * vpp  # "m large" (and a multiple of pp, as Megatron requires)
    total = sum(inflight("interleaved", 0, c, pp, vpp, m) for c in range(vpp))
    assert total == pp * vpp + pp - 1


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 8])
def test_zbv_chunk1_never_exceeds_chunk0(pp):
    # Schedule-independent invariant of any V-shaped placement: chunk 1 of a stage is a
    # later virtual stage than chunk 0 of the same stage, so a micro-batch in flight on
    # chunk 1 (F1 done, B1 not done) has F0 done and B0 not done (B0 needs B1): the set in
    # flight on chunk 1 is a subset of the set in flight on chunk 0 at every instant.
    m = 4 * pp
    for s in range(pp):
        assert inflight("zbv", s, 1, pp, 2, m) <= inflight("zbv", s, 0, pp, 2, m), f"stage {s}"


def test_zero_bubble_counts_if_w_frees():
    # Documentation only (no module call): if activations were held until W instead of B,
    # the same literal timelines give these stage totals.
    zbh1 = [replay(line, 1, free_on="W")[0] for line in ZBH1_PP3_M6]
    assert zbh1 == [3, 3, 3]  # deferred W's keep later stages at pp, not pp - i
    zbv2 = [replay(line, 2, free_on="W")[0] for line in ZBV_PP2_M4]
    zbv3 = [replay(line, 2, free_on="W")[0] for line in ZBV_PP3_M6]
    assert zbv2 == [4, 4] and zbv3 == [6, 6, 6]  # W follows B, peak unchanged


def test_simulator_detects_deadlock():
    # Sanity check that the feasibility check is not vacuous: stage 0 waits for B0 before
    # sending F1, while stage 1 waits for F1 before running B0.
    with pytest.raises(AssertionError, match="deadlock"):
        simulate(["F0 B0 F1 B1", "F0 F1 B0 B1"], "1f1b", 2, 1)


@pytest.mark.parametrize("pp,m,rows", [(2, 4, ZBV_PP2_M4), (3, 6, ZBV_PP3_M6)])
def test_zbv_op_order_is_the_hand_schedule(pp, m, rows):
    """schedules.op_order("zbv") reproduces the orders written above from the paper's figure."""
    for stage, row in enumerate(rows):
        got = [f"{k}{j}.{c}" for k, c, j in op_order("zbv", stage, pp, 2, m)]
        assert got == row.split()


@pytest.mark.parametrize("pp,vpp,m", [(2, 2, 4), (4, 2, 8), (4, 3, 12), (3, 2, 6)])
def test_held_profiles_interleaved(pp, vpp, m):
    """Every held vector sums to the stage total of the in-flight table, and the table's
    split is one of them (exact for equal chunks). pp=2, vpp=2, m=4, stage 0 by hand from
    Megatron's order F0.0 F1.0 F0.1 F1.1 | F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 ...:
    after the warm-up (2, 2) is held, then F2.0 gives (3, 2), and B0.1 F3.0 gives (4, 1)."""
    for s in range(pp):
        table = tuple(inflight("interleaved", s, c, pp, vpp, m) for c in range(vpp))
        prof = held_profiles("interleaved", s, pp, vpp, m)
        assert table in prof and all(sum(h) == sum(table) for h in prof)
    if (pp, vpp, m) == (2, 2, 4):
        assert set(held_profiles("interleaved", 0, 2, 2, 4)) == {(3, 2), (4, 1)}


def test_zbh1_op_order_is_the_hand_schedule():
    """schedules.op_order("zb-h1") reproduces ZBH1_PP3_M6 above (Qi et al. 2024 Fig. 3)."""
    for stage, row in enumerate(ZBH1_PP3_M6):
        got = [f"{k}{j}" for k, _, j in op_order("zb-h1", stage, 3, 1, 6)]
        assert got == row.split()


def _replay_after_first_backward(schedule, stage, pp, vpp, m) -> int:
    """Brute force: chunk-micro-batches held right after the stage's first backward and at every
    forward after it, the largest of them (a B frees one chunk-micro-batch; W frees none)."""
    held, after = 0, None
    for kind, _, _ in op_order(schedule, stage, pp, vpp, m):
        if kind == "F":
            held += 1
            if after is not None:
                after = max(after, held)
        elif kind == "B":
            held -= 1
            after = held if after is None else after
    return after


@pytest.mark.parametrize("schedule,vpps", [("gpipe", (1,)), ("1f1b", (1,)), ("zb-h1", (1,)),
                                           ("interleaved", (2, 3)), ("zbv", (2,)), ("dualpipe", (2,)),
                                           ("dualpipev", (2,))])
def test_held_after_first_backward_matches_op_order(schedule, vpps):
    """min(W, vpp*m - 1) equals the op-order replay for pp <= 8 and m <= 3*pp + 1 (interleaved:
    m a multiple of pp, as Megatron requires); gpipe keeps m - 1, 1F1B refills its peak."""
    for pp in (2, 3, 4, 8):
        for vpp in vpps:
            for m in range(1, 3 * pp + 2):
                if schedule == "interleaved" and m % pp:
                    continue
                if schedule.startswith("dualpipe") and (m < 2 * pp or schedule == "dualpipe" and (m % 2 or pp % 2)):
                    continue  # rules.py: DualPipe needs m >= 2*pp (dualpipe: m and pp even)
                for stage in range(pp):
                    want = _replay_after_first_backward(schedule, stage, pp, vpp, m)
                    assert held_after_first_backward(schedule, stage, pp, vpp, m) == want, (pp, vpp, m, stage)
    assert held_after_first_backward("gpipe", 0, 4, 1, 8) == 7
    assert held_after_first_backward("1f1b", 0, 4, 1, 8) == 4
