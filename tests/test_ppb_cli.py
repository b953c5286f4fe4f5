"""ndplan balance / estimate --export-layers: JSON schema, exported layers vs the estimate,
SAPP import, and one-line errors with exit code 2 for bad layer files."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from ndplan.catalog import load_hardware, load_model
from ndplan.cli import main
from ndplan.estimate import estimate
from ndplan.ppb.export import OVERHEAD_KEYS, layers_from_model
from ndplan.ppb.instance import Instance, Pipeline, from_sapp
from ndplan.ppb.plan import even_bounds, stage_memory_bytes, uniform_plan
from ndplan.strategy import Strategy

GOOD = {"format": "ndplan-layers/1", "layers": [
    {"name": "emb", "kind": "embedding", "forward_s": 0.001, "backward_input_s": 0.001, "backward_weight_s": 0.0,
     "static_bytes": 1e9, "activation_bytes": {"none": 1e8}},
    {"name": "dec", "kind": "dense", "count": 8, "forward_s": 0.004, "backward_input_s": 0.004,
     "backward_weight_s": 0.004, "static_bytes": 1e9,
     "activation_bytes": {"none": 8e8, "selective": 5e8, "full": 1e8}, "recompute_s": {"selective": 0.001, "full": 0.004}},
    {"name": "head", "kind": "head", "forward_s": 0.006, "backward_input_s": 0.006, "backward_weight_s": 0.006,
     "static_bytes": 2e9, "activation_bytes": {"none": 6e8}}]}


def _run(tmp_path, doc, *args):
    f = tmp_path / "layers.yaml"
    f.write_text(yaml.safe_dump(doc))
    return CliRunner().invoke(main, ["balance", "--layers", str(f), *args])


def test_balance_json_schema(tmp_path):
    svg = tmp_path / "t.svg"
    r = _run(tmp_path, GOOD, "--pp", "2", "--vpp", "2", "--m", "4", "--budget-gib", "20", "--json",
             "--timeline", str(svg), "--time-limit", "5")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["status"] == "OPTIMAL" and out["objective_s"] == pytest.approx(out["bound_s"])
    assert {"objective_s", "bound_s", "simulated_step_s", "stages", "mindformers", "megatron"} <= set(out)
    assert len(out["stages"]) == 4
    seen = [i for s in sorted(out["stages"], key=lambda s: s["layers"][0]) for i in s["layers"]]
    assert seen == list(range(10))
    for s in out["stages"]:
        assert {"stage", "chunk", "layers", "recompute", "time_s", "peak_bytes"} <= set(s)
        assert s["peak_bytes"] <= out["budget_bytes"]
    assert svg.read_text().startswith("<svg")


def test_balance_infeasible_names_stage_and_budget(tmp_path):
    r = _run(tmp_path, GOOD, "--pp", "2", "--m", "4", "--budget-gib", "2")
    assert r.exit_code == 2 and "stage" in r.output and "smallest budget" in r.output
    assert len(r.output.strip().splitlines()) == 1


def _bad(doc_change):
    doc = json.loads(json.dumps(GOOD))
    doc_change(doc)
    return doc


@pytest.mark.parametrize("change,args,word", [
    (lambda d: d["layers"][1].pop("forward_s"), [], "forward_s"),
    (lambda d: d["layers"][1].__setitem__("backward_input_s", -1), [], "backward_input_s"),
    (lambda d: d["layers"][1]["activation_bytes"].__setitem__("sometimes", 1), [], "recompute mode"),
    (lambda d: None, ["--pp", "11"], "exceed"),
    (lambda d: d.pop("layers"), [], "layers"),
])
def test_bad_layer_files_one_line_exit_2(tmp_path, change, args, word):
    base = ["--pp", "2", "--m", "4", "--budget-gib", "20"]
    if args:
        base[1] = args[1]
    r = _run(tmp_path, _bad(change), *base)
    assert r.exit_code == 2, r.output
    assert word in r.output and len(r.output.strip().splitlines()) == 1


def test_exported_layers_reproduce_the_estimates_memory():
    spec, hw = load_model("llama3-8b"), load_hardware("h100-sxm")
    strat = Strategy(dp=2, tp=2, pp=4, gbs=32, seq=4096, recompute="selective")
    layers, meta = layers_from_model(spec, hw, strat)
    inst = Instance(layers=layers, pipeline=Pipeline(pp=4, m=strat.m, schedule="1f1b", budget_bytes=hw.hbm_bytes))
    n = spec.num_hidden_layers // 4
    bounds = (0, n + 1, 2 * n + 1, 3 * n + 1, len(layers))  # the estimate's even split, embedding and head at the ends
    mem = stage_memory_bytes(inst, uniform_plan(inst, "selective", bounds))
    est = estimate(spec, hw, strat)
    want = [r["peak_bytes"] - sum(r["terms"].get(k, 0) for k in OVERHEAD_KEYS) for r in est.per_stage]
    assert mem == pytest.approx(want, rel=1e-6)
    assert meta["overhead_bytes"] > 0 and even_bounds(10, 4) == (0, 3, 6, 8, 10)


def test_estimate_export_layers_then_balance(tmp_path):
    f = tmp_path / "l.json"
    r = CliRunner().invoke(main, ["estimate", "-m", "llama3-8b", "--tp", "2", "--pp", "2", "--dp", "2", "--gbs", "16",
                                  "--export-layers", str(f)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["balance", "--layers", str(f), "--pp", "2", "--m", "8", "--time-limit", "5"])
    assert r.exit_code == 0, r.output
    assert "OPTIMAL" in r.output and "MindFormers" in r.output and "Megatron-LM" in r.output


def test_sapp_layers_description():
    doc = {"layers_description": [
        {"name": "Tail", "type": "TAIL", "time": 3, "nb_layer": 1, "memory_parameter": 500},
        {"name": "Body", "type": "BODY", "time": 2, "nb_layer": 4, "memory_parameter": 100, "memory_activation": 50,
         "memory_select_rec": 40, "memory_recompute": 5, "recompute_time": 7},
        {"name": "Head", "type": "HEAD", "time": 1, "nb_layer": 1, "memory_parameter": 300}]}
    layers = from_sapp(doc)
    # SAPP's HEAD is the first layer (the embedding), TAIL the last (output and loss)
    assert [x.kind for x in layers] == ["embedding", "body", "body", "body", "body", "head"]
    body = layers[1]
    assert body.forward_s == pytest.approx(2e-3)
    assert body.backward_input_s + body.backward_weight_s == pytest.approx(4e-3)  # 2 x time
    assert body.recompute_s["full"] == pytest.approx(3e-3)  # 7 ms stated - 4 ms
    assert body.recompute_s["selective"] == pytest.approx(4e-3 * 0.04)  # SAPP default coefficient
    assert body.activation_bytes == {"none": 50 * 2**20, "selective": 40 * 2**20, "full": 5 * 2**20}


def test_rerank_balances_pipelined_candidates_only():
    from ndplan.ppb.rerank import rerank
    from ndplan.ppb.solve import Config
    spec, hw = load_model("llama3-8b"), load_hardware("h100-sxm")
    ests = [estimate(spec, hw, Strategy(dp=2, tp=2, pp=2, gbs=16, seq=4096)),
            estimate(spec, hw, Strategy(dp=4, tp=2, pp=1, gbs=16, seq=4096))]
    out = rerank(ests, hw.hbm_bytes, Config(time_limit_s=5))
    assert [b.step_s for b in out] == sorted(b.step_s for b in out)
    by_pp = {b.estimate.strategy.pp: b for b in out}
    assert by_pp[1].solution is None and by_pp[1].step_s == by_pp[1].estimate.step_s
    assert by_pp[2].solution.status == "OPTIMAL"
