"""``--activations traced``: a model whose activation Terms are what ``ndplan trace`` measured.

``traced_activations`` traces a config (run.trace_model, every policy) and keeps each
site's exact polynomial as plain integers (formulas.traced.TracedActivations), cached on
disk next to the kernels, keyed by the config, the attention implementation, the torch and
transformers versions and the trace code, so a sweep traces once. ``traced_spec`` returns the
model with those polynomials attached: every command that builds memory Terms from it uses
them (formulas.activations checks ``ActContext.traced``), with the degrees kept symbolic.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import sympy as sp

from ndplan.formulas.traced import TracedActivations, score_sites

INEXACT_PCT = 0.01
"""A fit that misses a traced shape by more than this (percent) is reported as an estimate."""

_CODE = ("build.py", "recorder.py", "fit.py", "run.py", "measured.py")


def _monomials(expr: sp.Expr, names) -> tuple:
    from ndplan.trace import fit as F
    syms = [F.b_sym, F.s_sym] + [F.symbols_for(names)[n] for n in names]
    poly = sp.Poly(sp.expand(expr), *syms)
    out = []
    for powers, coef in sorted(poly.terms()):
        if coef != int(coef):
            raise ValueError(f"non-integer coefficient {coef}")
        out.append((int(coef), tuple((s.name, int(p)) for s, p in zip(syms, powers) if p)))
    return tuple(out)


def from_result(result) -> TracedActivations:
    """TracedActivations of a run.TraceResult."""
    polys, worst = [], 0.0
    for (site, policy), st in sorted(result.sites.items()):
        polys.append((site, policy, _monomials(st.stored.expr, result.names)))
        worst = max(worst, st.stored.max_rel_error)
    v = result.versions
    source = (f"transformers {v['transformers']} modules ({result.model_type}, attn {result.attn}), torch {v['torch']} "
              f"on the CPU, exact polynomial from {result.shapes - result.held_out} shapes checked at "
              f"{result.held_out} held out")
    if worst > 0:
        source += f" (largest miss {100 * worst:.2f} %)"
    notes = []
    if 100 * worst > INEXACT_PCT:
        notes.append(f"the traced bytes miss the exact polynomial by up to {100 * worst:.1f} % at the traced shapes "
                     "(tensors sized outside the basis of ndplan.trace.fit, see ndplan trace): the activations are a "
                     "least-squares estimate")
    scores = score_sites(polys, result.attn)
    if scores:
        notes.append(f"{', '.join(scores)}: on the CPU sdpa fell back to its math kernel and kept the s x s "
                     "probabilities, which GPU flash kernels do not (MLA: q and v head dims differ); these policies "
                     "overstate the layer (selective and full recompute do not keep them)")
    return TracedActivations(source=source, attn=result.attn, polynomials=tuple(polys),
                             worst_fit_pct=round(100 * worst, 4), notes=tuple(notes))


def _key(cfg: dict, attn: str) -> str:
    import torch
    import transformers
    here = Path(__file__).parent
    h = hashlib.sha256(json.dumps([{k: cfg[k] for k in sorted(cfg) if k not in ("source", "name")}, attn,
                                   torch.__version__, transformers.__version__], sort_keys=True, default=str).encode())
    for name in _CODE:
        h.update((here / name).read_bytes())
    return h.hexdigest()[:32]


def _cache_path(key: str) -> Path:
    from ndplan.kernels import cache_dir
    return cache_dir() / "traces" / f"{key}.json"


def _load(path: Path) -> TracedActivations | None:
    try:
        d = json.loads(path.read_text())
        polys = tuple((str(s), str(p), tuple((int(c), tuple((str(n), int(e)) for n, e in pw)) for c, pw in monos))
                      for s, p, monos in d["polynomials"])
        return TracedActivations(source=str(d["source"]), attn=str(d["attn"]), polynomials=polys,
                                 worst_fit_pct=float(d["worst_fit_pct"]), notes=tuple(str(n) for n in d["notes"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or corrupt: traced again


def _save(path: Path, tr: TracedActivations) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"source": tr.source, "attn": tr.attn, "worst_fit_pct": tr.worst_fit_pct,
                                   "notes": tr.notes, "polynomials": tr.polynomials}))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs time


def traced_activations(cfg: dict, attn: str = "sdpa", progress=None) -> TracedActivations:
    """The traced polynomials of ``cfg`` (an HF config mapping), from the cache or traced now."""
    from ndplan.trace import require
    require()
    path = _cache_path(_key(cfg, attn))
    cached = _load(path)
    if cached is not None:
        return cached
    from ndplan.trace import run
    tr = from_result(run.trace_model(cfg, attn=attn, progress=progress))
    _save(path, tr)
    return tr


def traced_spec(name_or_path: str, spec, flash: bool = True, progress=None):
    """``spec`` (the model loaded from ``name_or_path``) with its traced activations: sdpa
    (the flash path) when ``flash``, eager attention otherwise."""
    from dataclasses import replace

    from ndplan.trace import read_config
    _, cfg = read_config(name_or_path)
    return replace(spec, traced=traced_activations(cfg, "sdpa" if flash else "eager", progress))
