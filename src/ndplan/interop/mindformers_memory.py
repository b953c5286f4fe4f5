"""MindFormers yaml keys that change memory without changing the parallel degrees, read
into engine settings (engines.derive on the mindspore profile): the optimizer type (its states
and step temporaries), the
optimizer shard group (``optimizer_weight_shard_size``) and the MoE capacity. Sources are
at mindspore-lab/mindformers@fd4deebc.
"""

from __future__ import annotations

from ndplan import optimizers as O
from ndplan.errors import NdplanError
from ndplan.interop.mindformers import get  # mindformers imports this module inside read_doc

SHARD_SIZE = "parallel.parallel_optimizer_config.optimizer_weight_shard_size"
OPTIMIZER = "optimizer.type"
MOE = "moe_config"

FP32_ADAM = ("AdamW", "FusedAdamW", "FP32StateAdamWeightDecay")
"""Adam variants with fp32 moments: mindformers' AdamW (core/optim/__init__.py registers it; its
BasicAdamW and FusedAdamW clone exp_avg and exp_avg_sq as float32, adamw.py:162-181,
fused_adamw.py:163-193), and FP32StateAdamWeightDecay (the profile's, fp32 by name)."""


def _flag(doc: dict, key: str) -> bool:
    v = get(doc, key, False)
    if not isinstance(v, bool):
        raise NdplanError(key, v, "not true or false", f"write {key.rsplit('.', 1)[1]}: True")
    return v


def _fused_adamw(doc: dict, name: str, notes: list) -> dict:
    """``optimizer.use_fused`` (AdamW's default False, core/optim/__init__.py:175-198) or the type
    FusedAdamW: the fused in-place kernel (gen.AdamW, fused_adamw.py:17-33, 172) updates the
    parameters and moments in place, so no optimizer-step temporaries (grads are cast to the
    parameter dtype they already have); ``amsgrad`` adds max_exp_avg_sq (fused_adamw.py:168).
    The composite AdamW (adamw.py:35-65) builds each new moment out of place before assigning it:
    the profile's 8 bytes of step temporaries; it refuses amsgrad and maximize (__init__.py:192-193)."""
    fused = name == "FusedAdamW" or _flag(doc, "optimizer.use_fused")
    amsgrad, maximize = _flag(doc, "optimizer.amsgrad"), _flag(doc, "optimizer.maximize")
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


def optimizer_settings(doc: dict, weight_bytes: int, notes: list) -> dict:
    """optimizer_bytes (and step temporaries) of ``optimizer.type``: Adam's fp32 moments (the
    profile's 8), the fused AdamW's in-place update, CAME's exp_avg in the parameter dtype
    (``weight_bytes``), else counted as Adam with a note."""
    name = get(doc, OPTIMIZER)
    if name in ("AdamW", "FusedAdamW"):
        return _fused_adamw(doc, name, notes)
    if name is None or name in FP32_ADAM:
        return {}
    if name == "Came":
        beta1 = get(doc, "optimizer.beta1", 0.9)
        if not isinstance(beta1, (int, float)) or isinstance(beta1, bool) or beta1 != beta1:
            raise NdplanError("optimizer.beta1", beta1, "not a number", "give e.g. 0.9")
        opt = O.states("came" if beta1 and beta1 > 0 else "came_no_momentum")
        notes.append("Came: its step temporaries (the full-size update, its square and the instability matrix, "
                     "came.py:60-140) are counted as AdamW's 8 bytes per parameter (not derived)")
        return O.engine_settings(opt, weight_bytes)
    notes.append(f"{OPTIMIZER} {name}: its states are counted as Adam's two fp32 moments (not modelled)")
    return {}


def shard_settings(doc: dict, dp: int, cp: int, zero: int, notes: list) -> dict:
    """optimizer_shard_size from optimizer_weight_shard_size: (0, devices], -1 the whole data-
    parallel group; a size that does not divide the group is not applied (trainer/
    training_args.py:173-181)."""
    k = get(doc, SHARD_SIZE)
    if k is None or k == -1:
        return {}
    if not isinstance(k, int) or isinstance(k, bool) or k == 0 or k < -1 or k > 2**20:
        raise NdplanError(SHARD_SIZE, k, "not a shard group size", "give a power of 2 that divides data_parallel, or -1")
    if not zero:
        notes.append(f"{SHARD_SIZE.rsplit('.', 1)[1]}={k}: effective only with enable_parallel_optimizer")
        return {}
    group = dp * cp
    if group % k:
        notes.append(f"{SHARD_SIZE.rsplit('.', 1)[1]}={k} does not divide the data-parallel group {group}: "
                     "MindSpore shards over the whole group")
        return {}
    return {} if k >= group else {"optimizer_shard_size": k}


def capacity_settings(doc: dict, spec, mcore: bool, notes: list) -> dict:
    """moe_capacity_permille of the legacy MoE (moe_config): without use_gmm the llama MoE layer
    is MoEV2 (models/llama/llama_transformer.py:939-953; llama_layer.py:802), which dispatches
    every expert a (capacity, h) block, capacity = ceil(k x tokens x capacity_factor / E) capped
    at the tokens (modules/transformer/moe.py:276-283, 880-889): cf x tokens x k rows, at most
    E x tokens; capacity_factor <= 0 is dynamic (moe.py:1630-1636), and use_gmm's MoEV3 runs a
    grouped matmul over the routed tokens only (moev3.py:497-521): both dropless."""
    if not spec.is_moe or mcore:
        return {}
    cf = get(doc, f"{MOE}.capacity_factor", 1.1)  # MoEConfig default (moe.py:131)
    if not isinstance(cf, (int, float)) or isinstance(cf, bool) or cf != cf or abs(cf) > 1e6:
        raise NdplanError(f"{MOE}.capacity_factor", cf, "not a number", "give e.g. 1.1, or -1 for dropless")
    if cf <= 0 or get(doc, f"{MOE}.use_gmm", False):
        return {}
    rows = min(float(cf), spec.num_experts / spec.experts_per_token)
    notes.append(f"capacity_factor {cf:g}: every expert padded to capacity (MoEV2), {rows:g} x tokens x top-k rows")
    permille = round(rows * 1000)
    return {} if permille == 1000 else {"moe_capacity_permille": permille}


def engine(doc: dict, spec, *, dp: int, cp: int, zero: int, weight_bytes: int, mcore: bool, notes: list) -> str:
    """The mindspore engine with the settings above (settings equal to the profile's left out)."""
    from ndplan.engines import MINDSPORE, derive
    settings = (optimizer_settings(doc, weight_bytes, notes) | shard_settings(doc, dp, cp, zero, notes)
                | capacity_settings(doc, spec, mcore, notes))
    return derive("mindspore", {k: v for k, v in settings.items() if getattr(MINDSPORE, k) != v})
