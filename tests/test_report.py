"""Reports (ndplan.report): Markdown/HTML written with the sweep's top-k rows, PNGs
beside Markdown or embedded in HTML, CSV/JSON per table, and the no-matplotlib path."""

from __future__ import annotations

import csv
import io
import json
import sys

import pytest
from click.testing import CliRunner

from ndplan.cli import main
from ndplan.report import PLOT_MISSING, have_matplotlib
from ndplan.report.tables import STRATEGY_COLUMNS

SWEEP = ["sweep", "-m", "llama3-8b", "-H", "a100-80gb", "--gpus", "16", "--gbs", "64", "--tp", "1,2",
         "--pp", "1,2", "--cp", "1", "--vpp", "1", "--schedule", "1f1b", "--recompute", "none,full", "--top", "3"]
needs_mpl = pytest.mark.skipif(not have_matplotlib(), reason="matplotlib not installed")


def _run(args):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    return r


@pytest.fixture(scope="module")
def md_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("rep")
    r = _run(SWEEP + ["--json", "--report", str(d / "plan.md")])
    return d, json.loads(r.stdout), r


def test_md_report_top_rows_match_sweep_json(md_run):
    d, doc, _ = md_run
    text = (d / "plan.md").read_text()
    rows = list(csv.DictReader(io.StringIO((d / "plan_top.csv").read_text())))
    assert len(rows) == len(doc["top"]) == 3
    for i, (row, top) in enumerate(zip(rows, doc["top"]), 1):
        s = top["strategy"]
        assert [row[c] for c in STRATEGY_COLUMNS] == [str(s[c]) for c in STRATEGY_COLUMNS]
        assert int(row["peak_bytes"]) == top["memory"]["peak_bytes"]
        assert float(row["step_s"]) == pytest.approx(top["time"]["step_s"], rel=1e-12)
        cells = [str(i), *[str(s[c]) for c in STRATEGY_COLUMNS], f"{top['memory']['peak_bytes'] / 2**30:.2f}"]
        assert "| " + " | ".join(cells) + " |" in text
    assert json.loads((d / "plan_top.json").read_text())[0]["peak_bytes"] == doc["top"][0]["memory"]["peak_bytes"]
    for name in ("pareto", "memory", "time"):
        assert (d / f"plan_{name}.csv").exists() and (d / f"plan_{name}.json").exists()
    assert "mem.activations" in text and "```" in text  # the formulas behind the plan


@needs_mpl
def test_md_report_pngs(md_run):
    d, _, _ = md_run
    text = (d / "plan.md").read_text()
    for name in ("memory", "pareto", "timeline"):
        png = d / f"plan_{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png.name})" in text


@needs_mpl
def test_html_report_embeds_figures_and_latex(tmp_path):
    r = _run(["estimate", "-m", "llama3-8b", "-H", "a100-80gb", "--tp", "2", "--pp", "2", "--dp", "4", "--gbs", "64",
              "--report", str(tmp_path / "e.html")])
    html = (tmp_path / "e.html").read_text()
    assert html.count("data:image/png;base64,") == 2  # memory bars + pipeline timeline
    assert "\\[" in html and "\\frac" in html
    assert not list(tmp_path.glob("*.png"))
    assert "report written to" in r.stderr


def test_without_matplotlib_tables_only(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert not have_matplotlib()
    # a smaller sweep than SWEEP (one layout): the report's sections are the same, its formulas cheaper
    r = _run(SWEEP[:SWEEP.index("--tp")] + ["--tp", "2", "--pp", "1", "--cp", "1", "--vpp", "1", "--schedule", "1f1b",
                                            "--recompute", "none", "--zero", "1", "--top", "3",
                                            "--report", str(tmp_path / "p.md")])
    assert PLOT_MISSING in r.stderr and "pip install 'ndplan[plot]'" in r.stderr
    text = (tmp_path / "p.md").read_text()
    assert PLOT_MISSING in text and "## Top 3 candidates" in text
    assert not list(tmp_path.glob("*.png"))


def test_estimate_csv(tmp_path):
    r = _run(["estimate", "-m", "llama3-8b", "-H", "a100-80gb", "--tp", "2", "--pp", "2", "--dp", "4", "--gbs", "64",
              "--csv"])
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [row["stage"] for row in rows] == ["0", "1"]
    assert all(int(row["peak_bytes"]) == int(row["static_bytes"]) + int(row["dynamic_bytes"]) for row in rows)


def test_balance_csv_and_report(tmp_path):
    layers = tmp_path / "l.yaml"
    _run(["estimate", "-m", "llama3-8b", "-H", "a100-80gb", "--tp", "2", "--pp", "2", "--dp", "4", "--gbs", "64",
          "--export-layers", str(layers)])
    r = _run(["balance", "--layers", str(layers), "--pp", "2", "--m", "16", "-H", "a100-80gb", "--deterministic-time", "3", "--workers", "1",
              "--csv", "--report", str(tmp_path / "b.md")])
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [row["stage"] for row in rows] == ["0", "1"]
    assert (tmp_path / "b_stages.csv").read_text() == r.stdout
    assert "Balanced plan vs even splits" in (tmp_path / "b.md").read_text()


def test_report_rejects_other_suffix(tmp_path):
    r = CliRunner().invoke(main, SWEEP + ["--report", str(tmp_path / "p.txt")])
    assert r.exit_code == 2 and ".md or .html" in r.output


# ---------------------------------------------------------------- figures (ndplan.report.figures)

SWEEP_SPACE = {"tp": [1, 2], "pp": [1, 2], "cp": [1], "vpp": [1], "schedule": ["1f1b"], "recompute": ["none", "full"]}
LONG_TITLE = "dp=2 tp=8 pp=8 vpp=1 cp=1 ep=1 mbs=1 zero=1 rc=selective 1f1b"  # as the report titles it


def _drawn(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


@pytest.fixture(scope="module")
def sweep_res():
    import ndplan
    return ndplan.sweep(ndplan.load_model("llama3-8b"), ndplan.load_hardware("a100-80gb"), 16, 4096, 64,
                        SWEEP_SPACE, top=3)


@needs_mpl
@pytest.mark.parametrize("pp", [2, 8])
def test_timeline_legends_clear_of_title(pp):
    from matplotlib.text import Text

    from ndplan.ppb.instance import Instance, Pipeline
    from ndplan.ppb.plan import uniform_plan
    from ndplan.ppb.simulate import simulate
    from ndplan.report.figures import timeline_plot
    from tests.helpers import MB, layer
    x = layer(2, 3, 1, 100, {"none": 50}, {})
    pipe = Pipeline(pp=pp, m=2 * pp, schedule="1f1b", budget_bytes=10**6 * MB)
    inst = Instance(layers=(x,) * (2 * pp), pipeline=pipe)
    sim = simulate(inst, uniform_plan(inst, "none"))
    fig = timeline_plot(sim, LONG_TITLE)
    r = _drawn(fig)
    [title] = [t for t in fig.findobj(Text) if t.get_text().startswith(LONG_TITLE) and t.get_visible()]
    tb = title.get_window_extent(r)
    legends = [*fig.legends, *(a.get_legend() for a in fig.axes if a.get_legend())]
    assert any("F" in t.get_text() for lg in legends for t in lg.get_texts())  # the op legend is among them
    for lg in legends:
        lb = lg.get_window_extent(r)
        assert not tb.overlaps(lb), (tb, lb)
        assert fig.bbox.x0 <= lb.x0 and lb.x1 <= fig.bbox.x1 and fig.bbox.y0 <= lb.y0 and lb.y1 <= fig.bbox.y1
    assert fig.bbox.x0 <= tb.x0 and tb.x1 <= fig.bbox.x1 and tb.y1 <= fig.bbox.y1


@needs_mpl
def test_pareto_memory_axis_scaled_to_the_limit(sweep_res):
    from ndplan.report.figures import pareto_plot
    res = sweep_res
    lim = res.mem_limit_bytes / 2**30
    mem = res.table.peak_bytes / 2**30
    assert res.feasible and mem.max() > 2 * lim  # candidates far above the limit
    fig = pareto_plot(res, 0)
    _drawn(fig)
    lo, hi = fig.axes[0].get_ylim()
    assert lo <= 0 and lo <= mem[:res.feasible].min() and mem[:res.feasible].max() <= hi
    assert lim < hi < 2 * lim


@needs_mpl
def test_pareto_off_scale_note_counts_points_above_the_axis(sweep_res):
    from ndplan.report.figures import pareto_plot
    res = sweep_res
    fig = pareto_plot(res, 0)
    _drawn(fig)
    hi = fig.axes[0].get_ylim()[1]
    above = int((res.table.peak_bytes / 2**30 > hi).sum())
    assert above > 0
    [note] = fig.findobj(lambda a: a.get_gid() == "off-scale")
    assert note.get_text().startswith(f"{above:,} candidates above {hi:,.0f} GiB")


@needs_mpl
def test_pareto_labels_the_chosen_strategy(sweep_res):
    import re

    from ndplan.report.figures import pareto_plot
    res = sweep_res
    slowest = max(res.pareto, key=lambda i: res.table.step_s[i])
    for chosen in sorted({0, slowest}):
        s = res.strategy(chosen)
        [ann] = pareto_plot(res, chosen).findobj(lambda a: a.get_gid() == "chosen")
        text = ann.get_text()
        assert f"chosen #{chosen + 1}" in text
        for k in ("dp", "tp", "pp", "mbs", "zero"):
            assert re.search(rf"\b{k}={getattr(s, k)}\b", text), (k, text)
        assert f"recompute={s.recompute}" in text and s.schedule in text


def test_pareto_ylim_without_far_candidates():
    import numpy as np

    from ndplan.report.figures import pareto_ylim
    L = 80.0
    near = np.array([10, 50, 79, 95, 110.0])  # nothing far above: every point shown, the limit line too
    assert pareto_ylim(near, 3, L) >= 110 and pareto_ylim(near, 3, L) > L
    assert pareto_ylim(np.array([10, 20.0]), 2, L) > L  # all well below: the limit still on the axis
    assert pareto_ylim(np.array([10, 79, 5000.0]), 2, L) == pytest.approx(1.5 * L)
