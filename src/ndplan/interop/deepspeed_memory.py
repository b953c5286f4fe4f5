"""DeepSpeed config keys that change memory without changing the parallel degrees, read
into engine settings (engines.derive on the deepspeed profile): the optimizer type and
its states, bf16 master weights / gradients / optimizer states, ZeRO++ hpZ, ZeRO-3
parameter offload and the gradient-reduction bucket. Sources: DeepSpeed 0.19.8 (the release CI installs), paths relative to the
``deepspeed`` package.
"""

from __future__ import annotations

from ndplan import optimizers as O
from ndplan.errors import NdplanError
from ndplan.limits import MAX_ELEMENTS
from ndplan.units import DTYPE_BYTES

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


def flag(v) -> bool:
    """A DeepSpeed switch as its pydantic bool reads it (lax mode: true/false, 0/1 and the strings
    "true", "yes", "on", "1", ... in any case); ``"auto"`` is resolved before (``precision_auto``)."""
    if isinstance(v, str):
        return v.lower() in ("1", "on", "t", "true", "y", "yes")
    return v is True or (not isinstance(v, bool) and v == 1)


def bf16_enabled(flat: dict) -> bool:
    """``bf16.enabled``, or the old ``bfloat16`` section's when there is no ``bf16`` section
    (precision_config.py:34-38)."""
    if any(k == "bf16" or k.startswith("bf16.") for k in dict.keys(flat)):
        return flag(flat.get("bf16.enabled", False))
    return flag(flat.get("bfloat16.enabled", False))


HF_PRECISION = {"bf16.enabled": ("bf16", 181), "fp16.enabled": ("fp16", 180), "bfloat16.enabled": (None, None)}
"""The precision switches and how ``"auto"`` is filled: the Hugging Face Trainer's fill_match sets
bf16.enabled / fp16.enabled to ``args.<flag> or args.<flag>_full_eval`` (key -> (TrainingArguments flag, line of
transformers 5.17.0 integrations/deepspeed.py)); it does not fill the old ``bfloat16`` section, and DeepSpeed
itself drops an ``"auto"`` value for the field's default, false (runtime/config_utils.py:54-56)."""
HF_PRECISION_DEFAULT = False
"""TrainingArguments.bf16 / fp16 / bf16_full_eval / fp16_full_eval default (transformers 5.17.0
training_args.py:872-895), and DeepSpeed's enabled default (precision_config.py:46, 105)."""


def precision_auto(flat: dict, notes: list) -> None:
    """``"auto"`` precision switches resolved in ``flat`` as the Hugging Face Trainer resolves them with its
    defaults (HF_PRECISION: false), in one note saying what to write for a run that passes the flag."""
    autos = [k for k in HF_PRECISION if dict.get(flat, k) == "auto"]
    for k in autos:
        flat.get(k)
        dict.__setitem__(flat, k, HF_PRECISION_DEFAULT)
    if not autos:
        return
    filled = [k for k in autos if HF_PRECISION[k][0]]
    flags = list(dict.fromkeys(HF_PRECISION[k][0] or "bf16" for k in autos))
    how = (f"the Hugging Face Trainer fills it from TrainingArguments "
           f"{', '.join(HF_PRECISION[k][0] + '=False' for k in filled)}, its default, transformers "
           f"integrations/deepspeed.py:{'-'.join(sorted(str(HF_PRECISION[k][1]) for k in filled))}; " if filled else
           "the Hugging Face Trainer does not fill the old bfloat16 section; ")
    notes.append(f"{', '.join(autos)} 'auto': false ({how}DeepSpeed alone drops 'auto' for its default false, "
                 f"runtime/config_utils.py:54-56); for a run with {' or '.join(f'--{f}' for f in flags)}, write "
                 + " or ".join(f'"{f}": {{"enabled": true}}' for f in flags) + " in the file")


def _dtype(flat: dict, key: str):
    v = flat.get(key)
    if v is None:
        return None
    for name, spellings in DS_DTYPES.items():
        if v in spellings:
            return name
    raise NdplanError(key, v, "not a dtype DeepSpeed accepts", 'give "fp32", "bf16" or "fp16"')


COMM_DTYPE = "communication_data_type"
COMM_DTYPES = {d: DTYPE_BYTES[d] for d in ("fp32", "fp16", "bf16")}
"""``communication_data_type`` (runtime/config.py:216-230: fp16, bf16 or fp32, any case) in bytes."""


def comm_settings(flat: dict) -> dict:
    """grad_comm_bytes: the dtype DeepSpeed reduces gradients in, ``communication_data_type``, by
    default fp16 or bf16 when enabled, else fp32 (runtime/engine.py:1719-1730)."""
    v = flat.get(COMM_DTYPE)
    if v is None:
        half = bf16_enabled(flat) or flag(flat.get("fp16.enabled", False))
        return {"grad_comm_bytes": 2 if half else 4}
    if not isinstance(v, str) or v.lower() not in COMM_DTYPES:
        raise NdplanError(COMM_DTYPE, v, "not a dtype DeepSpeed accepts", 'give "fp16", "bf16" or "fp32"')
    return {"grad_comm_bytes": COMM_DTYPES[v.lower()]}


def bf16_optimizer_settings(flat: dict, zero: int, offload: bool, notes: list) -> dict:
    """fp32_grad_accumulation and lp_grad_bytes: the optimizer wrapper DeepSpeed picks from the
    model and gradient-accumulation dtypes (runtime/engine.py:2294-2323): BF16_Optimizer at ZeRO-1
    with bf16 weights and fp32 accumulation without offload (it refuses compute_grad_norm false,
    :2307-2309); at ZeRO-0 a bf16 model with fp32 accumulation is "unsupported mix"
    (NotImplementedError, :2322-2323)."""
    acc = _dtype(flat, GRAD_ACCUM)
    if not bf16_enabled(flat) or acc != "fp32":
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
    return _bf16_wrapper(flat)


def _bf16_wrapper(flat: dict) -> dict:
    """BF16_Optimizer's gradients: fp32 accumulation of the whole model, and the bf16 .grad beside
    it unless immediate_grad_update frees it (runtime/bf16_optimizer.py)."""
    return {"fp32_grad_accumulation": 1, "lp_grad_bytes": 0 if _switch(flat, IMMEDIATE) else DTYPE_BYTES["bf16"]}


def pipeline_bf16(flat: dict, zero: int, pp: int, notes: list) -> tuple[int, str]:
    """(ZeRO stage the engine runs, gradient dtype): ZeRO stage 0 with bf16 weights under the pipeline
    engine (pp > 1) and gradient accumulation in the model dtype (the default, runtime/engine.py:
    1806-1807) gets BF16_Optimizer (runtime/engine.py:582, 2313-2320, 2363-2364), which shards the fp32 master and the
    optimizer states over dp as ZeRO-1 does (bf16_optimizer.py:170-183) and keeps one gradient buffer
    of the whole model in the accumulation dtype, bf16 (:190-191); else the file's stage."""
    if pp > 1 and zero == 0 and bf16_enabled(flat) and _dtype(flat, GRAD_ACCUM) in (None, "bf16"):
        notes.append("zero_optimization.stage 0 with bf16 and pipeline stages: DeepSpeed's BF16_Optimizer "
                     "(runtime/engine.py:582, 2313-2320, 2363-2364), estimated as ZeRO-1 with a bf16 gradient buffer "
                     "of the whole "
                     "model (bf16_optimizer.py:170-191)")
        return 1, "bf16"
    return zero, "fp32"


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


PREFETCH = "zero_optimization.stage3_prefetch_bucket_size"
LIVE = "zero_optimization.stage3_max_live_parameters"
REUSE = "zero_optimization.stage3_max_reuse_distance"
QWZ = "zero_optimization.zero_quantized_weights"
QGZ = "zero_optimization.zero_quantized_gradients"
QNTW = "zero_optimization.zero_quantized_nontrainable_weights"
PERSIST = "zero_optimization.stage3_param_persistence_threshold"
MODEL_PERSIST = "zero_optimization.stage3_model_persistence_threshold"
SEQUENTIAL = "zero_optimization.stage3_allgather_sequential"
ALL_REDUCE_FETCH = "zero_optimization.stage3_use_all_reduce_for_fetch_params"
OFFLOAD_RATIO = "zero_optimization.offload_optimizer.ratio"
OFFLOAD_DEVICE = "zero_optimization.offload_optimizer.device"
SUB_GROUP = "zero_optimization.sub_group_size"
ZERO3_BUDGETS = {PREFETCH: ("zero3_prefetch_elements", 50_000_000), LIVE: ("zero3_live_elements", 1_000_000_000),
                 REUSE: ("zero3_reuse_elements", 1_000_000_000)}
"""ZeRO-3 coordinator budgets: key -> (engine setting, DeepSpeed 0.19.8 default, zero/config.py:222, 245, 251)."""
HF_AUTO_PREFETCH = 0.9
"""The Hugging Face Trainer fills ``"auto"`` stage3_prefetch_bucket_size with int(0.9 x hidden_size^2)
and stage3_param_persistence_threshold with 10 x hidden_size (transformers 5.17.0
integrations/deepspeed.py:229-239)."""
HF_AUTO_PERSIST = 10


def elements(flat: dict, key: str, default: int, auto: int | None = None, notes: list | None = None) -> int:
    """A DeepSpeed element-count key (pydantic int >= 0; a whole float such as 5e8 is accepted);
    ``"auto"`` is the Hugging Face Trainer's fill ``auto`` (None: the Trainer does not fill it)."""
    v = flat.get(key, default)
    if v == "auto":
        if auto is None:
            raise NdplanError(key, v, "is not filled by the Hugging Face Trainer (it fills reduce_bucket_size, "
                              "stage3_prefetch_bucket_size and stage3_param_persistence_threshold only)",
                              "give a whole number")
        if notes is not None:
            notes.append(f"{key} 'auto': {auto:,} (the Hugging Face Trainer's fill from hidden_size)")
        return auto
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise NdplanError(key, v, "not an element count (DeepSpeed's zero/config.py wants an int >= 0)",
                          "give a whole number such as 50000000")
    return min(v, MAX_ELEMENTS)  # DeepSpeed allows up to sys.maxsize: such a budget does not bind


def zero3_settings(flat: dict, zero: int, hidden_size: int, notes: list) -> dict:
    """ZeRO++ hpZ and qwZ, parameter offload and the coordinator's prefetch / live / reuse budgets:
    ZeRO-3 mechanisms (zero/config.py:164-168, 222-255, 324-332; formulas/deepspeed_gather.py).
    qgZ and the quantized storage of frozen weights are read and stated in notes."""
    out = {}
    hpz = flat.get(HPZ, 1)
    if not isinstance(hpz, int) or isinstance(hpz, bool) or hpz < 0 or hpz > 2**20:
        raise NdplanError(HPZ, hpz, "not a rank count", "give a whole number such as 8 (the GPUs of a node)")
    device = flat.get(OFFLOAD_PARAM, "none")
    if device not in ("none", "cpu", "nvme"):
        raise NdplanError(OFFLOAD_PARAM, device, "not an offload device", 'give "cpu", "nvme" or "none"')
    budgets = {key: elements(flat, key, default, int(HF_AUTO_PREFETCH * hidden_size * hidden_size)
                             if key == PREFETCH else None, notes if zero == 3 else None)
               for key, (_, default) in ZERO3_BUDGETS.items()}
    qwz, qgz, qntw = _switch(flat, QWZ), _switch(flat, QGZ), _switch(flat, QNTW)
    if zero != 3:
        stage3 = [k for k in (HPZ, OFFLOAD_PARAM, QWZ, QGZ, QNTW, *ZERO3_BUDGETS, PERSIST, MODEL_PERSIST, SEQUENTIAL,
                                ALL_REDUCE_FETCH, OFFLOAD_RATIO, SUB_GROUP)
                  if k in flat and flat[k] not in (False, None, "none") and not (k == HPZ and hpz <= 1)]
        if stage3:
            notes.append(f"{', '.join(stage3)}: ZeRO-3 settings, unused at stage {zero}")
        return out
    if hpz > 1:
        out["secondary_weight_shard"] = hpz
    if device != "none":
        out["weights_offloaded"] = 1
        notes.append(f"offload_param {device}: the parameter partitions are counted in host memory")
    for key, (setting, _) in ZERO3_BUDGETS.items():
        out[setting] = budgets[key]
    if qwz:
        out["zero3_quantized_weights"] = 1
    if qgz:
        notes.append(f"{QGZ}: read, not modelled: ZeRO++ qgZ reduces each gradient of a bucket by int4 all-to-alls "
                     "across nodes instead of a reduce-scatter (runtime/comm/coalesced_collectives.py:31-76; only with "
                     "more than one node, runtime/zero/stage3.py:1927-1930): its per-tensor int4 copies, under the "
                     "reduce bucket's size, are not counted")
    if qntw:
        notes.append(f"{QNTW}: read, not modelled: it keeps frozen parameters in int8 (partition_parameters.py:"
                     "1838, 1922); every parameter is trained in this estimate")
    for key in (SEQUENTIAL, ALL_REDUCE_FETCH):
        if _switch(flat, key):
            notes.append(f"{key}: read, not modelled: each fetch builds the parameters as views of its gather buffer "
                         "(partition_parameters.py:1373-1402, 1446-1464), so the bucket in use holds no second copy; "
                         "the estimate counts one (mem.zero3_gather)")
    ratio = flat.get(OFFLOAD_RATIO, 1.0)
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0 <= ratio <= 1:
        raise NdplanError(OFFLOAD_RATIO, ratio, "not a fraction (offload_config.py:99: 0 <= ratio <= 1)",
                          "give e.g. 0.3")
    if ratio < 1 and flat.get(OFFLOAD_DEVICE, "none") in ("cpu", "nvme"):
        notes.append(f"{OFFLOAD_RATIO} {ratio}: read, not modelled: ZeRO-3 offloads only this fraction of the "
                     "optimizer's sub-groups (runtime/zero/stage3.py:1100-1108); the estimate offloads them all")
    if SUB_GROUP in flat:
        elements(flat, SUB_GROUP, 1)  # a count of elements, or the one-line error
        notes.append(f"{SUB_GROUP} {flat[SUB_GROUP]}: read, not modelled: the ZeRO-3 optimizer step handles the fp32 "
                     "partitions in sub-groups of this many elements (runtime/zero/stage3.py:1213-1230); its "
                     "per-sub-group buffers are not counted")
    return out


def persistence_note(flat: dict, spec, tp: int, dp: int, hidden_size: int, notes: list) -> None:
    """``stage3_param_persistence_threshold`` / ``stage3_model_persistence_threshold``, read and
    stated: parameters of at most the threshold elements are never partitioned (mark_persistent_parameters,
    runtime/zero/parameter_offload.py:317-335, in named_parameters order, stopping at the model
    threshold). Which they are depends on each parameter's size on the device, not on the
    degrees the estimate varies, so the note counts them at the file's tp."""
    if PERSIST not in flat and MODEL_PERSIST not in flat:
        return
    threshold = elements(flat, PERSIST, 100_000, HF_AUTO_PERSIST * hidden_size, notes)
    cap = elements(flat, MODEL_PERSIST, MAX_ELEMENTS)
    total, count, kinds = 0, 0, []
    for name, numel, n in parameter_sizes(spec, tp):
        for _ in range(n):
            if numel + total > cap or numel > threshold:
                continue
            total, count = total + numel, count + 1
            if name not in kinds:
                kinds.append(name)
    from ndplan.units import fmt_bytes
    extra = DTYPE_BYTES["bf16"] * total * (1 - 1 / dp)  # the 16-bit weights ZeRO-3 gathers
    notes.append(f"{PERSIST} {threshold:,}: read, not modelled: parameters of at most {threshold:,} elements stay "
                 f"unpartitioned on every rank (runtime/zero/parameter_offload.py:317-335): here {count:,} "
                 f"({', '.join(kinds) or 'none'}; {total:,} elements), about {fmt_bytes(extra)} per device of "
                 "16-bit weights beyond their ZeRO-3 partitions")


def parameter_sizes(spec, tp: int) -> list[tuple[str, int, int]]:
    """(kind, elements on one device, how many) of each parameter tensor, in the order of the
    Hugging Face modules (embedding, layers, final norm, head), TP-split as params.py splits
    them; one device holds every expert (at AutoEP's ep > 1 it holds num_experts / ep of them, tensors of
    millions of elements, above the default and the Trainer's thresholds: the ones that stay whole are the same)."""
    h, a, kv, d = spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
    split = lambda n: max(n // tp, 1)  # noqa: E731
    norm = [("norms", h, 2 if spec.layernorm else 1)]
    out = [("embedding", split(spec.vocab_size * h), 1)]
    if spec.learned_positions:
        out.append(("embedding", spec.max_position_embeddings * h, 1))
    for kind in spec.layer_kinds or ["moe" if spec.is_moe else "dense"] * spec.num_hidden_layers:
        layer = list(norm)
        if spec.is_mla:
            dq, dr, dv = spec.qk_nope_head_dim + spec.qk_rope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
            if spec.q_lora_rank:
                layer += [("attention", h * spec.q_lora_rank, 1), ("norms", spec.q_lora_rank, 1),
                          ("attention", split(spec.q_lora_rank * a * dq), 1)]
            else:
                layer.append(("attention", split(h * a * dq), 1))
            layer += [("attention", h * (spec.kv_lora_rank + dr), 1), ("norms", spec.kv_lora_rank, 1),
                      ("attention", split(spec.kv_lora_rank * a * (spec.qk_nope_head_dim + dv)), 1),
                      ("attention", split(a * dv * h), 1)]
        else:
            layer += [("attention", split(h * a * d), 1), ("attention", split(h * kv * d), 2),
                      ("attention", split(a * d * h), 1)]
            if spec.attention_bias:
                layer += [("biases", split(a * d), 1), ("biases", split(kv * d), 2)]
                if not spec.implicit_qkv_bias:
                    layer.append(("biases", h, 1))
            if spec.qk_norm:
                layer.append(("norms", d, 2))
        layer += norm
        if kind == "moe":
            layer.append(("router", spec.num_experts * h, 1))
            if spec.router_bias:
                layer.append(("router", spec.num_experts, 1))
            layer.append(("experts", h * spec.moe_intermediate_size, 3 * spec.num_experts))
            if spec.shared_intermediate_size:
                layer.append(("MLP", split(h * spec.shared_intermediate_size), 3))
        else:
            f = spec.intermediate_size
            layer.append(("MLP", split(h * f), 3 if spec.gated_mlp else 2))
            if spec.mlp_bias:
                layer += [("biases", split(f), 1), ("biases", h, 1)]
        out += layer
    out += norm
    if not spec.tie_word_embeddings:
        out.append(("head", split(spec.vocab_size * h), 1))
    return out


BUCKET = "zero_optimization.reduce_bucket_size"
OVERLAP = "zero_optimization.overlap_comm"
CONTIGUOUS = "zero_optimization.contiguous_gradients"


def bucket_settings(flat: dict, zero: int, hidden_size: int, notes: list, offload: bool = False) -> dict:
    """reduce_bucket_elements, reduce_bucket_double and overlap_grad_reduce: ``reduce_bucket_size`` (default 5e8;
    the Hugging Face Trainer fills ``"auto"`` with hidden_size x hidden_size,
    transformers integrations/deepspeed.py:199-229) and ``overlap_comm`` (default on at
    stage 3 only, zero/config.py:384-387); with ``contiguous_gradients`` false (default true,
    zero/config.py:102) no bucket is allocated, except at ZeRO-1/2 with optimizer offload. At
    ZeRO-1/2 ``overlap_comm`` also moves the reduction to its own stream, under the backward
    (stage_1_and_2.py:1590-1616; the profile's default is the compute stream)."""
    size = flat.get(BUCKET, 500_000_000)
    if size == "auto":
        size = hidden_size * hidden_size
        notes.append(f"{BUCKET} 'auto': hidden_size^2 = {size:,} (the Hugging Face Trainer's fill)")
    if isinstance(size, float) and size.is_integer():
        size = int(size)
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_ELEMENTS:
        raise NdplanError(BUCKET, size, "not an element count", "give a whole number such as 500000000")
    overlap = flat.get(OVERLAP, zero == 3)
    if not isinstance(overlap, bool):
        raise NdplanError(OVERLAP, overlap, "not true or false", '"overlap_comm": true')
    contiguous = _switch(flat, CONTIGUOUS) if CONTIGUOUS in flat else True
    if not contiguous and not (offload and zero in (1, 2)):
        # no bucket buffer is allocated: stage_1_and_2.py:300 (contiguous_gradients or cpu_offload), 3260-3278;
        # stage3.py:780-784
        size = 0
    return {"reduce_bucket_elements": size, "reduce_bucket_double": int(overlap and zero in (1, 2)),
            "overlap_grad_reduce": int(overlap and zero in (1, 2))}


def engine(flat: dict, zero: int, offload: bool, hidden_size: int, notes: list, pipeline_bf16: bool = False) -> str:
    """The deepspeed engine with the settings above (settings equal to the profile's left out);
    ``pipeline_bf16``: the BF16_Optimizer of ``pipeline_bf16`` (bf16 accumulation)."""
    from ndplan.engines import DEEPSPEED, derive
    settings = optimizer_settings(flat, notes)
    if pipeline_bf16:
        wrapper = _bf16_wrapper(flat)
    else:
        wrapper = bf16_optimizer_settings(flat, zero, offload, notes)
    settings |= precision_settings(flat, zero, offload, settings, notes, bool(wrapper)) | wrapper
    settings |= zero3_settings(flat, zero, hidden_size, notes)
    settings |= bucket_settings(flat, zero, hidden_size, notes, offload) | comm_settings(flat)
    return derive("deepspeed", {k: v for k, v in settings.items() if getattr(DEEPSPEED, k) != v})
