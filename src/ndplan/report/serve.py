"""The report of ``ndplan serve``: its inputs, every layout (the rows of ``--json``), the
TPOT / throughput Pareto front, the first layout's Terms (``--explain``'s rows, closed forms in
LaTeX) and a figure of the layouts' latency against throughput."""

from __future__ import annotations

from ndplan.explain import Explained
from ndplan.report import figures as F
from ndplan.report.model import Figure, Report, Table

LAYOUT_COLUMNS = ["tp", "pp", "ep", "dp_attention", "replicas", "gpus", "weights_bytes", "kv_bytes_per_token",
                  "kv_cache_tokens", "max_concurrency", "concurrency", "running", "ttft_s", "tpot_s",
                  "output_tokens_per_s_per_gpu", "output_tokens_per_s_per_budget_gpu", "meets_limits",
                  "rejected_because"]


def layout_table(name: str, title: str, rows) -> Table:
    """One row per layout, the values of its ``--json`` record (base units)."""
    out = []
    for i, r in enumerate(rows, 1):
        j = r.to_json()
        out.append([i, *[j[c] for c in LAYOUT_COLUMNS]])
    return Table(name, title, ["rank", *LAYOUT_COLUMNS], out)


def _explained(terms: list[dict]) -> list[Explained]:
    return [Explained(key=t["key"], formula=t["formula"], latex=t["latex"], value=t["value"],
                      unit=t["unit"], source=t["source"], note=t["note"]) for t in terms]


def serve_report(inputs: dict, rows, front, terms: list[dict], *, plots: bool | None = None) -> Report:
    """``rows``: serve/search.py's ranked ServeRows; ``front``: their Pareto front; ``terms``: the
    first layout's explain rows (serve/explain.py)."""
    rep = Report(title=f"ndplan serve: {inputs['model']} on {inputs['gpus']} x {inputs['hardware']}", inputs=inputs)
    draw = F.have_matplotlib() if plots is None else plots and F.have_matplotlib()
    if not draw:
        rep.notes.append(F.PLOT_MISSING if plots is None or plots else "figures not requested: tables only")
    rep.tables.append(layout_table("layouts", "Layouts, ranked (output tokens/s over the budget's GPUs)", rows))
    rep.tables.append(layout_table("pareto", "Pareto front: TPOT vs output tokens/s per GPU", front))
    if terms:
        first = rows[0].estimate.layout
        rep.formulas = _explained(terms)
        rep.formulas_title = (f"Formulas behind the first layout (tp {first.tp}, pp {first.pp}, ep {first.ep}, "
                              f"attention DP {first.dp_attention})")
    if draw:
        rep.figures.append(Figure("latency", "TPOT vs output tokens/s per GPU (Pareto front joined)",
                                  F.to_png(F.serve_plot(rows, front))))
    return rep
