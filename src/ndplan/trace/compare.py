"""ndplan's closed-form activation Terms beside the traced polynomial, per site and policy.

The closed form is the one the estimate uses (``formulas.activations`` with an engine
profile), written in the same size symbols as the trace, at one device (tp = cp = 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from ndplan import engines
from ndplan.catalog.model import model_from_config
from ndplan.formulas import activations as A
from ndplan.symbols import ModelSymbols
from ndplan.trace import fit as F

LABEL_BYTES = 8
"""int64 labels, shifted by one and padded by transformers' ForCausalLMLoss, saved by nll_loss."""

POSITION_BYTES = 8
"""int64 position ids (1 x s), an input of every checkpointed layer call."""

CLOSED_FORM_MODES = {"none": "none", "selective": "selective", "op": "op", "full": "full"}
"""Trace policies and the closed-form recompute mode each is compared with (``op``:
formulas.activations.op_sac_layer, what the fsdp profile's ``selective`` means)."""


@dataclass(frozen=True)
class Row:
    site: str
    policy: str
    traced: sp.Expr
    closed: sp.Expr | None
    exact: bool
    """The traced polynomial reproduced every held-out shape."""

    @property
    def difference(self) -> sp.Expr | None:
        return None if self.closed is None else sp.expand(self.traced - self.closed)


def _symbols(names, cfg: dict) -> tuple[ModelSymbols, dict]:
    """ModelSymbols written in the trace's symbols (an expert width the config does not name
    is the dense width; DeepSeek's shared experts are ns x fe; MLA rotary tables use dr)."""
    S = F.symbols_for(names)
    z = sp.Integer(0)
    fe = S.get("fe", S.get("f", z)) if ("E" in S) else z
    fs = S["ns"] * S["fe"] if "ns" in S else S.get("fs", z)
    M = ModelSymbols(h=S["h"], L=sp.Integer(1), a=S["a"], kv=S.get("kv", S["a"]),
                     d=S.get("d", S.get("dr", z)), f=S.get("f", z), V=S["V"], P=z, E=S.get("E", z),
                     k=S.get("k", z), fe=fe, fs=fs, ql=S.get("ql", z), kl=S.get("kl", z), dn=S.get("dn", z),
                     dr=S.get("dr", z), dv=S.get("dv", z))
    return M, S


def closed_form(cfg: dict, names, site: str, policy: str, attn: str, engine: str = "hf") -> sp.Expr | None:
    """Bytes ndplan's Terms give for ``site`` under ``policy`` (None: no closed form). The
    compiled policy is the engine with ``compiled_blocks`` and no recompute."""
    if policy == "compiled":
        if site == "embedding":
            return None  # under saved-tensor hooks the embedding's output is booked on the first layer
        engine, policy = engines.derive(engine, {"compiled_blocks": 1}), "none"
    mode = CLOSED_FORM_MODES.get(policy)
    if mode is None:
        return None
    spec = model_from_config(cfg, "trace", "trace")
    M, _ = _symbols(names, cfg)
    eng = engines.profile(engine)
    one = sp.Integer(1)
    c = A.ActContext(s=F.s_sym, b=F.b_sym, t=one, t_sp=one, etp=one, capacity=one, flash=attn != "eager",
                     eng=eng, selective_configured=mode == "selective")
    if site == "embedding":
        rope = 0 if spec.learned_positions else eng.rope_table_bytes * 2 * F.s_sym * M.d
        # the trace books a tensor on the site that made it: under full recompute and op SAC the first
        # layer's input (ndplan's first-layer Term) is the embedding's output, and every
        # checkpointed call holds the int64 position ids (not in ndplan's Terms: 8 B per token)
        first_input = A.ACT_BYTES * F.s_sym * F.b_sym * M.h if mode in ("full", "op") else 0
        positions = POSITION_BYTES * F.s_sym if mode != "none" else 0
        return sp.expand(A.embedding_activation(spec, M, c) + rope + first_input + positions)
    if site == "head":
        # the loss keeps its fp32 log-softmax and the int64 shifted labels; memory.py counts
        # them inside the loss-logits transient (EngineProfile.logits_bytes_per_element)
        loss = (A.FP32_BYTES * M.V + LABEL_BYTES) * F.s_sym * F.b_sym
        return sp.expand(A.head_activation(spec, M, c) + loss)
    return sp.expand(A.layer_activation(spec, M, c, site, mode))


def rows(result, cfg: dict, engine: str = "hf") -> list[Row]:
    out = []
    for (site, policy), st in result.sites.items():
        out.append(Row(site, policy, st.stored.expr,
                       closed_form(cfg, result.names, site, policy, result.attn, engine), st.stored.exact))
    return out
