"""What one device of a stage holds, as counts the memory Terms and the FSDP phases share:
parameters per device (TP/EP-split, before ZeRO sharding), per layer kind and per stage,
the largest layer kind (the largest FSDP group) and the activation context (shapes and
parallel widths of one micro-batch)."""

from __future__ import annotations

import sympy as sp

from ndplan import symbols as S
from ndplan.catalog.model import ModelSpec
from ndplan.formulas import activations as A
from ndplan.formulas import groups as G
from ndplan.formulas import params as P
from ndplan.vocab import BIDIRECTIONAL_SCHEDULES
from ndplan.formulas.placement import chunk_layers, embedding_device_flag, head_device_flag, pp_expr
from ndplan.structure import Structure, structure
from ndplan.symbols import ModelSymbols, model_symbols
from ndplan.readlog import derived


def _per_device(pieces: list[P.Piece], tp, ep_etp) -> tuple[sp.Expr, sp.Expr]:
    """(non-expert, expert) parameters of ``pieces`` held by one device."""
    dense = sp.Add(*[p.count / (tp if p.shard == "tp" else 1) for p in pieces if p.shard != "expert"])
    expert = sp.Add(*[p.count / ep_etp for p in pieces if p.shard == "expert"])
    return dense, expert


def stage_params(spec: ModelSpec, M: ModelSymbols, view: Structure, stage) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """(non-expert, expert, input-embedding) parameters on one device of ``stage``; the
    non-expert total includes the embedding."""
    tp, pp, ep_etp = S.tp, pp_expr(spec, view), S.ep * S.etp
    dense, expert = sp.Integer(0), sp.Integer(0)
    layer = {k: _per_device(P.layer_pieces(spec, M, k), tp, ep_etp) for k in ("dense", "moe")}
    for c in range(view.vpp):
        nd, nm = chunk_layers(spec, view, stage, c, pp, M.L)
        dense += nd * layer["dense"][0] + nm * layer["moe"][0]
        expert += nd * layer["dense"][1] + nm * layer["moe"][1]
    first = embedding_device_flag(view.schedule, stage, pp)
    last = head_device_flag(view.schedule, stage, pp)
    emb_d, _ = _per_device(P.embedding_pieces(spec, M), tp, ep_etp)
    head_d, _ = _per_device(P.head_pieces(spec, M, tied_copy=False), tp, ep_etp)
    dense += first * emb_d + last * head_d
    dense += _tied_copy(spec, view, first, last) * M.V * M.h / tp
    if spec.mtp_layers:
        mtp_d, mtp_e = _per_device(P.mtp_pieces(spec, M), tp, ep_etp)
        dense += last * spec.mtp_layers * mtp_d
        expert += last * spec.mtp_layers * mtp_e
    return dense, expert, first * emb_d


def _tied_copy(spec: ModelSpec, view: Structure, first, last):
    """1 where a tied model's head needs its own copy of the embedding (groups.tied_head_copy); under
    a bidirectional schedule on both end stages, whose head belongs to the other model copy (each
    copy its own modules: deepseek-ai/DualPipe example_dualpipe.py builds two)."""
    if view.schedule in BIDIRECTIONAL_SCHEDULES and spec.tie_word_embeddings:
        return last
    return G.tied_head_copy(spec, first, last)


def vocab_params(spec: ModelSpec, M: ModelSymbols, view: Structure, stage) -> tuple[sp.Expr, sp.Expr]:
    """(vocabulary matrices, of them the input embedding) on one device of ``stage``: the
    input embedding on stage 0 and the output layer (or a tied model's head copy) on the
    head's device, V*h/tp each; what optimizers that treat them apart see (Muon)."""
    pp = pp_expr(spec, view)
    first, last = embedding_device_flag(view.schedule, stage, pp), head_device_flag(view.schedule, stage, pp)
    one = M.V * M.h / S.tp
    head = _tied_copy(spec, view, first, last) if spec.tie_word_embeddings else last
    return (first + head) * one, first * one


def device_params(pieces: list[P.Piece]) -> tuple[sp.Expr, sp.Expr]:
    """(non-expert, expert) parameters of ``pieces`` on one device (TP/EP-split, not ZeRO-sharded)."""
    return _per_device(pieces, S.tp, S.ep * S.etp)


def layer_params(spec: ModelSpec, M: ModelSymbols, kind: str) -> sp.Expr:
    """Parameters of one layer of ``kind`` on one device (TP/EP-split, not ZeRO-sharded)."""
    d, e = _per_device(P.layer_pieces(spec, M, kind), S.tp, S.ep * S.etp)
    return d + e


def act_context(spec: ModelSpec, view: Structure) -> A.ActContext:
    view = structure(spec, view)
    eng = view.engine
    capacity = sp.Rational(eng.moe_capacity_permille, 1000) if eng.moe_capacity_permille else 1
    seq_par = view.seq_parallel
    t_sp = S.tp if seq_par else sp.Integer(1)
    return A.ActContext(s=S.seq / S.cp, b=S.mbs, t=S.tp, t_sp=t_sp, etp=S.etp,
                        capacity=sp.sympify(capacity), flash=view.flash_attention, sp=seq_par, eng=eng, sp_flag=view.sp,
                        selective_configured=view.recompute == "selective", ep=S.ep, traced=spec.traced,
                        traced_mode=view.recompute)


@derived
def largest_kind(spec: ModelSpec) -> str:
    """The decoder layer kind with the most parameters (the largest FSDP group): compared in
    numbers (M may be symbolic), recorded as one read of the model (readlog.derived)."""
    concrete = model_symbols(spec)
    return max(("dense", "moe") if spec.is_moe else ("dense",), key=lambda k: P.total(P.layer_pieces(spec, concrete, k)))
