"""DeepSpeed config JSON (issue #14): every key read, modelled or stated in a note, the rest
listed as not used; ZeRO-3's gathered parameters as DeepSpeed's coordinator keeps them; key
lines in any JSON layout; MoE and pipeline recipes read as DeepSpeed runs them.

Expected values are derived by hand from DeepSpeed 0.19.8's code (the release CI installs;
paths relative to the ``deepspeed`` package) or from the upstream recipe they imitate, each
derivation written next to its number; none is copied from ndplan's output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import ndplan
from ndplan.catalog.hardware import load_hardware
from ndplan.cli import main
from ndplan.errors import NdplanError
from ndplan.estimate import estimate
from ndplan.interop import read_config
from ndplan.interop.textedit import REMOVE, json_edit, json_locate

RECIPES = Path(__file__).parent / "data" / "recipes"
H100 = "h100-sxm"

# Llama-3.1-8B (models/llama3-8b.yaml, HF meta-llama/Meta-Llama-3-8B config.json): h 4096, V 128256
LLAMA3_8B_HEAD = 128256 * 4096  # 525,336,576 elements of lm_head
GPT3_LAYER = 12 * 12288**2 + 13 * 12288
"""GPT-3 175B layer (h 12288, f 4h, biases and two LayerNorms; Brown et al. 2020 Table 2.1):
qkv 3h^2 + 3h, o h^2 + h, fc1 4h^2 + 4h, fc2 4h^2 + h, LayerNorms 2 x 2h = 12h^2 + 13h."""
GPT3_EMBEDDING = 50257 * 12288  # tied embedding / output layer


def _write(tmp_path: Path, doc_or_text, name="ds.json") -> Path:
    p = tmp_path / name
    p.write_text(doc_or_text if isinstance(doc_or_text, str) else json.dumps(doc_or_text, indent=2))
    return p


def _gather(ci, model=None) -> int:
    """mem.zero3_gather of stage 0 of the strategy read."""
    est = estimate(ci.model if model is None else model, load_hardware(H100), ci.strategy)
    return est.per_stage[0]["terms"].get("mem.zero3_gather", 0)


def _gather_of(model: str, **kw) -> int:
    s = ndplan.Strategy(**({"gbs": 64, "mbs": 1, "seq": 4096, "engine": "deepspeed"} | kw))
    est = estimate(ndplan.load_model(model), load_hardware(H100), s)
    return est.per_stage[0]["terms"].get("mem.zero3_gather", 0)


# --------------------------------------------------------------------------- key lines in any layout

AUDIT_DS2 = ('{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},\n'
             ' "zero_optimization": {"stage": 3,\n'
             '   "overlap_comm": true}}\n')
"""/tmp/aud/ds2.json of the #14 audit: members share lines, an object opens mid-line."""
AUDIT_DS3 = ('{"train_batch_size": 64,\n'
             ' "train_micro_batch_size_per_gpu": 1,\n'
             ' "zero_optimization": {\n'
             '   "stage": 3\n'
             ' }\n'
             '}\n')
"""/tmp/aud/ds3.json of the #14 audit: the first member on the opening brace's line."""

LAYOUTS = {  # name: (text, {dotted key: 0-based line}), lines counted by hand in the text
    "audit-ds2": (AUDIT_DS2, {"train_batch_size": 0, "train_micro_batch_size_per_gpu": 0, "bf16": 0,
                              "bf16.enabled": 0, "zero_optimization": 1, "zero_optimization.stage": 1,
                              "zero_optimization.overlap_comm": 2}),
    "audit-ds3": (AUDIT_DS3, {"train_batch_size": 0, "train_micro_batch_size_per_gpu": 1, "zero_optimization": 2,
                              "zero_optimization.stage": 3}),
    "one-line": ('{"a":{"b":{"c":1}},"d":[{"e":2},[3]],"f":"x\\"}{","g":{}}',
                 {"a": 0, "a.b": 0, "a.b.c": 0, "d": 0, "f": 0, "g": 0}),
    "crlf": ('{\r\n "a": 1,\r\n "b": {\r\n  "c": 2\r\n }\r\n}\r\n', {"a": 1, "b": 2, "b.c": 3}),
    "array-over-lines": ('{"betas": [\n  0.9,\n  0.999\n],\n "eps": 1e-8, "x": {"y":\n\n   null}}',
                         {"betas": 0, "eps": 4, "x": 4, "x.y": 4}),
    "duplicate-last-wins": ('{"a": 1,\n "a": 2}', {"a": 1}),  # json.loads keeps the last value
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_json_locate_any_layout(name):
    text, want = LAYOUTS[name]
    json.loads(text)  # each layout is valid JSON
    got = json_locate(text)
    assert {k: v[0] for k, v in got.items()} == want
    # a member inside an array has no dotted key ("d": [{"e": 2}]) and is not listed
    assert "d.e" not in got


def test_json_locate_columns_and_closing_lines():
    """(line, column of the key's quote, closing line of an object value): AUDIT_DS2 by hand."""
    got = json_locate(AUDIT_DS2)
    assert got["train_batch_size"] == (0, 1, -1)
    assert got["train_micro_batch_size_per_gpu"] == (0, len('{"train_batch_size": 64, '), -1)
    assert got["zero_optimization"] == (1, 1, 2)  # opens on line 1, closes on line 2
    assert got["zero_optimization.overlap_comm"] == (2, 3, -1)


@pytest.mark.parametrize("text", ['{"a": 1,}', '{"a" 1}', '{"a": tru}', '{"a": 1} x', '{"a": "b\n"}', ""])
def test_json_locate_refuses_invalid_json(text):
    assert json_locate(text) is None


@pytest.mark.parametrize("text,lines", [
    (AUDIT_DS2, {"zero": 2, "mbs": 1, "gbs": 1}),
    (AUDIT_DS3, {"zero": 4, "mbs": 2, "gbs": 1}),
])
def test_deepspeed_origins_in_any_layout(tmp_path, text, lines):
    """The `from:` origins name the line of each key the file sets, in 1-based lines."""
    ci = read_config(_write(tmp_path, text), model="llama3-8b", gpus=8, seq=4096)
    key = {"zero": "zero_optimization.stage", "mbs": "train_micro_batch_size_per_gpu", "gbs": "train_batch_size"}
    for f, n in lines.items():
        assert ci.origin[f] == f"line {n}: {key[f]}"
    # gas is not in the file: DeepSpeed derives it (runtime/config.py:619-622: 64 // 1 // 8 = 8)
    assert ci.strategy.m == 8 and "DeepSpeed's rule" in ci.origin["m"]


@pytest.mark.parametrize("name", ["ds2.json", "ds3.json"])
def test_deepspeed_origins_on_the_audit_files(name):
    """The audit's own files, when this machine still has them."""
    path = Path("/tmp/aud") / name
    if not path.exists():
        pytest.skip(f"{path} is not on this machine (its text is AUDIT_DS2 / AUDIT_DS3 above)")
    ci = read_config(path, model="llama3-8b", gpus=8, seq=4096)
    assert ci.origin["zero"].startswith("line ") and ci.origin["mbs"].startswith("line ")


def test_json_edit_in_any_layout(tmp_path):
    """Proposals edit the file where it stands: a value is replaced in place in any layout, a new key
    goes first in its object; every other character of the file is kept."""
    out = json_edit(AUDIT_DS2, {"zero_optimization.stage": 2})
    assert out == AUDIT_DS2.replace('{"stage": 3,', '{"stage": 2,')
    out = json_edit(AUDIT_DS3, {"zero_optimization.overlap_comm": True, "gradient_accumulation_steps": 8})
    assert json.loads(out) == json.loads(AUDIT_DS3) | {"gradient_accumulation_steps": 8, "zero_optimization": {
        "stage": 3, "overlap_comm": True}}
    assert out.splitlines()[:2] == ['{"gradient_accumulation_steps": 8, "train_batch_size": 64,',
                                    ' "train_micro_batch_size_per_gpu": 1,']
    per_line = json.dumps({"a": 1, "b": {"c": 2}}, indent=2)
    assert json_edit(per_line, {"b.c": 3}).splitlines()[3] == '    "c": 3'
    # a key inside an object written on one line of a one-member-per-line file (the line editor
    # alone wrote it after the object, invalid JSON)
    text = (RECIPES / "deepspeed_autotp_zero2.json").read_text()
    out = json_edit(text, {"zero_optimization.stage": 3, "zero_optimization.overlap_comm": True})
    assert json.loads(out)["zero_optimization"] == {"stage": 3, "overlap_comm": True}
    assert out.replace('{"overlap_comm": true, "stage": 3}', '{"stage": 2}') == text
    # removing keys from a compact layout re-serialises, with the same content
    want = {k: v for k, v in json.loads(AUDIT_DS2).items() if k != "bf16"}
    assert json.loads(json_edit(AUDIT_DS2, {"bf16.enabled": REMOVE})) == want


# --------------------------------------------------------------------------- ZeRO-3 gathered parameters

def test_zero3_gather_at_deepspeed_defaults():
    """Llama-3-8B, tp 1, dp 8, no recompute, DeepSpeed's defaults (zero/config.py:222, 245, 251: prefetch
    5e7, max live 1e9, reuse 1e9). At the forward/backward turn lm_head (525,336,576 elements) is in use
    and kept (reused at distance 0, partitioned_param_coordinator.py:653-662); kept = max(H, R/2 = 5e8) =
    525,336,576. The prefetch tops the gathered elements up to max live (min(1e9 - n_available, 5e7) per
    fetch, :452-485): gathered = 1e9, the bucket in use b = min(5e7, 1e9 - kept) = 5e7, whose coalesced
    buffer stays beside its parameters (partition_parameters.py:1329-1370, 786-796): 2 B x 1e9 + 2 B x 5e7."""
    assert _gather_of("llama3-8b", dp=8, zero=3) == 2 * 10**9 + 2 * 5 * 10**7


@pytest.mark.parametrize("settings,want", [
    # qwZ: the look-ahead (1e9 - 525,336,576) is int8 (1 B), the bucket in use adds its dequantized flat
    # tensor and its parameters (4 B more), the head 2 B (partition_parameters.py:1479-1537, 761-796)
    ("zero3_quantized_weights=1", 2 * LLAMA3_8B_HEAD + (10**9 - LLAMA3_8B_HEAD) + 4 * 5 * 10**7),
    # prefetch 0: no prefetch at all (:452, ``if self.__prefetch_bucket_sz > 0``): the head only
    ("zero3_prefetch_elements=0", 2 * LLAMA3_8B_HEAD),
    # max live 3e8 < kept: min(3e8 - 525,336,576, 5e7) < 0 prefetches nothing (:453-457)
    ("zero3_live_elements=300000000", 2 * LLAMA3_8B_HEAD),
    # reuse 3e9: kept = R/2 = 1.5e9 > max live, so nothing is prefetched: 2 B x 1.5e9
    ("zero3_reuse_elements=3000000000", 2 * 1_500_000_000),
    # max live 3e9, prefetch 5e8, qwZ (the audit's ds.json): 2 x head + (3e9 - head) + 4 x 5e8
    ("zero3_live_elements=3000000000,zero3_prefetch_elements=500000000,zero3_quantized_weights=1",
     2 * LLAMA3_8B_HEAD + (3 * 10**9 - LLAMA3_8B_HEAD) + 4 * 5 * 10**8),
])
def test_zero3_gather_budgets(settings, want):
    assert _gather_of("llama3-8b", dp=8, zero=3, engine=f"deepspeed[{settings}]") == want


def test_zero3_gather_tp_halves_the_head():
    """AutoTP tp 2: lm_head is 262,668,288 elements on a rank, under R/2, so the modules within
    5e8 elements of the forward's end are kept (kept = 5e8); gathered 1e9, bucket 5e7."""
    assert _gather_of("llama3-8b", dp=4, tp=2, sp=False, zero=3) == 2 * 10**9 + 2 * 5 * 10**7


def test_zero3_gather_full_recompute_gathers_a_layer():
    """GPT-3 175B (tied embedding 617,558,016 elements, layer 1,812,099,072): under full recompute a
    layer's recomputed forward gathers it whole for its backward, above max live 1e9, so nothing is
    prefetched: 2 B x one layer. Without recompute the tied head is kept (> R/2) and the prefetch fills to
    1e9: 2 B x 1e9 + 2 B x 5e7."""
    kw = {"dp": 64, "gbs": 64, "mbs": 1, "seq": 2048, "zero": 3}
    assert _gather_of("gpt3-175b", recompute="full", **kw) == 2 * GPT3_LAYER
    assert _gather_of("gpt3-175b", **kw) == 2 * 10**9 + 2 * 5 * 10**7


def test_zero3_gather_without_data_parallel_is_zero():
    assert _gather_of("llama3.2-1b", dp=1, gbs=8, zero=3) == 0


def test_zero3_gather_older_layer_model_still_available():
    """deepspeed[zero3_param_coordinator=0] keeps the generic model (gather_prefetch_layers = 2 layers):
    2 x 218,112,000 Llama-3-8B layer elements x 2 B (q 4096^2, k/v 4096x1024 each, o 4096^2, MLP
    3 x 4096 x 14336, two norms 2 x 4096)."""
    layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert layer == 218_112_000
    assert _gather_of("llama3-8b", dp=8, zero=3, engine="deepspeed[zero3_param_coordinator=0]") == 2 * 2 * layer


ZERO3_KEYS = {"stage": 3, "stage3_max_live_parameters": 3e9, "stage3_prefetch_bucket_size": 5e8,
              "stage3_max_reuse_distance": 2e9, "stage3_param_persistence_threshold": 1e6,
              "zero_quantized_weights": True, "zero_quantized_gradients": True}


def test_zero3_keys_are_modelled_or_noted(tmp_path):
    """Each ZeRO-3 / ZeRO++ key of the issue is modelled (an engine setting) or read and stated in a
    note that says "read, not modelled"; none is silent or listed as not used."""
    doc = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
           "zero_optimization": ZERO3_KEYS}
    ci = read_config(_write(tmp_path, doc), model="llama3-8b", gpus=16, seq=4096)
    eng = ndplan.engines.profile(ci.strategy.engine)
    assert (eng.zero3_live_elements, eng.zero3_prefetch_elements, eng.zero3_reuse_elements) == (3e9, 5e8, 2e9)
    assert eng.zero3_quantized_weights
    noted = {k: [n for n in ci.notes if n.startswith(f"zero_optimization.{k}")]
             for k in ("zero_quantized_gradients", "stage3_param_persistence_threshold")}
    assert all(len(v) == 1 and "read, not modelled" in v[0] for v in noted.values()), noted
    assert not ci.unknown
    # the Term follows the file: kept = max(head, 2e9 / 2 = 1e9) = 1e9, gathered 3e9, bucket 5e8, qwZ
    assert _gather(ci) == 2 * 10**9 + (3 * 10**9 - 10**9) + 4 * 5 * 10**8


def test_zero3_keys_below_stage_3_are_said_unused(tmp_path):
    doc = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
           "zero_optimization": ZERO3_KEYS | {"stage": 2}}
    ci = read_config(_write(tmp_path, doc), model="llama3-8b", gpus=16, seq=4096)
    note = next(n for n in ci.notes if "ZeRO-3 settings, unused at stage 2" in n)
    assert all(k in note for k in ZERO3_KEYS if k != "stage")
    assert not ci.unknown


def test_persistence_threshold_counts_what_stays_whole(tmp_path):
    """mark_persistent_parameters (parameter_offload.py:317-335) keeps parameters of at most the
    threshold elements whole. Llama-3-8B at tp 1: only the 2 x 32 + 1 = 65 RMSNorm weights (4,096
    each, 266,240 elements) are under 1e6; under 5e6 the 2 x 32 k/v projections (4,096 x 1,024 =
    4,194,304) join them: 129 parameters, 266,240 + 64 x 4,194,304 = 268,701,696 elements."""
    for threshold, count, elements in ((1e6, 65, 266_240), (5e6, 129, 268_701_696)):
        doc = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
               "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": threshold}}
        ci = read_config(_write(tmp_path, doc), model="llama3-8b", gpus=16, seq=4096)
        note = next(n for n in ci.notes if n.startswith("zero_optimization.stage3_param_persistence_threshold"))
        assert f"here {count:,} (" in note and f"{elements:,} elements" in note
    # "auto": the Hugging Face Trainer's 10 x hidden_size = 40,960 (transformers 5.17.0
    # integrations/deepspeed.py:236-239), which again keeps the 65 norms only
    ci = read_config(RECIPES / "deepspeed_hf_auto_zero3.json", model="llama3-8b", gpus=8, seq=4096, gbs=64)
    assert any("40,960: read, not modelled" in n and "here 65 (" in n for n in ci.notes)


def test_hf_auto_prefetch_is_the_trainers_fill():
    """transformers 5.17.0 integrations/deepspeed.py:232-235: int(0.9 x 4096^2) = 15,099,494."""
    ci = read_config(RECIPES / "deepspeed_hf_auto_zero3.json", model="llama3-8b", gpus=8, seq=4096, gbs=64)
    assert ndplan.engines.profile(ci.strategy.engine).zero3_prefetch_elements == int(0.9 * 4096 * 4096) == 15_099_494


def test_contiguous_gradients_off_allocates_no_bucket(tmp_path):
    """ZeRO-2 without contiguous_gradients (and without offload) allocates no reduce bucket:
    stage_1_and_2.py:300 (contiguous_gradients or cpu_offload), 3260-3278."""
    base = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
    on = read_config(_write(tmp_path, base), model="llama3-8b", gpus=8, seq=4096)
    off = read_config(_write(tmp_path, base | {"zero_optimization": {"stage": 2, "contiguous_gradients": False}}),
                      model="llama3-8b", gpus=8, seq=4096)
    terms = lambda ci: estimate(ci.model, load_hardware(H100), ci.strategy).per_stage[0]["terms"]  # noqa: E731
    assert terms(on)["mem.reduce_buckets"] == 2 * 500_000_000  # the 5e8 default bucket, 16-bit
    assert terms(off).get("mem.reduce_buckets", 0) == 0


def test_unknown_keys_are_listed_not_silent(tmp_path):
    """Keys the reader does not read are listed (a whole unread section as "section.*"); comment keys
    starting with "_" are not."""
    doc = {"_comment": "x", "train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
           "zero_optimization": {"stage": 1, "a_new_knob": 1}, "flops_profiler": {"enabled": True, "detailed": True},
           "wall_clock_breakdown": False}
    ci = read_config(_write(tmp_path, doc), model="llama3-8b", gpus=8, seq=4096)
    assert set(ci.unknown) == {"zero_optimization.a_new_knob", "flops_profiler.*", "wall_clock_breakdown"}
    args = ["check", str(tmp_path / "ds.json"), "-m", "llama3-8b", "--gpus", "8", "--seq", "4096"]
    r = CliRunner().invoke(main, args)
    assert "not used: " in r.output and "zero_optimization.a_new_knob" in r.output


@pytest.mark.parametrize("key,value,field", [
    ("stage3_max_live_parameters", -1, "zero_optimization.stage3_max_live_parameters"),
    ("stage3_max_live_parameters", "auto", "zero_optimization.stage3_max_live_parameters"),
    ("stage3_prefetch_bucket_size", "lots", "zero_optimization.stage3_prefetch_bucket_size"),
    ("zero_quantized_weights", "yes", "zero_optimization.zero_quantized_weights"),
    ("stage3_param_persistence_threshold", 1.5, "zero_optimization.stage3_param_persistence_threshold"),
])
def test_bad_zero3_values_are_one_line_errors(tmp_path, key, value, field):
    doc = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, key: value}}
    path = _write(tmp_path, doc)
    with pytest.raises(NdplanError) as e:
        read_config(path, model="llama3-8b", gpus=8, seq=4096)
    assert e.value.field == field
    r = CliRunner().invoke(main, ["check", str(path), "-m", "llama3-8b", "--gpus", "8", "--seq", "4096"])
    assert r.exit_code == 2 and field in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_zero3_budgets_emit_and_read_back(tmp_path, monkeypatch):
    """The emitted JSON carries the budgets and qwZ; DeepSpeed's own config class parses them
    (zero/config.py aliases stage3_*) and the reader gives the same engine back."""
    C = pytest.importorskip("deepspeed.runtime.config")
    eng = "deepspeed[zero3_live_elements=300000000,zero3_prefetch_elements=20000000,zero3_quantized_weights=1,"\
          "zero3_reuse_elements=400000000]"
    s = ndplan.Strategy(dp=8, gbs=32, mbs=1, seq=4096, zero=3, engine=eng)
    text = ndplan.export.emit("deepspeed", ndplan.load_model("llama3-8b"), s)
    monkeypatch.setattr(C.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(C.dist, "get_world_size", lambda *a, **k: 8)
    z = C.DeepSpeedConfig(json.loads(text)).zero_config
    assert (z.max_live_parameters, z.prefetch_bucket_size, z.max_reuse_distance, z.zero_quantized_weights) == \
        (300_000_000, 20_000_000, 400_000_000, True)
    ci = read_config(_write(tmp_path, text), model="llama3-8b", gpus=8, seq=4096)
    assert ci.strategy.engine == eng


# --------------------------------------------------------------------------- MoE and pipeline recipes

def _deepspeed_config(path: Path, world: int, monkeypatch, drop=()):
    """DeepSpeed's own config class on a fixture (less its comment and the ``drop`` keys), with
    ``world`` data-parallel ranks (runtime/config.py:457-471: the mpu's data-parallel world under the
    pipeline engine, else dist.get_world_size())."""
    C = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(C.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(C.dist, "get_world_size", lambda *a, **k: world)
    doc = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_") and k not in drop}
    return C.DeepSpeedConfig(doc)


def test_deepspeed_moe_recipe(monkeypatch):
    """Megatron-DeepSpeed's 1.3B MoE-128 recipe (fixture header) on its 64 GPUs, read with a catalog MoE
    model. No tensor/pipeline/sequence keys: tp = pp = cp = 1, dp = 64. DeepSpeed's batch rule
    (runtime/config.py:617-622, 602): gas = 512 // 8 // 64 = 1. zero 0 (the template's ZERO_STAGE sed
    to 0) with fp16 (FP16_Optimizer, engine.py:2313-2321). The experts' parallel degree (64) is
    --moe-expert-parallel-size in the script, MoE(ep_size=...) in code (moe/layer.py:42): ep 1 and a
    note. --checkpoint-activations is on the command line: recompute none, and the origin says so."""
    path = RECIPES / "deepspeed_moe_gpt_1.3b_moe128.json"
    ci = read_config(path, model="mixtral-8x7b", gpus=64, seq=2048)
    s = ci.strategy
    assert (s.tp, s.pp, s.cp, s.dp, s.ep) == (1, 1, 1, 64, 1)
    assert (s.mbs, s.gbs, s.m, s.zero, s.recompute) == (8, 512, 1, 0, "none")
    assert any("MoE(ep_size=...)" in n for n in ci.notes)
    assert "not visible in the JSON" in ci.origin["recompute"]
    assert ci.origin["gbs"] == "line 3: train_batch_size" and ci.origin["zero"] == "line 8: zero_optimization.stage"
    # keys with no effect on memory are listed, not silently dropped
    assert {"steps_per_print", "gradient_clipping", "prescale_gradients", "wall_clock_breakdown"} <= set(ci.unknown)
    assert not {"fp16.enabled", "bf16.enabled", "train_batch_size"} & set(ci.unknown)
    # DeepSpeed 0.19.8 refuses the legacy top-level curriculum_learning block (runtime/config.py:111-114,
    # 133-137): the reader says so and estimates the rest
    assert any(n.startswith("curriculum_learning: removed from DeepSpeed") for n in ci.notes)
    C = pytest.importorskip("deepspeed.runtime.config")
    with pytest.raises(C.DeepSpeedConfigError, match="curriculum_learning"):
        _deepspeed_config(path, 64, monkeypatch)
    c = _deepspeed_config(path, 64, monkeypatch, drop=("curriculum_learning",))
    assert (c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) == (512, 8, 1)
    assert (c.zero_optimization_stage, c.float16_config.enabled, c.bfloat16_config.enabled) == (0, True, False)


def test_removed_keys_are_deepspeeds():
    """The reader's list of removed keys is DeepSpeed 0.19.8's own (runtime/config.py:81-131)."""
    C = pytest.importorskip("deepspeed.runtime.config")
    from ndplan.interop.deepspeed import REMOVED_KEYS
    want = set(C._REMOVED_TOP_LEVEL_CONFIG_KEYS) | {f"zero_optimization.{k}" for k in C._REMOVED_ZERO_CONFIG_KEYS}
    assert set(REMOVED_KEYS) == want


def test_deepspeed_pipeline_recipe(monkeypatch):
    """DeepSpeedExamples' pipeline recipe (fixture header) on dp 4 x pp 2 = 8 GPUs. pp 2 from
    pipeline.stages (with the note that DeepSpeed takes it from PipelineModule(num_stages=...),
    runtime/pipe/module.py:127-142); dp = 8 / 2 = 4 (the pipeline grid's data-parallel world,
    runtime/config.py:463); gas = 256 // 16 // 4 = 4 (runtime/config.py:617-622). ZeRO stage 0 with a
    bf16 model under the pipeline engine and bf16 accumulation (the default, engine.py:1806-1807) builds
    BF16_Optimizer (engine.py:582, 2313-2320): fp32 master and Adam states sharded over dp (ZeRO-1,
    bf16_optimizer.py:170-183) and a bf16 gradient buffer of the whole model (:190-191) beside the
    bf16 .grad (immediate_grad_update off, precision_config.py:51). activation_checkpoint_interval 1 >
    0 checkpoints the layers (runtime/pipe/engine.py:217-218)."""
    path = RECIPES / "deepspeed_pipeline_bf16.json"
    ci = read_config(path, model="llama3-8b", gpus=8, seq=2048)
    s = ci.strategy
    assert (s.tp, s.pp, s.cp, s.dp) == (1, 2, 1, 4)
    assert (s.mbs, s.gbs, s.m, s.recompute, s.schedule) == (16, 256, 4, "full", "1f1b")
    assert (s.zero, s.grad_dtype) == (1, "bf16")
    eng = ndplan.engines.profile(s.engine)
    assert (eng.fp32_grad_accumulation, eng.lp_grad_bytes) == (True, 2)
    assert any(n.startswith("pipeline.stages 2: DeepSpeed does not read it") for n in ci.notes)
    # lines counted by hand in the fixture (the optimizer's betas span lines 10-13)
    assert ci.origin["pp"] == "line 19: pipeline.stages"
    assert ci.origin["recompute"] == "line 20: pipeline.activation_checkpoint_interval"
    assert {"optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps"} <= set(ci.unknown)
    c = _deepspeed_config(path, 4, monkeypatch)
    assert (c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) == (256, 16, 4)
    assert c.pipeline["stages"] == 2 and c.pipeline["activation_checkpoint_interval"] == 1
    assert c.bfloat16_config.enabled and c.zero_optimization_stage == 0 and c.grad_accum_dtype is None


@pytest.mark.parametrize("change,field", [
    ({"pipeline": {"stages": "auto"}}, "pipeline.stages"),
    ({"pipeline": {"stages": 2}, "zero_optimization": {"stage": 2}}, "zero_optimization.stage"),
])
def test_pipeline_refusals_are_one_line(tmp_path, change, field):
    """"auto" stages: DeepSpeed's default, which only the script resolves (PipelineModule(num_stages));
    ZeRO-2/3 with stages: the pipeline engine asserts stage < 2 (runtime/pipe/engine.py:76-77)."""
    doc = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1} | change
    path = _write(tmp_path, doc)
    with pytest.raises(NdplanError) as e:
        read_config(path, model="llama3-8b", gpus=8, seq=4096)
    assert e.value.field == field
    r = CliRunner().invoke(main, ["check", str(path), "-m", "llama3-8b", "--gpus", "8", "--seq", "4096"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and field in r.output


def test_pipeline_section_without_stages_says_pp_1(tmp_path):
    doc = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
           "pipeline": {"activation_checkpoint_interval": 1}}
    ci = read_config(_write(tmp_path, doc), model="llama3-8b", gpus=8, seq=4096)
    assert ci.strategy.pp == 1 and ci.strategy.recompute == "full"
    assert any(n.startswith("pipeline section without stages") for n in ci.notes)


def test_fp32_training_is_said(tmp_path):
    """Without fp16/bf16 DeepSpeed's model dtype is fp32 (runtime/engine.py:1799-1810)."""
    ci = read_config(_write(tmp_path, {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1}),
                     model="llama3-8b", gpus=8, seq=4096)
    assert any(n.startswith("neither fp16 nor bf16 is enabled") for n in ci.notes)


def test_deprecated_zero_switch_is_stage_1(tmp_path):
    """``"zero_optimization": true`` is DeepSpeed's deprecated form: stage 1 (runtime/zero/config.py:60-78);
    a proposal that changes the stage replaces the switch by an object."""
    C = pytest.importorskip("deepspeed.runtime.zero.config")
    assert C.get_zero_config({"zero_optimization": True}).stage == 1
    path = _write(tmp_path, '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "zero_optimization": true}')
    ci = read_config(path, model="llama3-8b", gpus=8, seq=4096)
    assert ci.strategy.zero == 1 and ci.origin["zero"].startswith("line 1: zero_optimization")
    assert "zero_optimization" not in ci.unknown
    edited = json.loads(json_edit(path.read_text(), {"zero_optimization.stage": 3}))
    assert edited["zero_optimization"] == {"stage": 3} and edited["train_batch_size"] == 64


def test_bad_checkpoint_interval_is_one_line(tmp_path):
    path = _write(tmp_path, {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
                             "pipeline": {"activation_checkpoint_interval": "every"}})
    r = CliRunner().invoke(main, ["check", str(path), "-m", "llama3-8b", "--gpus", "8", "--seq", "4096"])
    assert r.exit_code == 2 and "pipeline.activation_checkpoint_interval" in r.output
    assert len(r.output.strip().splitlines()) == 1


# --------------------------------------------------------------------------- the optimizer DeepSpeed builds

def _wrapper(doc: dict, world: int, pipeline: bool, monkeypatch) -> str:
    """The optimizer wrapper DeepSpeed's engine picks for ``doc``: DeepSpeedEngine's own
    _do_optimizer_sanity_check (runtime/engine.py:2294-2323) and get_data_types (:1799-1810) on its
    config, ``pipeline`` standing for isinstance(model, PipelineModule) (:582)."""
    torch = pytest.importorskip("torch")  # DeepSpeed needs it; the README's test command runs without both
    C = pytest.importorskip("deepspeed.runtime.config")
    E = pytest.importorskip("deepspeed.runtime.engine")
    monkeypatch.setattr(C.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(C.dist, "get_world_size", lambda *a, **k: world)
    D = E.DeepSpeedEngine

    class Engine:
        _do_optimizer_sanity_check, get_data_types = D._do_optimizer_sanity_check, D.get_data_types
        zero_optimization, zero_optimization_stage = D.zero_optimization, D.zero_optimization_stage
        zero_cpu_offload, zero_compute_grad_norm = D.zero_cpu_offload, D.zero_compute_grad_norm
        zero_allow_untested_optimizer, fp16_enabled, bfloat16_enabled = (
            D.zero_allow_untested_optimizer, D.fp16_enabled, D.bfloat16_enabled)

        def __init__(self):
            self._config = C.DeepSpeedConfig({k: v for k, v in doc.items() if not k.startswith("_")})
            self.pipeline_parallelism, self.global_rank = pipeline, 0

    return Engine()._do_optimizer_sanity_check(torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))]))


def _ndplan_wrapper(s: ndplan.Strategy) -> str:
    """Which optimizer the strategy read stands for: BF16_Optimizer (ZeRO-1 with a whole-model
    gradient buffer), the ZeRO optimizer, or at stage 0 DeepSpeed's FP16/DDP wrapper."""
    E = pytest.importorskip("deepspeed.runtime.engine")
    if s.zero == 1 and ndplan.engines.profile(s.engine).fp32_grad_accumulation:
        return E.BFLOAT16
    return E.ZERO_OPTIMIZATION if s.zero else E.FP16


def test_pipeline_recipe_is_the_optimizer_deepspeed_builds(monkeypatch):
    path = RECIPES / "deepspeed_pipeline_bf16.json"
    ci = read_config(path, model="llama3-8b", gpus=8, seq=2048)
    got = _wrapper(json.loads(path.read_text()), 4, True, monkeypatch)
    assert got == _ndplan_wrapper(ci.strategy) == pytest.importorskip("deepspeed.runtime.engine").BFLOAT16


@pytest.mark.parametrize("s", [
    ndplan.Strategy(dp=4, pp=2, gbs=64, mbs=1, seq=2048, zero=0, engine="deepspeed"),
    ndplan.Strategy(dp=4, pp=2, gbs=64, mbs=1, seq=2048, zero=1, engine="deepspeed"),
    ndplan.Strategy(dp=4, pp=2, gbs=64, mbs=1, seq=2048, zero=1, grad_dtype="bf16",
                    engine="deepspeed[fp32_grad_accumulation=1,lp_grad_bytes=2]"),
    ndplan.Strategy(dp=4, pp=2, gbs=64, mbs=1, seq=2048, zero=1,
                    engine="deepspeed[fp32_grad_accumulation=1]"),
], ids=["zero0", "zero1", "bf16-optimizer-bf16-accumulation", "bf16-optimizer-fp32-accumulation"])
def test_pipeline_emit_builds_the_estimated_optimizer(tmp_path, monkeypatch, s):
    """With pipeline stages the emitted JSON makes DeepSpeed build the optimizer the strategy
    estimates (ZeRO-0 as fp16: a bf16 model at stage 0 would get BF16_Optimizer), and reads back."""
    text = ndplan.export.emit("deepspeed", ndplan.load_model("llama3-8b"), s)
    assert _wrapper(json.loads(text), s.dp, True, monkeypatch) == _ndplan_wrapper(s)
    assert read_config(_write(tmp_path, text), model="llama3-8b", gpus=s.world, seq=2048).strategy == s


def test_moe_recipe_is_the_optimizer_deepspeed_builds(monkeypatch):
    """fp16 at stage 0 without the pipeline engine: FP16_Optimizer (engine.py:2321), zero 0 here."""
    path = RECIPES / "deepspeed_moe_gpt_1.3b_moe128.json"
    ci = read_config(path, model="mixtral-8x7b", gpus=64, seq=2048)
    doc = {k: v for k, v in json.loads(path.read_text()).items() if k != "curriculum_learning"}
    assert _wrapper(doc, 64, False, monkeypatch) == _ndplan_wrapper(ci.strategy)


def test_the_persistence_note_counts_every_parameter_transformers_counts():
    """The per-tensor sizes behind the stage3_param_persistence_threshold note (deepspeed_memory.
    parameter_sizes, in Hugging Face module order) add up, at tp = 1, to the parameter counts
    transformers gives for every model of tests/data/hf_param_counts.yaml."""
    import yaml
    from pathlib import Path
    from ndplan.interop.deepspeed_memory import parameter_sizes
    counts = yaml.safe_load((Path(__file__).parent / "data" / "hf_param_counts.yaml").read_text())["counts"]
    assert len(counts) > 30
    for name, row in counts.items():
        spec = ndplan.load_model(name)
        assert sum(numel * n for _, numel, n in parameter_sizes(spec, 1)) == row["params"], name


def test_deprecated_cpu_offload_switches_are_read_as_deepspeed_reads_them(tmp_path):
    """DeepSpeedExamples' older configs (Megatron-LM/scripts/ds_zero2_cpu_offload_config.json) write
    zero_optimization.cpu_offload: true; DeepSpeed 0.19.8 builds offload_optimizer {device: cpu} from
    it, and offload_param {device: cpu} from cpu_offload_param (runtime/zero/config.py:188-219)."""
    f = tmp_path / "ds.json"
    f.write_text(json.dumps({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
                             "zero_optimization": {"stage": 3, "cpu_offload": True, "cpu_offload_param": True}}))
    ci = read_config(f, model="llama3-8b", gpus=8, seq=4096)
    assert ci.strategy.offload_optimizer and "weights_offloaded=1" in ci.strategy.engine
    assert sum("(deprecated)" in n for n in ci.notes) == 2
    assert not {"zero_optimization.cpu_offload", "zero_optimization.cpu_offload_param"} & set(ci.unknown)
    f.write_text(json.dumps({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                             "zero_optimization": {"stage": 2, "cpu_offload": False}}))
    assert not read_config(f, model="llama3-8b", gpus=8, seq=4096).strategy.offload_optimizer
    f.write_text(json.dumps({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {
        "stage": 2, "cpu_offload": True, "offload_optimizer": {"device": "cpu"}}}))
    with pytest.raises(NdplanError) as e:  # config_utils.py:89-91 asserts
        read_config(f, model="llama3-8b", gpus=8, seq=4096)
    assert e.value.field == "zero_optimization.cpu_offload"
