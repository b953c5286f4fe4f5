"""The buffers of one MoE layer's token dispatch and combine above what the layer saves (an
exclusive transient of memory.transient_term), and the allgather dispatcher's gathered tokens
in the shared all-gather buffer (memory.buffer_terms): Megatron-LM's alltoall dispatcher by
expert-TP degree and local experts, its allgather dispatcher, and the count an engine names
(EngineProfile.moe_dispatch_rows, moe_allgather_dispatch, megatron_alltoall_rows cite each
framework's lines). DeepEP's buffer is formulas/deepep.py.
"""

from __future__ import annotations

import sympy as sp

from ndplan import symbols as S
from ndplan.catalog.model import ModelSpec
from ndplan.formulas import activations as A
from ndplan.formulas.local import act_context
from ndplan.formulas.minmax import Min
from ndplan.structure import Structure
from ndplan.symbols import ModelSymbols


def moe_dispatch_transient(spec: ModelSpec, M: ModelSymbols, view: Structure) -> sp.Expr:
    """The all-to-all buffers of one MoE layer's dispatch and combine above what the layer saves:
    ``moe_dispatch_rows`` copies of its routed rows, k x s x b x capacity / t_sp tokens (the
    rows before the expert-TP gather) x h x 2 bytes (engine_fields.py cites each engine's count);
    under the allgather dispatcher, moe_allgather_transient; 0 for dense models and engines
    without a derived count."""
    eng = view.engine
    if spec.is_moe and eng.moe_allgather_dispatch:
        return moe_allgather_transient(spec, M, view)
    rows = megatron_alltoall_rows(M) if eng.megatron_alltoall_rows else eng.moe_dispatch_rows
    if not (spec.is_moe and rows):
        return sp.Integer(0)
    c = act_context(spec, view)
    return rows * A.ACT_BYTES * c.s * c.b * M.k * c.capacity / c.t_sp * M.h


def dispatch_rows_text(eng) -> str:
    if eng.megatron_alltoall_rows:
        return ("Megatron-LM's alltoall dispatcher's count by etp and local experts (dispatch.megatron_alltoall_rows, "
                "engine setting megatron_alltoall_rows)")
    return f"{eng.moe_dispatch_rows} (engine setting moe_dispatch_rows)"


def megatron_alltoall_rows(M: ModelSymbols) -> sp.Expr:
    """Copies of the routed rows Megatron-LM's alltoall dispatcher holds at its peak beside the
    saved fc1 input (EngineProfile.megatron_alltoall_rows cites each): the permuted tokens, the
    dispatch all-to-all's output and the combine's output buffer (3), the experts' output over
    etp x rows and, with more than one local expert (u), its unsorted copy: 3 + u at etp 1,
    3 + etp (1 + u) above. Integer degrees, so u = min(E/ep - 1, 1) and the etp > 1 switch
    g = min(etp - 1, 1) are 0 or 1."""
    u = Min(M.E / S.ep - 1, 1)
    g = Min(S.etp - 1, 1)
    return 3 + u + g * (S.etp * (1 + u) - u)


def _allgather_tokens(spec: ModelSpec, view: Structure) -> sp.Expr:
    """Tokens the allgather dispatcher gathers: the device's s x b / t_sp over its tp_ep group,
    expert-TP x EP ranks (the dispatcher's "tp" is the expert-TP group: token_dispatcher.py:
    46-52, ``self.tp_group = pg_collection.expt_tp``, ``self.tp_ep_group = pg_collection.tp_ep``)."""
    c = act_context(spec, view)
    return c.s * c.b / c.t_sp * S.etp * S.ep


def moe_allgather_transient(spec: ModelSpec, M: ModelSymbols, view: Structure) -> sp.Expr:
    """Megatron's allgather dispatcher at the combine (EngineProfile.moe_allgather_dispatch):
    the experts' output, the gathered tokens x k x capacity / ep rows (the routed rows of the
    E/ep local experts), beside its unpermuted copy of the gathered tokens, of h 16-bit elements
    each (token_dispatcher.py:322-352; the unpermute runs on one rank too)."""
    c = act_context(spec, view)
    return A.ACT_BYTES * _allgather_tokens(spec, view) * M.h * (M.k * c.capacity / S.ep + 1)


def moe_gathered_tokens(spec: ModelSpec, M: ModelSymbols, view: Structure) -> sp.Expr:
    """The allgather dispatcher's gathered hidden states in the shared "mpu" buffer, 2 B x h per
    gathered token when the tp_ep group has more than one rank (token_dispatcher.py:285-301;
    EngineProfile.moe_allgather_dispatch), else 0."""
    if not (spec.is_moe and view.engine.moe_allgather_dispatch):
        return sp.Integer(0)
    return A.ACT_BYTES * _allgather_tokens(spec, view) * M.h * Min(S.etp * S.ep - 1, 1)
