"""Candidate space (ndplan.space): generate() against an independent brute-force oracle
built on Strategy + Strategy.check, counts that add up, why() against generate's
counts, a hypothesis property over the catalog, and one-line errors for bad spaces.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ndplan
from ndplan.catalog.files import catalog_names
from ndplan.errors import NdplanError
from ndplan.space import (DIMS, RULES, generate, group_strategies, load_space, normalize_space, why)
from ndplan.strategy import SCHEDULES, Strategy

_SPECS = {}


def spec(name):
    if name not in _SPECS:
        _SPECS[name] = ndplan.load_model(name)
    return _SPECS[name]


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def rows_of(cands):
    """Every valid candidate as a tuple in DIMS order."""
    out = []
    for g in cands.groups:
        grid = g.grid
        for i in range(len(g)):
            out.append((*(int(grid[d][i]) for d in ("dp", "tp", "pp", "cp", "ep", "etp")), g.vpp,
                        int(grid["mbs"][i]), g.zero, g.recompute, g.schedule, g.sp))
    return out


MEGATRON_SCHEDULES = ("1f1b", "interleaved")
"""Megatron-LM@d98e8a64 get_forward_backward_func (pipeline_parallel/schedules.py:161-165):
with_interleaving when a virtual size is set, else without_interleaving."""


MEGATRON_ZERO = """Megatron-LM@d98e8a64 without Megatron-FSDP: zero 1 is the distributed optimizer (the whole
gradient buffer kept), zero 3 is --use-torch-fsdp2, which validate_args refuses with
pipeline_model_parallel_size > 1, expert_model_parallel_size > 1 and without
--untie-embeddings-and-output-weights (arguments.py:1031-1045): no zero 2, and zero 3 only
at pp 1, ep 1, untied."""


def oracle(model, gpus, seq, gbs, dom, engine="megatron", megatron_schedules=True):
    """Valid candidates by brute force: nested loops building Strategy(...) and calling
    .check(), catching NdplanError, plus the canonical rule (pp == 1 keeps only 1f1b
    with vpp 1; tp == 1 keeps only sp=True) and, for engine megatron, the schedules Megatron-LM
    has code for (a Strategy built by hand may time any). ``dom`` lists each dimension's values;
    world degrees and ep loop over all divisors of gpus, so they are supersets of what
    generate enumerates."""
    world = [w for w in itertools.product(divisors(gpus), repeat=4) if w[0] * w[1] * w[2] * w[3] == gpus]
    valid = set()
    for (dp, tp, pp, cp), ep, etp, vpp, mbs, zero, rec, sched, sp in itertools.product(
            world, divisors(gpus), dom["etp"], dom["vpp"], dom["mbs"], dom["zero"], dom["recompute"],
            dom["schedule"], dom["sp"]):
        if pp == 1 and (sched != "1f1b" or vpp != 1) or tp == 1 and not sp:
            continue
        if megatron_schedules and engine == "megatron" and pp > 1 and sched not in MEGATRON_SCHEDULES:
            continue
        if megatron_schedules and engine == "megatron" and (zero == 2 or zero == 3 and (
                pp > 1 or model.tie_word_embeddings or model.is_moe and ep > 1)):
            continue  # MEGATRON_ZERO
        try:
            Strategy(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs, gbs=gbs, seq=seq,
                     zero=zero, recompute=rec, schedule=sched, sp=sp, engine=engine).check(model, gpus)
        except NdplanError:
            continue
        valid.add((dp, tp, pp, cp, ep, etp, vpp, mbs, zero, rec, sched, sp))
    return valid


# (model, gpus, seq, gbs, space given to generate, oracle loop values for etp..sp). Even splits
# only: the uneven rows have their own brute-force oracle (tests/test_uneven_sweep.py).
# Where the space says auto, the oracle loops over a superset of the auto values
# (vpp over 1..num_hidden_layers) or the one value auto means (etp 1, sp True).
ORACLE_CASES = [
    pytest.param("llama3-8b", 8, 4096, 16,
                 {"mbs": [1, 2], "sp": [True, False], "zero": 1, "recompute": "none", "uneven": False},
                 {"etp": [1], "vpp": range(1, 33), "mbs": [1, 2], "zero": [1], "recompute": ["none"],
                  "schedule": SCHEDULES, "sp": [True, False]}, id="llama3-8b-8gpu-auto-vpp"),
    pytest.param("llama3-8b", 16, 2052, 32,
                 {"mbs": [1, 2], "vpp": [1, 2, 4], "zero": [0, 3], "recompute": ["none", "full"], "uneven": False},
                 {"etp": [1], "vpp": [1, 2, 4], "mbs": [1, 2], "zero": [0, 3], "recompute": ["none", "full"],
                  "schedule": SCHEDULES, "sp": [True]}, id="llama3-8b-16gpu-seq2052"),
    pytest.param("mixtral-8x7b", 16, 4096, 8,
                 {"mbs": 1, "etp": [1, 2], "vpp": [1, 2, 3, 4], "zero": 1, "recompute": "selective", "uneven": False},
                 {"etp": [1, 2], "vpp": [1, 2, 3, 4], "mbs": [1], "zero": [1], "recompute": ["selective"],
                  "schedule": SCHEDULES, "sp": [True]}, id="mixtral-16gpu-etp"),
    pytest.param("deepseek-v2-lite", 8, 4096, 12,
                 {"mbs": 1, "sp": [True, False], "zero": 1, "recompute": "none", "uneven": False},
                 {"etp": [1], "vpp": range(1, 28), "mbs": [1], "zero": [1], "recompute": ["none"],
                  "schedule": SCHEDULES, "sp": [True, False]}, id="deepseek-v2-lite-8gpu-mla"),
]


@pytest.mark.parametrize("name,gpus,seq,gbs,space,dom", ORACLE_CASES)
def test_generate_equals_brute_force_oracle(name, gpus, seq, gbs, space, dom):
    model = spec(name)
    cands = generate(model, gpus, seq, gbs, space)
    rows = rows_of(cands)
    assert len(rows) == len(set(rows)), "a candidate appears twice"
    expected = oracle(model, gpus, seq, gbs, dom)
    assert expected, "case too restrictive to test anything"
    assert set(rows) == expected
    assert cands.generated == cands.valid + sum(cands.rejected.values())


def test_counts_add_up_and_name_every_rule():
    cands = generate(spec("llama3-70b"), 1024, 8192, 1024)
    assert list(cands.rejected) == [name for name, _ in RULES]
    assert cands.generated == cands.valid + sum(cands.rejected.values())
    assert cands.valid > 0 and cands.rejected["world"] == 0  # world holds by construction


def test_group_arrays():
    gbs = 64
    cands = generate(spec("mixtral-8x7b"), 32, 4096, gbs, {"etp": [1, 2]})
    keys = {g: i for i, g in enumerate((g.schedule, g.vpp, g.recompute, g.zero, g.sp) for g in cands.groups)}
    assert len(keys) == len(cands.groups), "one group per categorical combination"
    for g in cands.groups:
        assert set(g.grid) == {"dp", "tp", "pp", "cp", "ep", "etp", "mbs", "m", "first_layers", "last_layers", "uneven"}
        even = g.grid["uneven"] == 0  # even rows: L/pp on the first and last stage (mixtral: 32 layers)
        assert (g.grid["first_layers"][even] * g.grid["pp"][even] == 32).all()
        assert (g.grid["first_layers"][~even] + g.grid["last_layers"][~even] < 64).all()
        assert {len(a) for a in g.grid.values()} == {len(g)} and len(g) > 0
        assert all(a.dtype.kind == "i" and not a.flags.writeable for a in g.grid.values())
        assert (g.grid["m"] * g.grid["dp"] * g.grid["mbs"] == gbs).all()
        assert (g.grid["dp"] * g.grid["tp"] * g.grid["pp"] * g.grid["cp"] == 32).all()


# One point per rule, the rule named by why(); hand-checked against the model numbers
# (llama3-8b: 32 layers, 32 heads, 8 kv heads; mixtral-8x7b: 8 experts; 16 GPUs, seq 2052, gbs 64;
# dp = 16/(tp*pp*cp) when not given).
WHY_TABLE = [
    ("llama3-8b", {"dp": 2, "tp": 4}, "world"),                     # 2*4*1*1 = 8 != 16
    ("llama3-8b", {"tp": 3}, "world"),                              # 3 does not divide 16
    ("megatron-gpt-22b", {"tp": 16}, None),                         # 64 heads, MHA
    ("qwen2.5-7b", {"tp": 8, "dp": 2}, "heads"),                    # 28 heads % 8
    ("llama3-8b", {"tp": 16}, "kv_heads"),                          # 8 kv heads % 16
    ("deepseek-v2-lite", {"tp": 16}, None),                         # MLA: no kv-heads rule; 16 heads
    ("llama3-8b", {"tp": 2, "ep": 2}, "experts"),                   # dense model
    ("mixtral-8x7b", {"tp": 1, "ep": 16}, "experts"),               # 8 experts % 16
    ("mixtral-8x7b", {"tp": 1, "pp": 4, "ep": 8}, "experts"),       # dp*cp*tp = 4 % 8
    ("llama3-8b", {"tp": 1, "pp": 3}, "world"),
    ("llama3-8b", {"tp": 1, "pp": 4, "vpp": 2, "mbs": 8, "schedule": "interleaved"}, "schedule"),  # m=2 < pp
    ("llama3-8b", {"tp": 1, "pp": 16, "vpp": 4, "schedule": "interleaved"}, "layers"),  # 64 > 32
    ("llama3-8b", {"tp": 2, "cp": 8}, "seq"),                       # seq 2052 % 8
    ("llama3-8b", {"tp": 1, "mbs": 3}, "batch"),                    # 16*3 does not divide 64
    ("llama3-8b", {"tp": 2, "pp": 2, "vpp": 2, "schedule": "1f1b"}, "schedule"),  # 1f1b with vpp 2
    ("llama3-8b", {"tp": 2, "pp": 2, "vpp": 2, "schedule": "interleaved"}, None),
    ("llama3-8b", {"tp": 2, "pp": 2, "vpp": 1, "schedule": "interleaved"}, "schedule"),
    ("llama3-8b", {"tp": 2, "pp": 2, "vpp": 4, "schedule": "zbv"}, "schedule"),
    ("llama3-8b", {"tp": 2, "pp": 1, "schedule": "gpipe"}, "duplicate"),
    ("llama3-8b", {"tp": 1, "pp": 2, "sp": False}, "duplicate"),
    ("llama3-8b", {"tp": 2, "pp": 2, "sp": False}, None),
]


@pytest.mark.parametrize("name,point,rule", WHY_TABLE)
def test_why_names_the_rule(name, point, rule):
    space = {"sp": [True, False], "mbs": [1, 2, 3, 8], "ep": "auto"}
    got = why(spec(name), 16, 2052, 64, space, point)
    if rule is None:
        assert got is None
    else:
        assert got is not None and got.split(":")[0] == rule, got
        assert got.startswith(f"{rule}: ") and "\n" not in got


def test_why_agrees_with_generate_counts():
    """why() over every point of the product generate considers gives its counts."""
    model, gpus, seq, gbs = spec("mixtral-8x7b"), 8, 4096, 8
    space = {"ep": [1, 2, 8], "etp": [1, 2], "vpp": [1, 2, 3], "mbs": [1, 2], "zero": 1,
             "recompute": "none", "sp": [True, False], "uneven": False}  # uneven rows: test_uneven_sweep.py
    cands = generate(model, gpus, seq, gbs, space)
    tally = Counter()
    valid = set(rows_of(cands))
    for (dp, tp, pp, cp), ep, etp, vpp, mbs, sched, sp in itertools.product(
            [w for w in itertools.product(divisors(gpus), repeat=4) if w[0] * w[1] * w[2] * w[3] == gpus],
            [1, 2, 8], [1, 2], [1, 2, 3], [1, 2], SCHEDULES, [True, False]):
        point = dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs, schedule=sched, sp=sp)
        reason = why(model, gpus, seq, gbs, space, point)
        tally[reason.split(":")[0] if reason else None] += 1
        assert (reason is None) == ((dp, tp, pp, cp, ep, etp, vpp, mbs, 1, "none", sched, sp) in valid), reason
    assert sum(tally.values()) == cands.generated
    assert tally.pop(None) == cands.valid
    assert tally == Counter({k: v for k, v in cands.rejected.items() if v})


def test_why_outside_space():
    model = spec("llama3-8b")
    assert why(model, 8, 4096, 64, {"tp": 8}, {"tp": 4}).startswith("space: tp=4")
    assert why(model, 8, 4096, 512, None, {"tp": 1, "mbs": 16}).startswith("space: mbs=16")
    # a missing dimension takes the space's fixed value
    assert why(model, 8, 4096, 64, {"tp": 8, "mbs": 4}, {}) is None


SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(name=st.sampled_from(catalog_names("models")), gpus=st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
       seq=st.sampled_from([1000, 2048, 4096]), gbs=st.sampled_from([1, 6, 32, 96, 512]))
def test_every_candidate_is_a_valid_strategy(name, gpus, seq, gbs):
    """All-auto space on a random catalog model: first, middle and last row of every
    group build a Strategy that passes .check(model, gpus); counts add up."""
    model = spec(name)
    cands = generate(model, gpus, seq, gbs)
    assert cands.generated == cands.valid + sum(cands.rejected.values())
    for g in cands.groups:
        for s, i in zip(group_strategies(model, g, seq, gbs, rows := sorted({0, len(g) // 2, len(g) - 1})), rows):
            s.check(model, gpus)
            assert s.m == g.grid["m"][i]


# ------------------------------------------------------------------ bad input

def test_load_space_reads_yaml(tmp_path):
    f = tmp_path / "space.yaml"
    f.write_text("tp: 8\npp: [1, 2, 4]\nrecompute: auto\nschedule: dualpipe-v\n")
    raw = load_space(f)
    assert raw["tp"] == 8
    norm = normalize_space(raw)
    assert norm["tp"] == (8,) and norm["pp"] == (1, 2, 4) and norm["recompute"] is None
    assert norm["schedule"] == ("dualpipev",) and norm["dp"] is None and set(norm) == set(DIMS)
    assert normalize_space(norm) == norm
    assert normalize_space({"pp": "1,2,4", "sp": "false", "recompute": ["full", "none"]})["pp"] == (1, 2, 4)


@pytest.mark.parametrize("text,field,words", [
    ("tp: [8\npp: 2\n", "space", ["malformed"]),
    ("- tp\n- pp\n", "space", ["mapping"]),
    ("tpp: 8\n", "space", ["tpp", "did you mean tp"]),
    ("gbs: 512\n", "space", ["--gbs"]),
    ("tp: -2\n", "tp", ["out of range 1..", "-2"]),
    ("schedule: foo\n", "schedule", ["foo", "1f1b"]),
    ("recompute: bar\n", "recompute", ["bar", "selective"]),
    ("zero: 5\n", "zero", ["0, 1, 2 or 3"]),
    ("sp: maybe\n", "sp", ["true or false"]),
    ("pp: []\n", "pp", ["empty"]),
    ("pp: [1, auto]\n", "pp", ["auto"]),
])
def test_load_space_errors(tmp_path, text, field, words):
    f = tmp_path / "space.yaml"
    f.write_text(text)
    with pytest.raises(NdplanError) as e:
        load_space(f)
    assert e.value.field == field and str(e.value).startswith(f"{field}=")
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("space,field,words", [
    ({"tp": 3}, "tp", ["tp=3", "does not divide --gpus 64", "1, 2, 4"]),
    ({"ep": [2, 6]}, "ep", ["ep=6", "does not divide --gpus 64"]),
    ({"tp": 8, "pp": 16, "cp": 2}, "gpus", ["no dp*tp*pp*cp"]),
    ({"mbs": 0}, "mbs", ["out of range 1..", "0"]),
])
def test_generate_errors(space, field, words):
    with pytest.raises(NdplanError) as e:
        generate(spec("llama3-70b"), 64, 4096, 512, space)
    assert e.value.field == field
    for w in words:
        assert w in str(e.value)


def test_why_point_errors():
    with pytest.raises(NdplanError, match="one value"):
        why(spec("llama3-8b"), 8, 4096, 64, None, {"tp": [1, 2]})
    with pytest.raises(NdplanError, match="did you mean"):
        why(spec("llama3-8b"), 8, 4096, 64, None, {"tpp": 2})
    with pytest.raises(NdplanError, match="gbs="):
        generate(spec("llama3-8b"), 8, 4096, 0)


@pytest.mark.parametrize("gbs,ok", [(4, True), (8, True), (6, False), (5, False), (2, False)])
def test_interleaved_needs_m_a_multiple_of_pp(gbs, ok):
    """Megatron-core's interleaved schedule runs micro-batches in groups of
    microbatch_group_size_per_vp_stage (default pp) and refuses a last group smaller
    than pp (schedules.py, forward_backward_pipelining_with_interleaving), so with the
    default m must be a multiple of pp: pp = 4, dp = mbs = 1, m = gbs."""
    def make():
        return ndplan.Strategy(dp=1, tp=1, pp=4, vpp=2, gbs=gbs, schedule="interleaved")
    if ok:
        assert make().m == gbs
    else:
        with pytest.raises(NdplanError, match="multiple of pp=4"):
            make()


def test_sp_reads_on_and_off_as_labels_print_it():
    """labels.py prints sp=off; a pasted label must read back (space values true/false, on/off)."""
    assert normalize_space({"sp": "off"})["sp"] == (False,)
    assert normalize_space({"sp": ["on", "false"]})["sp"] == (True, False)
    with pytest.raises(NdplanError, match="on or off"):
        normalize_space({"sp": "maybe"})


def test_duplicate_names_the_field_that_duplicates():
    """tp=1 with sp off duplicates sp on: the reason names sp, not the schedule."""
    got = why(spec("llama3-8b"), 8, 4096, 64, {"sp": [True, False]}, {"tp": 1, "sp": False})
    assert got.startswith("duplicate: sp=False: tp=1 makes sequence parallelism a no-op"), got


def test_pipeline_and_strategy_share_the_schedule_rules():
    """PPB's Pipeline refuses what Strategy refuses (rules.py): virtual chunks without a
    pipeline, zbv without its two chunks, interleaved with m not a multiple of pp."""
    from ndplan.ppb.instance import Pipeline
    for kw, field in ((dict(pp=1, vpp=2, m=4, schedule="interleaved"), "vpp"),
                      (dict(pp=2, vpp=1, m=4, schedule="zbv"), "vpp"),
                      (dict(pp=2, vpp=2, m=3, schedule="interleaved"), "m")):
        with pytest.raises(NdplanError, match=f"^{field}="):
            Pipeline(budget_bytes=1e9, **kw)
        with pytest.raises(NdplanError):
            Strategy(pp=kw["pp"], vpp=kw["vpp"], gbs=kw["m"], schedule=kw["schedule"])


def test_a_deepspeed_sweep_holds_what_deepspeed_runs():
    """engine=deepspeed: the candidates are the brute-force oracle's (each Strategy(engine=
    "deepspeed") refuses what DeepSpeed refuses), and, written out here from DeepSpeed 0.19.8's
    code (runtime/pipe/engine.py:76-77 and 500-501, module_inject/layers.py:215-225): no pipeline
    schedule but 1F1B with one chunk, no ZeRO-2/3 with a pipeline, no sequence parallelism with
    AutoTP; the sweep of the same space under Megatron-FSDP (every ZeRO level with a pipeline,
    MEGATRON_ZERO) holds all of them and more."""
    model, gpus, seq, gbs = spec("llama3-8b"), 8, 4096, 16
    space = {"mbs": [1, 2], "sp": [True, False], "zero": [0, 1, 2, 3], "recompute": "none", "uneven": False}
    dom = {"etp": [1], "vpp": range(1, 33), "mbs": [1, 2], "zero": [0, 1, 2, 3], "recompute": ["none"],
           "schedule": SCHEDULES, "sp": [True, False]}
    cands = generate(model, gpus, seq, gbs, space, engine="deepspeed")
    rows = set(rows_of(cands))
    assert rows == oracle(model, gpus, seq, gbs, dom, engine="deepspeed")
    assert cands.generated == cands.valid + sum(cands.rejected.values())
    for dp, tp, pp, cp, ep, etp, vpp, mbs, zero, rec, sched, sp in rows:
        assert pp == 1 or (sched == "1f1b" and vpp == 1 and zero <= 1)
        assert tp == 1 or not sp
    megatron = generate(model, gpus, seq, gbs, space, engine="megatron[megatron_fsdp=1]")
    assert rows < set(rows_of(megatron))
    assert cands.rejected["engine"] - megatron.rejected["engine"] == megatron.valid - cands.valid > 0


def test_a_mindspore_sweep_holds_what_mindformers_runs():
    """engine=mindspore on a MoE model: the candidates are the brute-force oracle's, and, written
    out here from mindspore-lab/mindformers@f52743ca: no one-chunk zero bubble (MindSpore's
    pipeline_scheduler values are 1f1b, gpipe, seqpipe, seqvpp, seqsmartvpp, zero_bubble_v);
    zero_bubble_v with micro_batch_num >= 2 x stages (parallel_core/transformer_config.py:714-732);
    a MoE layer with tp > 1 only under sequence parallelism (moe/moe_layer.py:142-147); ep divides
    dp x tp (moe/ffn.py:185-195). The candidates of the same space without engine rules hold all of
    them and more."""
    model, gpus, seq, gbs = spec("mixtral-8x7b"), 16, 4096, 32
    space = {"mbs": [1, 2], "sp": [True, False], "zero": 1, "recompute": "none", "uneven": False, "etp": 1}
    dom = {"etp": [1], "vpp": [1, 2, 4], "mbs": [1, 2], "zero": [1], "recompute": ["none"],
           "schedule": SCHEDULES, "sp": [True, False]}
    cands = generate(model, gpus, seq, gbs, space | {"vpp": [1, 2, 4]}, engine="mindspore")
    rows = set(rows_of(cands))
    assert rows == oracle(model, gpus, seq, gbs, dom, engine="mindspore")
    for dp, tp, pp, cp, ep, etp, vpp, mbs, zero, rec, sched, sp in rows:
        m = gbs // (dp * mbs)
        assert pp == 1 or sched != "zb-h1"
        assert sched != "zbv" or m >= 2 * pp
        assert tp == 1 or sp
        assert dp * tp % ep == 0
    unruled = oracle(model, gpus, seq, gbs, dom, megatron_schedules=False)
    assert rows < unruled
    for row in unruled - rows:  # each row the mindspore sweep drops breaks one of the four
        dp, tp, pp, cp, ep, etp, vpp, mbs, zero, rec, sched, sp = row
        m = gbs // (dp * mbs)
        assert (pp > 1 and sched == "zb-h1") or (sched == "zbv" and m < 2 * pp) or (tp > 1 and not sp) \
            or dp * tp % ep != 0, row
    assert why(model, gpus, seq, gbs, None, {"tp": 2, "sp": False, "ep": 8}, engine="mindspore").startswith(
        "engine: sp=False")
    assert why(model, gpus, seq, gbs, None, {"dp": 2, "cp": 8, "ep": 4}, engine="mindspore").startswith("engine: ep=4")


def test_why_names_the_engine_rule_and_defaults_sp_off_for_deepspeed_tp():
    model, gpus, seq, gbs = spec("llama3-8b"), 8, 4096, 16
    assert why(model, gpus, seq, gbs, None, {"tp": 2}, engine="deepspeed") is None  # sp defaults off
    assert why(model, gpus, seq, gbs, None, {"tp": 2, "sp": True}, engine="deepspeed").startswith("engine: sp=True")
    assert why(model, gpus, seq, gbs, None, {"pp": 2, "zero": 3}, engine="deepspeed").startswith("engine: zero=3")
    assert "--use-torch-fsdp2 is not supported with pipeline parallelism" in why(
        model, gpus, seq, gbs, None, {"pp": 2, "zero": 3})  # MEGATRON_ZERO
    assert why(model, gpus, seq, gbs, None, {"pp": 2, "zero": 3}, engine="megatron[megatron_fsdp=1]") is None
    assert ndplan.strategy_from_point({"tp": 2, "engine": "deepspeed"}, 8).sp is False
    assert ndplan.strategy_from_point({"tp": 2}, 8).sp is True


def test_the_deepspeed_rules_are_in_deepspeeds_code():
    """The lines rules.py cites, in the DeepSpeed the CI installs (read as text: no import)."""
    import importlib.util
    from pathlib import Path
    found = importlib.util.find_spec("deepspeed")
    if found is None:
        pytest.skip("DeepSpeed is not installed (a CI extra)")
    root = Path(found.origin).parent
    engine = (root / "runtime/pipe/engine.py").read_text()
    assert '"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"' in engine
    train = engine[engine.index("def _train_schedule"):]
    assert train[:train.index("\n    def ", 10)].count("schedule.TrainSchedule(") == 1
    layers = (root / "module_inject/layers.py").read_text()
    row = layers[layers.index("class RowParallel"):]
    row = row[:row.index("\nclass ")]
    assert "all_reduce" in row and "reduce_scatter" not in row


def test_an_fsdp_sweep_has_no_one_chunk_zero_bubble_pipeline():
    """torch.distributed.pipelining (what torchtitan and FSDP2 users run) has no zb-h1: an fsdp
    sweep keeps zb-h1 only at pp = 1, and the schedule names torch 2.13 knows (read as text from
    the installed torch) have no one-chunk zero-bubble entry."""
    import importlib.util
    import re
    from pathlib import Path
    model, gpus, seq, gbs = spec("llama3-8b"), 8, 4096, 16
    space = {"mbs": 1, "zero": 1, "recompute": "none", "uneven": False}
    fsdp = generate(model, gpus, seq, gbs, space, engine="fsdp")
    assert all(not (r[2] > 1 and r[10] == "zb-h1") for r in rows_of(fsdp))
    assert fsdp.rejected["engine"] > 0
    assert {r[10] for r in rows_of(generate(model, gpus, seq, gbs, space)) if r[2] > 1} == set(MEGATRON_SCHEDULES)
    assert why(model, gpus, seq, gbs, space, {"pp": 2, "schedule": "zb-h1"}, engine="fsdp").startswith("engine:")
    found = importlib.util.find_spec("torch")
    if found is None:
        pytest.skip("torch is not installed (a CI extra)")
    text = (Path(found.submodule_search_locations[0]) / "distributed/pipelining/schedules.py").read_text()
    body = text[text.index("def get_schedule_class"):]
    names = set(re.findall(r'"(\w+)": Schedule', body[:body.index("}")]))
    assert names >= {"1F1B", "GPipe", "Interleaved1F1B", "ZBVZeroBubble"}
    assert not any("ZeroBubble" in n and n not in ("ZBVZeroBubble", "InterleavedZeroBubble") for n in names)


def test_the_sweeps_hold_the_framework_rules_the_exports_hold():
    """Engine rules of scope engine_sweep, written out here from the frameworks' code: a deepspeed
    sweep of a MoE model keeps ep > 1 only where DeepSpeed 0.19.8's AutoEP runs it (one stage,
    module_inject/auto_ep_presets via model.layers.N.mlp; AutoTP folding only at pp 1 without
    Ulysses, auto_ep_folding.py:206-212; ZeRO-3 without Ulysses, runtime/engine.py:2219-2221); a
    megatron sweep (no Megatron-FSDP) has no zero 2 and zero 3 only at pp 1 / ep 1 / untied
    (arguments.py:1031-1045); an fsdp (torchtitan) sweep of a MoE model splits the experts over tp
    when ep is 1 (v0.2.0 models/llama4/infra/parallelize.py:489-490). Every candidate of each sweep
    is emitted by that framework's exporter without a refusal."""
    from ndplan.export import emit
    model, gpus, seq, gbs = spec("mixtral-8x7b"), 16, 4096, 32
    space = {"mbs": 1, "zero": [1, 2, 3], "recompute": "full", "uneven": False, "vpp": 1, "schedule": "1f1b"}
    for engine, fmt in (("deepspeed", "deepspeed"), ("megatron", "megatron"), ("fsdp", "torchtitan")):
        cands = generate(model, gpus, seq, gbs, space | ({"sp": False} if engine == "deepspeed" else {}), engine=engine)
        rows = rows_of(cands)
        assert rows, engine
        for dp, tp, pp, cp, ep, etp, vpp, mbs, zero, rec, sched, sp in rows:
            if engine == "deepspeed" and ep > 1:
                assert pp == 1 and etp == 1 and not (tp > 1 and cp > 1) and not (zero == 3 and cp > 1)
            if engine == "megatron":
                assert zero != 2 and (zero < 3 or (pp == 1 and ep == 1))
            if engine == "fsdp":
                assert etp == (tp if ep == 1 else etp) and etp in (1, tp)
        for dp, tp, pp, cp, ep, etp, vpp, mbs, zero, rec, sched, sp in rows[::max(1, len(rows) // 40)]:
            s = Strategy(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, mbs=mbs, gbs=gbs, seq=seq, zero=zero,
                         recompute=rec, schedule=sched, sp=sp, engine=engine)
            emit(fmt, model, s)  # raises NdplanError if the framework's exporter refuses it
