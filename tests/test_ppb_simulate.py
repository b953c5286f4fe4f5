"""The discrete-event replay against the solver's objective and the memory table.

Stated relations (measured, and asserted here):
* gpipe, 1f1b, and interleaved with ``exact``: replayed step time == objective (the
  objective is the DAG makespan; times here are whole ms, so no rounding).
* interleaved, closed form: == replay when the chunks of every stage are equal (uniform
  layers, even split); for uneven chunks the closed form can be far below the replay.
* zbv, closed form vs the greedy replay: closed <= replay <= closed + (pp-1) x the
  longest chunk op, on uniform plans (the greedy rule is not the paper's hand schedule).
* memory: replay peak == table for gpipe/1f1b/zbv; for interleaved the replay peak can
  exceed the table when a stage's chunks hold different activations (the per-chunk
  split of held micro-batches moves during the steady state, schedules.op_order).
"""

from __future__ import annotations

import pytest

from ndplan.ppb.instance import Instance, Pipeline
from ndplan.ppb.plan import Plan, chunk_time_s, stage_memory_bytes, uniform_plan
from ndplan.ppb.simulate import simulate
from ndplan.ppb.solve import Config, evaluate, solve
from tests.test_ppb_solver import MB, MS, _llm, layer

CFG = Config(time_limit_s=20)


@pytest.mark.parametrize("schedule,vpp,exact", [("1f1b", 1, False), ("gpipe", 1, False), ("interleaved", 2, True)])
@pytest.mark.parametrize("budget_gib", [9, 40])
def test_replay_equals_objective_for_dag_schedules(schedule, vpp, exact, budget_gib):
    inst = _llm(10, 4 if vpp == 1 else 2, vpp, 8, schedule, budget_gib)
    cfg = Config(time_limit_s=20, exact=exact)
    sol = solve(inst, cfg)
    assert sol.status in ("OPTIMAL", "FEASIBLE")
    r = simulate(inst, sol.plan)
    assert r.step_s == pytest.approx(sol.objective_s, abs=1e-9)
    table = stage_memory_bytes(inst, sol.plan)
    if schedule == "interleaved":
        assert all(a >= b - 1e-6 for a, b in zip(r.peak_bytes, table))
    else:
        assert r.peak_bytes == pytest.approx(table)


def test_1f1b_closed_form_overestimates_a_light_last_stage():
    """sum t + (m-1) max t = 42 ms, but the replay (and the DAG objective) give 40 ms."""
    heavy, light = layer(10, 5, 5, 0, {"none": 0}, {}), layer(1, 1, 0, 0, {"none": 0}, {})
    inst = Instance(layers=(heavy, light), pipeline=Pipeline(pp=2, m=2, schedule="1f1b", budget_bytes=MB))
    plan = Plan(bounds=(0, 1, 2), recompute=("none", "none"))
    assert simulate(inst, plan).step_s == pytest.approx(40 * MS)
    assert evaluate(inst, plan) == pytest.approx(40 * MS)


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (3, 6)])
@pytest.mark.parametrize("fbw", [(1, 1, 1), (2, 3, 1), (1, 2, 2)])
def test_closed_forms_vs_replay_on_uniform_plans(pp, m, fbw):
    x = layer(*fbw, 0, {"none": 1}, {})
    for schedule in ("interleaved", "zbv"):
        inst = Instance(layers=(x,) * (4 * pp), pipeline=Pipeline(pp=pp, vpp=2, m=m, schedule=schedule, budget_bytes=MB))
        plan = uniform_plan(inst, "none")
        closed, replay = evaluate(inst, plan), simulate(inst, plan).step_s
        if schedule == "interleaved":
            assert replay == pytest.approx(closed, abs=1e-9)
        else:
            longest = max(max(chunk_time_s(inst, plan, v).values()) for v in range(inst.pipeline.chunks))
            assert closed - 1e-9 <= replay <= closed + (pp - 1) * longest + 1e-9


def test_interleaved_closed_form_is_optimistic_for_uneven_chunks():
    x = layer(1, 1, 1, 0, {"none": 1}, {})
    inst = Instance(layers=(x,) * 12, pipeline=Pipeline(pp=2, vpp=2, m=4, schedule="interleaved", budget_bytes=MB))
    plan = Plan(bounds=(0, 1, 2, 7, 12), recompute=("none",) * 12)
    assert simulate(inst, plan).step_s > evaluate(inst, plan) + 1e-3
    assert simulate(inst, plan).step_s == pytest.approx(evaluate(inst, plan, Config(exact=True)), abs=1e-9)


def test_interleaved_replay_peak_can_exceed_table_with_uneven_chunk_memory():
    small, big = layer(1, 1, 1, 0, {"none": 1}, {}), layer(1, 1, 1, 0, {"none": 100}, {})
    inst = Instance(layers=(big, small, small, small), pipeline=Pipeline(pp=2, vpp=2, m=8, schedule="interleaved",
                                                                          budget_bytes=2**40))
    plan = Plan(bounds=(0, 1, 2, 3, 4), recompute=("none",) * 4)
    assert simulate(inst, plan).peak_bytes[0] > stage_memory_bytes(inst, plan)[0]


def test_idle_split_adds_up():
    inst = _llm(14, 4, 1, 8, "1f1b", 40)
    r = simulate(inst, uniform_plan(inst, "selective"))
    for s in range(4):
        assert r.idle_s[s] == pytest.approx(r.bubble_s[s] + r.imbalance_s[s])
        assert r.busy_s[s] + r.idle_s[s] == pytest.approx(r.step_s)
        assert r.recompute_s[s] > 0
