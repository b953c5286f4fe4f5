"""Assemble Reports. ``plots=None`` draws figures when matplotlib is importable; without
it the report says so and carries tables only."""

from __future__ import annotations

import numpy as np

from ndplan.estimate import Estimate, estimate
from ndplan.ppb.instance import SCHEDULES
from ndplan.explain import Explained, explain
from ndplan.labels import label
from ndplan.report import figures as F
from ndplan.report import tables as T
from ndplan.report.model import Figure, Report
from ndplan.report.pipeline import REPORT_DETERMINISTIC_TIME, balanceable, pipeline_run
from ndplan.sweep import SweepResult
from ndplan.units import fmt_bytes, fmt_seconds


def _plots(plots: bool | None, report: Report) -> bool:
    ok = F.have_matplotlib() if plots is None else plots and F.have_matplotlib()
    if not ok:
        report.notes.append(F.PLOT_MISSING if plots is None or plots else "figures not requested: tables only")
    return ok


def formulas(e: Estimate) -> list[Explained]:
    """Every Term of the plan (parameters, memory at its peak stage, step time) as explain
    renders it, model sizes kept as symbols (h, L, a, ...) in the closed forms."""
    return explain(e.model, e.strategy, stage=e.peak_stage, symbolic=True, hardware=e.hardware)


def _best_pipelined(res: SweepResult) -> tuple[int, Estimate] | None:
    """The best-ranked feasible candidate with pp > 1 that PPB replays (top-k first)."""
    top = next(((i, e) for i, e in enumerate(res.top) if balanceable(e)), None)
    if top is not None:
        return top
    g = res.table.grid
    ok = (g["pp"][:res.feasible] > 1) & np.isin(g["schedule"][:res.feasible].astype(str), SCHEDULES)
    if not ok.any():
        return None
    i = int(np.argmax(ok))
    return i, estimate(res.model, res.hardware, res.strategy(i), res.gpus)


def _pipeline(report: Report, cand: tuple[int, Estimate] | None, limit: int, plots: bool,
              deterministic_time: float) -> None:
    if cand is None:
        report.notes.append("No pipeline timeline: no feasible candidate has pp > 1 with a schedule PPB replays "
                            f"({', '.join(SCHEDULES)}).")
        return
    i, e = cand
    run = pipeline_run(e, limit, deterministic_time)
    which = "the chosen plan" if i == 0 else f"candidate #{i + 1}, the best feasible one with pp > 1"
    report.notes.append(f"Pipeline timeline: {which} ({label(e.strategy)}), {run.how}; "
                        f"replayed step {fmt_seconds(run.sim.step_s)} for the per-layer work "
                        f"(the estimate's {fmt_seconds(e.step_s)} adds per-step terms).")
    if plots:
        report.figures.append(Figure("timeline", f"Pipeline timeline of #{i + 1} ({run.how})",
                                     F.to_png(F.timeline_plot(run.sim, label(e.strategy)))))


def _plan_sections(report: Report, e: Estimate) -> None:
    report.tables += [T.stage_table(e), T.time_table(e)]
    report.formulas = formulas(e)
    report.formulas_title = f"Formulas behind the plan (stage {e.peak_stage}, the peak stage)"


def sweep_report(res: SweepResult, space: dict | None = None, *, plots: bool | None = None,
                 ppb_deterministic_time: float = REPORT_DETERMINISTIC_TIME) -> Report:
    c = res.candidates
    inputs = {"model": res.model.name, "hardware": res.hardware.name, "gpus": res.gpus, "seq": res.seq,
              "gbs": res.gbs, "memory limit": fmt_bytes(res.mem_limit_bytes), "sort": res.sort,
              "space": {k: v for k, v in (space or {}).items() if v is not None} or "all",
              **{k: v for k, v in res.base.items()},
              "candidates": f"{c.generated:,} generated, {sum(c.rejected.values()):,} rejected by rule, "
                            f"{res.infeasible:,} over the memory limit, {res.feasible:,} feasible",
              "sweep time": f"{res.elapsed_s:.2f} s"}
    rep = Report(title=f"ndplan sweep: {res.model.name} on {res.gpus} x {res.hardware.name}", inputs=inputs)
    draw = _plots(plots, rep)
    if not res.top:
        rep.notes.append("Nothing fits the memory limit: no top-k table, no plan.")
        return rep
    rep.tables.append(T.top_table(res))
    rep.tables.append(T.pareto_table(res))
    _plan_sections(rep, res.top[0])
    labels = [f"#{i + 1}" for i in range(len(res.top))]
    if draw:
        rep.figures.append(Figure("memory", "Per-stage memory (static hatched, dynamic solid)",
                                  F.to_png(F.memory_bars(res.top, labels, res.mem_limit_bytes))))
        rep.figures.append(Figure("pareto", "Peak memory vs step time", F.to_png(F.pareto_plot(res, 0))))
    _pipeline(rep, _best_pipelined(res), res.mem_limit_bytes, draw, ppb_deterministic_time)
    return rep


def estimate_report(e: Estimate, *, plots: bool | None = None,
                    ppb_deterministic_time: float = REPORT_DETERMINISTIC_TIME) -> Report:
    s = e.strategy
    inputs = {"model": e.model.name, "hardware": e.hardware.name, **s.as_dict(),
              "peak": f"{fmt_bytes(e.peak_bytes)} on stage {e.peak_stage} ({'fits' if e.fits else 'DOES NOT FIT'})",
              "step": fmt_seconds(e.step_s), "mfu": f"{e.mfu:.1%}"}
    rep = Report(title=f"ndplan estimate: {e.model.name} on {s.world} x {e.hardware.name}", inputs=inputs)
    draw = _plots(plots, rep)
    _plan_sections(rep, e)
    if draw:
        rep.figures.append(Figure("memory", "Per-stage memory (static hatched, dynamic solid)",
                                  F.to_png(F.memory_bars([e], None, e.hardware.hbm_bytes))))
    _pipeline(rep, (0, e) if balanceable(e) else None, e.hardware.hbm_bytes, draw, ppb_deterministic_time)
    return rep


def balance_report(out: dict, sim, inputs: dict, *, plots: bool | None = None) -> Report:
    """A report of ``ndplan balance``: its JSON output ``out`` and the replay ``sim``."""
    rep = Report(title="ndplan balance", inputs={**inputs, "status": out.get("status"),
                                                  "objective": fmt_seconds(out["objective_s"]) if out.get("objective_s") else None,
                                                  "budget": fmt_bytes(out["budget_bytes"])})
    draw = _plots(plots, rep)
    rep.tables += [T.balance_stage_table(out), T.baseline_table(out)]
    if draw and sim is not None:
        rep.figures.append(Figure("timeline", "Pipeline timeline (discrete-event replay)",
                                  F.to_png(F.timeline_plot(sim, inputs.get("schedule", "")))))
    return rep
