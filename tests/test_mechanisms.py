"""The memory mechanisms the frameworks' recipes switch on, each re-derived here by hand
from the framework's source (cited next to each derivation) and compared with ndplan's
Terms: Megatron-LM's per-module recompute, MoE capacity, optimizers and the
precision-aware optimizer; DeepSpeed's bf16 optimizer states, ZeRO++ hpZ and parameter
offload; MindSpore's optimizer shard group and optimizer types.

Sizes are read from the catalog's config (h, f, heads, experts): the derivations are
plain integer arithmetic over them, never ndplan's expressions.
"""

from __future__ import annotations

import dataclasses
import textwrap

import pytest
import sympy as sp

import ndplan
from ndplan import symbols as S
from ndplan.engines import derive
from ndplan.errors import NdplanError
from ndplan.formulas import activations as A
from ndplan.formulas.local import act_context
from ndplan.interop import read_config
from ndplan.symbols import model_symbols

SEQ = 4096


def layer_bytes(spec, kind: str, engine: str, tp=1, b=1, etp=1, ep=1, recompute="selective") -> int:
    """ndplan's stored bytes of one layer of ``kind`` (one micro-batch, one device)."""
    strat = ndplan.Strategy(tp=tp, sp=tp > 1, ep=ep, etp=etp, recompute=recompute, engine=engine, seq=SEQ, mbs=b)
    ctx = act_context(spec, strat)
    expr = A.layer_activation(spec, model_symbols(spec), ctx, kind, recompute)
    val = sp.sympify(expr).subs({S.tp: tp, S.cp: 1, S.mbs: b, S.seq: SEQ, S.ep: ep, S.etp: etp})
    assert val.is_Rational, val
    return int(val)


def freed(spec, kind: str, settings: dict, **kw) -> int:
    """Bytes a layer stores less with the engine ``settings`` than Megatron's default selective."""
    return layer_bytes(spec, kind, "megatron", **kw) - layer_bytes(spec, kind, derive("megatron", settings), **kw)


# --------------------------------------------------------------------------- Megatron --recompute-modules

def test_recompute_mlp_keeps_only_the_mlp_input():
    """``mlp``: tensor_parallel.checkpoint(mlp) (transformer_layer.py:992-1010) keeps its input;
    with TE the pre-MLP norm is fused into fc1 (gpt_layer_specs.py:318-336), so the input is
    the residual stream, which the norm saved anyway. Freed per token: the norm output fc1
    saves (2h, /tp under SP), the fc1 output gate+up the fused SwiGLU saves (2 x 2f / tp) and
    the fc2 input (2f / tp)."""
    spec = ndplan.load_model("llama3-8b")
    h, f = spec.hidden_size, spec.intermediate_size
    for tp in (1, 2, 8):
        want = SEQ * (2 * h + 4 * f + 2 * f) // tp
        assert freed(spec, "dense", {"recompute_mlp": 1}, tp=tp) == want


def test_recompute_moe_layer_keeps_its_input():
    """``moe``: the whole MoE layer in one checkpoint keeping hidden_states (moe_layer.py:
    247-251, 701-717). DeepSeek-V3 per token at tp = etp = 1 (T = s x k token-expert rows):
    router logits fp32 (4E), each row's fc1 input (2h: the alltoall dispatcher's permute and
    unpermute save indices only, moe_utils.py index_select / scatter_add_, and _AllToAll saves
    nothing, tensor_parallel/mappings.py:428-431), the experts' fc1 output (4 fe) and fc2 input
    (2 fe), the shared expert's (6 fs)."""
    spec = ndplan.load_model("deepseek-v3")
    h, E, k = spec.hidden_size, spec.num_experts, spec.experts_per_token
    fe, fs = spec.moe_intermediate_size, spec.shared_intermediate_size
    rows = SEQ * k
    want = SEQ * 4 * E + rows * (2 * h + 6 * fe) + SEQ * 6 * fs
    assert freed(spec, "moe", {"recompute_moe": 1}) == want


def test_recompute_moe_act_frees_the_fc2_input():
    """``moe_act``: CheckpointWithoutOutput over the experts' activation (experts.py:269-276,
    1019-1030) frees the fc2 input, 2 fe bytes per token-expert row, split by etp."""
    spec = ndplan.load_model("deepseek-v3")
    fe, k = spec.moe_intermediate_size, spec.experts_per_token
    for etp in (1, 2):
        # rows per device: each token's k experts, etp ranks each hold 1/etp of every row's width
        # but see all rows of the EP group's tokens: s*k*etp/tp rows x 2*fe/etp bytes
        assert freed(spec, "moe", {"recompute_moe_act": 1}, tp=etp, etp=etp) == SEQ * k * 2 * fe // etp


def test_recompute_layernorm_acts_on_separate_norms_only():
    """``layernorm`` wraps the norms that are modules (transformer_layer.py:712-721, 820-828;
    an IdentityOp is never wrapped, :476, 523-527): a dense Llama layer under TE has none, a
    MoE layer's pre-MLP norm is one (the experts' input, 2h per token) and so is MLA's input
    norm (the q/kv down-projections' input, 2h)."""
    dense = ndplan.load_model("llama3-8b")
    assert freed(dense, "dense", {"recompute_layernorm": 1}) == 0
    mla_moe = ndplan.load_model("deepseek-v3")
    h = mla_moe.hidden_size
    assert freed(mla_moe, "moe", {"recompute_layernorm": 1}) == SEQ * (2 * h + 2 * h)
    assert freed(mla_moe, "dense", {"recompute_layernorm": 1}) == SEQ * 2 * h


def test_recompute_mla_up_proj_frees_full_head_qkv():
    """``mla_up_proj`` frees the up-projected, rotated q, k, v once core attention has saved
    them (multi_latent_attention.py:455-458, 983-988): per token a heads of q and k
    (qk_nope + qk_rope each) and v (v_head_dim), 2 bytes each, split by tp."""
    spec = ndplan.load_model("deepseek-v3")
    a, dn, dr, dv = (spec.num_attention_heads, spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim)
    for tp in (1, 4):
        assert freed(spec, "dense", {"recompute_mla_up_proj": 1}, tp=tp) == SEQ * 2 * a * (2 * (dn + dr) + dv) // tp


def test_recompute_list_without_core_attn_keeps_the_core():
    """A list without core_attn leaves _run_core_attention unwrapped (attention.py:392-395):
    flash attention's fp32 log-sum-exp (4 a bytes per token / tp) stays stored."""
    spec = ndplan.load_model("llama3-8b")
    a = spec.num_attention_heads
    assert freed(spec, "dense", {"keep_core_attn": 1}, tp=2) == -SEQ * 4 * a // 2


def test_megatron_reader_turns_the_module_list_into_settings(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(textwrap.dedent("""\
        torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 \\
          --seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 \\
          --recompute-granularity selective --recompute-modules mlp layernorm
        """))
    ci = read_config(script, model="llama3-8b")
    assert ci.strategy.engine == "megatron[keep_core_attn=1,recompute_layernorm=1,recompute_mlp=1]"
    # a full-granularity run ignores the list (transformer_config.py:1943: selective only)
    script.write_text(script.read_text().replace("selective", "full"))
    assert read_config(script, model="llama3-8b").strategy.engine == "megatron"


@pytest.mark.parametrize("flags,field", [
    ("--recompute-granularity selective --recompute-modules attn", "--recompute-modules"),
    ("--recompute-granularity selective --recompute-modules moe_act", "--recompute-modules"),
    ("--moe-pad-expert-input-to-capacity", "--moe-pad-expert-input-to-capacity"),
    ("--optimizer sgd --use-precision-aware-optimizer", "--use-precision-aware-optimizer"),
    ("--exp-avg-dtype bf16", "--exp-avg-dtype"),
    ("--optimizer adamax", "--optimizer"),
], ids=["unknown-module", "moe-act-no-grouped-gemm", "pad-no-factor", "precision-aware-sgd", "dtype-alone", "adamax"])
def test_megatron_refuses_what_its_validation_refuses(tmp_path, flags, field):
    """transformer_config.py:1943-1967 (module names, moe_act needs grouped GEMM), 1862-1866
    (padding needs a capacity factor); optimizer_config.py:433-479 (the precision-aware
    optimizer is adam-only, and only it takes other state dtypes); arguments.py:2913-2917."""
    script = tmp_path / "run.sh"
    script.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --seq-length 4096 "
                      f"--bf16 --num-experts 8 --moe-expert-capacity-factor 1.25 {flags}\n".replace(
                          "--moe-expert-capacity-factor 1.25 --moe-pad", "--moe-pad"))
    with pytest.raises(NdplanError) as e:
        read_config(script, model="mixtral-8x7b")
    assert e.value.field == field


# --------------------------------------------------------------------------- MoE capacity

def test_capacity_padding_scales_the_expert_rows():
    """With --moe-pad-expert-input-to-capacity each local expert receives capacity =
    tokens x k / E x cf rows (moe_utils.py:248-266; token_dispatcher.py:517-539): the expert
    rows' tensors (fc1 input, fc1 output, fc2 input: 2h + 6 fe per row) grow by
    cf - 1; the router and shared expert do not."""
    spec = ndplan.load_model("deepseek-v3")
    h, k, fe = spec.hidden_size, spec.experts_per_token, spec.moe_intermediate_size
    base = layer_bytes(spec, "moe", "megatron", recompute="none")
    padded = layer_bytes(spec, "moe", derive("megatron", {"moe_capacity_permille": 1500}), recompute="none")
    assert padded - base == SEQ * k * (2 * h + 6 * fe) // 2


def test_megatron_capacity_flags(tmp_path):
    """cf with padding -> cf; cf without padding -> min(cf, 1) (over-capacity tokens dropped,
    moe_utils.py:1077-1081); a negative cf is dropless (transformer_config.py:1836-1840)."""
    script = tmp_path / "run.sh"
    base = ("torchrun --nproc_per_node 8 pretrain_gpt.py --expert-model-parallel-size 8 --seq-length 4096 --bf16 "
            "--micro-batch-size 1 --global-batch-size 64 --moe-token-dispatcher-type alltoall ")
    for flags, want in (("--moe-expert-capacity-factor 1.5 --moe-pad-expert-input-to-capacity",
                         "megatron[moe_capacity_permille=1500]"),
                        ("--moe-expert-capacity-factor 1.5", "megatron"),
                        ("--moe-expert-capacity-factor 0.5", "megatron[moe_capacity_permille=500]"),
                        ("--moe-expert-capacity-factor -1", "megatron")):
        script.write_text(base + flags + "\n")
        assert read_config(script, model="mixtral-8x7b").strategy.engine == want, flags


# --------------------------------------------------------------------------- optimizers

def state_terms(engine: str, model="llama3-8b", **kw) -> tuple[int, int]:
    """(mem.optimizer, mem.master) bytes of stage 0."""
    spec = ndplan.load_model(model)
    strat = ndplan.Strategy(dp=kw.pop("dp", 1), tp=kw.pop("tp", 1), seq=SEQ, gbs=kw.pop("gbs", 8), zero=kw.pop("zero", 1),
                            engine=engine, **kw)
    est = ndplan.estimate(spec, ndplan.load_hardware("h100-sxm"), strat)
    terms = est.per_stage[0]["terms"]
    return terms["mem.optimizer"], terms["mem.master"]


def _params(name: str) -> int:
    from ndplan.formulas.params import params_total
    spec = ndplan.load_model(name)
    return int(params_total(spec, model_symbols(spec)))


@pytest.mark.parametrize("flags,opt_bytes,master_bytes", [
    ("", 8, 4),
    ("--optimizer sgd", 4, 4),
    ("--optimizer sgd --sgd-momentum 0", 0, 4),
    ("--optimizer lion", 4, 4),
    ("--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16", 4, 2),
    ("--use-precision-aware-optimizer --exp-avg-dtype fp8 --exp-avg-sq-dtype bf16", 3, 2),
], ids=["adam", "sgd", "sgd-no-momentum", "lion", "precision-aware-bf16", "precision-aware-fp8"])
def test_megatron_optimizer_states_per_parameter(tmp_path, flags, opt_bytes, master_bytes):
    """Per parameter of one device (pp = tp = dp = 1, all of llama3-8b's parameters): Adam's
    exp_avg + exp_avg_sq on the fp32 main params (optimizer/__init__.py:546-600, 8 B; main 4 B,
    distrib_optimizer.py:445), SGD's momentum buffer (--sgd-momentum 0.9 default,
    arguments.py:2626; torch SGD keeps none at momentum 0), Lion's exp_avg
    (optimizer/__init__.py:602-619); the precision-aware optimizer's dtypes (arguments.py:
    3667-3684) and 2-byte master (int16 remainders, distrib_optimizer.py:1007-1013)."""
    script = tmp_path / "run.sh"
    script.write_text("torchrun --nproc_per_node 1 pretrain_gpt.py --seq-length 4096 --bf16 --micro-batch-size 1 "
                      f"--global-batch-size 8 --use-distributed-optimizer {flags}\n")
    ci = read_config(script, model="llama3-8b")
    opt, master = state_terms(ci.strategy.engine)
    n = _params("llama3-8b")
    assert opt == pytest.approx(opt_bytes * n, rel=1e-12, abs=0)
    assert master == pytest.approx(master_bytes * n, rel=1e-12)


def test_muon_keeps_adam_moments_on_the_vocabulary_matrices(tmp_path):
    """--optimizer muon: one momentum buffer per 2-D non-embedding weight, the embedding and
    output layer on --muon-scalar-optimizer adam (emerging_optimizers.py:140-147, 579-590;
    arguments.py:2661): 4 B per parameter + 4 more on the V x h embedding and V x h output."""
    script = tmp_path / "run.sh"
    script.write_text("torchrun --nproc_per_node 1 pretrain_gpt.py --seq-length 4096 --bf16 --micro-batch-size 1 "
                      "--global-batch-size 8 --use-distributed-optimizer --optimizer muon\n")
    ci = read_config(script, model="llama3-8b")
    spec = ci.model
    opt, _ = state_terms(ci.strategy.engine)
    V, h = spec.vocab_size, spec.hidden_size
    assert opt == pytest.approx(4 * _params("llama3-8b") + 4 * 2 * V * h, rel=1e-12)


@pytest.mark.parametrize("settings", [
    {"keep_core_attn": 1, "recompute_mlp": 1, "recompute_moe_act": 1},
    {"recompute_moe": 1, "recompute_layernorm": 1, "recompute_shared_experts": 1},
    {"optimizer_bytes": 4, "non_matrix_optimizer_bytes": 8, "muon_tp_mode": 1},
    {"optimizer_bytes": 4, "non_matrix_optimizer_bytes": 8, "muon_tp_mode": 3, "muon_ns_fp32": 1, "muon_split_qkv": 0},
    {"optimizer_bytes": 4, "master_bytes": 2},
    {"optimizer_bytes": 0},
    {"moe_capacity_permille": 1250},
], ids=["modules", "moe-modules", "muon", "muon-distributed-fp32", "precision-aware", "sgd-no-momentum", "capacity"])
def test_megatron_emit_reads_back_the_engine_settings(tmp_path, settings):
    """Every setting the Megatron reader derives is written back as the flags it came from."""
    from ndplan.export import emit
    model = ndplan.load_model("mixtral-8x7b")
    s = ndplan.Strategy(dp=2, tp=2, pp=2, ep=2, etp=2, gbs=32, zero=1, recompute="selective", seq=SEQ,
                        engine=derive("megatron", settings))
    f = tmp_path / "run.sh"
    f.write_text(emit("megatron", model, s))
    back = read_config(f, model=model, gpus=16).strategy
    assert back.engine == s.engine


# --------------------------------------------------------------------------- DeepSpeed / torchtitan optimizers

def _ds(tmp_path, doc: dict, **kw):
    import json
    f = tmp_path / "ds.json"
    f.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                             "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}} | doc))
    return read_config(f, model="llama3-8b", gpus=1, seq=SEQ, **kw)


@pytest.mark.parametrize("optimizer,opt_bytes", [
    ({"type": "AdamW"}, 8), ({"type": "Lamb"}, 8), ({"type": "Lion"}, 4), ({"type": "Adagrad"}, 4),
    ({"type": "SGD"}, 0), ({"type": "SGD", "params": {"momentum": 0.9}}, 4),
], ids=["adamw", "lamb", "lion", "adagrad", "sgd", "sgd-momentum"])
def test_deepspeed_optimizer_type_states(tmp_path, optimizer, opt_bytes):
    """runtime/engine.py:2486-2549 (DeepSpeed 0.19.8): FusedAdam and FusedLamb keep exp_avg and
    exp_avg_sq, FusedLion exp_avg, torch Adagrad ``sum``; any other name is a torch.optim class,
    and torch SGD keeps a momentum buffer only with momentum > 0 (its default is 0). States are
    fp32 beside the fp32 master partition."""
    ci = _ds(tmp_path, {"optimizer": optimizer})
    opt, master = state_terms(ci.strategy.engine)
    n = _params("llama3-8b")
    assert (opt, master) == (pytest.approx(opt_bytes * n, rel=1e-12, abs=0), pytest.approx(4 * n, rel=1e-12))


def test_deepspeed_muon_keeps_adam_on_embedding_and_head(tmp_path):
    """deepspeed/__init__.py:357-372: use_muon on every >= 2-D parameter whose name has neither
    "embed" nor "lm_head"; MuonWithAuxAdam updates the rest with Adam (engine.py:2530-2546)."""
    ci = _ds(tmp_path, {"optimizer": {"type": "Muon"}})
    spec = ci.model
    opt, _ = state_terms(ci.strategy.engine)
    assert opt == pytest.approx(4 * _params("llama3-8b") + 4 * 2 * spec.vocab_size * spec.hidden_size, rel=1e-12)


def test_torchtitan_optimizer_names(tmp_path):
    """torchtitan 0.2.2 components/optimizer.py:315-319 builds Adam and AdamW only (else
    NotImplementedError); 0.3.0 adds DistMuon, one momentum_buffer per parameter
    (distributed/flex_shard/dist_muon.py:568-576)."""
    from ndplan.interop.torchtitan import TITAN_OPTIMIZERS
    from ndplan.interop import torchtitan as TT
    assert TT._engine_settings({"optimizer.name": "AdamW"}, 1) == {}
    assert TITAN_OPTIMIZERS["DistMuon"] == {"optimizer_bytes": 4}
    with pytest.raises(NdplanError) as e:
        TT._engine_settings({"optimizer.name": "SGD"}, 1)
    assert e.value.field == "optimizer.name"


# --------------------------------------------------------------------------- DeepSpeed precision, hpZ, offload

def test_deepspeed_bf16_master_grads_and_states(tmp_path):
    """bf16_master_weights_and_grads: the master partition is cloned in bf16 and gradient partitions
    are cast to it (runtime/zero/stage_1_and_2.py:559-561, 1899-1900; base_optimizer.py:522-527):
    2 + 2 bytes per parameter instead of 4 + 4; bf16_optimizer_states: the moments in bf16, 4."""
    ci = _ds(tmp_path, {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True,
                                 "bf16_optimizer_states": True}})
    spec = ndplan.load_model("llama3-8b")
    est = ndplan.estimate(spec, ndplan.load_hardware("h100-sxm"), ci.strategy)
    t, n = est.per_stage[0]["terms"], _params("llama3-8b")
    # zero 1 on one device: the full parameter set, unsharded
    assert (t["mem.master"], t["mem.grads"], t["mem.optimizer"]) == (2 * n, 2 * n, 4 * n)


@pytest.mark.parametrize("bf16,zero,field", [
    ({"bf16_master_weights_and_grads": True}, 1, "bf16.bf16_master_weights_and_grads"),
    ({"bf16_optimizer_states": True}, 1, "bf16.bf16_optimizer_states"),
    ({"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}, 0, "bf16.bf16_master_weights_and_grads"),
], ids=["master-without-offload", "states-without-master", "zero-0"])
def test_deepspeed_refuses_what_its_config_refuses(tmp_path, bf16, zero, field):
    """runtime/config.py:706-714 (ZeRO 1-3; states need the master flag); fp32 states beside bf16
    master weights need ZeRO-Offload (stage_1_and_2.py:331-342, stage3.py:299-310)."""
    with pytest.raises(NdplanError) as e:
        _ds(tmp_path, {"bf16": {"enabled": True} | bf16, "zero_optimization": {"stage": zero}})
    assert e.value.field == field


def test_deepspeed_hpz_secondary_partition_and_param_offload(tmp_path):
    """ZeRO++ hpZ keeps a secondary partition of numel / hpz elements in the parameter dtype
    (partition_parameters.py:1900-1929); offload_param moves the partitions to host memory.
    llama3-8b, ZeRO-3 over 64 ranks, hpz 8: 2 B x (n/64 + n/8) on the device."""
    import json
    f = tmp_path / "ds.json"
    doc = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
           "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}}
    f.write_text(json.dumps(doc))
    hw = ndplan.load_hardware("h100-sxm")
    spec = ndplan.load_model("llama3-8b")
    n = _params("llama3-8b")
    ci = read_config(f, model="llama3-8b", gpus=64, seq=SEQ)
    w = ndplan.estimate(spec, hw, ci.strategy).per_stage[0]["terms"]["mem.weights"]
    assert w == pytest.approx(2 * (n / 64 + n / 8), rel=1e-9)
    doc["zero_optimization"] |= {"offload_param": {"device": "cpu"}}
    f.write_text(json.dumps(doc))
    ci = read_config(f, model="llama3-8b", gpus=64, seq=SEQ)
    est = ndplan.estimate(spec, hw, ci.strategy)
    assert est.per_stage[0]["terms"]["mem.weights"] == 0
    assert est.host_bytes == pytest.approx(2 * (n / 64 + n / 8), rel=1e-9)


@pytest.mark.parametrize("settings", [
    {"master_bytes": 2, "grad_bytes_fp32": 2, "optimizer_bytes": 4},
    {"secondary_weight_shard": 8, "weights_offloaded": 1},
    {"optimizer_bytes": 4, "non_matrix_optimizer_bytes": 8},
    {"optimizer_bytes": 0},
], ids=["bf16-states", "hpz-offload", "muon", "sgd"])
def test_deepspeed_emit_reads_back_the_engine_settings(tmp_path, settings):
    from ndplan.export import emit
    model = ndplan.load_model("llama3-8b")
    s = ndplan.Strategy(dp=16, gbs=32, zero=3, seq=SEQ, engine=derive("deepspeed", settings))
    f = tmp_path / "ds.json"
    f.write_text(emit("deepspeed", model, s))
    assert read_config(f, model=model, gpus=16, seq=SEQ).strategy.engine == s.engine


# --------------------------------------------------------------------------- MindSpore / MindFormers

MF_RECIPES = __import__("pathlib").Path(__file__).parent / "data" / "recipes"


def _mf(tmp_path, edit: dict, fixture="mindformers_mixtral_8x7b.yaml"):
    """The fixture with dotted keys set (yaml round trip), read back."""
    import yaml
    doc = yaml.safe_load((MF_RECIPES / fixture).read_text())
    for dotted, v in edit.items():
        node = doc
        *path, last = dotted.split(".")
        for k in path:
            node = node.setdefault(k, {})
        node[last] = v
    f = tmp_path / "mf.yaml"
    f.write_text(yaml.safe_dump(doc))
    return read_config(f)


def test_optimizer_weight_shard_size_caps_the_shard_group():
    """MindSpore optimizer parallel with optimizer_weight_shard_size k (MindFormers
    training_args.py:173-181): weights and moments shard over k of the dp ranks, not all of
    them. llama3-8b, dp = 8, k = 2, one stage: the moments 8 B x (n - V h) / 2, and the input
    embedding, which MindFormers keeps out of the optimizer-parallel group (vocab_emb_dp
    False: the profile's ``embedding_zero_sharded``), 8 B x V h whole; the 16-bit weights
    2 B x the same counts."""
    spec = ndplan.load_model("llama3-8b")
    n, emb = _params("llama3-8b"), spec.vocab_size * spec.hidden_size
    for k, group in ((2, 2), (0, 8)):
        eng = derive("mindspore", {"optimizer_shard_size": k} if k else {})
        s = ndplan.Strategy(dp=8, gbs=8, seq=SEQ, zero=1, engine=eng, weight_dtype="bf16")
        t = ndplan.estimate(spec, ndplan.load_hardware("h100-sxm"), s).per_stage[0]["terms"]
        assert t["mem.optimizer"] == pytest.approx(8 * ((n - emb) / group + emb), rel=1e-12)
        assert t["mem.weights"] == pytest.approx(2 * ((n - emb) / group + emb), rel=1e-12)


@pytest.mark.parametrize("k,want", [(2, "mindspore[optimizer_shard_size=2]"), (-1, "mindspore"), (3, "mindspore"),
                                    (64, "mindspore")], ids=["divides", "default", "does-not-divide", "whole-group"])
def test_mindformers_shard_size_read(tmp_path, k, want):
    """-1 is the whole group; a size that does not divide the parameter's data-parallel group
    is not applied (training_args.py:177-180); one at least the group is the group."""
    ci = _mf(tmp_path, {"parallel.parallel_optimizer_config.optimizer_weight_shard_size": k,
                        "parallel_config.data_parallel": 8, "moe_config.capacity_factor": -1})
    assert (ci.strategy.dp, ci.strategy.cp, ci.strategy.zero) == (8, 1, 1)
    assert ci.strategy.engine == want


@pytest.mark.parametrize("moe,want", [
    ({"capacity_factor": 1.1}, "mindspore[moe_capacity_permille=1100]"),
    ({"capacity_factor": 1.1, "use_gmm": True}, "mindspore"),
    ({"capacity_factor": -1}, "mindspore"),
    ({"capacity_factor": 9.0}, "mindspore[moe_capacity_permille=4000]"),
], ids=["padded", "gmm-dropless", "dynamic", "capped-at-the-tokens"])
def test_mindformers_capacity_factor(tmp_path, moe, want):
    """MoEV2 (no use_gmm) pads each expert to capacity = ceil(k tokens cf / E) rows, at most the
    tokens (moe.py:276-283, 880-889): cf x tokens x k rows, at most E / k x tokens x k (Mixtral:
    E = 8, k = 2, so 4); cf <= 0 is dynamic and use_gmm's MoEV3 groups the routed tokens only."""
    ci = _mf(tmp_path, {f"moe_config.{k}": v for k, v in moe.items()})
    assert ci.strategy.engine == want


def test_mindformers_came_keeps_one_state_in_the_parameter_dtype(tmp_path):
    """CAME: exp_avg = clone of the parameters when beta1 > 0 (came.py:352-355), factored second
    moments; 2 B per parameter with bf16 parameters, 4 with float32 ones. Its composite step builds
    exp_avg's new value before its assign (came.py:124-125 at fd4deebc): as many step temporaries."""
    for dtype, want in (("bfloat16", 2), ("float32", 4)):
        ci = _mf(tmp_path, {"optimizer.type": "Came", "moe_config.capacity_factor": -1,
                            "model.model_config.param_init_type": dtype})
        assert ci.strategy.engine == f"mindspore[optimizer_bytes={want},optimizer_step_temp_bytes={want}]"
    ci = _mf(tmp_path, {"optimizer.type": "Came", "optimizer.beta1": 0, "moe_config.capacity_factor": -1})
    assert ci.strategy.engine == "mindspore[optimizer_bytes=0,optimizer_step_temp_bytes=0]"



@pytest.mark.parametrize("zero_doc,want", [
    ({"stage": 2}, 1 * 2 * 500_000_000),
    ({"stage": 2, "overlap_comm": True}, 2 * 2 * 500_000_000),
    ({"stage": 3}, 1 * 2 * 500_000_000),
    ({"stage": 2, "overlap_comm": True, "reduce_bucket_size": "auto"}, 2 * 2 * 4096 * 4096),
    ({"stage": 0}, None),
], ids=["zero2", "zero2-overlap", "zero3", "hf-auto", "zero0"])
def test_deepspeed_reduce_bucket_buffers(tmp_path, zero_doc, want):
    """ZeRO-1/2 allocate one reduce_bucket_size bucket in the 16-bit gradient dtype at each
    backward's first gradient hook and a second with overlap_comm (stage_1_and_2.py:3256-3278;
    default 5e8 elements, zero/config.py:113; overlap_comm defaults on at stage 3 only,
    :384-387); ZeRO-3 one at init (stage3.py:780-784). The Trainer's "auto" is hidden_size^2
    (transformers integrations/deepspeed.py:229; llama3-8b h = 4096)."""
    import json
    f = tmp_path / "ds.json"
    f.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                             "bf16": {"enabled": True}, "zero_optimization": zero_doc}))
    ci = read_config(f, model="llama3-8b", gpus=8, seq=SEQ)
    t = ndplan.estimate(ci.model, ndplan.load_hardware("h100-sxm"), ci.strategy).per_stage[0]["terms"]
    assert t.get("mem.reduce_buckets") == want


@pytest.mark.parametrize("bf16,grads_per_param", [({}, 2 + 4), ({"immediate_grad_update": True}, 4)],
                         ids=["lp-grads-kept", "immediate-grad-update"])
def test_deepspeed_bf16_optimizer_at_zero1_with_fp32_accumulation(tmp_path, bf16, grads_per_param):
    """DeepSpeed 0.19.8 runtime/engine.py:2305-2310: ZeRO-1, bf16 weights, grad_accum_dtype fp32 and
    no offload build BF16_Optimizer. bf16_optimizer.py:181-183 clones the dp partition of the flat
    bf16 group into an fp32 master (4 n / dp) on which the optimizer keeps its moments (8 n / dp,
    :225); :191 allocates an fp32 gradient buffer of the whole group (4 n); each bf16 param.grad
    (2 n) is added into it after the backward and zeroed, not freed (:508-530), unless
    immediate_grad_update frees it in the hook (:707-715). No ZeRO reduce bucket; the bf16 master
    keys are not read. llama3-8b on 8 ranks."""
    import json
    f = tmp_path / "ds.json"
    f.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
                             "bf16": {"enabled": True, "bf16_master_weights_and_grads": True} | bf16,
                             "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": 1}}))
    ci = read_config(f, model="llama3-8b", gpus=8, seq=SEQ)
    t = ndplan.estimate(ci.model, ndplan.load_hardware("h100-sxm"), ci.strategy).per_stage[0]["terms"]
    n = _params("llama3-8b")
    assert t["mem.grads"] == pytest.approx(grads_per_param * n, rel=1e-12)
    assert (t["mem.master"], t["mem.optimizer"]) == (pytest.approx(4 * n / 8, rel=1e-12), pytest.approx(8 * n / 8, rel=1e-12))
    assert "mem.reduce_buckets" not in t
    assert any("BF16_Optimizer" in x for x in ci.notes)


@pytest.mark.parametrize("doc,field", [
    ({"zero_optimization": {"stage": 0}}, "data_types.grad_accum_dtype"),
    ({"zero_optimization": {"stage": 1, "compute_grad_norm": False}}, "zero_optimization.compute_grad_norm"),
    ({"zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "fp64"}}, "data_types.grad_accum_dtype"),
], ids=["zero0-unsupported-mix", "no-grad-norm", "unknown-dtype"])
def test_deepspeed_refuses_its_wrapper_mixes(tmp_path, doc, field):
    """runtime/engine.py:2305-2309 (compute_grad_norm false refused by BF16_Optimizer), :2322-2323
    (bf16 with fp32 accumulation and no ZeRO: NotImplementedError), config.py:144-149 (DtypeEnum)."""
    with pytest.raises(NdplanError) as e:
        _ds(tmp_path, {"data_types": {"grad_accum_dtype": "fp32"}} | doc)
    assert e.value.field == field


def test_deepspeed_bf16_optimizer_emit_reads_back(tmp_path):
    from ndplan.export import emit
    model = ndplan.load_model("llama3-8b")
    for lp in (0, 2):
        s = ndplan.Strategy(dp=8, gbs=16, zero=1, seq=SEQ,
                            engine=derive("deepspeed", {"fp32_grad_accumulation": 1} | ({"lp_grad_bytes": lp} if lp else {})))
        f = tmp_path / "ds.json"
        f.write_text(emit("deepspeed", model, s))
        assert read_config(f, model=model, gpus=8, seq=SEQ).strategy.engine == s.engine


# --------------------------------------------------------------------------- Megatron flex dispatcher: DeepEP

MG_DSV3 = __import__("pathlib").Path(__file__).parent / "data" / "recipes" / "megatron_deepseek_v3.sh"


@pytest.mark.parametrize("ep,want", [
    # n = 8 (one node, no RDMA): 10 channels x 8 peers; counters 10*8*(2*1 + 3)*4 = 1,600; dispatch and
    # combine both receive 256 tokens per channel-peer, each 2*7168 + 8 + 128*8 + 128*4 + 128*4 = 16,392 B:
    # 10*8*256*16,392 = 335,708,160; 335,709,760 rounded up to 128 = 335,709,824; + 160 B of signals and
    # peer pointers + 32 MiB workspace
    (8, 335_709_824 + 160 + 33_554_432),
    # n = 16 (2 nodes): NVLink 288 tokens: 10*8*(2*2 + 3)*4 = 2,240 + 10*8*288*16,392 = 377,671,680 ->
    # 377,673,920 -> 377,673,984. RDMA, dispatch (send 20, recv 128 aligned up to 140): 10*2*18*2*4 = 2,880
    # + 10*2*140*(2*16,392 + 2*16) = 91,884,800 -> 91,887,744 (combine's 132 slots are fewer), in one
    # 512 MiB NVSHMEM granule
    (16, 377_673_984 + 160 + 536_870_912 + 33_554_432),
], ids=["ep8", "ep16"])
def test_megatron_deepep_buffer(clean_env_ep, ep, want):
    """Megatron-LM fused_a2a.py:24-69 allocates one deep_ep.Buffer for the tp_ep group (etp 1 x ep)
    sized by the larger of DeepEP's dispatch and combine configs (deep_ep/buffers/legacy.py:245-289) on
    20 SMs (token_dispatcher.py:1287-1292), tokens of hidden x 2 bytes (DeepSeek-V3: 7168). Sizes from
    csrc/legacy/config.hpp:53-98 (int64 top-k indices, 8-byte SourceMeta, 128 top-k and scales),
    buffer.hpp:101-149 (signals, 32 MiB workspace), NVSHMEM granules of 2**29 (legacy.py:122)."""
    clean_env_ep.setenv("EP", str(ep))
    ci = read_config(MG_DSV3, gpus=256)
    assert ci.strategy.ep == ep and "deepep_sms=20" in ci.strategy.engine
    t = ndplan.estimate(ci.model, ndplan.load_hardware("h100-sxm"), ci.strategy).per_stage[-1]["terms"]
    assert t["mem.dispatch_buffers"] == want


@pytest.fixture
def clean_env_ep(monkeypatch):
    for name in ("EP", "TP", "MBS", "GBS", "NUM_NODES", "SHARDING_STRATEGY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("old,new,field", [
    ("--moe-token-dispatcher-type flex", "--moe-token-dispatcher-type alltoall --moe-enable-deepep",
     "--moe-enable-deepep"),
    ("--moe-token-dispatcher-type flex", "--moe-token-dispatcher-type flex --moe-expert-capacity-factor 1 "
     "--moe-pad-expert-input-to-capacity", "--moe-pad-expert-input-to-capacity"),
    ("--expert-tensor-parallel-size 1", "--expert-tensor-parallel-size 32", "--expert-model-parallel-size"),
    ("--moe-token-dispatcher-type flex", "--moe-token-dispatcher-type flex --moe-flex-dispatcher-num-sms x",
     "--moe-flex-dispatcher-num-sms"),
], ids=["enable-deepep-without-flex", "deepep-pads", "group-outside-deepeps-table", "sms-not-a-number"])
def test_megatron_deepep_refusals(tmp_path, clean_env_ep, old, new, field):
    """transformer_config.py:1743-1761 (DeepEP needs flex; deepep cannot pad to capacity);
    deep_ep/buffers/legacy.py:259 (etp 32 x ep 8 = 256 ranks: no DeepEP config)."""
    text = MG_DSV3.read_text()
    assert old in text
    f = tmp_path / MG_DSV3.name
    f.write_text(text.replace(old, new))
    with pytest.raises(NdplanError) as e:
        read_config(f, gpus=256)
    assert e.value.field == field


def test_megatron_deepep_emit_reads_back(tmp_path):
    from ndplan.export import emit
    model = ndplan.load_model("deepseek-v3")
    s = ndplan.Strategy(dp=64, tp=1, ep=16, gbs=128, seq=SEQ, zero=1, recompute="full",
                        engine=derive("megatron", {"deepep_sms": 24}))
    f = tmp_path / "run.sh"
    f.write_text(emit("megatron", model, s))
    assert "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep" in f.read_text()
    assert read_config(f, gpus=64).strategy.engine == s.engine


# --------------------------------------------------------------------------- Megatron fp8 recipe (Transformer Engine)

FP8 = {"fp8_linear_inputs": 1}


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_fp8_dense_layer_saves_fp8_linear_inputs(tp):
    """TE linear.py:418-437, 598-621 (TransformerEngine@d0067d0d): under fp8 each linear saves its
    quantized input, 1 B per element: the q/k/v input (norm output) and the fc1 input, sbh/tp
    each under SP, lose 1 B per element; the fc2 input (s f / tp) too; the o_proj input gains a
    1 B fp8 copy beside the bf16 output flash attention keeps (a d = h for llama3-8b).
    Net: s (h + f) / tp fewer bytes per layer."""
    spec = ndplan.load_model("llama3-8b")
    h, f = spec.hidden_size, spec.intermediate_size
    base = layer_bytes(spec, "dense", "megatron", tp=tp, recompute="none")
    fp8 = layer_bytes(spec, "dense", derive("megatron", FP8), tp=tp, recompute="none")
    assert base - fp8 == SEQ * (h + f) // tp


def test_fp8_moe_layer_saves_fp8_expert_fc2_inputs():
    """Mixtral: the grouped expert fc2 inputs (s k f_e / tp token-expert rows under SP) are saved
    in fp8; the router and the permuted tokens stay 16-bit; q/k/v input -s h, o_proj copy +s h
    cancel (a d = h)."""
    spec = ndplan.load_model("mixtral-8x7b")
    k, fe = 2, 14336  # mistralai/Mixtral-8x7B-v0.1 config.json: num_experts_per_tok, intermediate_size
    for tp in (1, 4):
        base = layer_bytes(spec, "moe", "megatron", tp=tp, etp=tp, recompute="none")
        fp8 = layer_bytes(spec, "moe", derive("megatron", FP8), tp=tp, etp=tp, recompute="none")
        assert base - fp8 == SEQ * k * fe // tp


MG_FP8 = __import__("pathlib").Path(__file__).parent / "data" / "recipes" / "megatron_llama3_8b_fp8.sh"


@pytest.mark.parametrize("edit,cache", [
    ({}, 1),  # --fp8-param-gather: fp8 primary weights, the transpose is the only copy
    ({'"--fp8-param-gather"': '"--no-load-optim"'}, 2),  # fp8 compute on bf16 weights: cached row-wise + transpose
    ({'"--fp8-param-gather"': '"--disable-parameter-transpose-cache"'}, 0),
], ids=["fp8-param-gather", "fp8-compute", "no-transpose-cache"])
def test_fp8_weight_cache(tmp_path, edit, cache):
    """Megatron passes is_first_microbatch to every TE linear (extensions/transformer_engine.py:
    1338-1345) unless --disable-parameter-transpose-cache, so TE caches the quantized weight
    (linear.py:1958-1961, 2068-2071; base.py:792-890): 1 B row-wise plus, on Hopper's TN-only fp8
    GEMMs, 1 B transpose (storage/float8_tensor_storage.py:281-317). llama3-8b layer weights per
    layer: q, o 2 x 4096^2 + k, v 2 x 4096 x 1024 + gate, up, down 3 x 4096 x 14336 + 2 norms of
    4096 = 218,112,000; 32 layers and the final norm (4096) on the one stage (tp 1)."""
    text = MG_FP8.read_text()
    for old, new in edit.items():
        assert old in text
        text = text.replace(old, new)
    f = tmp_path / MG_FP8.name
    f.write_text(text)
    ci = read_config(f)
    assert ci.strategy.tp == 1 and ci.strategy.pp == 1
    t = ndplan.estimate(ci.model, ndplan.load_hardware("h100-sxm"), ci.strategy).per_stage[0]["terms"]
    assert t.get("mem.fp8_weight_cache", 0) == cache * (32 * 218_112_000 + 4096)
    assert "fp8_linear_inputs=1" in ci.strategy.engine


def test_fp8_param_gather_keeps_the_vocabulary_matrices_in_bf16(tmp_path):
    """--fp8-param-gather: Transformer Engine creates fp8 primary weights only for the modules
    built under fp8_model_init, the decoder layers (Megatron-LM@d98e8a64 fp8_utils.py:839-910,
    extensions/transformer_engine.py:257-300); the embedding (VocabParallelEmbedding,
    language_model_embedding.py:59) and the output layer (ColumnParallelLinear, gpt_model.py:
    272-277) keep bf16. llama3-8b untied: 2 x 128,256 x 4,096 vocabulary weights, the rest
    (32 x 218,112,000 layer weights and the final norm's 4,096) at 1 B, unsharded at ZeRO-1."""
    ci = read_config(MG_FP8)
    assert ci.strategy.weight_dtype == "fp8" and ci.strategy.zero == 1
    t = ndplan.estimate(ci.model, ndplan.load_hardware("h100-sxm"), ci.strategy).per_stage[0]["terms"]
    assert t["mem.weights"] == 1 * (32 * 218_112_000 + 4096) + 2 * (2 * 128_256 * 4096)


@pytest.mark.parametrize("recipe,scale,act_block,weight_block", [
    ("mxfp8", 1, 32, 32),  # E8M0 uint8 per 1 x 32 block (TE constants.py:175; quantizer.cpp:1601, 1606)
    ("blockwise", 4, 128, 128 * 128),  # fp32 per 1 x 128 input block, per 128 x 128 weight block
])
def test_fp8_block_scaled_recipes(tmp_path, recipe, scale, act_block, weight_block):
    """--fp8-recipe mxfp8 | blockwise (Megatron-LM@d98e8a64 core/enums.py:12-19): Transformer Engine
    (TransformerEngine@d0067d0d) stores every fp8 copy with its block scales. Each saved linear
    input (the column-wise copy, linear.py:601-621) holds scale/act_block more bytes per element;
    each cached weight copy, row-wise and column-wise (linear.py:463-491), and each fp8 primary
    weight scale/weight_block more. llama3-8b, tp 1, s = 4096, no recompute: the saved fp8 inputs
    of a layer are q/k/v's and fc1's s h each, o_proj's s a d = s h and fc2's s f. Layer weights
    as test_fp8_weight_cache: 32 x 218,112,000 + 4,096; with --fp8-param-gather the cache holds
    the column-wise copy (1) and the primary weights the row-wise one."""
    spec = ndplan.load_model("llama3-8b")
    h, f = spec.hidden_size, spec.intermediate_size
    settings = {"fp8_scale_bytes": scale, "fp8_act_block": act_block, "fp8_weight_block": weight_block}
    scaled = layer_bytes(spec, "dense", derive("megatron", FP8 | settings), recompute="none")
    plain = layer_bytes(spec, "dense", derive("megatron", FP8), recompute="none")
    assert scaled - plain == sp.Rational(scale, act_block) * SEQ * (3 * h + f)
    text = MG_FP8.read_text().replace('"--fp8-amax-compute-algo max"', f'"--fp8-recipe {recipe}"')
    path = tmp_path / MG_FP8.name
    path.write_text(text)
    ci = read_config(path)
    assert all(f"{k}={v}" in ci.strategy.engine for k, v in settings.items())
    t = ndplan.estimate(ci.model, ndplan.load_hardware("h100-sxm"), ci.strategy).per_stage[0]["terms"]
    layer_weights = 32 * 218_112_000 + 4096
    per_copy = 1 + sp.Rational(scale, weight_block)
    assert t["mem.fp8_weight_cache"] == pytest.approx(float(1 * per_copy * layer_weights), abs=1)
    assert t["mem.weights"] == pytest.approx(float(per_copy * layer_weights + 2 * (2 * 128_256 * 4096)), abs=1)
    from ndplan.export import emit
    out = tmp_path / "emitted.sh"
    out.write_text(emit("megatron", ci.model, ci.strategy))
    assert f"--fp8-recipe {recipe}" in out.read_text()
    assert read_config(out, model=ci.model, gpus=8).strategy.engine == ci.strategy.engine


def test_fp8_recipe_not_known(tmp_path):
    path = tmp_path / MG_FP8.name
    path.write_text(MG_FP8.read_text().replace('"--fp8-amax-compute-algo max"', '"--fp8-recipe nvfp4"'))
    with pytest.raises(NdplanError, match="--fp8-recipe.*nvfp4.*delayed, tensorwise, mxfp8, blockwise"):
        read_config(path)


@pytest.mark.parametrize("settings", [{"fp8_linear_inputs": 1, "fp8_weight_cache_bytes": 2},
                                      {"fp8_linear_inputs": 1}], ids=["cache", "no-cache"])
def test_fp8_emit_reads_back(tmp_path, settings):
    from ndplan.export import emit
    model = ndplan.load_model("llama3-8b")
    s = ndplan.Strategy(dp=8, tp=1, gbs=16, seq=SEQ, zero=1, engine=derive("megatron", settings))
    f = tmp_path / "run.sh"
    f.write_text(emit("megatron", model, s))
    assert read_config(f, gpus=8).strategy.engine == s.engine


# --------------------------------------------------------------------------- MindFormers AdamW step temporaries

def test_mindformers_fused_adamw_has_no_step_temporaries(tmp_path):
    """mindformers@fd4deebc core/optim/__init__.py:175-198: AdamW(use_fused=True) is FusedAdamW, whose
    gen.AdamW kernel updates parameters, exp_avg and exp_avg_sq in place (fused_adamw.py:17-33, 172);
    the composite AdamW (adamw.py:44-52) builds each new moment as an fp32 tensor before its assign:
    8 B per local parameter while the step runs (the profile's). With everything recomputed those
    temporaries are the dynamic peak of the composite, and the fused one's is lower."""
    hw = ndplan.load_hardware("h100-sxm")
    composite = _mf(tmp_path, {"optimizer.type": "AdamW", "recompute_config.recompute": True})
    fused = _mf(tmp_path, {"optimizer.type": "AdamW", "optimizer.use_fused": True, "recompute_config.recompute": True})
    assert "optimizer_step_temp_bytes=0" in fused.strategy.engine
    assert "optimizer_step_temp_bytes" not in composite.strategy.engine
    ta = ndplan.estimate(composite.model, hw, composite.strategy).per_stage[0]["terms"]
    tb = ndplan.estimate(fused.model, hw, fused.strategy).per_stage[0]["terms"]
    # the step runs after the backward, when the activations and gathered weights are gone: the
    # composite's dynamic memory is the larger of the fused one's and its temporaries, as large as
    # the fp32 moments they replace (2 x 4 B per optimizer-sharded parameter)
    def dynamic(t):
        return sum(v for k, v in t.items() if k in ("mem.activations", "mem.transient", "mem.zero3_gather"))
    assert dynamic(ta) == pytest.approx(max(dynamic(tb), ta["mem.optimizer"]), rel=1e-9)
    assert ta["mem.optimizer"] > dynamic(tb)


@pytest.mark.parametrize("edit,field,opt_bytes", [
    ({"optimizer.amsgrad": True}, "optimizer.amsgrad", None),
    ({"optimizer.maximize": True}, "optimizer.maximize", None),
    ({"optimizer.amsgrad": True, "optimizer.use_fused": True}, None, 12),
], ids=["amsgrad-unfused", "maximize-unfused", "amsgrad-fused"])
def test_mindformers_adamw_amsgrad(tmp_path, edit, field, opt_bytes):
    """__init__.py:192-193 refuses amsgrad and maximize without use_fused; FusedAdamW with amsgrad
    clones max_exp_avg_sq beside the two moments (fused_adamw.py:163-168): 3 x 4 B."""
    if field:
        with pytest.raises(NdplanError) as e:
            _mf(tmp_path, {"optimizer.type": "AdamW"} | edit)
        assert e.value.field == field
        return
    ci = _mf(tmp_path, {"optimizer.type": "AdamW"} | edit)
    assert f"optimizer_bytes={opt_bytes}" in ci.strategy.engine


@pytest.mark.parametrize("settings", [{"optimizer_step_temp_bytes": 0},
                                      {"optimizer_step_temp_bytes": 0, "optimizer_bytes": 12}], ids=["fused", "amsgrad"])
def test_mindformers_fused_adamw_emit_reads_back(tmp_path, settings):
    from ndplan.export import emit
    model = ndplan.load_model("llama3-8b")
    s = ndplan.Strategy(dp=8, gbs=16, seq=SEQ, zero=1, engine=derive("mindspore", settings))
    f = tmp_path / "mf.yaml"
    f.write_text(emit("mindformers", model, s))
    assert read_config(f, model=model, gpus=8).strategy.engine == s.engine


# --------------------------------------------------------------------------- MoE dispatch: saved rows, all-to-all buffers

DISPATCH_CASES = [("megatron", 4, "megatron_alltoall_rows"), ("mindspore", 2, "moe_dispatch_rows")]


@pytest.mark.parametrize("engine,rows,setting", DISPATCH_CASES, ids=[c[0] for c in DISPATCH_CASES])
def test_moe_dispatch_buffers_are_a_transient(engine, rows, setting):
    """One MoE layer's all-to-all buffers above what it saves, U = k x tokens x h x 2 bytes
    (tokens on the device: s x b / tp under SP). MindFormers' mcore alltoall dispatcher: the send
    buffer (IndexSelect's permuted tokens) and the receive buffer of AlltoAllV coexist, 2U
    (mindspore-lab/mindformers@f52743ca token_dispatcher.py:617-621). Megatron-LM's alltoall
    dispatcher at etp 1: at the combine all-to-all the permuted tokens and the dispatch output held
    by MoELayer.custom_forward (moe_layer.py:663, 680), the experts' output, its unsorted copy and
    the receive buffer, 4U beside the saved fc1 input. The transient Term is the max of the exclusive
    transients, so it equals max(the Term without the buffers, rows x U)."""
    spec, hw = ndplan.load_model("mixtral-8x7b"), ndplan.load_hardware("h100-sxm")
    h, k, tp, b = spec.hidden_size, spec.experts_per_token, 2, 2
    u = k * SEQ * b // tp * h * 2
    decided = []
    for pp, stage in ((4, 0), (4, 3), (1, 0)):
        s = ndplan.Strategy(dp=8 // pp, tp=tp, pp=pp, ep=4, mbs=b, gbs=64, seq=SEQ, recompute="none", engine=engine)
        with_buffers = ndplan.estimate(spec, hw, s).per_stage[stage]["terms"]["mem.transient"]
        off = dataclasses.replace(s, engine=derive(engine, {setting: 0}))
        without = ndplan.estimate(spec, hw, off).per_stage[stage]["terms"]["mem.transient"]
        assert with_buffers == max(without, rows * u), (pp, stage, with_buffers, without)
        decided.append(rows * u > without)
        # the buffers themselves, where they do not decide the Term too (MindSpore)
        from ndplan.formulas.dispatch import moe_dispatch_transient
        from ndplan.structure import structure
        expr = moe_dispatch_transient(spec, model_symbols(spec), structure(spec, s))
        assert expr.subs({S.tp: tp, S.mbs: b, S.seq: SEQ, S.cp: 1, S.ep: 4, S.etp: s.etp}) == rows * u
    # Megatron: on a first stage (no loss) the buffers decide the Term. MindSpore: the backward's
    # workspace of one layer's activation gradients (backward_layer_workspace) holds more than 2U
    # (the layer saves 2U of rows alone), so the buffers never decide there
    assert decided[0] == (engine == "megatron")


@pytest.mark.parametrize("ep,etp,rows", [(4, 1, 4), (8, 1, 3), (4, 2, 7), (8, 2, 5), (2, 4, 11)])
def test_megatron_alltoall_rows_follow_etp(ep, etp, rows):
    """Megatron-LM@d98e8a64 alltoall dispatcher, rows R = k x tokens entering the all-to-all (mixtral:
    8 experts, so u = 1 local-expert sort with ep < 8, 0 at ep 8). Alive at the combine's peak,
    beside fc1's saved input: the permuted tokens (R, token_dispatcher.py:665-680) and the dispatch
    all-to-all's output (R, :705-711), both held by MoELayer.custom_forward (moe_layer.py:663, 680);
    the experts' output (etp R after the expert-TP all-gather, :741-748; moe_layer.py:565-569); its
    unsorted copy with u = 1 (etp R, :817-822); and the output buffer (R: the reduce-scatter's at
    etp > 1, :829-833, the combine all-to-all's at etp 1, :864-870). etp 1: 3 + u; above:
    3 + etp (1 + u)."""
    spec = ndplan.load_model("mixtral-8x7b")
    from ndplan.formulas.dispatch import moe_dispatch_transient
    from ndplan.structure import structure
    tp, b = 2, 2
    s = ndplan.Strategy(dp=32, tp=tp, ep=ep, etp=etp, mbs=b, gbs=64, seq=SEQ, recompute="none", engine="megatron")
    expr = moe_dispatch_transient(spec, model_symbols(spec), structure(spec, s))
    r = spec.experts_per_token * SEQ * b // tp * spec.hidden_size * 2
    assert expr.subs({S.tp: tp, S.mbs: b, S.seq: SEQ, S.cp: 1, S.ep: ep, S.etp: etp}) == rows * r


def test_megatron_saves_one_copy_of_the_routed_rows():
    """Megatron's alltoall dispatcher saves no token rows of its own: permute's index_select and
    unpermute's scatter_add_ save indices, _AllToAll saves nothing (tensor_parallel/mappings.py:
    428-431); fc1 saves its input (2h per row). The transformers modules (hf) keep the permuted input
    and the expert output (2h + 2h). Per layer, one micro-batch, etp 1: T = s x k rows."""
    spec = ndplan.load_model("mixtral-8x7b")
    h, k = spec.hidden_size, spec.experts_per_token
    hf = layer_bytes(spec, "moe", "hf", recompute="none")
    mg = layer_bytes(spec, "moe", derive("hf", {"moe_rows_saved": 1}), recompute="none")
    assert hf - mg == SEQ * k * 2 * h
    assert ndplan.engines.profile("megatron").moe_rows_saved == 1


def test_megatron_dispatcher_flags(tmp_path):
    """The emit writes the dispatcher the engine models: alltoall for the megatron profile,
    allgather under moe_allgather_dispatch; a script without the flag runs Megatron's default,
    allgather (transformer_config.py:891-903), and says so; each emit reads back."""
    spec = ndplan.load_model("mixtral-8x7b")
    from ndplan.export import emit
    from ndplan.export.megatron import fields
    for engine, kind in (("megatron", "alltoall"), (derive("megatron", {"moe_allgather_dispatch": 1}), "allgather")):
        s = ndplan.Strategy(dp=8, ep=4, gbs=64, seq=SEQ, engine=engine)
        assert fields(spec, s)[0]["--moe-token-dispatcher-type"] == kind
        f = tmp_path / f"{kind}.sh"
        f.write_text(emit("megatron", spec, s))
        assert read_config(f, model=spec, gpus=8).strategy.engine == s.engine
    script = tmp_path / "run.sh"
    script.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py --expert-model-parallel-size 4 --seq-length 4096 "
                      "--bf16 --micro-batch-size 1 --global-batch-size 64 --num-experts 8\n")
    ci = read_config(script, model=spec)
    assert any("allgather" in n for n in ci.notes)
    assert "moe_allgather_dispatch=1" in ci.strategy.engine


def test_megatron_allgather_dispatcher_buffers():
    """MoEAllGatherTokenDispatcher (Megatron-LM@d98e8a64 token_dispatcher.py:233-372), one MoE
    layer, micro-batch b, tokens s, tp 2 with SP, ep 4: the dispatcher's group is expert-TP x EP
    (its tp_group is expt_tp, :46-52). Its hidden states, (s b / tp) x etp x ep rows of h at 2 B,
    are gathered into the shared "mpu" buffer (:299-301; GlobalMemoryBuffer keeps the largest
    request, utils.py:727-750), larger than the SP all-gather's s b h: the comm_buffers Term. At
    the combine, the experts' output for every routed row of the local experts (gathered tokens
    x k/E x E/ep) beside the unpermuted gathered tokens (:346-352): the transient, in place of the
    alltoall's 4 rows of s b k / tp. Cases etp 1 and etp 2."""
    spec, hw = ndplan.load_model("mixtral-8x7b"), ndplan.load_hardware("h100-sxm")
    h, k, tp, ep, b = spec.hidden_size, spec.experts_per_token, 2, 4, 2
    for etp in (1, 2):
        s = ndplan.Strategy(dp=4, tp=tp, pp=2, ep=ep, etp=etp, mbs=b, gbs=64, seq=SEQ, recompute="none",
                            engine=derive("megatron", {"moe_allgather_dispatch": 1}))
        terms = ndplan.estimate(spec, hw, s).per_stage[0]["terms"]  # stage 0 of 2: no loss logits
        gathered = SEQ * b // tp * etp * ep
        assert terms["mem.comm_buffers"] == 2 * gathered * h
        off = dataclasses.replace(s, engine=derive("megatron", {"megatron_alltoall_rows": 0}))
        without = ndplan.estimate(spec, hw, off).per_stage[0]["terms"]["mem.transient"]
        combine = 2 * h * (gathered * k // ep + gathered)
        assert terms["mem.transient"] == max(without, combine)
        assert combine > without  # the combine decides it here


@pytest.mark.parametrize("edit,field", [
    ({"optimizer.type": 5}, "optimizer.type"),  # was counted as Adam with a note, exit 0
    ({"optimizer.type": ["AdamW"]}, "optimizer.type"),
    ({"optimizer.type": "Came", "optimizer.beta1": 2e6}, "optimizer.beta1"),  # a decay rate is in [0, 1)
    ({"optimizer.type": "Came", "optimizer.beta1": -0.1}, "optimizer.beta1"),
])
def test_mindformers_optimizer_keys_that_are_no_optimizer_are_one_line_errors(tmp_path, edit, field):
    with pytest.raises(NdplanError) as e:
        _mf(tmp_path, edit)
    assert e.value.field == field
