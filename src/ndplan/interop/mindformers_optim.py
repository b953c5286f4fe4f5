"""MindFormers ``optimizer`` keys -> mindspore engine settings: the states each optimizer keeps
per parameter (ndplan.optimizers), in the dtype MindFormers gives them, and what MindFormers
refuses. Type names are MindFormers' optimizer registry: AdamW, PmaAdamW and Muon
(core/optim/__init__.py:26-30 at mindspore-lab/mindformers@f52743ca), Came (came.py:193), and
every class of mindspore.nn.optim, SGD and Momentum among them (core/optim/build_optim.py:101-129).
AdamW's lines are cited at fd4deebc, where they were first read; the rest at f52743ca.

Step temporaries (``optimizer_step_temp_bytes``): the fused kernels and MindSpore's SGD and
Momentum primitives update in place (none); a composite optimizer (AdamW, PmaAdamW, Came,
Muon) builds each state's new value out of place before its Assign, one state-sized tensor per
state (``composite_step_temps``; the rule that gives AdamW's 8 B, the measured flat floor of
llama3/fullrec in the mindspore profile's sources; for the others it is that rule, not a
measurement); Muon's
Newton-Schulz scratch (``muon_scratch_note``) and its MLA projections kept out of optimizer
parallel (``muon_unsharded_note``), each a note with its size.
"""

from __future__ import annotations

from ndplan import limits
from ndplan import optimizers as O
from ndplan.errors import NdplanError
from ndplan.interop.mindformers_model import get

OPTIMIZER = "optimizer.type"
SHARD_SIZE = "parallel.parallel_optimizer_config.optimizer_weight_shard_size"
FP32_ADAM = ("AdamW", "FusedAdamW", "FP32StateAdamWeightDecay")
"""Adam variants with fp32 moments: mindformers' AdamW (core/optim/__init__.py registers it; its
BasicAdamW and FusedAdamW clone exp_avg and exp_avg_sq as float32, adamw.py:162-181,
fused_adamw.py:163-193 at fd4deebc), and FP32StateAdamWeightDecay (the profile's, fp32 by name)."""
SWAP_TYPES = (None, "AdamW", "FusedAdamW", "PmaAdamW")
"""Optimizers that take ``swap`` (core/optim/__init__.py:185-215, 345-387 at f52743ca); None: the
recipe names none (the profile's AdamW)."""
STEP_TEMPS = ("one state-sized tensor per state, each new value built before its Assign (the composite AdamW's "
              "rule, measured on AdamW only)")


def composite_step_temps(opt: O.OptimizerStates, state_bytes: int) -> dict:
    """Step temporaries of a composite MindFormers optimizer: each state's new value out of place
    before its F.assign (adamw.py:47-55, came.py:124-125 at fd4deebc; pma_adamw.py, muon.py at f52743ca), all
    alive at the step: the states' own bytes per parameter. AdamW's two fp32 moments give the
    profile's 8 B, which llama3/fullrec's flat dynamic floor measured (engines.MINDSPORE sources)."""
    return {"optimizer_step_temp_bytes": opt.bytes_per_param(state_bytes)}


def flag(doc: dict, key: str) -> bool:
    v = get(doc, key, False)
    if not isinstance(v, bool):
        raise NdplanError(key, v, "not true or false", f"write {key.rsplit('.', 1)[1]}: True")
    return v


def _beta(doc: dict, key: str, default):
    """A moment decay rate: a number in [0, 1) (0: no moment kept)."""
    return limits.real(key, get(doc, key, default), 0.0, 1.0, lo_open=False, hi_open=True,
                       what="a decay rate (e.g. 0.9; 0 keeps no first moment)")


def _fused_adamw(doc: dict, name: str, notes: list) -> dict:
    """``optimizer.use_fused`` (AdamW's default False, core/optim/__init__.py:175-198) or the type
    FusedAdamW: the fused in-place kernel (gen.AdamW, fused_adamw.py:17-33, 172) updates the
    parameters and moments in place, so no optimizer-step temporaries (grads are cast to the
    parameter dtype they already have); ``amsgrad`` adds max_exp_avg_sq (fused_adamw.py:168).
    The composite AdamW (adamw.py:35-65) builds each new moment out of place before assigning it:
    the profile's 8 bytes of step temporaries; it refuses amsgrad and maximize (__init__.py:192-193).
    Lines at fd4deebc."""
    fused = name == "FusedAdamW" or flag(doc, "optimizer.use_fused")
    amsgrad, maximize = flag(doc, "optimizer.amsgrad"), flag(doc, "optimizer.maximize")
    if not fused:
        if amsgrad or maximize:
            raise NdplanError("optimizer.amsgrad" if amsgrad else "optimizer.maximize", True, "needs use_fused: True "
                              "(core/optim/__init__.py:192-193)", "add use_fused: True or drop the key")
        return {}
    notes.append("fused AdamW: parameters and moments updated in place (no optimizer-step temporaries)"
                 + ("; amsgrad keeps max_exp_avg_sq" if amsgrad else ""))
    out = {"optimizer_step_temp_bytes": 0}
    if amsgrad:
        out |= O.engine_settings(O.states("adam_amsgrad"))
    return out


def _pma_adamw(doc: dict, notes: list) -> dict:
    """PmaAdamW (core/optim/__init__.py:345-387): BasicPmaAdamW, the composite AdamW plus an fp32
    ``pma_weight`` (pma_adamw.py:195), or with ``use_fused`` FusedPmaAdamW, the fused in-place
    AdamW plus the same state (fused_pma_adamw.py:198), amsgrad adding max_exp_avg_sq
    (fused_adamw.py:173); amsgrad and maximize need use_fused (__init__.py:374-375)."""
    fused = flag(doc, "optimizer.use_fused")
    amsgrad, maximize = flag(doc, "optimizer.amsgrad"), flag(doc, "optimizer.maximize")
    if not fused and (amsgrad or maximize):
        raise NdplanError("optimizer.amsgrad" if amsgrad else "optimizer.maximize", True, "needs use_fused: True "
                          "(core/optim/__init__.py:374-375 at f52743ca)", "add use_fused: True or drop the key")
    opt = O.states("pma_adamw_amsgrad" if amsgrad else "pma_adamw")
    out = O.engine_settings(opt)  # clone_state: float32 whatever the parameter dtype
    text = (f"PmaAdamW: AdamW's two fp32 moments and an fp32 pma_weight per parameter ({opt.bytes_per_param()} B"
            + (", amsgrad's max_exp_avg_sq among them" if amsgrad else "") + "); the averaging of every "
            "interleave_step-th step (pma_adamw.py:65-73) and its temporaries are not counted; step temporaries ")
    if fused:
        out["optimizer_step_temp_bytes"] = 0
        notes.append(text + "none (the fused in-place AdamW kernel)")
    else:
        out |= composite_step_temps(opt, 4)
        notes.append(text + STEP_TEMPS)
    return out


def _came(doc: dict, weight_bytes: int, notes: list) -> dict:
    beta1 = _beta(doc, "optimizer.beta1", 0.9)
    opt = O.states("came" if beta1 and beta1 > 0 else "came_no_momentum")
    notes.append(f"Came: step temporaries {STEP_TEMPS}; its full-size intermediates that feed the factored row "
                 "and column means (the squared update and the instability matrix, came.py:86-133) are not counted")
    return O.engine_settings(opt, weight_bytes) | composite_step_temps(opt, weight_bytes)


def _sgd(doc: dict, name: str, weight_bytes: int, notes: list) -> dict:
    """mindspore.nn.SGD (registered as SGD and sgd, build_optim.py:101-119): accum and stat, whatever
    the momentum; mindspore.nn.Momentum: moments, and a ``momentum`` it requires as a float >= 0
    (momentum.py:198-203 at mindspore-ai/mindspore@09fe5b6f). Both in the parameter dtype.
    No step temporaries: each runs one primitive per parameter, P.SGD or P.ApplyMomentum
    (mindspore 2.10.0 nn/optim/sgd.py:34, 205-207; momentum.py:34, 187), which write the parameter
    and its states in place (``side_effect_mem``, ops/operations/nn_ops.py:2296, 2594;
    ApplyMomentum's variable and accumulation are RW_WRITE with the gradient in their dtype,
    2280-2286); MindFormers' accumulated gradients already have the parameter's dtype."""
    if name == "Momentum":
        m = get(doc, "optimizer.momentum")
        if isinstance(m, bool) or not isinstance(m, float) or not m >= 0:
            raise NdplanError("optimizer.momentum", m, "mindspore.nn.Momentum requires it as a float >= 0 "
                              "(momentum.py:198-203)", "give e.g. momentum: 0.9")
        opt = O.states("mindspore_momentum")
    else:
        opt = O.states("mindspore_sgd")
    notes.append(f"{name}: {opt.states} state(s) per parameter in the parameter dtype ({opt.source.split(' (')[0]}); "
                 f"no step temporaries (P.{'ApplyMomentum' if name == 'Momentum' else 'SGD'} updates in place)")
    return O.engine_settings(opt, weight_bytes) | {"optimizer_step_temp_bytes": 0}


def _muon(doc: dict, spec, weight_bytes: int, *, mcore: bool, dp: int, zero: int, notes: list) -> dict:
    """MindFormers Muon (core/optim/muon.py at f52743ca): mcore MLA models only (muon.py:321-332);
    one muon_m per 2-D/3-D weight but the embedding and output layer, AdamW's adam_m and adam_v on
    the rest, all param.clone() in the parameter dtype (muon.py:355-398; gpt_model.py:864-876);
    with optimizer parallel it wants optimizer_weight_shard_size in [1, data_parallel]
    (muon.py:407-417; MindSpore's default -1 is refused)."""
    if not mcore:
        raise NdplanError(OPTIMIZER, "Muon", "refuses the legacy model (core/optim/muon.py:326-327)",
                          "use the mcore model (use_legacy: False) or another optimizer")
    if not spec.is_mla:
        raise NdplanError(OPTIMIZER, "Muon", f"supports multi-latent attention models only, {spec.name} has none "
                          "(core/optim/muon.py:329-332)", "use an MLA model or another optimizer")
    if zero:
        k = get(doc, SHARD_SIZE, -1)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise NdplanError(SHARD_SIZE, k, "Muon with enable_parallel_optimizer needs a shard size >= 1 "
                              "(core/optim/muon.py:410-414)", "set optimizer_weight_shard_size to a divisor of "
                              "data_parallel")
        if dp < k:
            raise NdplanError(SHARD_SIZE, k, f"exceeds data_parallel={dp}, which Muon refuses (muon.py:415-417)",
                              f"give at most {dp}")
    opt = O.states("muon")
    notes.append(f"Muon: one momentum per weight matrix and AdamW's two moments on the embedding and output layer, "
                 f"in the parameter dtype ({weight_bytes} B each; muon.py:355-398); the norms' AdamW moments are "
                 f"counted at Muon's rate (under 0.01 % of the parameters); step temporaries {STEP_TEMPS}")
    notes.append(muon_scratch_note(spec))
    if zero:
        notes.append(muon_unsharded_note(spec))
    return O.engine_settings(opt, weight_bytes) | composite_step_temps(opt, weight_bytes)


def _mla_matrices(spec) -> dict[str, tuple[int, int]]:
    """Muon's Newton-Schulz inputs of one MLA layer that it gathers whole (name -> (rows, cols)):
    each weight after MindFormers' split (GPTModel.make_model_muon_fns, gpt_model.py:806-862: q and
    kv_up split per head into their nope/rope or nope/v parts, kv_down into the latent and rope
    parts, fc1 into gate and up), excluding the experts, which are not gathered (muon.py:41)."""
    h, a = spec.hidden_size, spec.num_attention_heads
    nope, rope, v = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
    q_in = spec.q_lora_rank if spec.has_q_lora else h
    out = {"linear_q_up_proj (nope part)" if spec.has_q_lora else "linear_q_proj (nope part)": (a * nope, q_in),
           "linear_kv_up_proj (nope part)": (a * nope, spec.kv_lora_rank),
           "linear_kv_up_proj (v part)": (a * v, spec.kv_lora_rank),
           "linear_kv_down_proj (latent part)": (spec.kv_lora_rank, h),
           "linear_proj": (h, a * v)}
    if spec.has_q_lora:
        out["linear_q_down_proj"] = (spec.q_lora_rank, h)
    if "dense" in spec.layer_kinds:
        out["dense linear_fc1 (gate part)"] = (spec.intermediate_size, h)
    if spec.has_shared_experts:
        out["shared_experts linear_fc1 (gate part)"] = (spec.shared_intermediate_size, h)
    if spec.mtp_layers:
        out["mtp eh_proj"] = (h, 2 * h)
    return out


def muon_scratch_note(spec) -> str:
    """The largest matrix Muon's Newton-Schulz step gathers whole (bf16, muon.py:128 and
    _perform_allgather_op, muon.py:39-53: over the optimizer shard and the tensor-parallel group),
    named with its size; not a Term: how MindSpore's graph reuses these buffers across the
    parameters of one hyper_map (muon.py:487-534) is not derived."""
    name, (m, n) = max(_mla_matrices(spec).items(), key=lambda kv: kv[1][0] * kv[1][1])
    mib = 2 * m * n / 2**20
    return ("Muon's Newton-Schulz step works on each non-expert weight matrix whole, in bf16, gathered over the "
            "optimizer shard and tensor-parallel groups (muon.py:39-53, 128-140), and iterates on it (X X^T, the "
            f"smaller side squared): the largest here, {name} {m} x {n}, is {mib:.1f} MiB gathered; the expert weights "
            "iterate batched on the local experts; not counted (the graph's reuse of these buffers is not derived)")


def muon_unsharded_note(spec) -> str:
    """GPTModel.get_op_groups_info (gpt_model.py:916-963) sets parallel_optimizer False on the MLA
    q and kv projections (and MTP's eh_proj): their weights and Muon states stay whole on every
    data-parallel rank; ndplan shards them with the rest."""
    h, a = spec.hidden_size, spec.num_attention_heads
    nope, rope, v = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
    q = (spec.q_lora_rank * h + spec.q_lora_rank * a * (nope + rope)) if spec.has_q_lora else h * a * (nope + rope)
    per_layer = q + h * (spec.kv_lora_rank + rope) + spec.kv_lora_rank * a * (nope + v)
    return (f"Muon keeps the MLA q and kv projections out of optimizer parallel (parallel_optimizer=False, "
            f"gpt_model.py:929-963): {per_layer / 1e6:.1f} M parameters a layer whose weights and states stay "
            "whole on every data-parallel rank; ndplan shards them with the rest (not modelled)")


def optimizer_settings(doc: dict, spec, weight_bytes: int, *, mcore: bool, dp: int, zero: int, notes: list) -> dict:
    """Engine settings of ``optimizer.type``: Adam's fp32 moments (the profile's 8), the fused
    AdamW's in-place update, PmaAdamW's third fp32 state, CAME's exp_avg, Muon's momentum and
    AdamW moments, SGD's and Momentum's states (those in the parameter dtype, ``weight_bytes``),
    else counted as Adam with a note."""
    if "optimizer" in doc and not isinstance(doc["optimizer"], dict):
        raise NdplanError("optimizer", doc["optimizer"], "not a mapping", "write optimizer:\n  type: AdamW")
    name = get(doc, OPTIMIZER)
    if name is not None and not isinstance(name, str):
        raise NdplanError(OPTIMIZER, name, "not an optimizer name", "write type: AdamW (or PmaAdamW, Came, Muon, SGD)")
    if name in ("AdamW", "FusedAdamW"):
        return _fused_adamw(doc, name, notes)
    if name is None or name in FP32_ADAM:
        return {}
    if name == "PmaAdamW":
        return _pma_adamw(doc, notes)
    if name == "Came":
        return _came(doc, weight_bytes, notes)
    if name == "Muon":
        return _muon(doc, spec, weight_bytes, mcore=mcore, dp=dp, zero=zero, notes=notes)
    if name in ("SGD", "sgd", "Momentum"):
        return _sgd(doc, name, weight_bytes, notes)
    notes.append(f"{OPTIMIZER} {name}: its states are counted as Adam's two fp32 moments (not modelled)")
    return {}


def swap(doc: dict, notes: list) -> bool:
    """``optimizer.swap``: AdamW and PmaAdamW make their states host Parameters (device='CPU',
    adamw.py:179-182, fused_adamw.py:191-194): the strategy's optimizer offload. Muon refuses it
    (muon.py:279-280); the other optimizers take no such argument."""
    if not flag(doc, "optimizer.swap"):
        return False
    name = get(doc, OPTIMIZER)
    if name not in SWAP_TYPES:
        why = "Muon refuses it (core/optim/muon.py:279-280)" if name == "Muon" else \
            f"{name} takes no swap argument; AdamW and PmaAdamW do (core/optim/__init__.py:185-215, 345-387)"
        raise NdplanError("optimizer.swap", True, why, "drop swap, or use AdamW")
    notes.append("optimizer.swap: the optimizer states are host Parameters (adamw.py:179-182), counted in host "
                 "memory; their transfers during the step are not modelled")
    return True
