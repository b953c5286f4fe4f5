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
    r = _run(SWEEP + ["--report", str(tmp_path / "p.md")])
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
    r = _run(["balance", "--layers", str(layers), "--pp", "2", "--m", "16", "-H", "a100-80gb", "--time-limit", "3",
              "--csv", "--report", str(tmp_path / "b.md")])
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [row["stage"] for row in rows] == ["0", "1"]
    assert (tmp_path / "b_stages.csv").read_text() == r.stdout
    assert "Balanced plan vs even splits" in (tmp_path / "b.md").read_text()


def test_report_rejects_other_suffix(tmp_path):
    r = CliRunner().invoke(main, SWEEP + ["--report", str(tmp_path / "p.txt")])
    assert r.exit_code == 2 and ".md or .html" in r.output
