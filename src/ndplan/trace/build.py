"""Build the real Hugging Face module from a config at small sizes and trace one step.

The architecture (model_type, activation, norms, attention code, router) is the user's;
only the sizes are replaced: each dimension the activation bytes depend on gets a small
value, the layer stack is cut to the few layers that show every layer kind, and the
weights are random (nothing is downloaded). ``trace_step`` runs one forward + backward
in bf16 on the CPU under ``recorder.LiveBytes``.
"""

from __future__ import annotations

import contextlib
import random
import warnings
from dataclasses import dataclass

from ndplan.errors import NdplanError

DIMS = {  # ndplan symbol -> HF config keys (first present wins; catalog.model.model_from_config reads the same)
    "h": ("hidden_size",), "f": ("intermediate_size",), "a": ("num_attention_heads",),
    "kv": ("num_key_value_heads",), "d": ("head_dim",), "V": ("vocab_size",),
    "E": ("num_local_experts", "n_routed_experts", "num_experts"), "k": ("num_experts_per_tok",),
    "fe": ("moe_intermediate_size",), "fs": ("shared_expert_intermediate_size",),
    "ql": ("q_lora_rank",), "kl": ("kv_lora_rank",), "dn": ("qk_nope_head_dim",),
    "dr": ("qk_rope_head_dim",), "dv": ("v_head_dim",),
}
POLICIES = ("none", "selective", "op", "full")
"""none; selective = Megatron's core-attention recompute (the attention function is
checkpointed); op = torchtitan's op-level SAC save list (per layer); full = every decoder
layer checkpointed (HF ``gradient_checkpointing_enable(use_reentrant=False)``)."""
COMPILED = "compiled"
"""No recompute, each decoder layer under ``torch.compile`` (EngineProfile.compiled_blocks), traced
on request (``--policy compiled``; every shape compiles again). What a compiled graph saves is
decided by AOTAutograd with inductor's decompositions and min-cut partitioner before code
generation; ``compiled_step`` runs them with the ``aot_eager_decomp_partition`` backend (the
graphs then execute eagerly). The min-cut depends on the relative sizes, so these shapes keep
a real model's ratios (``realistic_shape``). The dispatch-mode counter cannot run under dynamo:
the stored bytes come from saved-tensor hooks, booked on the site whose forward saved them (a
layer's input on that layer, not on the one that made it: the same bytes for a layer inside
the stack); no forward peak is recorded."""
ATTN = ("sdpa", "eager")


@dataclass(frozen=True)
class Shape:
    b: int
    s: int
    dims: dict  # symbol -> value


def present_dims(cfg: dict) -> dict[str, str]:
    """The size symbols this architecture has, each with the HF key that holds it."""
    out = {}
    mla = bool(cfg.get("kv_lora_rank"))
    for sym, keys in DIMS.items():
        key = next((k for k in keys if cfg.get(k)), None)
        if sym == "d" and not mla:
            key = "head_dim"  # set explicitly: the scaled hidden size need not be heads x head_dim
        if key is None or (mla and sym == "d"):
            continue
        out[sym] = key
    if cfg.get("n_shared_experts") and "fe" in out:
        out["ns"] = "n_shared_experts"
    return out


def random_shape(cfg: dict, rng: random.Random, tokens=(4, 24)) -> Shape:
    """Small sizes for every dimension (heads a multiple of kv heads, even rotary dims)."""
    dims = {}
    have = present_dims(cfg)
    for sym in have:
        dims[sym] = rng.randint(5, 40)
    if "kv" in have:
        dims["kv"] = rng.randint(1, 4)
        dims["a"] = dims["kv"] * rng.randint(1, 4)
    elif "a" in have:
        dims["a"] = rng.randint(1, 8)
    if "kl" in dims:  # MLA: every head has its own k and v (num_key_value_heads = heads)
        dims["kv"] = dims["a"]
    if "h" in dims and "a" in dims:
        dims["h"] = dims["a"] * rng.randint(2, 12)  # transformers checks hidden % heads even with head_dim
    for sym in ("d", "dr"):
        if sym in dims:
            dims[sym] = 2 * rng.randint(2, 12)
    if "E" in dims:  # transformers' grouped_mm experts need 16-byte row strides: bf16 widths % 8 == 0
        dims["h"] = 8 * dims["a"] * rng.randint(1, 2)
        for sym in ("f", "fe", "fs", "kl", "ql"):
            if sym in dims:
                dims[sym] = 8 * rng.randint(1, 6)
        dims["E"] = rng.randint(4, 10)
        dims["k"] = rng.randint(1, min(4, dims["E"]))
    if "ns" in dims:
        dims["ns"] = rng.randint(1, 2)
    if "V" in dims:
        dims["V"] = rng.randint(32, 160)
    return Shape(b=rng.randint(2, 4), s=2 * rng.randint(tokens[0] // 2, tokens[1] // 2), dims=dims)


def realistic_shape(cfg: dict, rng: random.Random) -> Shape:
    """Small sizes in a real model's ratios (the partitioner's min-cut depends on them): head
    dim a multiple of 8, heads a multiple of the kv heads, hidden = heads x (head dim, or head
    dim + 8), MLP widths 2.5-4 x hidden, vocabulary 4-8 x hidden."""
    shape = random_shape(cfg, rng)
    dims = dict(shape.dims)
    d = 8 * rng.randint(1, 4)
    if "kv" in dims:
        dims["kv"] = rng.randint(1, 3)
        dims["a"] = dims["kv"] * rng.choice((1, 2, 4))
    if "d" in dims:
        dims["d"] = d
    if "a" in dims and "h" in dims:
        dims["h"] = dims["a"] * (d + 8 * rng.randint(0, 1))
    for sym in ("f", "fe", "fs"):
        if sym in dims:
            dims[sym] = 8 * max(1, round(dims["h"] * rng.uniform(2.5, 4.0) / 8))
    if "V" in dims:
        dims["V"] = rng.randint(4 * dims["h"], 8 * dims["h"])
    return Shape(b=shape.b, s=shape.s, dims=dims)


def scaled_config(cfg: dict, shape: Shape) -> dict:
    """The user's config with the sizes of ``shape`` and a short layer stack that keeps two
    consecutive layers of each kind."""
    out = {k: v for k, v in cfg.items() if k not in ("source", "name")}
    for sym, key in present_dims(cfg).items():
        out[key] = shape.dims[sym]
    if cfg.get("kv_lora_rank"):
        out["head_dim"] = shape.dims["dr"]  # HF DeepSeek: head_dim is the rotary part
    moe = any(cfg.get(k) for k in DIMS["E"])
    layers = 3
    if moe and cfg.get("first_k_dense_replace"):
        out["first_k_dense_replace"], layers = 2, 4
    if moe:
        out["mlp_only_layers"] = [] if "mlp_only_layers" in cfg else out.get("mlp_only_layers")
        for key in ("decoder_sparse_step", "moe_layer_freq"):
            if key in cfg:
                out[key] = 1
        for key in ("n_group", "topk_group"):
            if key in cfg:
                out[key] = 1
    out["num_hidden_layers"] = layers
    out["max_position_embeddings"] = max(int(cfg.get("max_position_embeddings") or 0), 4 * shape.s)
    out["use_cache"] = False
    for key in {"pad_token_id", "bos_token_id", "eos_token_id"} | {k for k in out if k.endswith("_token_id")}:
        out[key] = 0  # special token ids (the config class's defaults too) must lie inside the scaled vocabulary
    out.pop("num_nextn_predict_layers", None)
    for key in ("attention_dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop"):
        if key in out:
            out[key] = 0.0
    return {k: v for k, v in out.items() if v is not None}


def build(cfg: dict, attn: str):
    """``AutoModelForCausalLM.from_config`` in bf16 with ``attn`` (sdpa or eager)."""
    import torch
    import transformers
    model_type = str(cfg.get("model_type", ""))
    try:
        hf_cfg = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in cfg.items() if k != "model_type"})
        with _quiet():
            model = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.bfloat16,
                                                                  attn_implementation=attn)
    except Exception as e:  # transformers raises ValueError/KeyError/TypeError for configs it cannot build
        raise NdplanError("model_type", model_type or None,
                          f"transformers {transformers.__version__} cannot build it ({type(e).__name__}: "
                          f"{_last_line(e)[:160]})",
                          "give a config.json of an architecture transformers knows, or use the closed-form "
                          "activations (--activations closed-form)") from None
    model.train()
    return model


def _failure(model, what: str, e: Exception, fix: str) -> NdplanError:
    """One line for a step of ``model`` that raised ``e``."""
    return NdplanError("architecture", type(model).__name__, f"{what} ({type(e).__name__}: {_last_line(e)[:160]})", fix)


def _last_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[-1] if lines else ""


@contextlib.contextmanager
def _quiet():
    import transformers
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)


TORCHTITAN_SAVE_OPS = (
    # torchtitan torchtitan/distributed/activation_checkpoint.py `_save_list` (op-level SAC) at
    # 55e42c0d (2025-08; HEAD b5bcd76c adds linear/addmm/bmm/topk and saves every _scaled_mm),
    # plus the CPU flash kernel that stands for the CUDA ones on this machine
    "aten.mm.default", "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention.default", "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default", "aten._scaled_mm.default",
    "_c10d_functional.reduce_scatter_tensor.default", "aten.max.default",
)


def _op_sac_context():
    """torchtitan's op-level SAC policy: save the outputs of the listed ops except every
    second mm (counted separately in forward and in recompute)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def context():  # one count per checkpointed layer call, as torchtitan's meta dict
        counts = {"forward": 0, "recompute": 0}

        def policy(ctx, func, *args, **kwargs):
            mode = "recompute" if ctx.is_recompute else "forward"
            name = str(func)
            if name == "aten.mm.default":
                counts[mode] += 1
            save = name in TORCHTITAN_SAVE_OPS and not (name == "aten.mm.default" and counts[mode] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return context


@contextlib.contextmanager
def _recompute_attention_core(model, attn: str):
    """Megatron's selective recompute: the attention function (scores, softmax, weighted sum;
    the flash kernel under sdpa) runs under ``torch.utils.checkpoint``."""
    import sys
    from torch.utils.checkpoint import checkpoint
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    inner = (ALL_ATTENTION_FUNCTIONS[attn] if attn != "eager"
             else sys.modules[type(model).__module__].eager_attention_forward)

    def wrapped(module, q, k, v, mask, **kw):
        return checkpoint(lambda q, k, v: inner(module, q, k, v, mask, **kw), q, k, v, use_reentrant=False)

    had = attn in ALL_ATTENTION_FUNCTIONS._global_mapping
    old = ALL_ATTENTION_FUNCTIONS._global_mapping.get(attn)
    ALL_ATTENTION_FUNCTIONS._global_mapping[attn] = wrapped
    try:
        yield
    finally:
        if had:
            ALL_ATTENTION_FUNCTIONS._global_mapping[attn] = old
        else:
            del ALL_ATTENTION_FUNCTIONS._global_mapping[attn]


def decoder_layers(model):
    """The decoder layer stack (``model.model.layers`` in every causal LM transformers builds)."""
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    if layers is None:
        raise NdplanError("architecture", type(model).__name__, "has no model.layers stack to trace",
                          "trace a decoder-only causal LM")
    return body, layers


def layer_kind(layer) -> str:
    """``moe`` if the layer's MLP has routed experts, else ``dense``."""
    mlp = getattr(layer, "mlp", None)
    return "moe" if mlp is not None and hasattr(mlp, "experts") else "dense"


def trace_step(model, shape: Shape, policy: str, attn: str):
    """One forward + backward of a scaled model (``build``) under ``policy``; returns the
    recorder and the bytes each site stored at the end of the forward."""
    import torch
    from ndplan.trace.recorder import LiveBytes, storage_ptrs
    model.gradient_checkpointing_disable()
    if policy in ("full", "op"):
        kwargs = {"use_reentrant": False} | ({"context_fn": _op_sac_context()} if policy == "op" else {})
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.zero_grad(set_to_none=True)
    body, layers = decoder_layers(model)
    gen = torch.Generator().manual_seed(shape.b * 1000 + shape.s)
    ids = torch.randint(0, model.config.vocab_size, (shape.b, shape.s), generator=gen)
    rec = LiveBytes(storage_ptrs(list(model.parameters()) + list(model.buffers()) + [ids]))
    handles = [layer.register_forward_pre_hook(lambda mod, args, i=i: rec.enter(f"layer{i}"))
               for i, layer in enumerate(layers)]
    norm = getattr(body, "norm", None)
    if norm is None:
        raise NdplanError("architecture", type(model).__name__, "has no final model.norm to mark the head",
                          "trace a decoder-only causal LM")
    handles.append(norm.register_forward_pre_hook(lambda mod, args: rec.enter("head")))
    handles += [p.register_post_accumulate_grad_hook(lambda p: rec.mark_grad(p.grad)) for p in model.parameters()]
    core = _recompute_attention_core(model, attn) if policy == "selective" else contextlib.nullcontext()
    try:
        with core, rec:
            rec.enter("embedding")
            try:
                loss = model(input_ids=ids, labels=ids).loss  # the logits are dropped, as HF Trainer does
                stored = rec.stored()
                rec.phase = "backward"
                loss.backward()
            except (RuntimeError, ValueError, TypeError, AttributeError, IndexError) as e:
                raise _failure(model, "one training step on the CPU failed", e,
                               "trace a decoder-only causal LM that takes input_ids and labels") from None
    finally:
        for h in handles:
            h.remove()
    return rec, stored


def compiled_step(model, shape: Shape) -> dict[str, int]:
    """Bytes each site saves for backward with every decoder layer compiled (``COMPILED``): a
    warm-up step compiles, a second one is counted with saved-tensor hooks (each storage once;
    parameters, buffers and the inputs excluded)."""
    import torch
    from ndplan.trace.recorder import storage_ptrs
    model.gradient_checkpointing_disable()
    body, layers = decoder_layers(model)
    torch._dynamo.reset()  # each traced shape is a new model of the same code: fresh dynamo caches
    for layer in layers:
        layer.forward = torch.compile(layer.forward, backend="aot_eager_decomp_partition", fullgraph=True)
    gen = torch.Generator().manual_seed(shape.b * 1000 + shape.s)
    ids = torch.randint(0, model.config.vocab_size, (shape.b, shape.s), generator=gen)
    known = storage_ptrs(list(model.parameters()) + list(model.buffers()) + [ids])
    site = ["embedding"]
    handles = [layer.register_forward_pre_hook(lambda mod, args, i=i: site.__setitem__(0, f"layer{i}"))
               for i, layer in enumerate(layers)]
    handles.append(body.norm.register_forward_pre_hook(lambda mod, args: site.__setitem__(0, "head")))
    seen: set[int] = set()
    stored: dict[str, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in known and st.data_ptr() not in seen and st.nbytes():
            seen.add(st.data_ptr())
            stored[site[0]] = stored.get(site[0], 0) + st.nbytes()
        return t

    try:
        with warnings.catch_warnings():  # dynamo's notes on the library code it traces are not the user's
            warnings.simplefilter("ignore")
            model(input_ids=ids, labels=ids).loss.backward()  # compiles
        model.zero_grad(set_to_none=True)
        site[0] = "embedding"
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    except Exception as e:  # dynamo raises its own error classes for code it cannot compile
        raise _failure(model, "torch.compile of its decoder layers failed", e,
                       "trace the eager policies (--policy none|selective|op|full)") from None
    finally:
        for h in handles:
            h.remove()
    return stored
