"""CLI error handling: bad input exits with code 2 and one line naming the field,
never a traceback. Plus a smoke test of the ``estimate --json`` schema."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ndplan.cli import main


def run(args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_one_line_error(res, field, *also):
    out = res.output
    assert res.exit_code == 2, f"exit {res.exit_code}, output: {out!r}, exception: {res.exception!r}"
    assert "Traceback" not in out
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line, got {lines}"
    line = lines[0]
    assert line.startswith("error: "), line
    assert f"{field}=" in line, f"field {field!r} not named in {line!r}"
    for text in also:
        assert text in line, f"{text!r} not in {line!r}"
    # the message goes to stderr, nothing on stdout
    assert res.stdout.strip() == "", res.stdout
    assert res.stderr.strip() == line
    return line


# model YAML files for the file-based cases
MALFORMED_YAML = "name: broken\nhidden_size: [4096\nnum_hidden_layers: 32\n"
MISSING_HIDDEN = """\
name: tiny
model_type: llama
num_hidden_layers: 4
num_attention_heads: 8
num_key_value_heads: 8
intermediate_size: 1024
vocab_size: 32000
"""
NOT_A_MAPPING = "- hidden_size: 4096\n- num_hidden_layers: 32\n"


CASES = [
    # id, args, field, extra text the line must contain
    ("unknown-model", ["estimate", "-m", "llama3-70"], "model", ["llama3-70b"]),
    ("unknown-hardware", ["estimate", "-m", "llama3-8b", "-H", "h100-sx"], "hardware", ["h100-sxm"]),
    ("heads-not-divisible-by-tp", ["estimate", "-m", "llama3-8b", "--tp", 3], "tp", ["32"]),
    ("layers-lt-pp-vpp", ["estimate", "-m", "llama3-8b", "--pp", 16, "--vpp", 4, "--gbs", 64], "pp", ["32"]),
    ("layers-lt-pp", ["estimate", "-m", "llama3-8b", "--pp", 64], "pp", ["32"]),
    ("layers-not-divisible", ["estimate", "-m", "llama3-8b", "--pp", 3], "pp", ["32"]),
    ("world-ne-gpus", ["estimate", "-m", "llama3-8b", "--gpus", 8, "--dp", 2, "--tp", 2], "gpus", []),
    ("gpus-not-divisible", ["estimate", "-m", "llama3-8b", "--gpus", 6, "--tp", 4], "gpus", []),
    ("ep-etp-not-dividing", ["estimate", "-m", "mixtral-8x7b", "--dp", 2, "--ep", 4], "ep", []),
    ("ep-etp-not-dividing-etp", ["estimate", "-m", "mixtral-8x7b", "--dp", 4, "--ep", 2, "--etp", 4], "ep", []),
    ("ep-not-dividing-experts", ["estimate", "-m", "mixtral-8x7b", "--dp", 3, "--ep", 3], "ep", ["8"]),
    ("ep-on-dense-model", ["estimate", "-m", "llama3-8b", "--dp", 2, "--ep", 2], "ep", []),
    ("seq-zero", ["estimate", "-m", "llama3-8b", "--seq", 0], "seq", []),
    ("seq-negative", ["estimate", "-m", "llama3-8b", "--seq", -4096], "seq", []),
    ("tp-negative", ["estimate", "-m", "llama3-8b", "--tp", -1], "tp", []),
    ("tp-zero", ["estimate", "-m", "llama3-8b", "--tp", 0], "tp", []),
    ("pp-zero", ["estimate", "-m", "llama3-8b", "--pp", 0], "pp", []),
    ("cp-negative", ["estimate", "-m", "llama3-8b", "--cp", -2], "cp", []),
    ("gpus-zero", ["estimate", "-m", "llama3-8b", "--gpus", 0], "gpus", []),
    ("gpus-negative", ["estimate", "-m", "llama3-8b", "--gpus", -8], "gpus", []),
    ("dp-zero", ["estimate", "-m", "llama3-8b", "--dp", 0], "dp", []),
    ("mbs-zero", ["estimate", "-m", "llama3-8b", "--mbs", 0], "mbs", []),
    ("gbs-zero", ["estimate", "-m", "llama3-8b", "--gbs", 0], "gbs", []),
    ("gbs-not-multiple", ["estimate", "-m", "llama3-8b", "--dp", 4, "--gbs", 6], "gbs", []),
    ("seq-not-divisible-by-cp", ["estimate", "-m", "llama3-8b", "--cp", 3, "--seq", 4096], "seq", []),
    ("explain-unknown-term", ["explain", "-m", "llama3-8b", "--term", "mem.bogus"], "term",
     ["mem.activations"]),
    ("explain-stage-out-of-range", ["explain", "-m", "llama3-8b", "--pp", 2, "--stage", 5], "stage", []),
    ("explain-unknown-model", ["explain", "-m", "mixtral-8x7", "--term", "mem.weights"], "model", ["mixtral-8x7b"]),
]


@pytest.mark.parametrize("args,field,also", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2(args, field, also):
    assert_one_line_error(run(args), field, *also)


def test_malformed_yaml_model_file(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text(MALFORMED_YAML)
    line = assert_one_line_error(run(["estimate", "-m", p]), "model", "broken.yaml")
    assert "malformed" in line.lower() or "yaml" in line.lower()


def test_model_yaml_missing_hidden_size(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(MISSING_HIDDEN)
    assert_one_line_error(run(["estimate", "-m", p]), "hidden_size", "missing")


def test_model_yaml_not_a_mapping(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text(NOT_A_MAPPING)
    assert_one_line_error(run(["estimate", "-m", p]), "model")


def test_malformed_config_json_dir(tmp_path):
    d = tmp_path / "hf-model"
    d.mkdir()
    (d / "config.json").write_text('{"hidden_size": 4096, "num_hidden_layers": ')
    assert_one_line_error(run(["estimate", "-m", d]), "model", "config.json")


def test_unknown_hardware_file_path(tmp_path):
    assert_one_line_error(run(["estimate", "-m", "llama3-8b", "-H", tmp_path / "nope.yaml"]), "hardware")


def test_no_traceback_on_any_error_case(tmp_path):
    """Belt and braces over all cases: no traceback text, no non-SystemExit exception."""
    for _, args, _, _ in CASES:
        res = run(args)
        assert "Traceback" not in res.output
        assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception))


# ---------------------------------------------------------------- --json schema

def _estimate_json(args):
    res = run(["estimate", *args, "--json"])
    assert res.exit_code == 0, res.output
    assert all(ln.startswith("compiling") for ln in res.stderr.splitlines())  # progress only
    return json.loads(res.stdout)


def _check_schema(doc, pp):
    for key in ("strategy", "model", "memory", "time", "fits"):
        assert key in doc, key
    assert isinstance(doc["strategy"], dict) and doc["strategy"]["pp"] == pp
    mem = doc["memory"]
    assert isinstance(mem["per_stage"], list) and len(mem["per_stage"]) == pp
    for i, row in enumerate(mem["per_stage"]):
        for key in ("stage", "peak_bytes", "static_bytes", "dynamic_bytes", "terms"):
            assert key in row, key
        assert row["stage"] == i
        assert isinstance(row["terms"], dict) and row["terms"]
        assert all(isinstance(v, int) for v in row["terms"].values())
        assert row["peak_bytes"] == row["static_bytes"] + row["dynamic_bytes"]
        assert row["peak_bytes"] == sum(row["terms"].values())
    assert mem["peak_bytes"] == max(r["peak_bytes"] for r in mem["per_stage"])
    t = doc["time"]
    for key in ("step_s", "terms", "mfu", "tokens_per_s"):
        assert key in t, key
    assert isinstance(t["terms"], dict)
    assert isinstance(doc["fits"], bool)
    assert isinstance(doc["model"]["params_total"], int)


def test_estimate_json_schema_dense():
    doc = _estimate_json(["-m", "llama3-8b", "--gpus", 8, "--tp", 2, "--pp", 2, "--gbs", 16, "--seq", 8192])
    _check_schema(doc, pp=2)
    assert doc["model"]["params_total"] == 8_030_261_248
    assert "params_active" not in doc["model"] or doc["model"]["params_active"] is None


def test_estimate_json_schema_moe_has_params_active():
    doc = _estimate_json(["-m", "mixtral-8x7b", "--gpus", 16, "--tp", 2, "--pp", 2, "--ep", 4, "--gbs", 32])
    _check_schema(doc, pp=2)
    assert doc["model"]["params_total"] == 46_702_792_704
    active = doc["model"]["params_active"]
    assert isinstance(active, int)
    # 2 of 8 experts per token: total - 32 layers * 6 experts * 3*h*fe
    assert active == 46_702_792_704 - 32 * 6 * 3 * 4096 * 14336
