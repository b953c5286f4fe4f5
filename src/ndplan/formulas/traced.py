"""Traced activation bytes as Terms: what ``ndplan trace`` measured, on one device of a
parallel layout (``--activations traced``).

``ndplan trace`` fits, per site (embedding, dense layer, MoE layer, head + loss) and
recompute policy, the exact polynomial of the bytes the real transformers module keeps for
backward, in the micro-batch ``b``, the sequence ``s`` and the model's sizes, on one device.
This module keeps those polynomials (``TracedActivations``, plain integers and names, no
SymPy, so a ModelSpec that carries them stays hashable and its repr keys the kernel cache)
and turns each monomial into the bytes one device of a layout keeps (``local_bytes``).

The division rule, one monomial at a time (each monomial is one tensor class: tokens times
one width or one head product; ``fit.basis``):

- ``s`` is the local sequence shard ``s/cp`` throughout (each CP rank keeps its shard);
  ``b`` the micro-batch;
- a monomial with ``k`` (routed token-expert pairs) counts the pairs one device holds,
  ``b*s*k*capacity*min(etp, t_sp)/t_sp``: each rank routes its sequence shard, and an
  expert-TP group gathers the shards of its ranks (with SP and etp = tp, Megatron's
  ``b*s*k*capacity*etp/t_sp`` of formulas.activations item 6; without SP the tokens are
  already whole on every rank, as the tp = 2 trace of transformers' ``moe_tp_experts`` plan
  shows); an expert-intermediate width (``fe``, or ``f`` where the config names no expert
  width) is split over ``etp``;
- a monomial with a head count (``a``, ``kv``), an MLP width (``f``, ``ns*fe``, ``fs``), the MLA
  per-head dims (``dn``, ``dv``) or the vocabulary ``V`` is a column-parallel output,
  divided by ``tp`` (Megatron's and torchtitan's vocab-parallel loss for ``V``);
- the MLA latents (``ql``, ``kl``, ``dr`` alone) are replicated over TP (their
  down-projections are not split);
- ``b*s^2`` without heads (an expanded attention mask) and tensors without ``b`` (rotary
  tables, position ids) are replicated;
- everything else on the token axis (``b*s*h``, ``b*s*E`` router logits, per-token
  scalars ``b*s``) is the residual stream, divided by ``tp`` under SP (``t_sp``), except, for
  engines that save the all-gathered linear inputs (``gathered_inputs``), one ``2*b*s*h``
  per column-parallel input (attention, MLP; the output layer), which stays whole.

``tests/test_traced.py`` checks this rule against a second trace of the same modules at
tp = 2 under torch's fake process group (``ndplan.trace.tp``).

Outside the rule, by site:

- head: the monomials in ``V`` are the loss's kept tensors (the eager loss's fp32
  log-softmax); memory.py counts the loss through the logits transient
  (EngineProfile.logits_bytes_per_element, measured on the same eager loss), so they are
  left out here;
- embedding: the monomials without ``b`` in ``s*d``, ``s*dr`` and ``s^2`` are the rotary
  tables and the causal mask, which mem.graph_constants counts once per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from ndplan.formulas.minmax import Min

Monomial = tuple[int, tuple[tuple[str, int], ...]]
"""(integer coefficient in bytes, ((size name, power), ...)), names as in trace.fit."""

SITES = ("embedding", "dense", "moe", "head")
ROUTED = "k"
EXPERT_WIDTHS = frozenset({"fe", "f"})
COLUMN_PARALLEL = frozenset({"a", "kv", "f", "fs", "ns", "dn", "dv", "V"})
REPLICATED = frozenset({"ql", "kl", "dr"})
GRAPH_CONSTANT_WIDTHS = frozenset({"d", "dr"})


@dataclass(frozen=True)
class TracedActivations:
    """Per (site, policy), the bytes the traced module keeps for backward on one device."""

    source: str
    """What was traced: library versions, attention implementation, shapes."""
    attn: str
    """attn_implementation the trace ran (sdpa or eager)."""
    polynomials: tuple[tuple[str, str, tuple[Monomial, ...]], ...]
    """(site, policy, monomials)."""
    worst_fit_pct: float = 0.0
    """Largest relative miss of the fitted polynomials at the traced shapes, percent."""
    notes: tuple[str, ...] = ()
    """What the CPU trace shows that the GPU run would not (printed with the estimate)."""

    def monomials(self, site: str, policy: str) -> tuple[Monomial, ...] | None:
        for s, p, monos in self.polynomials:
            if s == site and p == policy:
                return monos
        return None

    def policies(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p for _, p, _ in self.polynomials))


def trace_policy(mode: str, selective_op_sac: bool) -> str:
    """The trace policy a recompute mode stands for (``selective`` is torchtitan's op SAC for
    engines with ``selective_op_sac``, Megatron's core-attention recompute otherwise)."""
    if mode == "selective":
        return "op" if selective_op_sac else "selective"
    return mode


def _size(name: str, M) -> sp.Expr:
    if name == "ns":  # DeepSeek: shared experts, each of the routed width
        return M.fs / M.fe
    return getattr(M, name)


def divisor(names: frozenset[str], s_power: int, c, has_b: bool = True) -> sp.Expr:
    """What one device's share of a tensor class is divided by (module docstring)."""
    if not has_b:  # per-sequence tensors (rotary tables, position ids): every rank holds them whole
        return sp.Integer(1)
    if ROUTED in names:  # token-expert pairs on a device; expert widths split over etp
        pairs = c.capacity * Min(c.etp, c.t_sp) / c.t_sp
        return (c.etp if names & EXPERT_WIDTHS else sp.Integer(1)) / pairs
    if names & COLUMN_PARALLEL:
        return c.t
    if names & REPLICATED or s_power > 1:
        return sp.Integer(1)
    return c.t_sp


def _kept(site: str, names: frozenset[str], has_b: bool, s_power: int) -> bool:
    if site == "head" and "V" in names:
        return False
    if site == "embedding" and not has_b and (names & GRAPH_CONSTANT_WIDTHS or s_power > 1):
        return False
    return True


def monomial_bytes(coef: int, powers, M, c) -> sp.Expr:
    """One traced monomial on one device: its bytes at the local sizes, divided by the rule."""
    pw = dict(powers)
    names = frozenset(n for n in pw if n not in ("b", "s"))
    term = sp.Integer(coef) * c.b ** pw.get("b", 0) * c.s ** pw.get("s", 0)
    for n in names:
        term *= _size(n, M) ** pw[n]
    return term / divisor(names, pw.get("s", 0), c, "b" in pw)


def local_bytes(tr: TracedActivations, site: str, policy: str, M, c, counted_elsewhere: bool = False) -> sp.Expr | None:
    """Bytes one device keeps for ``site`` under ``policy`` per micro-batch (``M`` the model's
    sizes, ``c`` a formulas.activations.ActContext); None when the trace has no such site.
    The loss tensors and graph constants that memory.py counts in other Terms are left out
    unless ``counted_elsewhere`` (every traced tensor, as the tp = 2 check compares)."""
    monos = tr.monomials(site, policy)
    if monos is None:
        return None
    total = sp.Integer(0)
    for coef, powers in monos:
        pw = dict(powers)
        names = frozenset(n for n in pw if n not in ("b", "s"))
        if counted_elsewhere or _kept(site, names, "b" in pw, pw.get("s", 0)):
            total += monomial_bytes(coef, powers, M, c)
    return total + gathered_inputs(site, policy, M, c)


GATHERED_GROUPS = {"dense": 2, "moe": 2, "head": 1}
"""All-gathered inputs per site under SP: the attention input, the MLP (or MoE block) input;
the output layer's input."""


GATHERED_POLICIES = ("none", "selective")
"""Policies under which a layer keeps its linear inputs (full recompute keeps the layer input
only; op-level SAC re-runs the all-gather, which is not on its save list)."""


def gathered_inputs(site: str, policy: str, M, c) -> sp.Expr:
    """Under SP with an engine that saves the all-gathered linear inputs full-size
    (EngineProfile.gathered_inputs_kept; torch DTensor SP: ``PrepareModuleInput`` hands the
    gathered tensor to the column-parallel linears, which save it), the part of each gathered
    input above its sequence shard, which the residual-stream rule divided by tp."""
    if not (c.sp and c.eng.gathered_inputs_kept) or site not in GATHERED_GROUPS:
        return sp.Integer(0)
    if site != "head" and policy not in GATHERED_POLICIES:
        return sp.Integer(0)
    from ndplan.formulas.activations import ACT_BYTES
    return GATHERED_GROUPS[site] * ACT_BYTES * c.b * c.s * M.h * (1 - 1 / c.t_sp)


def score_sites(polynomials, attn: str) -> tuple[str, ...]:
    """Layer sites and policies whose sdpa trace keeps s x s scores per head (``b*s^2*a``):
    the CPU's math fallback, which GPU flash kernels do not allocate (MLA: q and v head dims
    differ, so sdpa on the CPU cannot take its flash path)."""
    if attn != "sdpa":
        return ()
    out = []
    for site, policy, monos in polynomials:
        if site in ("dense", "moe") and any(dict(pw).get("s", 0) == 2 and "a" in dict(pw) for _, pw in monos):
            out.append(f"{site}/{policy}")
    return tuple(out)
