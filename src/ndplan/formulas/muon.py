"""Megatron-LM's Muon step: the Newton-Schulz scratch of its largest matrix (``mem.transient``).

Megatron-LM@d98e8a64 with ``--optimizer muon`` (or ``dist_muon``) runs NVIDIA Emerging-Optimizers'
``newton_schulz`` (fd772972) one parameter after another (orthogonalized_optimizer.py:175-210) on
every 2-D weight but the embedding and output layer (megatron/core/optimizer/emerging_optimizers.py:
140-147), in fp32 (muon_utils.py:201-202). Per matrix of M x N elements, m = min(M, N) (it
transposes to whiten the smaller side, :205-208), the peak above its input, measured to the
byte on CPU by a live-storage counter (a helper's probe of the real code, shapes 96-1536 x
256-4096, fp32 and bf16):

* ``--muon-fp32-matmul-prec medium`` (default, arguments.py:2640): X is cast to bf16 for the
  iterations and back (:245-269): max(6 MN, 4 MN + 4 m^2) bytes; ``low``/``high``: fp32
  iterations, 8 MN + 8 m^2 (the old X, A = X X^T, B = bA + cA^2 and the new X, :370-375);
* ``--muon-tp-mode duplicated`` (default, arguments.py:2650-2655): every TP rank all-gathers
  the shards and orthogonalises the whole M x N matrix (muon_utils.py:327-333): 8 MN more for
  the fp32 gather buffers and their concatenation (a matrix TP does not split, MLA's down
  projections, runs plain Newton-Schulz: no gather); ``blockwise``: the local r x c shard,
  max(NS(r, c), 12 rc) with the fp32 output and the two temporaries of ``orth_grad *
  scale_factor * extra_scale_factor`` (emerging_optimizers.py:236-237); ``distributed``: the
  shard with the Gram matrix of the unsharded side k: max(6 rc, 4 rc + 4 k^2, 12 rc) (fp32:
  8 rc + 8 k^2);
* QKV is split into Q, K and V first (``--muon-no-split-qkv`` turns it off, arguments.py:
  2630-2632; emerging_optimizers.py:407-437): each piece separately, plus 4 B per local
  QKV element of split copies;
* the previous parameter's fp32 orthogonalised gradient is still referenced while the next
  runs: 4 B x the largest local matrix more.

The step runs after the last backward, so this replaces the activations and gathered weights
(memory.transient_term).
"""

from __future__ import annotations

import sympy as sp

from ndplan import symbols as S
from ndplan.catalog.model import ModelSpec
from ndplan.engines import EngineProfile
from ndplan.formulas.activations import FP32_BYTES
from ndplan.formulas.minmax import Max, Min
from ndplan.formulas.placement import has_kind
from ndplan.symbols import ModelSymbols

DUPLICATED, BLOCKWISE, DISTRIBUTED = 1, 2, 3
"""EngineProfile.muon_tp_mode values (0: no Muon)."""


def _ns(rows, cols, fp32: bool) -> sp.Expr:
    """Bytes above its input of one Newton-Schulz call on a rows x cols fp32 matrix (the Gram
    matrix of its smaller side)."""
    return _gram_side(rows * cols, Min(rows, cols), fp32)


def _gram_side(mn, k, fp32: bool) -> sp.Expr:
    """Newton-Schulz on mn elements with a k x k Gram matrix (``distributed``: k the unsharded side)."""
    return 8 * mn + 8 * k ** 2 if fp32 else Max(6 * mn, 4 * mn + 4 * k ** 2)


def _matrices(spec: ModelSpec, M: ModelSymbols) -> list[tuple[str, sp.Expr, sp.Expr, str, sp.Expr]]:
    """(name, rows, cols, split, TP degree) of every Muon matrix, Megatron's (out, in) shapes;
    split: 'rows' (column-parallel), 'cols' (row-parallel) or 'none' (not TP-split)."""
    tp, etp = S.tp, S.etp
    out = []
    if spec.is_mla:
        qk = M.dn + M.dr
        if spec.has_q_lora:
            out += [("q_down", M.ql, M.h, "none", tp), ("q_up", M.a * qk, M.ql, "rows", tp)]
        else:
            out += [("q", M.a * qk, M.h, "rows", tp)]
        out += [("kv_down", M.kl + M.dr, M.h, "none", tp), ("kv_up", M.a * (M.dn + M.dv), M.kl, "rows", tp),
                ("o", M.h, M.a * M.dv, "cols", tp)]
    else:
        out += [("q", M.a * M.d, M.h, "rows", tp), ("k", M.kv * M.d, M.h, "rows", tp),
                ("v", M.kv * M.d, M.h, "rows", tp), ("o", M.h, M.a * M.d, "cols", tp)]
    up = 2 if spec.gated_mlp else 1
    if has_kind(spec, "dense"):
        out += [("fc1", up * M.f, M.h, "rows", tp), ("fc2", M.h, M.f, "cols", tp)]
    if has_kind(spec, "moe"):
        out += [("expert_fc1", up * M.fe, M.h, "rows", etp), ("expert_fc2", M.h, M.fe, "cols", etp)]
        if spec.has_shared_experts:
            out += [("shared_fc1", up * M.fs, M.h, "rows", tp), ("shared_fc2", M.h, M.fs, "cols", tp)]
    return out


def _local(rows, cols, split, t):
    return (rows / t, cols) if split == "rows" else ((rows, cols / t) if split == "cols" else (rows, cols))


def muon_step_bytes(spec: ModelSpec, M: ModelSymbols, eng: EngineProfile) -> sp.Expr:
    """Peak bytes of Megatron's Muon step above the weights and states (module docstring);
    0 without Muon (EngineProfile.muon_tp_mode 0)."""
    mode, fp32 = eng.muon_tp_mode, eng.muon_ns_fp32
    if not mode:
        return sp.Integer(0)
    mats = _matrices(spec, M)
    if not eng.muon_split_qkv and not spec.is_mla:  # one QKV matrix instead of its pieces
        qkv = ("qkv", (M.a + 2 * M.kv) * M.d, M.h, "rows", S.tp)
        mats = [qkv] + [x for x in mats if x[0] not in ("q", "k", "v")]
    scratch = [matrix_scratch(rows, cols, split, t, mode, fp32) for _, rows, cols, split, t in mats]
    if eng.muon_split_qkv and not spec.is_mla:  # the split copies of the local QKV, beside a piece's step
        copies = FP32_BYTES * (M.a + 2 * M.kv) * M.d * M.h / S.tp
        scratch = [s + copies if m[0] in ("q", "k", "v") else s for s, m in zip(scratch, mats)]
    largest = [r * c for r, c in (_local(rows, cols, split, t) for _, rows, cols, split, t in mats)]
    return Max(*scratch) + FP32_BYTES * Max(*largest)


def matrix_scratch(rows, cols, split: str, t, mode: int, fp32: bool) -> sp.Expr:
    """Bytes of one matrix's Muon step above its input (module docstring)."""
    r, c = _local(rows, cols, split, t)
    if mode == DUPLICATED and split != "none":  # a matrix TP does not split is not gathered
        return 8 * rows * cols + _ns(rows, cols, fp32)
    if mode in (DUPLICATED, BLOCKWISE) or split == "none":
        return Max(_ns(r, c, fp32), 12 * r * c)
    return Max(_gram_side(r * c, cols if split == "rows" else rows, fp32), 12 * r * c)  # DISTRIBUTED
