"""Tables of a sweep, an estimate and a balance run, in base units (bytes, seconds).

Values come from the objects' own JSON (``Estimate.to_json``, ``SweepResult``'s table,
the balance output), so a report's rows match ``--json`` exactly."""

from __future__ import annotations

from ndplan.estimate import Estimate
from ndplan.report.model import Table
from ndplan.sweep import SweepResult

STRATEGY_COLUMNS = ["dp", "tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "m", "zero", "sp", "recompute", "schedule"]


def inputs_table(inputs: dict) -> Table:
    return Table("inputs", "Inputs", ["name", "value"], [[k, v] for k, v in inputs.items()])


def top_table(res: SweepResult) -> Table:
    """The top-k candidates, one row each, from their estimates' JSON."""
    cols = ["rank", *STRATEGY_COLUMNS, "peak_bytes", "step_s", "mfu", "tokens_per_s", "fits"]
    rows = []
    for i, e in enumerate(res.top, 1):
        j = e.to_json()
        s = j["strategy"]
        rows.append([i, *[s[c] for c in STRATEGY_COLUMNS], j["memory"]["peak_bytes"], j["time"]["step_s"],
                     j["time"]["mfu"], j["time"]["tokens_per_s"], j["fits"]])
    return Table("top", f"Top {len(rows)} candidates (sorted by {res.sort})", cols, rows)


def pareto_table(res: SweepResult) -> Table:
    """The memory / step-time Pareto front (ascending peak), as in the sweep's JSON."""
    t = res.table
    cols = ["rank", *STRATEGY_COLUMNS, "peak_bytes", "step_s", "mfu"]
    rows = []
    for i in sorted(res.pareto, key=lambda k: t.peak_bytes[k]):
        s = res.strategy(i).as_dict()
        rows.append([i + 1, *[s[c] for c in STRATEGY_COLUMNS], int(t.peak_bytes[i]), float(t.step_s[i]),
                     float(res.mfu(t.step_s[i]))])
    return Table("pareto", "Pareto front: peak memory vs step time", cols, rows)


def stage_table(est: Estimate) -> Table:
    """Per-stage memory: peak, static, dynamic and every term (bytes)."""
    keys = list(est.per_stage[0]["terms"])
    cols = ["stage", "peak_bytes", "static_bytes", "dynamic_bytes", *keys]
    rows = [[r["stage"], r["peak_bytes"], r["static_bytes"], r["dynamic_bytes"], *[r["terms"][k] for k in keys]]
            for r in est.per_stage]
    return Table("memory", "Per-stage memory (GiB; bytes in the CSV and JSON)", cols, rows)


def time_table(est: Estimate) -> Table:
    """Step-time terms (seconds) and their share of the step."""
    rows = [[k, v, v / est.step_s if est.step_s else 0.0] for k, v in est.time_terms.items()]
    rows.append(["time.step", est.step_s, 1.0])
    return Table("time", "Step-time terms (seconds)", ["term", "seconds", "share"], rows)


def balance_stage_table(out: dict) -> Table:
    """``ndplan balance`` stages: layer range, recompute counts, time, memory, idle split."""
    cols = ["stage", "chunk", "first_layer", "last_layer", "full", "selective", "time_s", "stage_time_s",
            "peak_bytes", "simulated_peak_bytes", "bubble_s", "imbalance_s", "recompute_s"]
    rows = [[r["stage"], r["chunk"], r["layers"][0] if r["layers"] else None, r["layers"][-1] if r["layers"] else None,
             r["recompute"].count("full"), r["recompute"].count("selective"), r["time_s"], r["stage_time_s"],
             r["peak_bytes"], r["simulated_peak_bytes"], r["bubble_s"], r["imbalance_s"], r["recompute_s"]]
            for r in out.get("stages", [])]
    return Table("stages", "Balanced pipeline stages", cols, rows)


def baseline_table(out: dict) -> Table:
    cols = ["plan", "objective_s", "simulated_step_s", "fits", "gain"]
    rows = [["balanced", out.get("objective_s"), out.get("simulated_step_s"), True, 0.0]]
    rows += [[name, c["objective_s"], c["simulated_step_s"], c["fits"], c["gain"]]
             for name, c in out.get("baselines", {}).items()]
    return Table("baselines", "Balanced plan vs even splits", cols, rows)
