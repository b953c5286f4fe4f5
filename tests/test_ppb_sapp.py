"""MindSpore SAPP import and MindFormers plan forms (issue 18, import fidelity).

Oracles: SAPP's own reading at mindformers v1.6.0-beta1 (toolkit/pipeline_balance/utils/layer.py
``compute_internal_time``, recompute.py ``DEFAULT_COEF``, ``JSON_*_NAME``, ``yaml_from_internal``,
``internal_from_yaml``; sapp_solver.py ``add_pipeline_memory_constraint``), worked by hand below,
and the peer's own example tests/st/test_pipeline_balance/sim.json (pp 16, vpp 3, 16 micro-batches,
its 192 decoder layers with every recompute mode), whose numbers are copied here.
"""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from ndplan.cli import main
from ndplan.errors import NdplanError, NdplanWarning
from ndplan.export.balance import plan_forms
from ndplan.ppb.instance import Instance, Pipeline, from_sapp, stage_constant_bytes
from ndplan.ppb.plan import Plan, one_select_list, stage_memory_bytes
from ndplan.ppb.solve import Config, evaluate, solve
from ndplan.ppb.userplan import user_plan

MIB = 2 ** 20
BODY = {"name": "LLamaDecodeLayer", "model_name": "llama2_70b_prof", "type": "BODY", "time": 180, "nb_layer": 192,
        "memory_parameter": 1583, "memory_activation": 826, "memory_recompute": 32, "memory_select_rec": 614,
        "memory_select_comm": 426, "memory_both_comm_select": 310, "backward_coef": 0, "select_rec_coef": 0.125,
        "select_comm_coef": 0.125, "both_comm_select_coef": 0.165, "recompute_coef": 0.5}
PEER = {"name": "llama2_70b_prof", "pre_defined_layer": {"LlamaEmbedding": 0, "LlamaRMSNorm": -1},
        "auto_partition_layer": {"LLamaDecodeLayer": 96},
        "layers_description": [
            {"name": "LlamaEmbedding", "model_name": "llama2_70b_prof", "type": "HEAD", "time": 30, "nb_layer": 1,
             "memory_parameter": 11000},
            BODY,
            {"name": "LlamaRMSNorm", "model_name": "llama2_70b_prof", "type": "TAIL", "time": 90, "nb_layer": 1,
             "memory_parameter": 2473}]}
"""mindformers v1.6.0-beta1 tests/st/test_pipeline_balance/sim.json."""


def test_every_sapp_mode_as_sapp_reads_it():
    """backward(mode) = (1 + coef) x 2 x time (no time keys given); recompute = that less the
    no-recompute backward; activation MB per micro-batch for each of the five SAPP types."""
    layers = from_sapp(PEER)
    head, body, tail = layers[0], layers[1], layers[-1]
    assert len(layers) == 194
    assert body.modes == ("none", "selective", "comm", "selective+comm", "full")
    assert body.forward_s == pytest.approx(0.180)
    assert body.backward_input_s + body.backward_weight_s == pytest.approx(0.360)
    assert body.recompute_s == pytest.approx({"selective": 0.045, "comm": 0.045, "selective+comm": 0.0594,
                                              "full": 0.180})
    assert body.activation_bytes == {"none": 826 * MIB, "selective": 614 * MIB, "comm": 426 * MIB,
                                     "selective+comm": 310 * MIB, "full": 32 * MIB}
    assert body.static_bytes == 1583 * MIB
    # HEAD and TAIL: time forward, 2 x time backward, no activations (SAPP counts BODY only)
    assert (head.forward_s, head.backward_input_s + head.backward_weight_s) == pytest.approx((0.030, 0.060))
    assert (tail.kind, tail.forward_s, tail.static_bytes) == ("head", pytest.approx(0.090), 2473 * MIB)
    assert head.activation_bytes == tail.activation_bytes == {"none": 0}


def test_default_coefficients_and_given_times():
    """Without coefficients SAPP's DEFAULT_COEF (selective 0.04, comm 0.125, both 0.165, full 0.5);
    a given time key wins over its coefficient, except full's, which SAPP looks up as
    'recompute_time ' (trailing space) and so never reads."""
    body = {"type": "BODY", "time": 10, "memory_activation": 8, "memory_select_rec": 6, "memory_select_comm": 5,
            "memory_both_comm_select": 4, "memory_recompute": 1, "select_comm_time": 30}
    layer = from_sapp({"layers_description": [body]})[0]
    assert layer.recompute_s == pytest.approx({"selective": 0.0008, "comm": 0.010, "selective+comm": 0.0033,
                                               "full": 0.010})
    with pytest.warns(NdplanWarning, match="recompute_time"):
        layer = from_sapp({"layers_description": [dict(body, recompute_time=99)]})[0]
    assert layer.recompute_s["full"] == pytest.approx(0.010)


def test_unknown_fields_are_named_and_the_constant_is_read():
    with pytest.warns(NdplanWarning, match="memory_activaton"):
        from_sapp({"layers_description": [{"type": "BODY", "time": 1, "memory_activaton": 3}]})
    with pytest.warns(NdplanWarning, match="stage_const"):
        from_sapp({"stage_const": 5, "layers_description": [{"type": "BODY", "time": 1}]})
    assert stage_constant_bytes(dict(PEER, stage_const_mem=1234)) == 1234 * MIB
    assert stage_constant_bytes(PEER) == 0
    with pytest.raises(NdplanError, match="memory_activation"):
        from_sapp({"layers_description": [{"type": "BODY", "time": 1, "memory_recompute": 3}]})


def test_stage_constant_memory_comes_off_the_budget(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps(dict(PEER, stage_const_mem=2000)))
    r = CliRunner().invoke(main, ["balance", "--layers", str(f), "--pp", "16", "--vpp", "3", "--m", "16",
                                  "--budget-gib", str(56000 / 1024), "--deterministic-time", "1", "--workers", "1",
                                  "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["budget_bytes"] == (56000 - 2000) * MIB


def test_the_peers_example_balances_under_its_own_budget():
    """pp 16, vpp 3, m 16 at 56,000 MB (run_pipeline_balance.py's default -mem): with the comm modes
    read, a plan fits (the import that dropped them needed 72 GiB); it keeps one select list per
    slice and its MindFormers form replays to the same step."""
    inst = Instance(layers=from_sapp(PEER), pipeline=Pipeline(pp=16, vpp=3, m=16, schedule="interleaved",
                                                             budget_bytes=56000 * MIB))
    sol = solve(inst, Config(deterministic_time=1, workers=1))
    assert sol.plan is not None
    assert max(stage_memory_bytes(inst, sol.plan)) <= 56000 * MIB
    assert one_select_list(sol.plan)
    assert {"comm", "selective+comm"} & set(sol.plan.recompute)
    form = plan_forms(inst, sol.plan)["mindformers"]
    assert "select_comm_recompute" in form
    replay = user_plan(inst, _write(form), None)
    assert evaluate(inst, replay) == pytest.approx(evaluate(inst, sol.plan), rel=1e-12)


_FILES = []


def _write(doc: dict) -> str:
    import tempfile
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    yaml.safe_dump(doc, f)
    f.close()
    _FILES.append(f.name)
    return f.name


def _small(pp=2, vpp=1, n=8):
    body = dict(BODY, nb_layer=n)
    doc = dict(PEER, layers_description=[PEER["layers_description"][0], body, PEER["layers_description"][2]])
    return Instance(layers=from_sapp(doc), pipeline=Pipeline(pp=pp, vpp=vpp, m=4, schedule="1f1b" if vpp == 1
                                                            else "interleaved", budget_bytes=10 ** 12))


def test_mindformers_plan_file_as_sapp_reads_it():
    """offset [1, -1] of 8 decoder layers on 2 stages: 5 and 3; stage 0 recompute 1, select 3, comm 2
    -> 1 full, min(3 - 1, 2 - 1) = 1 both, 3 - 1 - 1 = 1 selective, 0 comm, 2 none (internal_from_yaml);
    stage 1 select_comm True: every layer's comm (3), no select -> 3 comm."""
    inst = _small()
    f = _write({"model": {"model_config": {"offset": [1, -1]}},
                "recompute_config": {"recompute": [1, 0], "select_recompute": [3, 0], "select_comm_recompute": [2, 3]}})
    plan = user_plan(inst, f, None)
    assert plan.bounds == (0, 6, 10)  # the embedding joins stage 0, the output layer stage 1
    assert plan.recompute == ("none", "full", "selective+comm", "selective", "none", "none",
                              "comm", "comm", "comm", "none")


def test_layout_string_and_per_layer_modes():
    inst = _small(pp=2, vpp=2)
    layout = user_plan(inst, "Et*2|t*2|t*2|t*2L", "full")
    sizes = user_plan(inst, "3,2,2,3", "full")
    assert layout == sizes and set(layout.recompute[1:-1]) == {"full"}
    per = user_plan(inst, "3,2,2,3", ",".join(["none"] + ["comm"] * 8 + ["none"]))
    assert per.recompute[1:-1] == ("comm",) * 8
    for bad, flag in ((("Et*3|t*2|t*2|t*2L", None), "--plan"), (("3,2,2,3", "none,full"), "--plan-recompute"),
                      (("3,2,2,3", "partial"), "--plan-recompute")):
        with pytest.raises(NdplanError, match=flag):
            user_plan(inst, *bad)


def test_comm_recompute_has_no_megatron_form():
    inst = _small()
    plan = Plan(bounds=(0, 5, 10), recompute=("none",) + ("comm",) * 8 + ("none",))
    forms = plan_forms(inst, plan)
    assert forms["mindformers"]["select_comm_recompute"] is True
    assert "communication recompute" in forms["megatron"]["error"]


def teardown_module():
    import os
    for name in _FILES:
        os.unlink(name)


def test_a_first_slice_without_decoder_layers_round_trips():
    """The embedding alone on stage 0, 8 decoder layers and the head on stage 1: offset [-4, 4];
    read back, the embedding stays alone (the boundary is the next slice's first decoder layer)."""
    inst = _small()
    plan = Plan(bounds=(0, 1, 10), recompute=("none",) * 10)
    form = plan_forms(inst, plan)["mindformers"]
    assert form["offset"] == [-4, 4]
    assert user_plan(inst, _write(form), None).bounds == (0, 1, 10)


def test_plan_file_values_as_mindformers_reads_them():
    inst = _small()
    # True inside a list: every layer of that stage; False / 0: none
    plan = user_plan(inst, _write({"offset": 0, "recompute": [True, 0], "select_recompute": False}), None)
    assert plan.recompute[1:5] == ("full",) * 4 and plan.recompute[5:9] == ("none",) * 4
    for bad, field in (({"recompute": [-1, 0]}, "negative"), ({"offset": True}, "offset"), ({"foo": 1}, "none of"),
                       ({"offset": [1, -1, 0]}, "offset")):
        with pytest.raises(NdplanError, match=field):
            user_plan(inst, _write(bad), None)
    inst2 = _small(vpp=2)
    with pytest.raises(NdplanError, match="per chunk"):
        user_plan(inst2, _write({"recompute": [1, 1]}), None)


def test_mixed_layer_kinds_whose_recompute_is_not_first_are_refused():
    """MindFormers and Megatron recompute a slice's first N layers: a plan recomputing a MoE layer
    after a dense one it leaves alone has no such form (an independent review's case)."""
    from ndplan.ppb.instance import Layer
    def layer(name, kind, act):
        return Layer(name=name, kind=kind, forward_s=1e-3, backward_input_s=1e-3, backward_weight_s=1e-3,
                     static_bytes=MIB, activation_bytes={"none": act, "full": 1}, recompute_s={"full": 1e-3})
    emb = Layer(name="e", kind="embedding", forward_s=0, backward_input_s=0, backward_weight_s=0, static_bytes=0,
                activation_bytes={"none": 0})
    head = Layer(name="h", kind="head", forward_s=0, backward_input_s=0, backward_weight_s=0, static_bytes=0,
                 activation_bytes={"none": 0})
    dense, moe = layer("d", "dense", 10 * MIB), layer("m", "moe", 20 * MIB)
    inst = Instance(layers=(emb, dense, moe, dense, moe, head), pipeline=Pipeline(pp=2, m=4, budget_bytes=10 ** 12))
    plan = Plan(bounds=(0, 3, 6), recompute=("none", "none", "full", "none", "none", "none"))
    forms = plan_forms(inst, plan)
    assert "first N layers" in forms["mindformers"]["error"] and "first N layers" in forms["megatron"]["error"]
    ordered = Plan(bounds=(0, 3, 6), recompute=("none", "full", "none", "none", "none", "none"))
    assert plan_forms(inst, ordered)["mindformers"]["recompute"] == [1, 0]


def test_null_fields_are_one_line_or_no_memory():
    layers = from_sapp({"layers_description": [{"type": "BODY", "time": 2, "memory_parameter": None}]})
    assert layers[0].static_bytes == 0
    with pytest.raises(NdplanError, match="time"):
        from_sapp({"layers_description": [{"type": "BODY", "time": None}]})


@pytest.mark.parametrize("text", ["5,,5", "5,x", "5,-1"])
def test_malformed_sizes_are_one_line(text):
    with pytest.raises(NdplanError, match="comma-separated layer counts"):
        user_plan(_small(), text, None)
