"""Fuzz the CLI: random values for every numeric option and random bytes for every file
argument of ``estimate``, ``explain``, ``check``, ``balance`` and a ``sweep`` restricted
to a small model and space. Whatever comes in, the answer is an exit code in {0, 1, 2},
never a traceback; an answer (exit 0 or 1) holds no ``nan`` / ``inf`` (no value ndplan
prints is documented as unbounded), and bad input (exit 2) is one ``error: ...; ...`` line.

Values are drawn from two pools: bad ones (NaN, infinities, signs, zero, huge integers,
floats for counts, junk text) and small valid ones, so that what passes the checks also
finishes quickly (CP-SAT limits under a second, micro-batch counts under 64, a sweep of
a few candidates). The example counts are bounded (``EXAMPLES``) and derandomized.
"""

from __future__ import annotations

import os
import re

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ndplan.cli import main

EXAMPLES = int(os.environ.get("NDPLAN_FUZZ_EXAMPLES", "40"))
"""Examples per test (40 in the suite; raise it locally to search longer)."""
NAN_INF = re.compile(r"\b(nan|inf|-inf|infinity)\b", re.IGNORECASE)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("NDPLAN_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

BAD_TEXT = st.sampled_from(["nan", "-nan", "inf", "-inf", "1e400", "-1", "0", "-0", "", " ", "x", "1.5", "1e3",
                            "0x10", "99999999999999999999", "1_000", "2**10", "NaN", "Infinity", "\u0661\u0662"])


def _count(lo: int, hi: int):
    return st.one_of(BAD_TEXT, st.integers(lo, hi).map(str), st.integers(-(2**70), 2**70).map(str))


def _real(lo: float, hi: float):
    return st.one_of(BAD_TEXT, st.floats(lo, hi).map(repr), st.floats(allow_nan=True, allow_infinity=True).map(repr))


def _assert_clean(r, argv):
    assert r.exit_code in (0, 1, 2), (argv, r.exit_code, r.output[-1500:])
    assert "Traceback" not in r.output, (argv, r.output[-1500:])
    assert r.exception is None or isinstance(r.exception, SystemExit), (argv, repr(r.exception))
    if r.exit_code in (0, 1):  # an answer: computed numbers (an error line may quote the input's nan)
        bad = NAN_INF.search(r.output)
        assert bad is None, (argv, r.output[max(0, bad.start() - 300):bad.end() + 100])
    else:
        lines = [ln for ln in r.output.splitlines() if ln.strip() and not ln.startswith("compiling")]
        assert len(lines) == 1 and lines[0].startswith("error: ") and "; " in lines[0], (argv, lines)


def _invoke(argv):
    r = CliRunner().invoke(main, argv)
    _assert_clean(r, argv)
    return r


STRATEGY_NUMERIC = {
    "--gpus": _count(1, 16), "--seq": _count(128, 4096), "--gbs": _count(1, 64), "--dp": _count(1, 4),
    "--tp": _count(1, 4), "--pp": _count(1, 4), "--cp": _count(1, 2), "--ep": _count(1, 2), "--etp": _count(1, 2),
    "--vpp": _count(1, 2), "--mbs": _count(1, 2), "--recompute-layers": _count(0, 8),
}
SETS = st.sampled_from(["gemm_efficiency", "hbm_gib", "inter_node_gb_per_s", "intra_node_latency_us",
                        "devices_per_node", "overlap_tp_comm", "gather_prefetch_layers"])


@st.composite
def strategy_args(draw):
    """A few numeric strategy options (each random), plus maybe a --set."""
    argv = []
    for flag in draw(st.lists(st.sampled_from(sorted(STRATEGY_NUMERIC)), max_size=4, unique=True)):
        argv += [flag, draw(STRATEGY_NUMERIC[flag])]
    if draw(st.booleans()):
        argv += ["--set", f"{draw(SETS)}={draw(_real(0.0, 2.0))}"]
    return argv


@FUZZ
@given(args=strategy_args(), cmd=st.sampled_from(["estimate", "explain"]))
def test_estimate_and_explain(args, cmd):
    extra = ["--term", "mem.weights"] if cmd == "explain" else ["--json"]
    _invoke([cmd, "-m", "llama3-8b", *args, *extra])


@FUZZ
@given(data=st.binary(max_size=600), which=st.sampled_from(["-m", "-H"]), suffix=st.sampled_from([".yaml", ".json"]))
def test_random_catalog_files(tmp_path, data, which, suffix):
    f = tmp_path / f"fuzz{suffix}"
    f.write_bytes(data)
    argv = ["estimate", "-m", str(f)] if which == "-m" else ["estimate", "-m", "llama3-8b", "-H", str(f)]
    _invoke(argv)


MODEL_KEYS = ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size", "max_position_embeddings", "head_dim", "num_local_experts",
              "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace",
              "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
              "num_nextn_predict_layers", "attention_dropout", "tie_word_embeddings", "mlp_only_layers"]
YAML_VALUES = st.one_of(st.integers(-4, 64), st.integers(-(2**70), 2**70), st.sampled_from([".nan", ".inf", "-.inf",
                        "1.5", "true", "null", "llama", "mixtral", "deepseek_v3", "[1, 2]", "{a: 1}", "''"]))


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(MODEL_KEYS), YAML_VALUES, min_size=3, max_size=12))
def test_structured_model_yaml(tmp_path, fields):
    """Model YAMLs with real field names and odd values: small or huge sizes, NaN,
    infinities, wrong types."""
    base = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 128, "vocab_size": 256}
    text = "".join(f"{k}: {v}\n" for k, v in (base | fields).items())
    f = tmp_path / "m.yaml"
    f.write_text(text)
    _invoke(["estimate", "-m", str(f), "--json"])


SWEEP = ["sweep", "-m", "llama3-8b", "--tp", "1,2", "--pp", "1", "--cp", "1", "--vpp", "1", "--mbs", "1",
         "--zero", "1", "--recompute", "none", "--schedule", "1f1b"]


@FUZZ
@given(gpus=_count(1, 8), gbs=_count(1, 32), seq=_count(256, 4096), top=_count(0, 3),
       limit=st.one_of(st.none(), st.tuples(st.sampled_from(["--mem-limit-gib", "--mem-fraction"]), _real(0.0, 100.0))))
def test_small_sweep(gpus, gbs, seq, top, limit):
    argv = [*SWEEP, "--gpus", gpus, "--gbs", gbs, "--seq", seq, "--top", top]
    if limit:
        argv += list(limit)
    _invoke(argv)


@FUZZ
@given(data=st.binary(max_size=600))
def test_random_space_file(tmp_path, data):
    f = tmp_path / "space.yaml"
    f.write_bytes(data)
    _invoke(["sweep", "-m", "llama3-8b", "--gpus", "8", "--gbs", "8", "--space", str(f), "--tp", "1", "--pp", "1",
             "--cp", "1", "--vpp", "1", "--mbs", "1", "--zero", "1", "--recompute", "none", "--schedule", "1f1b"])


@pytest.fixture(scope="module")
def layer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "l.yaml"
    r = CliRunner().invoke(main, ["estimate", "-m", "llama3-8b", "--pp", "2", "--gbs", "8", "--export-layers", str(path)])
    assert r.exit_code == 0, r.output
    return path


@FUZZ
@given(pp=_count(1, 4), vpp=_count(1, 2), m=_count(1, 16), budget=st.one_of(st.none(), _real(1.0, 100.0)),
       reserve=st.one_of(st.none(), _real(0.0, 20.0)), limit=_real(0.05, 0.5), workers=_count(1, 2),
       res_us=_real(1.0, 100.0))
def test_balance_numbers(layer_file, pp, vpp, m, budget, reserve, limit, workers, res_us):
    argv = ["balance", "--layers", str(layer_file), "--pp", pp, "--vpp", vpp, "--m", m, "--deterministic-time", limit,
            "--workers", workers, "--time-resolution-us", res_us]
    argv += ["--budget-gib", budget] if budget is not None else ["-H", "h100-sxm"]
    if reserve is not None and budget is None:
        argv += ["--reserve-gib", reserve]
    _invoke(argv)


@FUZZ
@given(data=st.binary(max_size=800), suffix=st.sampled_from([".yaml", ".json"]))
def test_random_layer_file(tmp_path, data, suffix):
    f = tmp_path / f"layers{suffix}"
    f.write_bytes(data)
    _invoke(["balance", "--layers", str(f), "--pp", "2", "--m", "4", "--budget-gib", "70", "--deterministic-time", "0.2"])


@FUZZ
@given(data=st.binary(max_size=800), suffix=st.sampled_from([".sh", ".toml", ".json", ".yaml", ".txt", ""]),
       gpus=st.one_of(st.none(), _count(1, 16)), limit=st.one_of(st.none(), _real(0.0, 100.0)))
def test_random_check_files(tmp_path, data, suffix, gpus, limit):
    f = tmp_path / f"launch{suffix}"
    f.write_bytes(data)
    argv = ["check", str(f), "-m", "llama3-8b", "--seq", "4096", "--top", "0"]
    if gpus is not None:
        argv += ["--gpus", gpus]
    if limit is not None:
        argv += ["--mem-limit-gib", limit]
    _invoke(argv)


MEGATRON_WORDS = st.sampled_from([
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--micro-batch-size", "--global-batch-size",
    "--seq-length", "--context-parallel-size", "--num-layers-per-virtual-pipeline-stage", "--recompute-num-layers",
    "--recompute-granularity", "--use-distributed-optimizer", "--sequence-parallel", "$((2*4))", "$((9**9**9))",
    "$TP", "TP=2", "${GPUS}", "--nproc_per_node", "--nnodes", "torchrun", "pretrain_gpt.py", "\\", "\n",
    "full", "selective", "block", "--recompute-method", "--decoder-first-pipeline-num-layers"])


@FUZZ
@given(words=st.lists(st.one_of(MEGATRON_WORDS, _count(0, 64)), min_size=1, max_size=30))
def test_random_megatron_scripts(tmp_path, words):
    """Structured junk: Megatron flags, values and shell syntax in random order."""
    f = tmp_path / "train.sh"
    f.write_text("GPUS=8\n" + " ".join(words) + "\n")
    _invoke(["check", str(f), "-m", "llama2-7b", "--gpus", "8", "--top", "0"])


@FUZZ
@given(gpus=_count(1, 8), isl=_count(1, 4096), osl=_count(1, 1024), conc=_count(1, 64), rate=_real(0.1, 50),
       ttft=_real(1, 5000), tpot=_real(1, 200), frac=_real(0.3, 1.0), tp=_count(1, 8),
       which=st.sets(st.sampled_from(["conc", "rate", "ttft", "tpot", "frac", "tp", "min"]), max_size=3),
       model=st.sampled_from(["llama3.2-1b", "qwen3-30b-a3b"]))
def test_serve_never_tracebacks(gpus, isl, osl, conc, rate, ttft, tpot, frac, tp, which, model):
    argv = ["serve", "-m", model, "--gpus", gpus, "--isl", isl, "--osl", osl]
    for key, flag, value in (("conc", "--concurrency", conc), ("rate", "--rate", rate), ("ttft", "--ttft-ms", ttft),
                             ("tpot", "--tpot-ms", tpot), ("frac", "--engine-mem-fraction", frac), ("tp", "--tp", tp)):
        if key in which:
            argv += [flag, value]
    if "min" in which:
        argv.append("--find-min-gpus")
    _invoke(argv)
