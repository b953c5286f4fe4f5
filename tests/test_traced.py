"""``--activations traced``: the traced polynomials on one device of a parallel layout.

The division rule of formulas/traced.py is checked against a second trace of the same
transformers modules at tp = 2 under torch's fake process group (ndplan.trace.tp): rank 0's
bytes per site equal the tp = 1 polynomial divided monomial by monomial. Two plans:
transformers' own (no SP; experts split by ``moe_tp_experts``, i.e. etp = tp) and
torchtitan's TP + SP on the transformers module names (gathered linear inputs kept whole,
the fsdp profile's ``gathered_inputs_kept``). Both plans gather the logits before the loss
(transformers ``colwise_gather_output``; the torch plan's ``output_layouts=Replicate()``), so
the head's loss tensors (the ``V`` monomials; under SP also the int64 labels, 8 B per token)
stay whole there, where ndplan's rule follows the vocab-parallel loss of Megatron and
torchtitan's ``loss_parallel`` (memory.py counts the loss in the logits transient).
Needs the trace extra (torch + transformers), which CI installs.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import sympy as sp

pytest.importorskip("torch", reason="needs the trace extra: pip install 'ndplan[trace]'")
pytest.importorskip("transformers", reason="needs the trace extra: pip install 'ndplan[trace]'")

from ndplan import engines  # noqa: E402
from ndplan.formulas import activations as A  # noqa: E402
from ndplan.formulas import traced as T  # noqa: E402
from ndplan.trace import build as B  # noqa: E402
from ndplan.trace import read_config, run  # noqa: E402
from ndplan.trace.fit import SCALAR_BYTES  # noqa: E402
from ndplan.trace.measured import from_result  # noqa: E402
from ndplan.trace.tp import trace_sites  # noqa: E402

ONE, TWO = sp.Integer(1), sp.Integer(2)


class _Sizes:
    """ModelSymbols-like sizes of a traced shape."""

    def __init__(self, dims: dict):
        for k in ("h", "a", "kv", "d", "f", "V", "E", "k", "fe", "fs", "ql", "kl", "dn", "dr", "dv"):
            setattr(self, k, sp.Integer(dims.get(k, 0)))
        if "E" in dims and "fe" not in dims:
            self.fe = self.f


def _even(shape: B.Shape) -> B.Shape:
    """Sizes tp = 2 divides (heads, widths, vocabulary, sequence)."""
    d = dict(shape.dims)
    for k in ("kv", "f", "V", "fe"):
        if k in d and d[k] % 2:
            d[k] += 1
    d["a"] = d["kv"] * max(1, d["a"] // d["kv"])
    d["h"] = d["a"] * 2 * max(1, d["h"] // (2 * d["a"]))
    return B.Shape(b=shape.b, s=shape.s + shape.s % 2, dims=d)


def _gathered_loss(tr, policy, M, c, sp_on: bool) -> sp.Expr:
    """What the plans' gathered logits keep above the vocab-parallel rule: the V monomials
    whole, and under SP the int64 labels (8 B per token) whole."""
    v_local = sum(T.monomial_bytes(coef, pw, M, c) for coef, pw in tr.monomials("head", policy) if "V" in dict(pw))
    labels = 8 * c.b * c.s * (1 - 1 / c.t_sp) if sp_on else 0  # int64 labels of every token, 8 B each
    return v_local * (c.t - 1) + labels  # the V part is whole: t times its vocab-parallel share


PLANS = {"llama3-8b": ("hf", "sp"), "mixtral-8x7b": ("hf",)}
"""torchtitan's SP plan (trace.tp) is written for dense Llama-style layers; MoE runs transformers' plan."""


@pytest.mark.parametrize("name", sorted(PLANS))
def test_division_rule_matches_tp2_trace(name):
    _, cfg = read_config(name)
    tr = from_result(run.trace_model(cfg, policies=("none", "full")))
    kind = "moe" if "E" in B.present_dims(cfg) else "dense"
    for plan in PLANS[name]:
        eng = engines.FSDP if plan == "sp" else engines.HF
        for seed in (3, 7):
            shape = _even(B.random_shape(cfg, random.Random(seed)))
            M = _Sizes(shape.dims)
            c = A.ActContext(s=sp.Integer(shape.s), b=sp.Integer(shape.b), t=TWO, t_sp=TWO if plan == "sp" else ONE,
                             etp=TWO if plan == "hf" else ONE, capacity=ONE, flash=True, sp=plan == "sp", eng=eng)
            for policy in ("none", "full"):
                got = trace_sites(cfg, shape, policy, plan)
                for site, key in (("embedding", "embedding"), (kind, "layer0"), ("head", "head")):
                    want = T.local_bytes(tr, site, policy, M, c, counted_elsewhere=True)
                    if site == "head":
                        want += _gathered_loss(tr, policy, M, c, plan == "sp")
                    assert abs(got[key] - int(want)) <= SCALAR_BYTES, (name, plan, policy, site, shape, got[key], want)


def _estimate(*args) -> dict:
    r = subprocess.run([sys.executable, "-m", "ndplan.cli", "estimate", *args, "--json"], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    return json.loads(r.stdout)["memory"]["per_stage"][0]["terms"]


def test_traced_estimate_equals_closed_form_where_the_hf_terms_are_exact():
    """Llama-3-8B on the hf profile: the closed form equals the trace per site (test_trace.py);
    so at tp = 2 with SP the traced activations equal the closed-form ones within 1 %."""
    common = ["-m", "llama3-8b", "--gpus", "8", "--tp", "2", "--engine", "hf", "--zero", "3", "--seq", "4096"]
    traced, closed = _estimate(*common, "--activations", "traced"), _estimate(*common)
    assert traced["mem.activations"] == pytest.approx(closed["mem.activations"], rel=0.01)
    assert traced["mem.weights"] == closed["mem.weights"]
