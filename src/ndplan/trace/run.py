"""Trace a config over many small shapes and fit each site's bytes exactly (``fit``)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import sympy as sp

from ndplan.trace import build as B
from ndplan.trace import fit as F

SITES = ("embedding", "dense", "moe", "head")
"""Layer kinds a trace reports: everything before the first decoder layer (embedding,
rotary tables, masks), a dense decoder layer, a MoE decoder layer, and everything after
the last one (final norm, output projection, loss)."""


@dataclass(frozen=True)
class SiteTrace:
    site: str
    policy: str
    stored: F.Fit
    """Bytes the site keeps for backward, per micro-batch."""
    forward_peak: F.Fit | None
    """Largest live bytes inside the site's forward above what was live when it began (None
    for the compiled policy, build.COMPILED)."""


@dataclass
class TraceResult:
    model_type: str
    attn: str
    names: tuple[str, ...]
    """Size symbols of the architecture (h, f, a, kv, d, V, E, k, fe, ...)."""
    shapes: int
    held_out: int
    sites: dict = field(default_factory=dict)
    """(site, policy) -> SiteTrace."""
    backward_peak: dict = field(default_factory=dict)
    """policy -> Fit of the largest non-gradient workspace in backward (whole model)."""
    versions: dict = field(default_factory=dict)


def representative(kinds: list[str]) -> dict[str, int]:
    """Per decoder-layer kind, a layer followed by one of the same kind (its output is
    another layer's input, as in the middle of a deep stack)."""
    out = {}
    for i in range(len(kinds) - 1):
        if kinds[i] == kinds[i + 1]:
            out.setdefault(kinds[i], i)
    return out


def trace_model(cfg: dict, policies=B.POLICIES, attn: str = "sdpa", seed: int = 0, held_out: int = 3,
                progress=None) -> TraceResult:
    import torch
    import transformers
    compiled = B.COMPILED in policies
    policies = tuple(p for p in policies if p != B.COMPILED)
    names = tuple(B.present_dims(cfg))
    monos = F.basis(names)
    n = len(monos) + 2 + held_out
    rng = random.Random(seed)
    shapes = [B.random_shape(cfg, rng) for _ in range(n)] if policies else []
    values: dict[tuple[str, str, str], list[int]] = {}
    bwd: dict[str, list[int]] = {}
    where = None
    for j, shape in enumerate(shapes):
        model = B.build(B.scaled_config(cfg, shape), attn)
        kinds = [B.layer_kind(layer) for layer in B.decoder_layers(model)[1]]
        where = where or representative(kinds)
        sites = {"embedding": "embedding", "head": "head"} | {k: f"layer{i}" for k, i in where.items()}
        for policy in policies:
            rec, stored = B.trace_step(model, shape, policy, attn)
            for site, key in sites.items():
                values.setdefault((site, policy, "stored"), []).append(stored.get(key, 0))
                values.setdefault((site, policy, "peak"), []).append(rec.forward_peak.get(key, 0))
            bwd.setdefault(policy, []).append(rec.backward_peak)
        if progress:
            progress(j + 1, n * (1 + compiled))  # the compiled policy traces n shapes of its own after these
    points = [_point(sh, names) for sh in shapes]
    fit_n = n - held_out
    res = TraceResult(model_type=str(cfg.get("model_type")), attn=attn, names=names, shapes=n, held_out=held_out,
                      versions={"torch": torch.__version__, "transformers": transformers.__version__})

    def solve(vals):
        return F.fit(monos, points[:fit_n], vals[:fit_n], points[fit_n:], vals[fit_n:])

    for site in SITES:
        if site not in ("embedding", "head") and site not in (where or {}):
            continue
        for policy in policies:
            res.sites[(site, policy)] = SiteTrace(site, policy, solve(values[(site, policy, "stored")]),
                                                  solve(values[(site, policy, "peak")]))
    for policy in policies:
        res.backward_peak[policy] = solve(bwd[policy])
    if compiled:
        _trace_compiled(cfg, attn, res, monos, n, held_out, rng, where, progress, offset=len(shapes))
    return res


def _trace_compiled(cfg, attn, res: TraceResult, monos, n: int, held_out: int, rng, where, progress,
                    offset: int = 0) -> None:
    """The compiled policy over its own shapes (build.realistic_shape), fitted like the others."""
    shapes = [B.realistic_shape(cfg, rng) for _ in range(n)]
    values: dict[str, list[int]] = {}
    for j, shape in enumerate(shapes):
        model = B.build(B.scaled_config(cfg, shape), attn)
        if where is None:
            where = representative([B.layer_kind(layer) for layer in B.decoder_layers(model)[1]])
        stored = B.compiled_step(model, shape)
        # hooks book a layer's input on the layer: the second of the pair is the one inside the stack
        # (the first also saves the rotary tables every layer shares)
        for site, key in ({"head": "head"} | {k: f"layer{i + 1}" for k, i in where.items()}).items():
            values.setdefault(site, []).append(stored.get(key, 0))
        if progress:
            progress(offset + j + 1, offset + n)
    points = [_point(sh, res.names) for sh in shapes]
    fit_n = n - held_out
    for site, vals in values.items():
        res.sites[(site, B.COMPILED)] = SiteTrace(site, B.COMPILED, F.fit(monos, points[:fit_n], vals[:fit_n],
                                                                          points[fit_n:], vals[fit_n:]), None)


def _point(shape: B.Shape, names) -> dict:
    S = F.symbols_for(names)
    return {F.b_sym: shape.b, F.s_sym: shape.s} | {S[k]: v for k, v in shape.dims.items() if k in S}


def evaluate(expr: sp.Expr, values: dict) -> int:
    """The polynomial at a model's sizes (``values``: symbol name -> number, plus b and s)."""
    subs = {sym: values[sym.name] for sym in expr.free_symbols}
    return int(expr.subs(subs))
