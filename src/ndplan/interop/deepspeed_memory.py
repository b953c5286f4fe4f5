"""DeepSpeed config keys that change memory without changing the parallel degrees, read
into engine settings (engines.derive on the deepspeed profile): the optimizer type and
its states, bf16 master weights / gradients / optimizer states, ZeRO++ hpZ, ZeRO-3
parameter offload and the gradient-reduction bucket. Sources: DeepSpeed 0.19.8 (the release CI installs), paths relative to the
``deepspeed`` package.
"""

from __future__ import annotations

from ndplan import optimizers as O
from ndplan.errors import NdplanError

DS_OPTIMIZERS = {"adam": "adam", "adamw": "adamw", "lamb": "lamb", "lion": "lion", "adagrad": "adagrad",
                 "muon": "muon", "muadam": "adam", "muadamw": "adamw"}
"""DeepSpeed's own optimizer names (runtime/config.py:52-66, lower-cased at :518-520) -> the
ndplan.optimizers entry of what runtime/engine.py:2486-2546 builds: FusedAdam (two moments),
torch Adagrad (``sum``), FusedLamb (two moments), FusedLion (``exp_avg``), mup's MuAdam/MuAdamW
(Adam's moments) and MuonWithAuxAdam, whose Muon half is every matrix whose name has neither
"embed" nor "lm_head" (deepspeed/__init__.py:357-372) and whose other half is Adam."""
TORCH_STATES = {"Adam": "adam", "AdamW": "adamw", "Adagrad": "adagrad"}
"""Other names are torch.optim classes (runtime/engine.py:2547-2549: getattr(torch.optim, name));
SGD (and mup's MuSGD) keeps a momentum buffer only with momentum > 0, torch's default 0."""


def optimizer_settings(flat: dict, notes: list) -> dict:
    """optimizer_bytes (and Muon's non_matrix_optimizer_bytes) of ``optimizer.type``; without
    an ``optimizer`` section the script passes its own (the Hugging Face Trainer's AdamW)."""
    name = flat.get("optimizer.type")
    if name is None:
        notes.append("no optimizer section: the script's own optimizer, counted as AdamW (the Hugging Face "
                     "Trainer's default)")
        return {}
    if not isinstance(name, str):
        raise NdplanError("optimizer.type", name, "not an optimizer name", 'give e.g. "AdamW"')
    low = name.lower()
    if low in DS_OPTIMIZERS:
        opt = O.states(DS_OPTIMIZERS[low])
    elif name in TORCH_STATES:
        opt = O.states(TORCH_STATES[name])
    elif name == "SGD" or low == "musgd":
        momentum = flat.get("optimizer.params.momentum", 0)
        if not isinstance(momentum, (int, float)) or isinstance(momentum, bool) or momentum != momentum:
            raise NdplanError("optimizer.params.momentum", momentum, "not a number", "give e.g. 0.9")
        opt = O.states("sgd_momentum" if momentum else "sgd")
    else:
        notes.append(f"optimizer.type {name}: its states are counted as Adam's two fp32 moments (not modelled)")
        return {}
    return O.engine_settings(opt)


BF16_MASTER = "bf16.bf16_master_weights_and_grads"
BF16_STATES = "bf16.bf16_optimizer_states"
HPZ = "zero_optimization.zero_hpz_partition_size"
OFFLOAD_PARAM = "zero_optimization.offload_param.device"


def _switch(flat: dict, key: str) -> bool:
    v = flat.get(key, False)
    if not isinstance(v, bool):
        raise NdplanError(key, v, "not true or false", f'write "{key.rsplit(".", 1)[1]}": true')
    return v


GRAD_ACCUM = "data_types.grad_accum_dtype"
DS_DTYPES = {"fp32": ("torch.float32", "fp32", "float32", "float"), "bf16": ("torch.bfloat16", "bf16", "bfloat16"),
             "fp16": ("torch.float16", "fp16", "float16", "half")}
"""The spellings DeepSpeed's DtypeEnum accepts (runtime/config.py:144-149; int8 is not a gradient dtype)."""
IMMEDIATE = "bf16.immediate_grad_update"


def _bf16(flat: dict) -> bool:
    """``bf16.enabled`` (or the old ``bfloat16`` section, precision_config.py:34-38)."""
    return bool(flat.get("bf16.enabled", flat.get("bfloat16.enabled", False)))


def _dtype(flat: dict, key: str):
    v = flat.get(key)
    if v is None:
        return None
    for name, spellings in DS_DTYPES.items():
        if v in spellings:
            return name
    raise NdplanError(key, v, "not a dtype DeepSpeed accepts", 'give "fp32", "bf16" or "fp16"')


def bf16_optimizer_settings(flat: dict, zero: int, offload: bool, notes: list) -> dict:
    """fp32_grad_accumulation and lp_grad_bytes: the optimizer wrapper DeepSpeed picks from the
    model and gradient-accumulation dtypes (runtime/engine.py:2294-2323): BF16_Optimizer at ZeRO-1
    with bf16 weights and fp32 accumulation without offload (it refuses compute_grad_norm false,
    :2307-2309); at ZeRO-0 a bf16 model with fp32 accumulation is "unsupported mix"
    (NotImplementedError, :2322-2323)."""
    acc = _dtype(flat, GRAD_ACCUM)
    if not _bf16(flat) or acc != "fp32":
        return {}
    if zero == 0:
        raise NdplanError(GRAD_ACCUM, flat[GRAD_ACCUM], "with bf16 weights and no ZeRO is refused by DeepSpeed "
                          "(\"unsupported mix\", runtime/engine.py:2322-2323)",
                          "set zero_optimization.stage 1 (BF16_Optimizer) or drop grad_accum_dtype")
    if zero != 1 or offload:
        return {}
    if flat.get("zero_optimization.compute_grad_norm", True) is False:
        raise NdplanError("zero_optimization.compute_grad_norm", False, "is refused at ZeRO-1 with bf16 weights and "
                          "fp32 gradient accumulation (runtime/engine.py:2307-2309)", "drop the key")
    immediate = _switch(flat, IMMEDIATE)
    notes.append("ZeRO-1 with bf16 and grad_accum_dtype fp32: DeepSpeed's BF16_Optimizer (fp32 gradients of the "
                 "whole model" + ("" if immediate else " beside the bf16 .grad") + ", no reduce bucket)")
    return {"fp32_grad_accumulation": 1, "lp_grad_bytes": 0 if immediate else 2}


def precision_settings(flat: dict, zero: int, offload: bool, opt: dict, notes: list,
                       bf16_optimizer: bool = False) -> dict:
    """bf16 master weights, gradients and optimizer states (runtime/precision_config.py:63-71).
    With ``bf16_master_weights_and_grads`` the ZeRO optimizer's master partition and its gradient
    partitions take bf16 (base_optimizer.py:522-527; stage_1_and_2.py:559-561, 1899-1900): 2 + 2
    bytes; ``bf16_optimizer_states`` keeps the moments in bf16 too, half the optimizer bytes.
    DeepSpeed asserts ZeRO 1-3 for both and the master flag for the states (config.py:706-714), and
    bf16 master weights with fp32 states need ZeRO-Offload with DeepSpeedCPUAdam
    (base_optimizer.py:508-519; stage_1_and_2.py:331-342)."""
    master, states = _switch(flat, BF16_MASTER), _switch(flat, BF16_STATES)
    if not (master or states):
        return {}
    if zero not in (1, 2, 3):
        raise NdplanError(BF16_MASTER if master else BF16_STATES, True, "needs ZeRO stage 1, 2 or 3 (DeepSpeed "
                          "runtime/config.py:706-714)", "set zero_optimization.stage or drop the flag")
    if states and not master:
        raise NdplanError(BF16_STATES, True, f"needs {BF16_MASTER.split('.')[1]} (runtime/config.py:714)",
                          f'add "{BF16_MASTER.split(".")[1]}": true')
    if bf16_optimizer:
        notes.append(f"{BF16_MASTER if master else BF16_STATES}: not read by BF16_Optimizer (it keeps fp32 master "
                     "partitions and fp32 states, bf16_optimizer.py:181-183)")
        return {}
    if master and not states and not offload:
        raise NdplanError(BF16_MASTER, True, "with fp32 optimizer states needs ZeRO-Offload with DeepSpeedCPUAdam "
                          "(runtime/zero/stage_1_and_2.py:331-342, stage3.py:299-310)",
                          'add zero_optimization.offload_optimizer {"device": "cpu"} or "bf16_optimizer_states": true')
    out = {"master_bytes": 2, "grad_bytes_fp32": 2}
    if states:
        out["optimizer_bytes"] = opt.get("optimizer_bytes", 8) // 2
        if "non_matrix_optimizer_bytes" in opt:
            out["non_matrix_optimizer_bytes"] = opt["non_matrix_optimizer_bytes"] // 2
    notes.append("bf16 master weights and gradient partitions" + (" and bf16 optimizer states" if states else ""))
    return out


def zero3_settings(flat: dict, zero: int, notes: list) -> dict:
    """ZeRO++ hpZ and parameter offload, both ZeRO-3 mechanisms (zero/config.py:164-168, 324)."""
    out = {}
    hpz = flat.get(HPZ, 1)
    if not isinstance(hpz, int) or isinstance(hpz, bool) or hpz < 0 or hpz > 2**20:
        raise NdplanError(HPZ, hpz, "not a rank count", "give a whole number such as 8 (the GPUs of a node)")
    device = flat.get(OFFLOAD_PARAM, "none")
    if device not in ("none", "cpu", "nvme"):
        raise NdplanError(OFFLOAD_PARAM, device, "not an offload device", 'give "cpu", "nvme" or "none"')
    if zero != 3:
        if hpz > 1 or device != "none":
            notes.append(f"{HPZ if hpz > 1 else OFFLOAD_PARAM}: a ZeRO-3 setting, unused at stage {zero}")
        return out
    if hpz > 1:
        out["secondary_weight_shard"] = hpz
    if device != "none":
        out["weights_offloaded"] = 1
        notes.append(f"offload_param {device}: the parameter partitions are counted in host memory")
    return out


BUCKET = "zero_optimization.reduce_bucket_size"
OVERLAP = "zero_optimization.overlap_comm"


def bucket_settings(flat: dict, zero: int, hidden_size: int, notes: list) -> dict:
    """reduce_bucket_elements and reduce_bucket_double: ``reduce_bucket_size`` (default 5e8;
    the Hugging Face Trainer fills ``"auto"`` with hidden_size x hidden_size,
    transformers integrations/deepspeed.py:199-229) and ``overlap_comm`` (default on at
    stage 3 only, zero/config.py:384-387)."""
    size = flat.get(BUCKET, 500_000_000)
    if size == "auto":
        size = hidden_size * hidden_size
        notes.append(f"{BUCKET} 'auto': hidden_size^2 = {size:,} (the Hugging Face Trainer's fill)")
    if isinstance(size, float) and size.is_integer():
        size = int(size)
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= 2**40:
        raise NdplanError(BUCKET, size, "not an element count", "give a whole number such as 500000000")
    overlap = flat.get(OVERLAP, zero == 3)
    if not isinstance(overlap, bool):
        raise NdplanError(OVERLAP, overlap, "not true or false", '"overlap_comm": true')
    return {"reduce_bucket_elements": size, "reduce_bucket_double": int(overlap and zero in (1, 2))}


def engine(flat: dict, zero: int, offload: bool, hidden_size: int, notes: list) -> str:
    """The deepspeed engine with the settings above (settings equal to the profile's left out)."""
    from ndplan.engines import DEEPSPEED, derive
    settings = optimizer_settings(flat, notes)
    wrapper = bf16_optimizer_settings(flat, zero, offload, notes)
    settings |= precision_settings(flat, zero, offload, settings, notes, bool(wrapper)) | wrapper
    settings |= zero3_settings(flat, zero, notes) | bucket_settings(flat, zero, hidden_size, notes)
    return derive("deepspeed", {k: v for k, v in settings.items() if getattr(DEEPSPEED, k) != v})
