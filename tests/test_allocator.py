"""The caching allocator's slack: reserved vs allocated, and which one the verdict checks.

Independent reference: tests/data/allocator_pairs.yaml, published (max allocated, max
reserved) pairs of real training runs (Megatron-LM logs, DeepSpeed see_memory_usage,
ORTModule), each transcribed from its source. The engine constants are derived here from
that file, so a changed constant or a changed file fails.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

import ndplan
from ndplan import engines

PAIRS = Path(__file__).parent / "data" / "allocator_pairs.yaml"


def _per_source_medians(family: str | None = None) -> list[float]:
    by = defaultdict(list)
    for e in yaml.safe_load(PAIRS.read_text()):
        if e.get("in_stats", True) and (family is None or family in e["framework_family"]):
            assert e["max_reserved"] >= e["max_allocated"] > 0
            by[str(e["source"])].append(e["max_reserved"] / e["max_allocated"])
    return [statistics.median(v) for v in by.values()]


def test_torch_allocator_slack_is_the_published_median():
    meds = _per_source_medians()
    assert len(meds) >= 20
    slack = round((statistics.median(meds) - 1) * 1000)
    assert engines.MEGATRON.allocator_slack_permille == slack
    assert engines.FSDP.allocator_slack_permille == engines.HF.allocator_slack_permille == slack


def test_deepspeed_slack_is_the_median_of_its_sources():
    meds = _per_source_medians("DeepSpeed")  # Megatron-DeepSpeed and DeepSpeed itself
    assert len(meds) >= 3
    assert engines.DEEPSPEED.allocator_slack_permille == round((statistics.median(meds) - 1) * 1000)


def test_mindspore_has_no_slack():
    assert engines.MINDSPORE.allocator_slack_permille == 0


@pytest.mark.parametrize("engine", ["megatron", "fsdp", "deepspeed", "mindspore"])
def test_reserved_is_allocated_times_slack_and_peak_adds_the_reserve(engine):
    model, hw = ndplan.load_model("llama3-8b"), ndplan.load_hardware("h100-sxm")
    est = ndplan.estimate(model, hw, ndplan.Strategy(dp=8, gbs=8, zero=3, engine=engine))
    st = est.per_stage[0]
    terms = st["terms"]
    allocated = sum(v for k, v in terms.items() if k not in ("mem.allocator", "mem.reserve"))
    assert st["allocated_bytes"] == allocated
    slack = engines.profile(engine).allocator_slack_permille / 1000
    assert st["reserved_bytes"] == pytest.approx(allocated * (1 + slack), abs=2)
    assert st["peak_bytes"] == st["reserved_bytes"] + terms["mem.reserve"]
    assert est.fits == (st["peak_bytes"] <= hw.hbm_bytes)


def test_estimate_text_names_both_lines():
    from click.testing import CliRunner
    from ndplan.cli import main
    r = CliRunner().invoke(main, ["estimate", "-m", "llama3-8b", "--gpus", "8", "--zero", "3", "--engine", "fsdp"])
    assert r.exit_code == 0, r.output
    assert "allocated" in r.output and "reserved ~" in r.output and "max_memory_reserved" in r.output
