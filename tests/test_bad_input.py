"""Bad and edge input, table-driven, over every command: each case is one command line
(plus the files it reads) and the exit code, field and text its answer must carry.

Contract checked for every row (README "Bad input exits with code 2 and one line naming
the field, the value and the fix"):

* exit 2 (bad input): exactly one non-empty line in the combined output, on stderr
  (stdout empty), shaped ``error: <field>=<value>: <what is wrong>; <how to fix>``, and
  ``<field>=`` names the field of the row (matched case-blind and with ``_`` and ``-``
  alike, so ``gpus`` matches ``gpus=`` and ``--gpus=``, ``layers-per-stage`` matches
  ``layers_per_stage=``); when the row has an extra text, the line contains it too (for
  unknown options, unknown commands, strategy texts, nested layer-file keys and the
  ``check FILE`` readers the row gives no field, only the text: the file's name for a
  file it cannot read);
* exit 0 (valid but suspicious input, or a valid boundary value) and exit 1 (only where
  documented: ``sweep`` nothing fits, ``check`` does not fit): no ``nan`` / ``inf`` word
  anywhere in the output; a row with a field at exit 0 wants a stderr line starting
  ``warning:`` that names that field;
* never a traceback, never an exception other than SystemExit, never a directory
  created under ``nonexistent/``.

Rows are ``(id, argv, files, exit, field, extra)``; ``files`` maps a name (sub
directories allowed) to its bytes, or to ``DIR`` for a directory, written under the
test's tmp directory and referenced in ``argv`` as ``{tmp}/name``. Ids are
``<command>/<kind>/<case>``; kinds: ``usage`` (click's own parsing), ``num`` (numeric
flags), ``set`` (``--set NAME=VALUE``), ``file`` (unreadable or malformed files),
``model`` / ``hw`` / ``layers`` / ``space`` (fields inside those files), ``sem``
(semantics: values that parse but do not fit together), ``edge`` (valid, must not
fail or print nan/inf).

Choices made where the contract leaves room:

* ``sweep --find-min-gpus --gpus 8`` is an error (exit 2) whose line names ``gpus``
  (either ``--gpus`` or ``--find-min-gpus``);
* giving ``--mem-limit-gib`` and ``--mem-fraction`` together: the line names one of them
  (row extra ``mem-``);
* ``--layers-per-stage 0,32`` (a stage with no decoder layer) is valid (exit 0);
* a row whose command could run long on a broken build runs under a timeout
  (``TIMEOUT_S`` in process, by SIGALRM; the ``$((9**9**9))`` row in a forked child,
  ``FORK_TIMEOUT_S``, because a big-integer power cannot be interrupted in process)
  and fails when it expires.

Rows run in process through ``CliRunner().invoke(main, argv)``. With click >= 8.2
(8.5 here) the runner always keeps ``result.stdout`` and ``result.stderr`` apart and
``result.output`` is both, interleaved; there is no ``mix_stderr`` argument any more.

``python tests/test_bad_input.py`` runs every row and prints a Markdown table and a
summary (cases, tracebacks, exit codes, silent-wrong = exit 0/1 with nan/inf).
"""

from __future__ import annotations

import os
import pickle
import re
import select
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ndplan.cli import main

DIR = None
"""A ``files`` value: make a directory of that name instead of a file."""
TIMEOUT_S = 20.0
"""Per-row wall clock in process; a row that takes longer fails."""
FORK_TIMEOUT_S = 10.0
"""Per-row wall clock of the rows run in a forked child (ISOLATED)."""
NAN_INF = re.compile(r"\b(nan|inf|-inf)\b", re.IGNORECASE)

# ------------------------------------------------------------------ base commands

E = ["estimate", "-m", "llama3-8b"]
X = ["explain", "-m", "llama3-8b", "--term", "mem.weights"]
SMALL = ["--tp", "1", "--pp", "1", "--cp", "1", "--vpp", "1", "--mbs", "1", "--zero", "1",
         "--recompute", "full", "--schedule", "1f1b"]
"""Fixes every sweep dimension but dp: a valid sweep evaluates one candidate. A flag
appended after it overrides it (click keeps the last value)."""
S = ["sweep", "-m", "llama3-8b", "--gpus", "8", "--gbs", "8", *SMALL]
C = ["compare", "-m", "llama3-8b", "--gpus", "8", "--gbs", "8"]
K = ["check", "{tmp}/train.sh", "-m", "llama2-7b"]
B = ["balance", "--layers", "{tmp}/l.yaml", "--pp", "2", "--m", "4", "--budget-gib", "70", "--deterministic-time", "2",
     "--workers", "1"]
BH = ["balance", "--layers", "{tmp}/l.yaml", "--pp", "2", "--m", "4", "-H", "h100-sxm", "--deterministic-time", "2",
      "--workers", "1"]
"""balance with the budget from the hardware (HBM minus --reserve-gib)."""

# ------------------------------------------------------------------ files

MODEL_FIELDS = {
    "model_type": "llama",
    "hidden_size": "256",
    "num_hidden_layers": "4",
    "num_attention_heads": "8",
    "num_key_value_heads": "8",
    "intermediate_size": "512",
    "vocab_size": "1000",
    "max_position_embeddings": "4096",
}


def model_yaml(**changes) -> bytes:
    """A tiny valid llama model YAML; ``changes`` replace (raw YAML text) or, with None,
    drop fields."""
    d = dict(MODEL_FIELDS) | changes
    return "".join(f"{k}: {v}\n" for k, v in d.items() if v is not None).encode()


HW_FIELDS = {
    "name": "tiny-gpu",
    "bf16_tflops": "100",
    "fp8_tflops": "200",
    "hbm_gib": "80",
    "hbm_gb_per_s": "2000",
    "intra_node_gb_per_s": "300",
    "inter_node_gb_per_s": "25",
    "devices_per_node": "8",
}


def hw_yaml(**changes) -> bytes:
    """A valid hardware YAML (plain values); ``changes`` as in model_yaml."""
    d = dict(HW_FIELDS) | changes
    return "".join(f"{k}: {v}\n" for k, v in d.items() if v is not None).encode()


LAYERS = """\
format: ndplan-layers/1
model: llama3-8b
hardware: h100-sxm
hbm_bytes: 85899345920
overhead_bytes: 4225761280
strategy:
  dp: 1
  tp: 1
  pp: 2
  cp: 1
  ep: 1
  etp: 1
  vpp: 1
  mbs: 1
  gbs: 8
  seq: 4096
  zero: 1
  sp: true
  recompute: none
  recompute_layers: null
  schedule: 1f1b
  engine: megatron
  flash_attention: true
  layers_per_stage: null
  grad_dtype: fp32
  weight_dtype: auto
  offload_optimizer: false
  order: tp-cp-ep-dp-pp
  m: 8
layers:
- name: embedding
  kind: embedding
  forward_s: 0.0
  backward_input_s: 0.0
  backward_weight_s: 0.0
  static_bytes: 9456058368
  activation_bytes:
    none: 0
  recompute_s: {}
- name: decoder.dense
  kind: dense
  forward_s: 0.0032358294499834467
  backward_input_s: 0.0039026459024601337
  backward_weight_s: 0.0026952961015661533
  static_bytes: 3926016000
  activation_bytes:
    none: 570949632
    selective: 570425344
    full: 33554432
  recompute_s:
    selective: 0.0002525662081187864
    full: 0.0032358294499834467
  count: 32
- name: head
  kind: head
  forward_s: 0.008844288646933917
  backward_input_s: 0.008844288646933917
  backward_weight_s: 0.0064920353215607825
  static_bytes: 9456132096
  activation_bytes:
    none: 67108864
  recompute_s: {}
"""
"""``ndplan estimate -m llama3-8b --pp 2 --gbs 8 --export-layers l.yaml`` (the note line
dropped): 34 layers, with the model and strategy that ``balance --emit`` needs."""


def layers(old: str | None = None, new: str = "") -> dict:
    """files for balance: the layer file, with the first ``old`` replaced by ``new``."""
    text = LAYERS
    if old is not None:
        assert old in text, old
        text = text.replace(old, new, 1)
    return {"l.yaml": text.encode()}


L_DECODER_FWD = "  forward_s: 0.0032358294499834467\n"
L_DECODER_BWD = "  backward_input_s: 0.0039026459024601337\n"
L_DECODER_STATIC = "  static_bytes: 3926016000\n"
L_ACT_NONE = "    none: 570949632\n"
L_RECOMPUTE_FULL = "    full: 0.0032358294499834467\n"
L_COUNT = "  count: 32\n"
LAYERS_JSON_NAN = (b'{"format": "ndplan-layers/1", "layers": [{"name": "d", "kind": "dense", "forward_s": NaN, '
                   b'"backward_input_s": 0.001, "backward_weight_s": 0.001, "static_bytes": 1000, '
                   b'"activation_bytes": {"none": 1000}, "count": 4}]}')
SAPP = ("layers_description:\n"
        "- {type: HEAD, name: embedding, time: 1.0, memory_parameter: 100, nb_layer: 1}\n"
        "- {type: BODY, name: decoder, time: TIME, memory_parameter: 200, memory_activation: 50, nb_layer: 4}\n"
        "- {type: TAIL, name: head, time: 1.0, memory_parameter: 100, nb_layer: 1}\n")

MEGATRON = r"""#!/bin/bash
# Llama-2 7B on one node of 8 GPUs, DP=4 x TP=2
GPUS_PER_NODE=8
TP=2
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes 1 pretrain_gpt.py \
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \
    --ffn-hidden-size 11008 --swiglu --untie-embeddings-and-output-weights \
    --vocab-size 32000 \
    --tensor-model-parallel-size $TP \
    --pipeline-model-parallel-size 1 \
    --sequence-parallel \
    --use-distributed-optimizer \
    --micro-batch-size 1 \
    --global-batch-size 16 \
    --seq-length SEQ \
    --bf16
"""


def megatron(tp: str = "$TP", seq: str = "4096") -> dict:
    """files for check: a Megatron-LM launch script (fits on 8 H100 at seq 4096)."""
    text = MEGATRON.replace("--tensor-model-parallel-size $TP", f"--tensor-model-parallel-size {tp}")
    return {"train.sh": text.replace("SEQ", seq).encode()}


BINARY = bytes(range(256)) * 4 + b"\x00\xff\xfe\x00"
"""Not UTF-8, not text: NUL bytes and invalid sequences."""
LATIN1 = "name: caf\u00e9\nhidden_size: 4096\n".encode("latin-1")
"""Text, but Latin-1 (0xE9 alone is invalid UTF-8)."""
DEEP_JSON = b"[" * 100_000 + b"]" * 100_000
"""Nesting deeper than any parser's recursion limit."""
MALFORMED_YAML = b"hidden_size: [4096\nnum_hidden_layers: 32\n"
TABS_YAML = b"hidden_size: 4096\n\tnum_hidden_layers: 32\n"
YAML_LIST = b"- hidden_size: 4096\n- num_hidden_layers: 32\n"
YAML_SCALAR = b"42\n"
MALFORMED_JSON = b'{"hidden_size": 4096, "num_hidden_layers": '


def bad_files(cmd, flag: str | None, field: str | None, name: str, *, tail=()):
    """The unreadable / malformed file rows of one reader: ``cmd`` with ``flag FILE``
    (or FILE as the argument when ``flag`` is None), ``tail`` appended."""
    def argv(fname):
        return [*cmd, *([flag] if flag else []), "{tmp}/" + fname, *tail]
    rows = [
        ("binary", "bin.yaml", BINARY),
        ("latin1", "latin1.yaml", LATIN1),
        ("empty", "empty.yaml", b""),
        ("whitespace-only", "blank.yaml", b"\n   \n\t\n"),
        ("directory", "adir", DIR),
        ("missing", "nope.yaml", "missing"),
        ("yaml-list", "list.yaml", YAML_LIST),
        ("yaml-scalar", "scalar.yaml", YAML_SCALAR),
        ("malformed-yaml", "broken.yaml", MALFORMED_YAML),
        ("tab-indent-yaml", "tabs.yaml", TABS_YAML),
        ("malformed-json", "broken.json", MALFORMED_JSON),
        ("deep-json", "deep.json", DEEP_JSON),
    ]
    out = []
    for kind, fname, content in rows:
        files = {} if content == "missing" else {fname: content}
        out.append((f"{name}/file/{kind}", argv(fname), files, 2, field, fname))
    return out


# ------------------------------------------------------------------ the table

CASES: list[tuple] = []


def add(id_, argv, exit_=2, field=None, extra=None, files=None):
    CASES.append((id_, [str(a) for a in argv], files or {}, exit_, field, extra))


# ---- click usage errors, every command ---------------------------------------
add("main/usage/unknown-command", ["frobnicate"], extra="frobnicate")
add("main/usage/unknown-top-option", ["--frobnicate"], extra="frobnicate")
add("estimate/usage/unknown-option", [*E, "--tpp", "2"], extra="tpp")
add("estimate/usage/missing-model", ["estimate"], field="model")
add("estimate/usage/model-without-value", ["estimate", "--tp", "2", "--model"], field="model")
add("estimate/usage/tp-not-integer", [*E, "--tp", "x"], field="tp")
add("estimate/usage/tp-float", [*E, "--tp", "2.5"], field="tp")
add("estimate/usage/tp-missing-value", [*E, "--tp"], field="tp")
add("estimate/usage/seq-hex", [*E, "--seq", "0x1000"], field="seq")
add("estimate/usage/gbs-exponent", [*E, "--gbs", "1e3"], field="gbs")
add("estimate/usage/schedule-choice", [*E, "--schedule", "foo"], field="schedule")
add("estimate/usage/recompute-choice", [*E, "--recompute", "partial"], field="recompute")
add("estimate/usage/engine-choice", [*E, "--engine", "jax"], field="engine")
add("estimate/usage/zero-out-of-range", [*E, "--zero", "4"], field="zero")
add("estimate/usage/zero-not-integer", [*E, "--zero", "x"], field="zero")
add("estimate/usage/grad-dtype-choice", [*E, "--grad-dtype", "fp16"], field="grad-dtype")
add("estimate/usage/weight-dtype-choice", [*E, "--weight-dtype", "int4"], field="weight-dtype")
add("estimate/usage/emit-choice", [*E, "--emit", "jax"], field="emit")
add("estimate/usage/extra-argument", [*E, "stray"], extra="stray")
add("estimate/usage/set-missing-value", [*E, "--set"], field="set")
add("estimate/usage/export-layers-directory", [*E, "--export-layers", "{tmp}/adir"], field="export-layers",
    files={"adir": DIR})
add("explain/usage/stage-not-integer", [*X, "--stage", "one"], field="stage")
add("sweep/usage/missing-gbs", ["sweep", "-m", "llama3-8b", "--gpus", "8"], field="gbs")
add("sweep/usage/gpus-not-integer", [*S, "--gpus", "eight"], field="gpus")
add("sweep/usage/sort-choice", [*S, "--sort", "speed"], field="sort")
add("sweep/usage/mem-limit-removed", [*S, "--mem-limit", "0.9"], extra="mem-limit")
add("sweep/usage/space-directory", [*S, "--space", "{tmp}/adir"], field="space", files={"adir": DIR})
add("compare/usage/missing-strategies", C, field="strategies")
add("compare/usage/missing-gpus", ["compare", "-m", "llama3-8b", "--gbs", "8", "tp=1"], field="gpus")
add("check/usage/missing-file", ["check"], field="file")
add("check/usage/format-choice", [*K, "--format", "slurm"], field="format", files=megatron())
add("check/usage/mem-limit-removed", [*K, "--mem-limit", "70"], extra="mem-limit", files=megatron())
add("check/usage/two-files", [*K, "{tmp}/train.sh"], extra="train.sh", files=megatron())
add("balance/usage/missing-layers", ["balance", "--pp", "2", "--m", "4"], field="layers")
add("balance/usage/missing-pp", ["balance", "--layers", "{tmp}/l.yaml", "--m", "4"], field="pp", files=layers())
add("balance/usage/missing-m", ["balance", "--layers", "{tmp}/l.yaml", "--pp", "2"], field="m", files=layers())
add("balance/usage/workers-not-integer", [*B, "--workers", "two"], field="workers", files=layers())
add("balance/usage/budget-not-number", [*B, "--budget-gib", "lots"], field="budget-gib", files=layers())
add("balance/usage/plan-recompute-choice", [*B, "--plan", "17,17", "--plan-recompute", "some"],
    field="plan-recompute", files=layers())
add("balance/usage/schedule-choice", [*B, "--schedule", "chimera"], field="schedule", files=layers())
add("models/usage/extra-argument", ["models", "extra"], extra="extra")
add("hardware/usage/unknown-option", ["hardware", "--csv"], extra="csv")

# ---- estimate: numeric flags ---------------------------------------------------
add("estimate/num/gpus-nan", [*E, "--gpus", "nan"], field="gpus")
add("estimate/num/gpus-inf", [*E, "--gpus", "inf"], field="gpus")
add("estimate/num/gpus-huge", [*E, "--gpus", "99999999999999999999"], field="gpus")
add("estimate/num/gpus-above-bound", [*E, "--gpus", str(2**20 + 1)], field="gpus")
add("estimate/num/dp-above-bound", [*E, "--dp", str(2**20 + 1)], field="dp")
add("estimate/num/tp-above-bound", [*E, "--tp", str(2**20 + 1)], field="tp")
add("estimate/num/tp-int64-overflow", [*E, "--tp", str(2**63)], field="tp")
add("estimate/num/pp-above-bound", [*E, "--pp", str(2**20 + 1)], field="pp")
add("estimate/num/cp-above-bound", [*E, "--cp", str(2**20 + 1)], field="cp")
add("estimate/num/ep-above-bound", [*E, "--ep", str(2**20 + 1)], field="ep")
add("estimate/num/etp-above-bound", [*E, "--etp", str(2**20 + 1)], field="etp")
add("estimate/num/ep-zero", [*E, "--ep", "0"], field="ep")
add("estimate/num/etp-negative", [*E, "--etp", "-1"], field="etp")
add("estimate/num/vpp-zero", [*E, "--vpp", "0"], field="vpp")
add("estimate/num/vpp-negative", [*E, "--vpp", "-2"], field="vpp")
add("estimate/num/seq-above-bound", [*E, "--seq", str(2**24 + 1)], field="seq")
add("estimate/num/seq-nan", [*E, "--seq", "nan"], field="seq")
add("estimate/num/gbs-above-bound", [*E, "--gbs", str(2**24 + 1)], field="gbs")
add("estimate/num/gbs-negative", [*E, "--gbs", "-8"], field="gbs")
add("estimate/num/mbs-above-bound", [*E, "--mbs", str(2**24 + 1)], field="mbs")
add("estimate/num/mbs-negative", [*E, "--mbs", "-1"], field="mbs")
add("estimate/num/recompute-layers-not-int", [*E, "--recompute", "full", "--recompute-layers", "1,x"],
    field="recompute-layers")
add("estimate/num/recompute-layers-negative", [*E, "--recompute", "full", "--recompute-layers", "-1"],
    field="recompute-layers")
add("estimate/num/recompute-layers-empty", [*E, "--recompute", "full", "--recompute-layers", ""],
    field="recompute-layers")
add("estimate/num/recompute-layers-wrong-count", [*E, "--pp", "2", "--gbs", "8", "--recompute", "full",
                                                   "--recompute-layers", "1,2,3"], field="recompute-layers")
add("estimate/num/layers-per-stage-not-int", [*E, "--pp", "2", "--gbs", "8", "--layers-per-stage", "a,b"],
    field="layers-per-stage")
add("estimate/num/layers-per-stage-wrong-length", [*E, "--pp", "2", "--gbs", "8", "--layers-per-stage", "32"],
    field="layers-per-stage")
add("estimate/num/layers-per-stage-wrong-sum", [*E, "--pp", "2", "--gbs", "8", "--layers-per-stage", "10,10"],
    field="layers-per-stage")
add("estimate/num/layers-per-stage-negative", [*E, "--pp", "2", "--gbs", "8", "--layers-per-stage", "-1,33"],
    field="layers-per-stage")

# ---- estimate: --set NAME=VALUE --------------------------------------------------
for name, value in [("inter_node_gb_per_s", "nan"), ("inter_node_gb_per_s", "inf"), ("inter_node_gb_per_s", "-1"),
                    ("inter_node_gb_per_s", "0"), ("intra_node_gb_per_s", "1e400"), ("bf16_tflops", "nan"),
                    ("fp8_tflops", "-inf"), ("hbm_gib", "inf"), ("hbm_gib", "0"), ("hbm_gb_per_s", "-5"),
                    ("gemm_efficiency", "5"), ("gemm_efficiency", "0"), ("gemm_efficiency", "nan"),
                    ("gemm_efficiency", "1.0001"), ("attention_efficiency", "1.5"), ("hbm_efficiency", "-0.5"),
                    ("intra_node_efficiency", "2"), ("inter_node_efficiency", "nan"),
                    ("intra_node_latency_us", "-1"), ("inter_node_latency_us", "nan"),
                    ("inter_node_latency_us", "inf"), ("devices_per_node", "2.5"), ("devices_per_node", "0"),
                    ("devices_per_node", "-8"), ("overlap_tp_comm", "2"), ("overlap_tp_comm", "0.5"),
                    ("overlap_tp_comm", "nan"), ("overlap_tp_comm", "-1"), ("gather_prefetch_layers", "-1"),
                    ("gather_prefetch_layers", "1.5"), ("gather_prefetch_layers", "inf"),
                    ("gemm_efficiency", "fast")]:
    add(f"estimate/set/{name}={value}", [*E, "--set", f"{name}={value}"], field=name)
add("estimate/set/no-equals", [*E, "--set", "gemm_efficiency"], field="set")
add("estimate/set/empty-name", [*E, "--set", "=0.5"], field="set")
add("estimate/set/unknown-name", [*E, "--set", "warp_speed=9"], field="set", extra="warp_speed")

# ---- estimate: semantics -----------------------------------------------------------
add("estimate/sem/vpp-without-pp", [*E, "--vpp", "2"], field="vpp")
add("estimate/sem/zbv-with-vpp-1", [*E, "--pp", "2", "--gbs", "8", "--schedule", "zbv"], field="vpp")
add("estimate/sem/order-missing-axes", [*E, "--order", "tp-dp"], field="order")
add("estimate/sem/order-unknown-axis", [*E, "--order", "tp-cp-ep-dp-xx"], field="order")
add("estimate/sem/order-repeated-axis", [*E, "--order", "tp-tp-cp-ep-dp-pp"], field="order")
add("estimate/sem/emit-out-is-directory", [*E, "--emit", "megatron", "--emit-out", "{tmp}/outdir"],
    field="emit-out", files={"outdir": DIR})
add("estimate/sem/emit-out-parent-missing", [*E, "--emit", "megatron", "--emit-out",
                                              "{tmp}/nonexistent/dir/out.sh"], field="emit-out")
add("estimate/sem/report-parent-missing", [*E, "--report", "{tmp}/nonexistent/dir/r.html"], field="report")
add("estimate/sem/report-bad-suffix", [*E, "--report", "{tmp}/r.txt"], field="report")
add("estimate/sem/report-is-directory", [*E, "--report", "{tmp}/r.html"], field="report", files={"r.html": DIR})
add("estimate/sem/export-layers-parent-missing", [*E, "--export-layers", "{tmp}/nonexistent/l.yaml"],
    field="export-layers")

# ---- explain ---------------------------------------------------------------------
add("explain/num/stage-negative", [*X, "--stage", "-1"], field="stage")
add("explain/num/stage-equals-pp", [*X, "--pp", "2", "--gbs", "8", "--stage", "2"], field="stage")
add("explain/num/stage-huge", [*X, "--stage", "99999999999999999999"], field="stage")
add("explain/num/gpus-nan", [*X, "--gpus", "nan"], field="gpus")
add("explain/num/seq-inf", [*X, "--seq", "inf"], field="seq")
add("explain/set/gemm_efficiency=nan", [*X, "--set", "gemm_efficiency=nan"], field="gemm_efficiency")
add("explain/sem/term-empty", [*X, "--term", ""], field="term")

# ---- sweep: numeric flags ------------------------------------------------------------
add("sweep/num/gpus-zero", [*S, "--gpus", "0"], field="gpus")
add("sweep/num/gpus-negative", [*S, "--gpus", "-8"], field="gpus")
add("sweep/num/gpus-nan", [*S, "--gpus", "nan"], field="gpus")
add("sweep/num/gpus-above-bound", [*S, "--gpus", str(2**20 + 1)], field="gpus")
add("sweep/num/gpus-huge", [*S, "--gpus", "99999999999999999999"], field="gpus")
add("sweep/num/seq-zero", [*S, "--seq", "0"], field="seq")
add("sweep/num/seq-above-bound", [*S, "--seq", str(2**24 + 1)], field="seq")
add("sweep/num/gbs-zero", [*S, "--gbs", "0"], field="gbs")
add("sweep/num/gbs-above-bound", [*S, "--gbs", str(2**24 + 1)], field="gbs")
add("sweep/num/top-negative", [*S, "--top", "-1"], field="top")
add("sweep/num/top-above-bound", [*S, "--top", "1001"], field="top")
add("sweep/num/mem-limit-gib-nan", [*S, "--mem-limit-gib", "nan"], field="mem-limit-gib")
add("sweep/num/mem-limit-gib-inf", [*S, "--mem-limit-gib", "inf"], field="mem-limit-gib")
add("sweep/num/mem-limit-gib-zero", [*S, "--mem-limit-gib", "0"], field="mem-limit-gib")
add("sweep/num/mem-limit-gib-negative", [*S, "--mem-limit-gib", "-1"], field="mem-limit-gib")
add("sweep/num/mem-fraction-zero", [*S, "--mem-fraction", "0"], field="mem-fraction")
add("sweep/num/mem-fraction-above-one", [*S, "--mem-fraction", "1.5"], field="mem-fraction")
add("sweep/num/mem-fraction-nan", [*S, "--mem-fraction", "nan"], field="mem-fraction")
add("sweep/num/mem-fraction-negative", [*S, "--mem-fraction", "-0.5"], field="mem-fraction")
add("sweep/num/mem-both-given", [*S, "--mem-limit-gib", "70", "--mem-fraction", "0.9"], extra="mem-")
add("sweep/num/dim-tp-not-int", [*S, "--tp", "x"], field="tp")
add("sweep/num/dim-tp-zero", [*S, "--tp", "0"], field="tp")
add("sweep/num/dim-tp-negative", [*S, "--tp", "-2"], field="tp")
add("sweep/num/dim-tp-nan", [*S, "--tp", "nan"], field="tp")
add("sweep/num/dim-tp-empty", [*S, "--tp", ""], field="tp")
add("sweep/num/dim-tp-above-bound", [*S, "--tp", str(2**20 + 1)], field="tp")
add("sweep/num/dim-dp-huge", [*S, "--dp", "99999999999999999999"], field="dp")
add("sweep/num/dim-cp-float", [*S, "--cp", "1.5"], field="cp")
add("sweep/num/dim-pp-inf", [*S, "--pp", "inf"], field="pp")
add("sweep/num/dim-ep-zero", [*S, "--ep", "0"], field="ep")
add("sweep/num/dim-etp-negative", [*S, "--etp", "-1"], field="etp")
add("sweep/num/dim-vpp-zero", [*S, "--vpp", "0"], field="vpp")
add("sweep/num/dim-mbs-above-bound", [*S, "--mbs", str(2**24 + 1)], field="mbs")
add("sweep/num/dim-zero-out-of-range", [*S, "--zero", "4"], field="zero")
add("sweep/num/dim-recompute-choice", [*S, "--recompute", "partial"], field="recompute")
add("sweep/num/dim-schedule-choice", [*S, "--schedule", "foo"], field="schedule")
add("sweep/num/dim-sp-not-bool", [*S, "--sp", "maybe"], field="sp")
add("sweep/set/inter_node_gb_per_s=nan", [*S, "--set", "inter_node_gb_per_s=nan"], field="inter_node_gb_per_s")
add("sweep/set/hbm_efficiency=0", [*S, "--set", "hbm_efficiency=0"], field="hbm_efficiency")

# ---- sweep: semantics ---------------------------------------------------------------
add("sweep/sem/why-no-equals", [*S, "--why", "tp"], field="why")
add("sweep/sem/why-unknown-dim", [*S, "--why", "foo=1"], extra="foo")
add("sweep/sem/why-not-int", [*S, "--why", "tp=x"], field="tp")
add("sweep/sem/find-min-gpus-with-gpus", [*S, "--find-min-gpus"], extra="gpus")
add("sweep/sem/gpus-missing", ["sweep", "-m", "llama3-8b", "--gbs", "8", *SMALL], field="gpus")
add("sweep/sem/emit-all-without-emit", [*S, "--emit-all"], field="emit-all")
add("sweep/sem/emit-out-is-directory", [*S, "--emit", "megatron", "--emit-out", "{tmp}/outdir"], field="emit-out",
    files={"outdir": DIR})
add("sweep/sem/emit-all-out-is-file", [*S, "--emit", "megatron", "--emit-all", "--emit-out", "{tmp}/out.txt"],
    field="emit-out", files={"out.txt": b"not a directory\n"})
add("sweep/sem/report-parent-missing", [*S, "--report", "{tmp}/nonexistent/dir/r.html"], field="report")
add("sweep/sem/order-unknown-axis", [*S, "--order", "tp-cp-ep-dp-xx"], field="order")

# ---- sweep: space file fields -------------------------------------------------------
for case, text, field, extra in [
        ("unknown-dim", b"foo: 2\n", None, "foo"),
        ("tp-zero", b"tp: 0\n", "tp", None),
        ("tp-nan", b"tp: .nan\n", "tp", None),
        ("tp-list-bad-item", b"tp: [1, x]\n", "tp", None),
        ("tp-above-bound", f"tp: {2**20 + 1}\n".encode(), "tp", None),
        ("not-a-dim-gbs", b"gbs: 8\n", None, "gbs"),
        ("schedule-unknown", b"schedule: foo\n", "schedule", None),
        ("recompute-list-bad", b"recompute: [none, partial]\n", "recompute", None),
        ("zero-out-of-range", b"zero: [0, 7]\n", "zero", None),
        ("mbs-empty-list", b"mbs: []\n", "mbs", None),
]:
    add(f"sweep/space/{case}", ["sweep", "-m", "llama3-8b", "--gpus", "8", "--gbs", "8", "--space", "{tmp}/space.yaml"],
        field=field, extra=extra, files={"space.yaml": text})

# ---- compare --------------------------------------------------------------------
add("compare/sem/garbage-strategy", [*C, "garbage"], extra="garbage")
add("compare/sem/garbage-second-strategy", [*C, "tp=1", "tp=2,garbage"], extra="garbage")
add("compare/sem/unknown-dim", [*C, "foo=1"], extra="foo")
add("compare/sem/dim-not-int", [*C, "dp=x"], field="dp")
add("compare/sem/tp-zero", [*C, "tp=0"], field="tp")
add("compare/sem/tp-not-dividing-heads", ["compare", "-m", "llama3-8b", "--gpus", "6", "--gbs", "6", "dp=2,tp=3"],
    field="tp")
add("compare/sem/empty-strategy", [*C, ""])
add("compare/num/gpus-zero", ["compare", "-m", "llama3-8b", "--gpus", "0", "--gbs", "8", "tp=1"], field="gpus")
add("compare/num/gbs-nan", ["compare", "-m", "llama3-8b", "--gpus", "8", "--gbs", "nan", "tp=1"], field="gbs")
add("compare/num/seq-negative", [*C, "--seq", "-1", "tp=1"], field="seq")
add("compare/set/gemm_efficiency=nan", [*C, "--set", "gemm_efficiency=nan", "tp=1"], field="gemm_efficiency")

# ---- check: numeric flags and semantics ----------------------------------------------
add("check/num/mem-limit-gib-nan", [*K, "--mem-limit-gib", "nan"], field="mem-limit-gib", files=megatron())
add("check/num/mem-limit-gib-inf", [*K, "--mem-limit-gib", "inf"], field="mem-limit-gib", files=megatron())
add("check/num/mem-limit-gib-zero", [*K, "--mem-limit-gib", "0"], field="mem-limit-gib", files=megatron())
add("check/num/mem-fraction-above-one", [*K, "--mem-fraction", "2"], field="mem-fraction", files=megatron())
add("check/num/mem-fraction-nan", [*K, "--mem-fraction", "nan"], field="mem-fraction", files=megatron())
add("check/num/mem-both-given", [*K, "--mem-limit-gib", "70", "--mem-fraction", "0.9"], extra="mem-",
    files=megatron())
add("check/num/top-negative", [*K, "--top", "-1"], field="top", files=megatron())
add("check/num/top-above-bound", [*K, "--top", "1001"], field="top", files=megatron())
add("check/num/gpus-zero", [*K, "--gpus", "0"], field="gpus", files=megatron())
add("check/num/gpus-huge", [*K, "--gpus", "99999999999999999999"], field="gpus", files=megatron())
add("check/num/seq-zero", [*K, "--seq", "0"], field="seq", files=megatron())
add("check/num/gbs-negative", [*K, "--gbs", "-1"], field="gbs", files=megatron())
add("check/sem/arithmetic-tower", K, files=megatron(tp="$((9**9**9))"))
add("check/sem/arithmetic-division-by-zero", K, files=megatron(tp="$((1/0))"))
add("check/sem/script-tp-zero", K, extra="tensor-model-parallel-size", files=megatron(tp="0"))
add("check/sem/script-seq-nan", K, extra="seq-length", files=megatron(seq="nan"))
add("check/file/model-binary", [*K[:2], "-m", "{tmp}/bin.yaml"], field="model", extra="bin.yaml",
    files={**megatron(), "bin.yaml": BINARY})
add("check/file/hardware-binary", [*K, "-H", "{tmp}/bin.yaml"], field="hardware", extra="bin.yaml",
    files={**megatron(), "bin.yaml": BINARY})

# ---- balance: numeric flags --------------------------------------------------------
for flag, value in [("--m", "0"), ("--m", "-1"), ("--m", str(65537)), ("--pp", "0"), ("--pp", "1025"),
                    ("--vpp", "0"), ("--time-limit", "nan"), ("--time-limit", "inf"), ("--time-limit", "0"),
                    ("--time-limit", "-1"), ("--time-limit", "86401"), ("--workers", "0"), ("--workers", "257"),
                    ("--time-resolution-us", "nan"), ("--time-resolution-us", "0"), ("--time-resolution-us", "inf"),
                    ("--budget-gib", "nan"), ("--budget-gib", "0"), ("--budget-gib", "-5"), ("--budget-gib", "inf")]:
    add(f"balance/num/{flag[2:]}={value}", [*B, flag, value], field=flag[2:], files=layers())
for value in ("-10", "nan", "inf", "80", "1000"):
    add(f"balance/num/reserve-gib={value}", [*BH, "--reserve-gib", value], field="reserve-gib", files=layers())
add("balance/sem/plan-wrong-count", [*B, "--plan", "1,2"], field="plan", files=layers())
add("balance/sem/plan-not-int", [*B, "--plan", "x,y"], field="plan", files=layers())
add("balance/sem/plan-zero-stage", [*B, "--plan", "0,34"], field="plan", files=layers())
add("balance/sem/plan-recompute-without-plan", [*B, "--plan-recompute", "full"], extra="plan-recompute",
    files=layers())
add("balance/sem/pp-exceeds-layers", [*B, "--pp", "64", "--m", "64"], field="pp", files=layers())
add("balance/sem/zbv-with-vpp-1", [*B, "--schedule", "zbv"], field="vpp", files=layers())
add("balance/sem/interleaved-m-not-multiple", [*B, "--vpp", "2", "--m", "3"], field="m", files=layers())
add("balance/sem/no-budget-no-hardware", ["balance", "--layers", "{tmp}/l.yaml", "--pp", "2", "--m", "4"],
    field="budget-gib", files=layers("hbm_bytes: 85899345920\n", ""))
add("balance/sem/timeline-parent-missing", [*B, "--timeline", "{tmp}/nonexistent/t.svg"], field="timeline",
    files=layers())
add("balance/sem/emit-out-is-directory", [*B, "--emit", "megatron", "--emit-out", "{tmp}/outdir"],
    field="emit-out", files={**layers(), "outdir": DIR})
add("balance/sem/report-parent-missing", [*B, "--report", "{tmp}/nonexistent/dir/r.md"], field="report",
    files=layers())

# ---- balance: layer file fields ---------------------------------------------------
for case, old, new, field, extra in [
        ("format-unknown-version", "format: ndplan-layers/1\n", "format: ndplan-layers/99\n", "format", None),
        ("forward-nan", L_DECODER_FWD, "  forward_s: .nan\n", None, "forward_s"),
        ("forward-negative", L_DECODER_FWD, "  forward_s: -0.001\n", None, "forward_s"),
        ("forward-inf", L_DECODER_FWD, "  forward_s: .inf\n", None, "forward_s"),
        ("forward-missing", L_DECODER_FWD, "", None, "forward_s"),
        ("backward-not-number", L_DECODER_BWD, "  backward_input_s: fast\n", None, "backward_input_s"),
        ("static-bytes-nan", L_DECODER_STATIC, "  static_bytes: .nan\n", None, "static_bytes"),
        ("activation-negative", L_ACT_NONE, "    none: -570949632\n", None, "activation_bytes"),
        ("activation-inf", L_ACT_NONE, "    none: .inf\n", None, "activation_bytes"),
        ("activation-no-none-mode", L_ACT_NONE, "", None, "activation_bytes"),
        ("activation-unknown-mode", L_ACT_NONE, L_ACT_NONE + "    partial: 1000\n", None, "partial"),
        ("recompute-s-nan", L_RECOMPUTE_FULL, "    full: .nan\n", None, "recompute_s"),
        ("count-zero", L_COUNT, "  count: 0\n", None, "count"),
        ("count-float", L_COUNT, "  count: 2.5\n", None, "count"),
        ("layers-missing", "layers:\n- name: embedding", "extra:\n- name: embedding", "layers", None),
]:
    add(f"balance/layers/{case}", B, field=field, extra=extra, files=layers(old, new))
add("balance/layers/layers-empty-list", B, field="layers",
    files={"l.yaml": LAYERS.split("layers:\n")[0].encode() + b"layers: []\n"})
add("balance/layers/layers-a-mapping", B, field="layers",
    files={"l.yaml": LAYERS.split("layers:\n")[0].encode() + b"layers: {decoder: 32}\n"})
add("balance/layers/layer-a-scalar", B, extra="layers",
    files={"l.yaml": LAYERS.split("layers:\n")[0].encode() + b"layers: [7, 8]\n"})
add("balance/layers/json-nan-literal", [*B[:2], "{tmp}/l.json", *B[3:]], extra="forward_s",
    files={"l.json": LAYERS_JSON_NAN})
add("balance/layers/sapp-empty", B, field="layers_description", files={"l.yaml": b"layers_description: []\n"})
add("balance/layers/sapp-time-negative", B, extra="time", files={"l.yaml": SAPP.replace("TIME", "-2.0").encode()})
add("balance/layers/sapp-time-nan", B, extra="time", files={"l.yaml": SAPP.replace("TIME", ".nan").encode()})

# ---- unreadable and malformed files, every reader ---------------------------------
CASES += bad_files(["estimate"], "-m", "model", "estimate-model")
CASES += bad_files(E, "-H", "hardware", "estimate-hardware")
CASES += bad_files(["sweep", "-m", "llama3-8b", "--gpus", "8", "--gbs", "8"], "--space", "space", "sweep-space")
CASES += bad_files(["balance", "--pp", "2", "--m", "4", "--budget-gib", "70"], "--layers", "layers", "balance-layers")
CASES += bad_files(["check"], None, None, "check", tail=["-m", "llama2-7b", "--gpus", "8", "--seq", "4096"])
add("estimate-model/file/hf-dir-without-config", [*E[:2], "{tmp}/hf"], field="model", extra="hf",
    files={"hf/README.md": b"no config here\n"})
add("estimate-model/file/hf-dir-binary-config", [*E[:2], "{tmp}/hf"], field="model", extra="config.json",
    files={"hf/config.json": BINARY})
add("estimate-model/file/hf-dir-deep-config", [*E[:2], "{tmp}/hf"], field="model", extra="config.json",
    files={"hf/config.json": DEEP_JSON})
add("sweep/file/model-binary", ["sweep", "-m", "{tmp}/bin.yaml", "--gpus", "8", "--gbs", "8", *SMALL],
    field="model", extra="bin.yaml", files={"bin.yaml": BINARY})
add("explain/file/hardware-latin1", [*X, "-H", "{tmp}/latin1.yaml"], field="hardware", extra="latin1.yaml",
    files={"latin1.yaml": LATIN1})
add("compare/file/model-empty", ["compare", "-m", "{tmp}/empty.yaml", "--gpus", "8", "--gbs", "8", "tp=1"],
    field="model", extra="empty.yaml", files={"empty.yaml": b""})
add("balance/file/hardware-binary", [*BH[:7], "-H", "{tmp}/bin.yaml", *BH[9:]], field="hardware", extra="bin.yaml",
    files={**layers(), "bin.yaml": BINARY})

# ---- model YAML fields (estimate -m FILE) ------------------------------------------
EM = ["estimate", "-m", "{tmp}/m.yaml"]
for field, value, name in [
        ("num_attention_heads", "0", "heads-zero"),
        ("num_attention_heads", "-8", "heads-negative"),
        ("hidden_size", "-256", "hidden-negative"),
        ("hidden_size", "0", "hidden-zero"),
        ("hidden_size", ".nan", "hidden-nan"),
        ("hidden_size", ".inf", "hidden-inf"),
        ("hidden_size", "256.5", "hidden-float"),
        ("hidden_size", str(10**30), "hidden-huge"),
        ("hidden_size", str(2**24 + 8), "hidden-above-bound"),
        ("hidden_size", '"256"', "hidden-string"),
        ("hidden_size", "true", "hidden-bool"),
        ("num_hidden_layers", "0", "layers-zero"),
        ("num_hidden_layers", str(2**14 + 1), "layers-above-bound"),
        ("vocab_size", "0", "vocab-zero"),
        ("vocab_size", str(10**30), "vocab-huge"),
        ("num_key_value_heads", "3", "kv-not-dividing-heads"),
        ("num_key_value_heads", "0", "kv-zero"),
        ("intermediate_size", "-5", "intermediate-negative"),
        ("max_position_embeddings", "-1", "max-positions-negative"),
        ("head_dim", "0", "head-dim-zero"),
        ("attention_dropout", ".nan", "attention-dropout-nan"),
        ("attention_dropout", "-0.1", "attention-dropout-negative"),
        ("attention_dropout", "high", "attention-dropout-string"),
        ("hidden_dropout", "1.5", "hidden-dropout-above-one"),
        ("hidden_size", None, "hidden-missing"),
        ("vocab_size", None, "vocab-missing"),
        ("model_type", None, "model-type-missing"),
]:
    add(f"estimate-model/model/{name}", EM, field=field, files={"m.yaml": model_yaml(**{field: value})})
add("estimate-model/model/hidden-not-divisible-by-heads", EM, field="head_dim",
    files={"m.yaml": model_yaml(hidden_size="260")})
for name, changes, field in [
        ("moe-topk-above-experts", {"num_local_experts": "4", "num_experts_per_tok": "8"}, "num_experts_per_tok"),
        ("moe-topk-zero", {"num_local_experts": "4", "num_experts_per_tok": "0"}, "num_experts_per_tok"),
        ("moe-experts-negative", {"num_local_experts": "-4", "num_experts_per_tok": "2"}, "num_local_experts"),
        ("moe-layer-freq-zero", {"num_local_experts": "4", "num_experts_per_tok": "2", "moe_layer_freq": "0"},
         "moe_layer_freq"),
]:
    add(f"estimate-model/model/{name}", EM, field=field, files={"m.yaml": model_yaml(**changes)})
add("explain-model/model/heads-zero", ["explain", "-m", "{tmp}/m.yaml"], field="num_attention_heads",
    files={"m.yaml": model_yaml(num_attention_heads="0")})

# ---- hardware YAML fields (estimate -H FILE) ------------------------------------
EH = [*E, "-H", "{tmp}/hw.yaml"]
for field, value, name in [
        ("hbm_gib", "0", "hbm-zero"),
        ("hbm_gib", "-80", "hbm-negative"),
        ("hbm_gib", ".nan", "hbm-nan"),
        ("hbm_gib", ".inf", "hbm-inf"),
        ("hbm_gib", "{value: .nan, source: datasheet}", "hbm-nan-in-value-form"),
        ("gemm_efficiency", "1.5", "gemm-efficiency-above-one"),
        ("gemm_efficiency", "{value: .nan, source: x}", "gemm-efficiency-nan"),
        ("devices_per_node", "0", "devices-per-node-zero"),
        ("devices_per_node", "2.5", "devices-per-node-float"),
        ("bf16_tflops", None, "bf16-missing"),
        ("bf16_tflops", "fast", "bf16-string"),
        ("bf16_tflops", ".inf", "bf16-inf"),
        ("fp8_tflops", ".nan", "fp8-nan"),
        ("inter_node_gb_per_s", "-1", "inter-node-negative"),
        ("hbm_gb_per_s", "{value: null, source: x}", "hbm-bandwidth-null"),
        ("intra_node_latency_us", "-5", "latency-negative"),
        ("inter_node_latency_us", ".inf", "latency-inf"),
        ("attention_efficiency", "0", "attention-efficiency-zero"),
        ("mamf_bf16_tflops", "5000", "mamf-above-the-peak"),
        ("mamf_bf16_tflops", ".nan", "mamf-nan"),
        ("mamf_fp8_tflops", "-3", "mamf-fp8-negative"),
        ("fp8_gemm_efficiency", "1.2", "fp8-gemm-efficiency-above-one"),
        ("fa2_attention_efficiency", "0", "fa2-attention-efficiency-zero"),
]:
    add(f"estimate-hardware/hw/{name}", EH, field=field, files={"hw.yaml": hw_yaml(**{field: value})})

# ---- edge inputs: valid, exit 0 (or 1 where documented), no nan/inf ------------------
add("estimate/edge/seq-beyond-max-positions", ["estimate", "-m", "llama2-7b", "--seq", "10000000"], 0,
    field="max_position_embeddings")
add("estimate/edge/seq-one", [*E, "--seq", "1"], 0)
add("estimate/edge/layers-per-stage-empty-stage", [*E, "--pp", "2", "--gbs", "8", "--layers-per-stage", "0,32"], 0)
add("estimate/edge/gpus-at-bound", [*E, "--gpus", str(2**20)], 0)
add("estimate/edge/set-gemm-efficiency-one", [*E, "--set", "gemm_efficiency=1"], 0)
add("estimate/edge/set-latency-zero", [*E, "--set", "inter_node_latency_us=0"], 0)
add("estimate/edge/set-engine-bool-one", [*E, "--set", "overlap_tp_comm=1"], 0)
add("estimate/edge/set-engine-int-zero", [*E, "--set", "gather_prefetch_layers=0"], 0)
add("estimate-hardware/edge/latency-zero", EH, 0, files={"hw.yaml": hw_yaml(intra_node_latency_us="0")})
add("estimate-hardware/edge/gemm-efficiency-one", EH, 0, files={"hw.yaml": hw_yaml(gemm_efficiency="1.0")})
add("estimate-hardware/edge/mamf-at-the-peak", EH, 0, files={"hw.yaml": hw_yaml(mamf_bf16_tflops=HW_FIELDS["bf16_tflops"])})
add("estimate/set/mamf_bf16_tflops=nan", [*E, "--set", "mamf_bf16_tflops=nan"], field="mamf_bf16_tflops")
add("estimate-model/edge/dropout-one", EM, 0, files={"m.yaml": model_yaml(attention_dropout="1.0")})
add("sweep/edge/top-zero", [*S, "--top", "0"], 0)
add("sweep/edge/top-at-bound", [*S, "--top", "1000"], 0)
add("sweep/edge/mem-fraction-one", [*S, "--mem-fraction", "1"], 0)
add("sweep/edge/nothing-fits", [*S, "--mem-limit-gib", "1"], 1)
add("check/edge/fits", [*K, "--mem-fraction", "1"], 0, files=megatron())
add("check/edge/does-not-fit", [*K, "--top", "0"], 1, files=megatron(seq="65536"))
add("balance/edge/reserve-zero", [*BH, "--reserve-gib", "0"], 0, files=layers())

ISOLATED = {"check/sem/arithmetic-tower"}
"""Rows run in a forked child with a hard timeout: on a build that evaluates the
expression, 9**9**9 is a C-level big-integer power that SIGALRM cannot interrupt."""

# ------------------------------------------------------------------ running a row


class _Timeout(BaseException):
    """Raised by SIGALRM; BaseException so CliRunner does not swallow it."""


def _alarm(signum, frame):
    raise _Timeout()


def _outcome(res) -> dict:
    exc = res.exception
    return {"exit": res.exit_code, "stdout": res.stdout, "stderr": res.stderr, "output": res.output,
            "exc_ok": exc is None or isinstance(exc, SystemExit), "exc": None if exc is None else repr(exc),
            "timeout": False}


def _timeout_outcome(seconds: float) -> dict:
    return {"exit": None, "stdout": "", "stderr": "", "output": "", "exc_ok": True, "exc": None,
            "timeout": True, "seconds": seconds}


def _invoke_in_process(argv: list[str], timeout: float) -> dict:
    use_alarm = hasattr(signal, "setitimer") and sys.platform != "win32"
    if use_alarm:
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return _outcome(CliRunner().invoke(main, argv))
    except _Timeout:
        return _timeout_outcome(timeout)
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


def _invoke_forked(argv: list[str], timeout: float) -> dict:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: run the row, send the outcome, exit without cleanup
        os.close(r)
        try:
            data = pickle.dumps(_outcome(CliRunner().invoke(main, argv)))
        except BaseException as e:  # noqa: BLE001
            data = pickle.dumps({"exit": None, "stdout": "", "stderr": "", "output": "", "exc_ok": False,
                                 "exc": repr(e), "timeout": False})
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    chunks, deadline = [], time.monotonic() + timeout
    with os.fdopen(r, "rb") as f:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([f], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return _timeout_outcome(timeout)
            chunk = os.read(f.fileno(), 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    os.waitpid(pid, 0)
    return pickle.loads(b"".join(chunks))


def materialize(files: dict, tmp: Path) -> None:
    for name, content in files.items():
        p = tmp / name
        if content is DIR:
            p.mkdir(parents=True, exist_ok=True)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(content)


def run_case(case: tuple, tmp: Path) -> dict:
    id_, argv, files, _, _, _ = case
    materialize(files, tmp)
    argv = [a.replace("{tmp}", str(tmp)) for a in argv]
    t0 = time.perf_counter()
    if id_ in ISOLATED and hasattr(os, "fork"):
        out = _invoke_forked(argv, FORK_TIMEOUT_S)
    else:
        out = _invoke_in_process(argv, TIMEOUT_S)
    out["elapsed"] = time.perf_counter() - t0
    out["created_nonexistent"] = (tmp / "nonexistent").exists()
    return out


def _norm(s: str) -> str:
    """Field names compare case-blind and with _ and - alike (layers_per_stage = --layers-per-stage)."""
    return s.lower().replace("_", "-")


def lines_of(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def problems(case: tuple, out: dict) -> list[str]:
    """What is wrong with the outcome of one row (empty: the row passes)."""
    _, _, _, want, field, extra = case
    if out["timeout"]:
        return [f"timed out after {out['seconds']:g} s"]
    bad = []
    text = out["output"] + out["stderr"] + out["stdout"]
    if out["exit"] != want:
        first = (lines_of(out["stderr"]) or lines_of(out["output"]) or [""])[0]
        bad.append(f"exit {out['exit']} (want {want}); first line: {first[:200]!r}")
    if "Traceback" in text:
        bad.append("traceback in the output")
    if not out["exc_ok"]:
        bad.append(f"exception {out['exc']}")
    if out["created_nonexistent"]:
        bad.append("created a directory under nonexistent/")
    if want == 2:
        lines = lines_of(out["output"])
        if len(lines) != 1:
            bad.append(f"want one line, got {len(lines)}: {[ln[:120] for ln in lines[:4]]}")
        if out["stdout"].strip():
            bad.append(f"stdout not empty: {out['stdout'][:120]!r}")
        line = (lines_of(out["stderr"]) or [""])[0]
        if not line.startswith("error: "):
            bad.append(f"line does not start with 'error: ': {line[:160]!r}")
        rest = line[len("error: "):]
        eq = rest.find("=")
        colon = rest.find(": ", eq + 1) if eq > 0 else -1
        if eq <= 0 or colon < 0 or "; " not in rest[colon:]:
            bad.append(f"line is not '<field>=<value>: <what>; <fix>': {line[:160]!r}")
        if field is not None and _norm(f"{field}=") not in _norm(line):
            bad.append(f"field {field!r} not named as '{field}=' in {line[:160]!r}")
        if extra is not None and extra not in line:
            bad.append(f"{extra!r} not in {line[:160]!r}")
    else:
        m = NAN_INF.search(text)
        if m:
            at = text[max(0, m.start() - 60):m.end() + 20].replace("\n", " ")
            bad.append(f"silent-wrong: {m.group(0)!r} in the output (...{at}...)")
        if field is not None and not any(ln.startswith("warning:") and field in ln for ln in lines_of(out["stderr"])):
            bad.append(f"no 'warning:' line on stderr naming {field!r}")
        if extra is not None and extra not in text:
            bad.append(f"{extra!r} not in the output")
    return bad


# ------------------------------------------------------------------ pytest

_ids = [c[0] for c in CASES]
assert len(set(_ids)) == len(_ids), "duplicate case ids"


def test_table_is_large_and_distinct():
    assert len(CASES) >= 170
    assert len({(tuple(c[1]), tuple(sorted((k, v) for k, v in c[2].items() if v is not DIR))) for c in CASES}) \
        == len(CASES), "two rows run the same command on the same files"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_bad_input(case, tmp_path):
    out = run_case(case, tmp_path)
    bad = problems(case, out)
    assert not bad, "\n".join(bad) + f"\n--- stdout:\n{out['stdout'][:2000]}\n--- stderr:\n{out['stderr'][:2000]}"


# ------------------------------------------------------------------ report


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def main_report() -> int:
    print("| # | id | command | exit | first stderr line |")
    print("|---|---|---|---|---|")
    exits: dict[str, int] = {}
    tracebacks = silent = failing = 0
    failed: list[tuple[str, str]] = []
    t0 = time.perf_counter()
    for i, case in enumerate(CASES, 1):
        with tempfile.TemporaryDirectory() as d:
            out = run_case(case, Path(d))
        bad = problems(case, out)
        code = "timeout" if out["timeout"] else str(out["exit"])
        exits[code] = exits.get(code, 0) + 1
        text = out["output"] + out["stderr"]
        if "Traceback" in text or not out["exc_ok"]:
            tracebacks += 1
        if out["exit"] in (0, 1) and NAN_INF.search(text):
            silent += 1
        if bad:
            failing += 1
            failed.append((case[0], bad[0]))
        first = (lines_of(out["stderr"]) or [""])[0][:160]
        shown = code if out["exit"] == case[3] else f"{code} (want {case[3]})"
        print(f"| {i} | {_md(case[0])} | `{_md('ndplan ' + shlex.join(case[1]))}` | {shown} | {_md(first)} |")
    print()
    by_code = ", ".join(f"{k}: {v}" for k, v in sorted(exits.items()))
    print(f"cases: {len(CASES)}; tracebacks: {tracebacks}; exit codes: {by_code}; silent-wrong (exit 0/1 with "
          f"nan/inf): {silent}; failing: {failing}; {time.perf_counter() - t0:.1f} s")
    if failed:
        print()
        for id_, why in failed:
            print(f"- {id_}: {why}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main_report())
