"""ndplan balance / estimate --export-layers: JSON schema, exported layers vs the estimate,
SAPP import, and one-line errors with exit code 2 for bad layer files."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from click.testing import CliRunner

from ndplan.catalog import load_hardware, load_model
from ndplan.cli import main
from ndplan.errors import NdplanWarning
from ndplan.estimate import estimate
from ndplan.ppb.export import OVERHEAD_KEYS, layers_from_model
from ndplan.export.balance import plan_forms
from ndplan.ppb.instance import Instance, Layer, Pipeline, from_sapp
from ndplan.ppb.plan import Plan, even_bounds, stage_memory_bytes, uniform_plan
from ndplan.strategy import Strategy

GOOD = {"format": "ndplan-layers/1", "layers": [
    {"name": "emb", "kind": "embedding", "forward_s": 0.001, "backward_input_s": 0.001, "backward_weight_s": 0.0,
     "static_bytes": 1e9, "activation_bytes": {"none": 1e8}},
    {"name": "dec", "kind": "dense", "count": 8, "forward_s": 0.004, "backward_input_s": 0.004,
     "backward_weight_s": 0.004, "static_bytes": 1e9,
     "activation_bytes": {"none": 8e8, "selective": 5e8, "full": 1e8}, "recompute_s": {"selective": 0.001, "full": 0.004}},
    {"name": "head", "kind": "head", "forward_s": 0.006, "backward_input_s": 0.006, "backward_weight_s": 0.006,
     "static_bytes": 2e9, "activation_bytes": {"none": 6e8}}]}


DETERMINISTIC = ("--deterministic-time", "5", "--workers", "1")
"""CP-SAT budget in deterministic time on one worker: the same answer on any machine or load."""


def _run(tmp_path, doc, *args):
    f = tmp_path / "layers.yaml"
    f.write_text(yaml.safe_dump(doc))
    return CliRunner().invoke(main, ["balance", "--layers", str(f), *args])


def test_balance_json_schema(tmp_path):
    svg = tmp_path / "t.svg"
    r = _run(tmp_path, GOOD, "--pp", "2", "--vpp", "2", "--m", "4", "--budget-gib", "20", "--json",
             "--timeline", str(svg), *DETERMINISTIC)
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
    r = CliRunner().invoke(main, ["balance", "--layers", str(f), "--pp", "2", "--m", "8", *DETERMINISTIC])
    assert r.exit_code == 0, r.output
    assert "OPTIMAL" in r.output and "MindFormers" in r.output and "Megatron-LM" in r.output


def test_sapp_layers_description():
    """SAPP v1.6.0-beta1's own reading (toolkit/pipeline_balance/utils/layer.py compute_internal_time,
    recompute.py): backward = (1 + coef) x 2 x time unless the mode's time key is given, and the full
    mode's key is 'recompute_time ' with a trailing space, so a 'recompute_time' is never read."""
    doc = {"layers_description": [
        {"name": "Tail", "type": "TAIL", "time": 3, "nb_layer": 1, "memory_parameter": 500},
        {"name": "Body", "type": "BODY", "time": 2, "nb_layer": 4, "memory_parameter": 100, "memory_activation": 50,
         "memory_select_rec": 40, "memory_recompute": 5, "recompute_time": 7},
        {"name": "Head", "type": "HEAD", "time": 1, "nb_layer": 1, "memory_parameter": 300}]}
    with pytest.warns(NdplanWarning, match="recompute_time"):
        layers = from_sapp(doc)
    # SAPP's HEAD is the first layer (the embedding), TAIL the last (output and loss)
    assert [x.kind for x in layers] == ["embedding", "body", "body", "body", "body", "head"]
    body = layers[1]
    assert body.forward_s == pytest.approx(2e-3)
    assert body.backward_input_s + body.backward_weight_s == pytest.approx(4e-3)  # 2 x time
    assert body.recompute_s["full"] == pytest.approx(4e-3 * 0.5)  # SAPP's default full coefficient, not the 7 ms
    assert body.recompute_s["selective"] == pytest.approx(4e-3 * 0.04)  # SAPP default coefficient
    assert body.activation_bytes == {"none": 50 * 2**20, "selective": 40 * 2**20, "full": 5 * 2**20}


def test_rerank_balances_pipelined_candidates_only():
    from ndplan.ppb.rerank import rerank
    from ndplan.ppb.solve import Config
    spec, hw = load_model("llama3-8b"), load_hardware("h100-sxm")
    ests = [estimate(spec, hw, Strategy(dp=2, tp=2, pp=2, gbs=16, seq=4096)),
            estimate(spec, hw, Strategy(dp=4, tp=2, pp=1, gbs=16, seq=4096))]
    out = rerank(ests, hw.hbm_bytes, Config(deterministic_time=5, workers=1))
    assert [b.step_s for b in out] == sorted(b.step_s for b in out)
    by_pp = {b.estimate.strategy.pp: b for b in out}
    assert by_pp[1].solution is None and by_pp[1].step_s == by_pp[1].estimate.step_s
    assert by_pp[2].solution.status == "OPTIMAL"


# ------------------------------------------------ framework forms of a plan (export/)

def _plan(kinds, counts, pp, vpp=1, schedule=None, modes=None):
    """Layers of the given kinds, ``counts`` layers per virtual stage, ``modes`` per layer."""
    layers = tuple(Layer(name=k, kind=k, forward_s=1e-3, backward_input_s=1e-3, backward_weight_s=1e-3,
                         static_bytes=1, activation_bytes={"none": 3, "selective": 2, "full": 1},
                         recompute_s={"selective": 1e-4, "full": 1e-3}) for k in kinds)
    pipe = Pipeline(pp=pp, vpp=vpp, m=4, schedule=schedule or ("interleaved" if vpp > 1 else "1f1b"),
                    budget_bytes=10**12)
    bounds = (0, *(sum(counts[:i + 1]) for i in range(len(counts))))
    return Instance(layers=layers, pipeline=pipe), Plan(bounds=bounds, recompute=tuple(modes or ("none",) * len(kinds)))


def test_sapp_plan_offsets_sum_to_the_layer_remainder():
    """7 BODY layers between a HEAD and a TAIL on pp = 2, slices HEAD + 4 BODY | 3 BODY +
    TAIL. MindFormers builds 7 // 2 + offset[s] layers on stage s and requires sum(offset)
    = 7 % 2 = 1 (mindspore-lab/mindformers:mindformers/models/utils.py,
    LayerSetting._check_inputs), so offset = [4 - 3, 3 - 3] = [1, 0]. Counting the TAIL as a
    decoder layer (its kind was "tail") gave [0, 0], which MindFormers rejects."""
    doc = {"layers_description": [{"name": "h", "type": "HEAD", "time": 1},
                                  {"name": "b", "type": "BODY", "time": 2, "nb_layer": 7},
                                  {"name": "t", "type": "TAIL", "time": 1}]}
    inst = Instance(layers=from_sapp(doc), pipeline=Pipeline(pp=2, m=4, budget_bytes=10**12))
    forms = plan_forms(inst, Plan(bounds=(0, 5, 9), recompute=("none",) * 9))
    assert forms["mindformers"] == {"offset": [1, 0], "recompute": False, "select_recompute": False}


def test_mindformers_select_recompute_counts_full_layers_too():
    """Stage 0: 1 full + 1 selective of 3 decoder layers; stage 1: 2 full of 3. MindFormers
    counts both lists from the slice's first layer and skips select recompute on a fully
    recomputed layer (LayerSetting.set: ``if not is_full_recompute``), so the selective
    layer of stage 0 needs select_recompute = 2 there: recompute [1, 2], select [2, 2]."""
    modes = ["none", "full", "selective", "none", "full", "full", "none", "none"]
    inst, plan = _plan(["embedding"] + ["dense"] * 6 + ["head"], (4, 4), pp=2, modes=modes)
    assert plan_forms(inst, plan)["mindformers"] == {"offset": 0, "recompute": [1, 2], "select_recompute": [2, 2]}


def test_megatron_layout_places_mtp_layers():
    """E + 6 decoder + 1 MTP + loss on pp = 2, vpp = 2, slices of 3, 2, 2, 2 layers:
    groups Ett | tt | tt | mL. Megatron-LM's validate_layer_layout
    (megatron/core/transformer/pipeline_parallel_layer_layout.py) asserts the layout's m
    count equals mtp_num_layers, so the layout carries the m and --mtp-num-layers 1; the
    MTP sits in the last virtual stage of pp rank 1, as it requires."""
    inst, plan = _plan(["embedding"] + ["dense"] * 6 + ["mtp", "head"], (3, 2, 2, 2), pp=2, vpp=2)
    forms = plan_forms(inst, plan)["megatron"]
    words = shlex.split(" ".join(forms["args"]))
    assert dict(zip(words[::2], words[1::2])) == {"--pipeline-model-parallel-layout": "Ett|tt|tt|mL",
                                                  "--num-virtual-stages-per-pipeline-rank": "2",
                                                  "--mtp-num-layers": "1"}


def test_megatron_partial_selective_recompute_is_noted():
    """Decoder layers 5 | 3, selective on 3 | 3: Megatron-LM's selective granularity covers
    every layer of the block (TransformerBlock: checkpoint_core_attention =
    recompute_granularity == 'selective'), so the two stage-0 layers without it differ
    and must be noted (the old check min(sel) < min(layers), 3 < 3, missed it)."""
    modes = ["none"] + ["selective"] * 3 + ["none"] * 2 + ["selective"] * 3 + ["none"]
    inst, plan = _plan(["embedding"] + ["dense"] * 8 + ["head"], (6, 4), pp=2, modes=modes)
    forms = plan_forms(inst, plan)["megatron"]
    assert "--recompute-granularity selective" in forms["args"]
    assert any("selective recompute of [3, 3]" in n for n in forms["notes"])


def test_zbv_plan_has_no_megatron_form_and_a_mindformers_one():
    """zbv runs slice 2*pp-1-s on stage s's second chunk, Megatron-LM's interleaving slice
    pp + s (pipeline_parallel_layer_layout.py: layout[vpp_rank * pp + pp_rank]), so
    flags for a zbv plan would put layers on other devices: no form, a reason. MindSpore's
    zero_bubble_v places that V itself (mindformers@f52743ca parallel_core/training_graph/
    transformer/utils.py:163-167, 410-419) with offsets per [chunk][stage]. Slices of 2, 2, 3, 1
    layers with the embedding and head: decoder layers 1, 2, 3, 0 (average 6 // 4 = 1), offsets
    0, 1, 2, -1 by slice; stage 0 runs slices 0 and 3, stage 1 slices 1 and 2: [[0, 1], [-1, 2]]."""
    inst, plan = _plan(["embedding"] + ["dense"] * 6 + ["head"], (2, 2, 3, 1), pp=2, vpp=2, schedule="zbv")
    forms = plan_forms(inst, plan)
    assert "cannot express" in forms["megatron"]["error"]
    assert forms["mindformers"]["pipeline_scheduler"] == "zero_bubble_v"
    assert forms["mindformers"]["offset"] == [[0, 1], [-1, 2]]


def test_balanced_strategy_takes_gbs_from_dp_mbs_and_m():
    """The layer file's strategy at dp 2, mbs 2, balanced with m = 8 micro-batches:
    gbs = 2 * 2 * 8 = 32, decoder layers per stage 3 | 5 (embedding and head excluded)."""
    from ndplan.ppb.result import balanced_strategy
    inst, plan = _plan(["embedding"] + ["dense"] * 8 + ["head"], (4, 6), pp=2)
    inst = Instance(layers=inst.layers, pipeline=Pipeline(pp=2, m=8, budget_bytes=10**12))
    s = balanced_strategy(Strategy(dp=2, tp=1, pp=1, mbs=2, gbs=4).as_dict(), inst, plan)
    assert (s.gbs, s.m, s.pp, s.layers_per_stage) == (32, 8, 2, (3, 5))


def test_schedule_auto_balances_every_order_and_recommends_the_fastest(tmp_path):
    """--schedule auto: each fixed order balanced under the same budget; the recommended one is the
    fastest balanced plan that fits, and it is the plan printed; a pipeline a schedule cannot run
    (interleaved needs m a multiple of pp: rules.py) is named with the rule's words."""
    f = tmp_path / "l.json"
    r = CliRunner().invoke(main, ["estimate", "-m", "llama3-8b", "--tp", "2", "--pp", "4", "--dp", "1", "--gbs", "16",
                                  "--export-layers", str(f)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["balance", "--layers", str(f), "--pp", "4", "--m", "6", "-H", "h100-sxm",
                                  "--schedule", "auto", "--deterministic-time", "0.5", "--workers", "1", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output[r.output.index("{"):])
    rows = {s["schedule"]: s for s in doc["schedules"]}
    assert set(rows) == {"gpipe", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipe", "dualpipev"}
    assert rows["interleaved"]["status"] == "NOT_RUN" and "multiple" in rows["interleaved"]["why"]
    for s in ("dualpipe", "dualpipev"):  # DualPipe needs m >= 2 x pp = 8 (deepseek-ai/DualPipe asserts it)
        assert rows[s]["status"] == "NOT_RUN" and "2*pp = 8" in rows[s]["why"]
    ran = [s for s in doc["schedules"] if s["balanced_step_s"] is not None]
    best = min(ran, key=lambda s: s["balanced_step_s"])
    assert doc["recommended"]["schedule"] == best["schedule"]
    assert doc["objective_s"] == best["balanced_step_s"]
    r = CliRunner().invoke(main, ["balance", "--layers", str(f), "--pp", "4", "--m", "8", "-H", "h100-sxm",
                                  "--schedule", "auto", "--plan", "9,9,9,9"])
    assert r.exit_code == 2 and "--plan" in r.output


def test_sweep_balance_says_why_a_zbv_step_differs_from_the_estimate():
    """The estimate's zbv bubble is the closed form; the replay runs the hand-written op order, so
    the estimate's own split replays at another step; the re-ranked line prints that replay."""
    from ndplan.cli_format import balanced_lines
    from ndplan.points import complete_point
    from ndplan.ppb.rerank import rerank
    from ndplan.ppb.solve import Config
    from ndplan.strategy import Strategy
    spec, hw = load_model("llama3-8b"), load_hardware("h100-sxm")
    s = Strategy(**complete_point({"dp": 1, "tp": 2, "pp": 4, "vpp": 2, "schedule": "zbv", "gbs": 16, "mbs": 1,
                                   "seq": 4096}, 8))
    b = rerank([estimate(spec, hw, s)], hw.hbm_bytes, Config(deterministic_time=0.5, workers=1))[0]
    assert b.step_s <= b.own_split_s + 1e-9  # balancing never loses to the split it starts from
    assert abs(b.own_split_s - b.estimate.step_s) > 0.01 * b.estimate.step_s
    assert "its own split replays at" in balanced_lines([b])[1]
