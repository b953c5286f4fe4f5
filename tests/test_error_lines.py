"""The error-line contract and the launch-script arithmetic.

* Every ``NdplanError`` raised in src/ says what is wrong and how to fix it (a fourth
  argument, or a problem text that already holds "; "): checked on the source, so a
  new error cannot slip in without a fix.
* ``$(( ))`` in Megatron launch scripts is evaluated by interop.arith, not ``eval``:
  held to bash itself on random expressions (bash is the oracle), and the 64-bit
  bound refuses ``9**9**9`` at once.
* The one-line form holds for click's own usage errors and for warnings.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from collections import OrderedDict
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from ndplan.cli import main
from ndplan.errors import NdplanError
from ndplan.interop import arith

SRC = Path(__file__).resolve().parents[1] / "src" / "ndplan"


def _error_calls():
    for p in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "NdplanError":
                yield p.relative_to(SRC), node


def test_every_error_says_how_to_fix():
    missing = []
    for path, node in _error_calls():
        if len(node.args) + len(node.keywords) >= 4 or any(isinstance(a, ast.Starred) for a in node.args):
            continue
        problem = ast.unparse(node.args[2]) if len(node.args) > 2 else ""
        if ";" not in problem:
            missing.append(f"{path}:{node.lineno}")
    assert not missing, f"NdplanError without a fix: {missing}"
    assert sum(1 for _ in _error_calls()) > 150  # the scan sees the tree


def test_error_text_is_one_line():
    e = NdplanError("seq", "a\nb", "two\nlines", "fix\nit")
    assert "\n" not in str(e) and str(e) == "seq='a\\nb': two lines; fix it"


# ------------------------------------------------------------------ $(( )) arithmetic

ENV = {"NNODES": "2", "GPUS_PER_NODE": "8", "TP": "4", "ZERO": "0"}


@st.composite
def expressions(draw, depth=3):
    """Random bash arithmetic over small integers and the ENV names."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.one_of(st.integers(0, 999).map(str), st.sampled_from(sorted(ENV))))
    kind = draw(st.sampled_from(["bin", "bin", "bin", "neg", "paren"]))
    if kind == "neg":  # "-(x)": a bare "--x" would be bash's pre-decrement
        return "-(" + draw(expressions(depth=depth - 1)) + ")"
    if kind == "paren":
        return "(" + draw(expressions(depth=depth - 1)) + ")"
    op = draw(st.sampled_from(["+", "-", "*", "/", "%", "**"]))
    a, b = draw(expressions(depth=depth - 1)), draw(expressions(depth=depth - 1))
    if op == "**":
        b = str(draw(st.integers(0, 3)))
    return f"{a} {op} {b}"


def _bash(expr: str) -> tuple[int, str]:
    assign = "; ".join(f"{k}={v}" for k, v in ENV.items())
    r = subprocess.run(["bash", "-c", f"{assign}; echo $(({expr}))"], capture_output=True, text=True, timeout=10)
    return r.returncode, r.stdout.strip()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is the oracle")
@settings(max_examples=60, deadline=None, derandomize=True)
@given(expressions())
def test_arith_equals_bash(expr):
    code, out = _bash(expr)
    try:
        ours = arith.evaluate(expr, ENV.get)
    except NdplanError as e:
        # refused: bash fails too (division by zero) or overflows 64 bits
        assert code != 0 or abs(int(out)) >= 2**62 or "64-bit" in str(e), (expr, out, str(e))
        return
    assert code == 0, (expr, ours)
    assert str(ours) == out, (expr, ours, out)


@pytest.mark.parametrize("expr,value", [("GPUS_PER_NODE*NNODES", 16), ("$TP*2", 8), ("${TP} * (1+1)", 8),
                                        ("-2**2", 4), ("2**3**2", 512), ("-7/2", -3), ("-7%3", -1)])
def test_arith_expand_cases(expr, value):
    """Hand-checked against bash 5: unary minus binds tighter than **, ** groups right,
    / and % truncate toward zero."""
    assert arith.expand(f"--x=$(({expr}))", ENV.get) == f"--x={value}"


@pytest.mark.parametrize("expr", ["9**9**9", "2**64", "1/0", "UNSET+1", "1 << 2", "(1+2", "a ? 1 : 2",
                                  "__import__('os')"])
def test_arith_refuses(expr):
    t0 = time.perf_counter()
    with pytest.raises(NdplanError) as e:
        arith.expand(f"$(({expr}))", ENV.get)
    assert time.perf_counter() - t0 < 1.0
    assert str(e.value).startswith("$((...))=") and "; " in str(e.value)


def test_check_refuses_exponent_bomb_in_one_line(tmp_path):
    f = tmp_path / "train.sh"
    f.write_text("TP=$((9**9**9))\ntorchrun pretrain_gpt.py --tensor-model-parallel-size $TP\n")
    r = CliRunner().invoke(main, ["check", str(f), "-m", "llama2-7b"])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "line 1" in r.stderr and "64-bit" in r.stderr


# ------------------------------------------------------------------ click usage errors, warnings

@pytest.mark.parametrize("args,starts", [
    (["estimate", "-m", "llama3-8b", "--tpp", "2"], "error: option='--tpp': no such option"),
    (["sweep", "-m", "llama3-8b", "--gpus", "8"], "error: --gbs=None: required"),
    (["estimate", "-m", "llama3-8b", "--schedule", "foo"], "error: --schedule='foo':"),
    (["estimate", "-m", "llama3-8b", "--tp"], "error: --tp=None:"),
    (["frobnicate"], "error: command='frobnicate': no such command"),
    (["estimate", "-m", "llama3-8b", "stray"], "error: argument='stray':"),
])
def test_click_usage_errors_are_one_line(args, starts):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts) and "; " in lines[0], lines


def test_no_arguments_prints_help():
    r = CliRunner().invoke(main, [])
    assert r.exit_code == 0 and "Usage:" in r.stdout


def test_warning_is_one_line_once():
    """seq above max_position_embeddings: an estimate, and one warning line (Strategy.check
    runs twice in estimate; the warning prints once)."""
    r = CliRunner().invoke(main, ["estimate", "-m", "llama2-7b", "--seq", "8192", "--json"])
    assert r.exit_code == 0
    warns = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert warns == ["warning: seq=8192: above llama2-7b's max_position_embeddings=4096; the estimate assumes "
                     "the model runs at this length (e.g. after RoPE scaling)"]


def test_first_compile_prints_progress_then_a_warm_run_is_quiet(tmp_path, monkeypatch):
    """A sweep of a model no kernel exists for: stderr says it is compiling and where the
    kernels go; the same sweep again (from the disk cache, in a new in-memory cache)
    prints nothing on stderr and the same stdout."""
    from ndplan import cli_types, kernels
    model = tmp_path / "tiny-progress.yaml"
    model.write_text("model_type: llama\nhidden_size: 384\nnum_hidden_layers: 6\nnum_attention_heads: 6\n"
                     "intermediate_size: 1000\nvocab_size: 5000\n")
    monkeypatch.setenv("NDPLAN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NDPLAN_PREBUILT", "0")  # a Llama-class model: the package ships its kernels
    monkeypatch.setattr(kernels, "_MEMORY", OrderedDict())
    monkeypatch.setattr(kernels, "_READ_SETS", {})
    monkeypatch.setattr(cli_types, "QUIET_S", 0.0)  # announce at the second kernel: a small sweep suffices
    args = ["sweep", "-m", str(model), "--gpus", "2", "--gbs", "4", "--tp", "1", "--pp", "1,2", "--cp", "1",
            "--recompute", "none", "--zero", "1", "--json"]
    cold = CliRunner().invoke(main, args)
    assert cold.exit_code == 0, cold.output
    assert "compiling kernels (first use" in cold.stderr and str(tmp_path / "cache") in cold.stderr
    assert cold.stderr.splitlines()[-1].startswith("compiled ")
    monkeypatch.setattr(kernels, "_MEMORY", OrderedDict())
    warm = CliRunner().invoke(main, args)
    assert warm.exit_code == 0 and warm.stderr == "" and warm.stdout == cold.stdout
