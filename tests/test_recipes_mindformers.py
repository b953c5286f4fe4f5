"""MindFormers recipes: the mcore MoE capacity keys, the optimizers' states and the ZeRO-3 round
trip, each expected value derived here by hand from MindFormers / MindSpore source (repository,
path, commit and lines next to it) and the exact Hugging Face parameter counts of
tests/data/hf_param_counts.yaml, never from ndplan's own output.

Sources: mindspore-lab/mindformers@f52743ca27a5a8af5fbc77c5b2037c1147c7004c (master, 2026-01-15;
"f52743ca" below) unless a line says fd4deebc; MindSpore's nn.optim at the commits cited.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import sympy as sp
import yaml
from click.testing import CliRunner

import ndplan
from ndplan import symbols as S
from ndplan.cli import main
from ndplan.errors import NdplanError, NdplanWarning
from ndplan.export import emit
from ndplan.interop import read_config

DATA = Path(__file__).parent / "data"
RECIPES = DATA / "recipes"
HF = {k: int(v["params"]) for k, v in yaml.safe_load((DATA / "hf_param_counts.yaml").read_text())["counts"].items()}
QWEN3_MOE = "mindformers_qwen3_30b_a3b_mcore.yaml"
MC = "model.model_config"
HW = ndplan.load_hardware("h100-sxm")


def _doc(fixture: str) -> dict:
    return yaml.safe_load((RECIPES / fixture).read_text())


def _set(doc: dict, edit: dict) -> dict:
    """A copy of ``doc`` with dotted keys set (None deletes the key)."""
    doc = copy.deepcopy(doc)
    for dotted, v in edit.items():
        node = doc
        *path, last = dotted.split(".")
        for k in path:
            node = node.setdefault(k, {})
        if v is None:
            node.pop(last, None)
        else:
            node[last] = v
    return doc


def _read(tmp_path, doc: dict, **kw):
    f = tmp_path / "mf.yaml"
    f.write_text(yaml.safe_dump(doc))
    return read_config(f, **kw)


def _terms(ci) -> list[dict]:
    return [s["terms"] for s in ndplan.estimate(ci.model, HW, ci.strategy).per_stage]


# --------------------------------------------------------------------------- 1. mcore MoE capacity keys

@pytest.mark.parametrize("key", ["moe_expert_capacity_factor", "capacity_factor"])
def test_mcore_capacity_factor_changes_no_term(tmp_path, key):
    """MindFormers' mcore model maps model_config ``moe_expert_capacity_factor`` (alias
    ``capacity_factor``, parallel_core/transformer_config_utils.py:353) onto TransformerConfig,
    which validates it (transformer_config.py:536-543) and which no module of the mcore MoE reads:
    ``git grep -i capacity`` over parallel_core/training_graph/ at f52743ca (and r1.6.0, r1.7.0,
    r1.8.0) finds nothing; router.py, token_dispatcher.py, moe_layer.py and ffn.py route every
    token to its top-k experts. So the Terms a capacity factor would scale stay dropless.

    Hand derivation of the Term a capacity would change, the dispatch transient: the mcore
    alltoall dispatcher keeps its send buffer (the permuted tokens) and the AlltoAllV receive
    buffer at once (token_dispatcher.py:617-621), 2 copies of the routed rows of one layer, bf16
    (2 B); rows = k x tokens on the device = 8 x (4096 x 1 / tp 4, SP on); h = 2048 (the fixture:
    num_experts_per_tok 8, seq_length 4096, batch_size 1, model_parallel 4, use_seq_parallel,
    hidden_size 2048). Capacity 1: 2 x 2 x 8 x 1024 x 2048 = 67,108,864 B, not x 1.5."""
    from ndplan.formulas.dispatch import moe_dispatch_transient
    from ndplan.symbols import model_symbols
    from ndplan.structure import structure
    base = _doc(QWEN3_MOE)
    without = _read(tmp_path, base)
    ci = _read(tmp_path, _set(base, {f"{MC}.{key}": 1.5}))
    assert ci.strategy == without.strategy and ci.strategy.engine == "mindspore"  # moe_capacity_permille 0
    assert _terms(ci) == _terms(without)
    assert any(n.startswith(f"{key} 1.5") and "dropless" in n for n in ci.notes), ci.notes
    spec, s = ci.model, ci.strategy
    expr = moe_dispatch_transient(spec, model_symbols(spec), structure(spec, s))
    value = sp.sympify(expr).subs({S.seq: s.seq, S.mbs: s.mbs, S.tp: s.tp, S.cp: s.cp, S.ep: s.ep, S.etp: s.etp})
    assert value == 2 * 2 * 8 * (4096 * 1 // 4) * 2048 == 67_108_864


@pytest.mark.parametrize("edit,field", [
    ({"moe_pad_expert_input_to_capacity": True}, f"{MC}.moe_pad_expert_input_to_capacity"),
    ({"moe_expert_capacity_factor": 1.5, "capacity_factor": 1.5}, f"{MC}.capacity_factor"),
    ({"moe_expert_capacity_factor": 1.5, "moe_router_load_balancing_type": "aux_loss"},
     f"{MC}.moe_router_load_balancing_type"),
    ({"moe_expert_capacity_factor": -1, "moe_router_load_balancing_type": "aux_loss"},
     f"{MC}.moe_router_load_balancing_type"),
    ({"moe_expert_capacity_factor": "big"}, f"{MC}.moe_expert_capacity_factor"),
], ids=["pad-is-not-a-key", "both-aliases", "balancing-type", "negative-still-checked", "not-a-number"])
def test_mcore_capacity_keys_mindformers_refuses(tmp_path, edit, field):
    """What MindFormers refuses, ndplan refuses naming the key: a model_config key outside
    COMMON_CONFIG_MAPPING and the whitelist ("Unexpected Keys", transformer_config_utils.py:
    500-518; moe_pad_expert_input_to_capacity is Megatron-LM's, not MindFormers'); two keys that
    map to one field ("Multiple Config", :480-485); a capacity factor, even a negative one, with a
    load-balancing type other than sub_seq_aux_loss / seq_aux_loss / gbs_aux_loss
    (transformer_config.py:536-543: the type check follows the None-ing of a negative factor)."""
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, _set(_doc(QWEN3_MOE), {f"{MC}.{k}": v for k, v in edit.items()}))
    assert e.value.field == field


def test_mcore_capacity_refusal_is_one_line_exit_2(tmp_path):
    f = tmp_path / "mf.yaml"
    f.write_text(yaml.safe_dump(_set(_doc(QWEN3_MOE), {f"{MC}.moe_pad_expert_input_to_capacity": True})))
    r = CliRunner().invoke(main, ["check", str(f)])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {MC}.moe_pad_expert_input_to_capacity="), r.output


def test_mcore_skips_a_top_level_moe_config(tmp_path):
    """ConfigTemplate._apply_template skips moe_config for a non-legacy model (tools/register/
    template.py:699-700) and convert_to_transformer_config whitelists it (transformer_config_utils.py:
    190-193): a legacy capacity_factor beside an mcore model changes nothing, and is said."""
    base = _doc(QWEN3_MOE)
    ci = _read(tmp_path, _set(base, {"moe_config.capacity_factor": 1.1, "moe_config.expert_num": 128}))
    assert ci.strategy == _read(tmp_path, base).strategy
    assert any(n.startswith("moe_config (capacity_factor, expert_num): skipped") for n in ci.notes), ci.notes


@pytest.mark.parametrize("dtype,want", [(None, "fp32"), ("float32", "fp32"), ("bfloat16", "bf16")])
def test_mcore_params_dtype_default_is_float32(tmp_path, dtype, want):
    """ModelParallelConfig.params_dtype defaults to "float32" (parallel_core/model_parallel_config.py:
    106); the upstream recipe writes it out (configs/qwen3_moe/pretrain_qwen3_30b_a3b_4k.yaml:170),
    the fixture leaves it to the default. The legacy param_init_type defaults to float16
    (models/llama/llama_config.py:153)."""
    ci = _read(tmp_path, _set(_doc(QWEN3_MOE), {f"{MC}.params_dtype": dtype}))
    assert ci.strategy.weight_dtype == want


# --------------------------------------------------------------------------- 2. optimizers

def _mla_mcore(**edit) -> dict:
    """An mcore (use_legacy: False) recipe whose model_config holds DeepSeek-V2-Lite's HF config
    (models/deepseek-v2-lite.yaml), one device, no optimizer parallel, Muon."""
    cfg = {k: v for k, v in yaml.safe_load((Path(__file__).parents[1] / "models" / "deepseek-v2-lite.yaml")
                                           .read_text()).items() if k not in ("name", "source")}
    doc = {"use_legacy": False, "runner_config": {"batch_size": 1},
           "parallel_config": {"data_parallel": 1, "model_parallel": 1, "pipeline_stage": 1},
           "parallel": {"enable_parallel_optimizer": False}, "optimizer": {"type": "Muon"},
           "model": {"model_config": cfg | {"seq_length": 4096}}}
    return _set(doc, edit)


# DeepSeek-V2-Lite (its HF config.json, models/deepseek-v2-lite.yaml): V = 102400, h = 2048,
# 27 layers, kv_lora_rank 512, no q_lora_rank (so no q_a_layernorm); its 1-D parameters are the
# norms: per layer input_layernorm (h) + post_attention_layernorm (h) + kv_a_layernorm (512), and
# the final norm (h); the router (64 x h) is 2-D, and there is no router bias.
V, H = 102400, 2048
NORMS = 27 * (2 * H + 512) + H  # 126,464


@pytest.mark.parametrize("dtype,wb", [("float32", 4), ("bfloat16", 2)])
def test_mindformers_muon_states_in_the_parameter_dtype(tmp_path, dtype, wb):
    """Muon (core/optim/muon.py:355-398): muon_m = param.clone("zeros") for every parameter that
    get_muon_filter passes, 2-D or 3-D and named neither word_embeddings nor output_layer
    (parallel_core/training_graph/base_models/gpt/gpt_model.py:864-876); adam_m and adam_v =
    param.clone("zeros") for the rest; the others get one-element fp32 placeholders (muon.py:371,
    395-396). Parameter.clone keeps the dtype: wb bytes each. One device, N = 15,706,484,224 (HF):
    MindFormers keeps wb x (N - 2Vh - norms) + 2 wb x (2Vh + norms). ndplan counts the norms at
    Muon's rate (the note says so): wb x N + wb x 2Vh, short by wb x NORMS (3e-6 relative)."""
    ci = _read(tmp_path, _mla_mcore(**{f"{MC}.params_dtype": dtype}))
    # the composite step: each state's new value before its assign (muon.py), one state's bytes
    assert ci.strategy.engine == (f"mindspore[non_matrix_optimizer_bytes={2 * wb},optimizer_bytes={wb},"
                                  f"optimizer_step_temp_bytes={wb}]")
    n = HF["deepseek-v2-lite"]
    mindformers = wb * (n - 2 * V * H - NORMS) + 2 * wb * (2 * V * H + NORMS)
    opt = _terms(ci)[0]["mem.optimizer"]
    assert opt == wb * n + wb * 2 * V * H == mindformers - wb * NORMS
    assert abs(opt - mindformers) / mindformers < 1e-5
    assert any(n_.startswith("Muon: one momentum per weight matrix") and "norms" in n_ for n_ in ci.notes)


def test_mindformers_muon_names_its_newton_schulz_gather(tmp_path):
    """_perform_allgather_op (muon.py:39-53) gathers each non-expert matrix over the optimizer shard
    and the TP group after the split of make_model_muon_fns (gpt_model.py:806-862), in bf16
    (muon.py:128). DeepSeek-V2-Lite's largest: the dense layer's fc1, split into gate and up
    (alt_pair_periodic), each intermediate_size 10944 x h 2048; 2 B x 10944 x 2048 = 44,826,624 B
    = 42.75 MiB (printed 42.8). The others: q_proj's nope part 16 x 128 x 2048, linear_proj
    2048 x 16 x 128 (4.19 M elements each), shared experts' fc1 part 2 x 1408 x 2048 (5.77 M)."""
    ci = _read(tmp_path, _mla_mcore())
    note = next(n for n in ci.notes if n.startswith("Muon's Newton-Schulz"))
    assert "dense linear_fc1 (gate part) 10944 x 2048, is 42.8 MiB" in note and "not counted" in note
    assert 2 * 10944 * 2048 == 44_826_624


@pytest.mark.parametrize("edit,field", [
    ({"parallel.enable_parallel_optimizer": True}, "parallel.parallel_optimizer_config.optimizer_weight_shard_size"),
    ({"parallel.enable_parallel_optimizer": True, "parallel_config.data_parallel": 2,
      "parallel.parallel_optimizer_config.optimizer_weight_shard_size": 4},
     "parallel.parallel_optimizer_config.optimizer_weight_shard_size"),
    ({"optimizer.swap": True}, "optimizer.swap"),
    ({"use_legacy": True, f"{MC}.num_layers": 27}, "optimizer.type"),
], ids=["shard-size-default", "shard-size-over-dp", "swap", "legacy"])
def test_mindformers_muon_refuses_what_muon_refuses(tmp_path, edit, field):
    """Muon.__init__: swap (muon.py:279-280); legacy models (:326-327); with optimizer parallel a
    shard size below 1 (:410-414; MindSpore's default -1) or above data_parallel (:415-417). The
    legacy case takes the architecture from the catalog (-m), as a legacy model_config with HF keys
    is not one ndplan reads."""
    model = "deepseek-v2-lite" if edit.get("use_legacy") else None
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, _mla_mcore(**edit), model=model)
    assert e.value.field == field


def test_mindformers_muon_needs_mla(tmp_path):
    """muon.py:329-332: "Current Muon implementation only supports models with Multi-Latent
    Attention enabled"; Qwen3-30B-A3B is GQA."""
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, _set(_doc(QWEN3_MOE), {"optimizer.type": "Muon"}))
    assert e.value.field == "optimizer.type" and "multi-latent attention" in e.value.problem


def test_mindformers_muon_with_optimizer_parallel_says_what_stays_whole(tmp_path):
    """get_op_groups_info (gpt_model.py:916-963) sets parallel_optimizer False on the q and kv
    projections: for DeepSeek-V2-Lite (no q_lora) q_proj h x 16 x 192 + kv_down h x (512 + 64)
    + kv_up 512 x 16 x 256 = 6,291,456 + 1,179,648 + 2,097,152 = 9.57 M parameters a layer."""
    ci = _read(tmp_path, _mla_mcore(**{"parallel.enable_parallel_optimizer": True, "parallel_config.data_parallel": 2,
                                       "parallel.parallel_optimizer_config.optimizer_weight_shard_size": 2}))
    assert ci.strategy.zero == 1 and ci.strategy.dp == 2
    assert 2048 * 16 * 192 + 2048 * 576 + 512 * 16 * 256 == 9_568_256
    assert any("9.6 M parameters a layer" in n and "not modelled" in n for n in ci.notes), ci.notes


@pytest.mark.parametrize("optimizer,want", [
    ({"type": "PmaAdamW"}, "mindspore[optimizer_bytes=12,optimizer_step_temp_bytes=12]"),  # composite: 3 x 4 B
    ({"type": "PmaAdamW", "use_fused": True}, "mindspore[optimizer_bytes=12,optimizer_step_temp_bytes=0]"),
    ({"type": "PmaAdamW", "use_fused": True, "amsgrad": True},
     "mindspore[optimizer_bytes=16,optimizer_step_temp_bytes=0]"),
], ids=["composite", "fused", "fused-amsgrad"])
def test_mindformers_pma_adamw_keeps_a_third_fp32_state(tmp_path, optimizer, want):
    """PmaAdamW (core/optim/__init__.py:345-387) is AdamW plus pma_weight = clone_state(...)
    (pma_adamw.py:195; fused_pma_adamw.py:198), and clone_state makes float32 Parameters whatever the
    parameter dtype (adamw.py:170-192; fused_adamw.py:182-204): exp_avg, exp_avg_sq, pma_weight =
    3 x 4 = 12 B; FusedAdamW's amsgrad adds max_exp_avg_sq (fused_adamw.py:173): 16 B. The fused
    kernel updates in place (no step temporaries), as for the fused AdamW."""
    ci = _read(tmp_path, _set(_doc("mindformers_mixtral_8x7b.yaml"), {"optimizer": optimizer,
                                                                       "moe_config.capacity_factor": -1}))
    assert ci.strategy.engine == want
    assert any(n.startswith("PmaAdamW: AdamW's two fp32 moments and an fp32 pma_weight") for n in ci.notes)
    if optimizer == {"type": "PmaAdamW"}:  # one device, llama3-8b: 12 B x N (HF)
        s = ndplan.Strategy(dp=1, gbs=8, zero=1, seq=4096, engine=want, weight_dtype="bf16")
        t = ndplan.estimate(ndplan.load_model("llama3-8b"), HW, s).per_stage[0]["terms"]
        assert t["mem.optimizer"] == 12 * HF["llama3-8b"]


def test_mindformers_pma_adamw_refuses_amsgrad_unfused(tmp_path):
    """PmaAdamW.__new__: amsgrad and maximize need use_fused (core/optim/__init__.py:374-375)."""
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, _set(_doc("mindformers_mixtral_8x7b.yaml"),
                             {"optimizer": {"type": "PmaAdamW", "amsgrad": True}, "moe_config.capacity_factor": -1}))
    assert e.value.field == "optimizer.amsgrad"


@pytest.mark.parametrize("optimizer,dtype,want", [
    ({"type": "SGD"}, "float32", 8), ({"type": "sgd", "momentum": 0.9}, "bfloat16", 4),
    ({"type": "Momentum", "momentum": 0.9}, "float32", 4), ({"type": "Momentum", "momentum": 0.9}, "bfloat16", 2),
], ids=["sgd-fp32", "sgd-alias-bf16", "momentum-fp32", "momentum-bf16"])
def test_mindspore_sgd_and_momentum_states(tmp_path, optimizer, dtype, want):
    """MindFormers registers every mindspore.nn.optim class and the alias sgd (core/optim/
    build_optim.py:101-129). nn.SGD keeps accum and stat = self._parameters.clone(...) whatever the
    momentum (mindspore-ai/mindspore@5f31f425 nn/optim/sgd.py:199-200): 2 states; nn.Momentum keeps
    moments = self.params.clone(...) (@09fe5b6f nn/optim/momentum.py:207): 1 state.
    ParameterTuple.clone keeps each parameter's dtype: 4 B (float32) or 2 B (bfloat16) a state
    (8 B is the profile's own figure, so the engine keeps its plain name)."""
    from ndplan.engines import profile
    ci = _read(tmp_path, _set(_doc("mindformers_mixtral_8x7b.yaml"),
                              {"optimizer": optimizer, "moe_config.capacity_factor": -1, f"{MC}.param_init_type": dtype}))
    assert profile(ci.strategy.engine).optimizer_bytes == want
    # no step temporaries: P.SGD / P.ApplyMomentum write the parameter and states in place
    # (mindspore 2.10.0 ops/operations/nn_ops.py:2280-2296, 2594: side_effect_mem), unlike the
    # composite AdamW's out-of-place moments (the profile's 8 B)
    assert profile(ci.strategy.engine).optimizer_step_temp_bytes == 0
    assert profile("mindspore").optimizer_step_temp_bytes == 8


def test_mindspore_momentum_needs_its_momentum(tmp_path):
    """nn.Momentum(params, learning_rate, momentum, ...): no default, a float >= 0 (momentum.py:198-203)."""
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, _set(_doc("mindformers_mixtral_8x7b.yaml"),
                             {"optimizer": {"type": "Momentum"}, "moe_config.capacity_factor": -1}))
    assert e.value.field == "optimizer.momentum"


def test_mindformers_swap_puts_the_states_on_the_host(tmp_path):
    """AdamW(swap=True) creates its states with device='CPU' (adamw.py:179-182): the strategy's
    optimizer offload. llama3-8b on one device (bf16 parameters): 8 B x N of fp32 moments on the
    host, none on the device. Came takes no swap argument (came.py:274-287)."""
    doc = _set(_doc("mindformers_mixtral_8x7b.yaml"), {"optimizer": {"type": "AdamW", "swap": True},
                                                       "moe_config.capacity_factor": -1})
    ci = _read(tmp_path, doc)
    assert ci.strategy.offload_optimizer and ci.strategy.engine == "mindspore"
    s = ndplan.Strategy(dp=1, gbs=8, zero=1, seq=4096, engine="mindspore", weight_dtype="bf16", offload_optimizer=True)
    est = ndplan.estimate(ndplan.load_model("llama3-8b"), HW, s)
    assert est.per_stage[0]["terms"]["mem.optimizer"] == 0 and est.host_bytes == 8 * HF["llama3-8b"]
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, _set(doc, {"optimizer.type": "Came"}))
    assert e.value.field == "optimizer.swap"


@pytest.mark.parametrize("settings", [
    {"optimizer_bytes": 12, "optimizer_step_temp_bytes": 12}, {"optimizer_bytes": 16, "optimizer_step_temp_bytes": 0},
], ids=["pma-adamw", "fused-pma-amsgrad"])
def test_mindformers_emit_reads_back_the_optimizer(tmp_path, settings):
    """The emit writes the optimizer keys the reader derives these settings from (PmaAdamW, with
    use_fused and amsgrad) and optimizer offload as AdamW's swap."""
    from ndplan.engines import derive
    model = ndplan.load_model("llama3-8b")
    s = ndplan.Strategy(dp=8, gbs=16, seq=4096, zero=1, engine=derive("mindspore", settings), offload_optimizer=True,
                        flash_attention=False, weight_dtype="bf16")
    back = _read(tmp_path, yaml.safe_load(emit("mindformers", model, s)), model=model, gpus=8).strategy
    assert (back.engine, back.offload_optimizer) == (s.engine, True)


def test_mindformers_emit_names_the_optimizer_it_cannot_write():
    """Muon's settings (states in the parameter dtype, AdamW's on the vocabulary matrices) need an
    mcore MLA model_config, which this form does not write: the emit says so in a comment."""
    from ndplan.engines import derive
    s = ndplan.Strategy(dp=8, gbs=16, seq=4096, zero=1,
                        engine=derive("mindspore", {"optimizer_bytes": 2, "non_matrix_optimizer_bytes": 4}))
    text = emit("mindformers", ndplan.load_model("deepseek-v2-lite"), s)
    assert "# note: optimizer states of 2 B per parameter (4 B on the embedding and output layer)" in text
    assert "optimizer" not in yaml.safe_load(text)


# --------------------------------------------------------------------------- 3. ZeRO-3 round trip

def test_mindformers_zero3_round_trip_names_the_field_it_loses(tmp_path):
    """MindFormers has one optimizer-parallel switch, parallel.enable_parallel_optimizer
    (MindSpore optimizer parallel), and no ZeRO level: a zero=3 strategy emits it, and it reads back
    as zero=1. The field lost is ``zero`` and nothing else; the emit's comment and check's note both
    name it. The mindspore profile shards the weights from zero 1 (weights_sharded_from = 1; the
    gradients never, grads_sharded_from = 4), so zero 1 and zero 3 give the same memory Terms."""
    model = ndplan.load_model("llama3-70b")
    s = ndplan.Strategy(dp=8, tp=4, cp=2, gbs=16, zero=3, seq=8192, engine="mindspore", flash_attention=False,
                        weight_dtype="bf16")
    text = emit("mindformers", model, s)
    assert "# note: zero=3 is not expressed" in text and "parallel.enable_parallel_optimizer" in text
    f = tmp_path / "zero3.yaml"
    f.write_text(text)
    ci = read_config(f, model=model)
    lost = {x.name for x in dataclasses.fields(s) if getattr(ci.strategy, x.name) != getattr(s, x.name)}
    assert lost == {"zero"} and ci.strategy.zero == 1
    assert any(n.startswith("parallel.enable_parallel_optimizer -> zero=1") for n in ci.notes)
    assert [x["terms"] for x in ndplan.estimate(model, HW, s).per_stage] == _terms(ci)
    r = CliRunner().invoke(main, ["check", str(f), "-m", "llama3-70b"])
    assert r.exit_code in (0, 1), r.output
    assert "enable_parallel_optimizer -> zero=1" in r.output


# --------------------------------------------------------------------------- pipeline_scheduler zero_bubble_v, gpipe

def _mindformers_layer_stages(L: int, pp: int, vpp: int, offset, zbv: bool) -> list[tuple[int, int]]:
    """(stage, chunk) of each decoder layer, transcribed from MindFormers' LayerSetting
    (f52743ca parallel_core/training_graph/transformer/utils.py:163-171 and set_pipeline_stage,
    :410-419): layer_list = L // (pp vpp) + offset per [chunk][stage], the second row reversed under
    zero_bubble_v; pp_ids = searchsorted(layer_accu, i + 1) % pp; interleave_ids the row; and under
    zero_bubble_v the second row's stage is pp - 1 - pp_id."""
    import numpy as np
    avg = L // (pp * vpp)
    layer_list = np.ones((vpp, pp), np.int32) * avg + np.array(offset, np.int32)
    if zbv:
        layer_list[1] = layer_list[1][::-1]
    interleave_sum = np.insert(np.cumsum(np.sum(layer_list, axis=1))[:-1], 0, 0)
    layer_accu = np.cumsum(layer_list, axis=1) + interleave_sum.reshape(-1, 1)
    out = []
    for i in range(L):
        pp_id = int(np.searchsorted(layer_accu.reshape(-1), i + 1) % pp)
        v_id = int(np.where(i < layer_accu)[0][0])
        out.append((pp - 1 - pp_id if zbv and v_id == 1 else pp_id, v_id))
    return out


@pytest.mark.parametrize("scheduler,schedule", [("zero_bubble_v", "zbv"), ("1f1b", "interleaved")])
def test_mindformers_zero_bubble_v_offsets_are_per_stage(tmp_path, scheduler, schedule):
    """qwen3-32b (64 layers), pp 4, pp_interleave_num 2, offsets [[-1, 0, 0, 1], [1, 0, 0, -1]]:
    the layers each (stage, chunk) runs, from MindFormers' own placement code (transcribed above),
    equal ndplan's layers_per_stage read through its slice order (layouts.virtual_stage: under zbv
    the second chunk runs the stages in reverse, the V). The emit writes the scheduler back."""
    from collections import Counter
    from ndplan.layouts import virtual_stage
    offset = [[-1, 0, 0, 1], [1, 0, 0, -1]]
    doc = _set(_doc("mindformers_qwen3_32b_mcore.yaml"),
               {f"{MC}.offset": offset, f"{MC}.pp_interleave_num": 2, "parallel.pipeline_config.pipeline_interleave": True,
                "parallel.pipeline_config.pipeline_scheduler": scheduler, "parallel_config.micro_batch_num": 8,
                "recompute_config.recompute": False})
    ci = _read(tmp_path, doc)
    s = ci.strategy
    assert (s.schedule, s.pp, s.vpp) == (schedule, 4, 2)
    placed = Counter(_mindformers_layer_stages(64, 4, 2, offset, scheduler == "zero_bubble_v"))
    assert all(s.layers_per_stage[virtual_stage(schedule, st, ch, 4)] == n for (st, ch), n in placed.items())
    f = tmp_path / "emitted.yaml"
    f.write_text(emit("mindformers", ci.model, s))
    back = yaml.safe_load(f.read_text())
    assert back["model"]["model_config"]["offset"] == offset
    assert back["parallel"]["pipeline_config"].get("pipeline_scheduler", "1f1b") == scheduler
    again = read_config(f, model=ci.model).strategy
    fields = ("pp", "vpp", "schedule", "layers_per_stage", "gbs", "mbs", "dp", "tp")
    assert [getattr(again, k) for k in fields] == [getattr(s, k) for k in fields]


def test_mindformers_zero_bubble_v_needs_twice_the_stages_in_micro_batches(tmp_path):
    """MindFormers' TransformerConfig (f52743ca parallel_core/transformer_config.py:714-726):
    zero_bubble_v with micro_batch_num < 2 x pipeline stages raises; the reader says so in one line."""
    doc = _set(_doc("mindformers_qwen3_32b_mcore.yaml"),
               {f"{MC}.offset": 0, f"{MC}.pp_interleave_num": 2, "parallel.pipeline_config.pipeline_interleave": True,
                "parallel.pipeline_config.pipeline_scheduler": "zero_bubble_v", "parallel_config.micro_batch_num": 7,
                "recompute_config.recompute": False})
    with pytest.raises(NdplanError, match="^parallel_config.micro_batch_num=7: .*m=7 >= 2\\*pp = 8"):
        _read(tmp_path, doc)
    doc = _set(doc, {"parallel_config.micro_batch_num": 8, f"{MC}.pp_interleave_num": 4})
    with pytest.raises(NdplanError, match="^model.model_config.pp_interleave_num=4: zbv places two chunks"):
        _read(tmp_path, doc)


def test_hccl_buffers_beside_the_pool_are_said(tmp_path, monkeypatch):
    """CANN's HCCL_BUFFSIZE reference (envref_07_0080): each communication domain holds
    2 x HCCL_BUFFSIZE (200 MB by default) outside MindSpore's pool. The Mixtral fixture's
    parallel_config (data_parallel 2, model_parallel 4, expert_parallel 2, pipeline_stage 2)
    gives 4 groups of more than one rank plus the world group: 5 domains, 5 x 2 x 200 MiB =
    1.95 GiB; with HCCL_BUFFSIZE=50, 0.49 GiB. (Which groups MindSpore creates is the note's
    stated rule, not derived: this checks the buffer arithmetic on it.)"""
    monkeypatch.delenv("HCCL_BUFFSIZE", raising=False)
    ci = _read(tmp_path, _set(_doc("mindformers_mixtral_8x7b.yaml"), {"moe_config.capacity_factor": -1}))
    note = next(n for n in ci.notes if n.startswith("HCCL buffers"))
    assert "5 domains" in note and "1.95 GiB" in note
    monkeypatch.setenv("HCCL_BUFFSIZE", "50")
    ci = _read(tmp_path, _set(_doc("mindformers_mixtral_8x7b.yaml"), {"moe_config.capacity_factor": -1}))
    assert "0.49 GiB" in next(n for n in ci.notes if n.startswith("HCCL buffers"))
    monkeypatch.setenv("HCCL_BUFFSIZE", "abc")  # not an integer: a warning and the default
    with pytest.warns(NdplanWarning, match="HCCL_BUFFSIZE='abc'"):
        ci = _read(tmp_path, _set(_doc("mindformers_mixtral_8x7b.yaml"), {"moe_config.capacity_factor": -1}))
    assert "1.95 GiB" in next(n for n in ci.notes if n.startswith("HCCL buffers"))


def test_mcore_moe_without_top_k_names_the_key(tmp_path):
    """An mcore model_config with experts and no num_experts_per_tok (MindFormers v1.7.0
    tests/st/.../deepseekv3_train.yaml): MindFormers takes its config class's default, which the
    yaml does not carry; one line names the key, not a made-up 0."""
    doc = _set(_doc("mindformers_qwen3_30b_a3b_mcore.yaml"), {f"{MC}.num_experts_per_tok": None})
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, doc)
    assert (e.value.field, e.value.value) == (f"{MC}.num_experts_per_tok", None)
    assert _read(tmp_path, doc, model="qwen3-30b-a3b").model.experts_per_token == 8  # -m replaces it


def test_incomplete_model_config_names_only_the_missing_keys(tmp_path):
    """MindFormers v1.5.0 research/yizhao writes GLM-style num_attention_heads / padded_vocab_size:
    the error lists the keys the legacy form lacks (num_heads, vocab_size), not all four."""
    doc = _set(_doc("mindformers_mixtral_8x7b.yaml"), {f"{MC}.num_heads": None, f"{MC}.vocab_size": None})
    with pytest.raises(NdplanError) as e:
        _read(tmp_path, doc)
    assert "lacks num_heads, vocab_size)" in e.value.problem


def test_pet_config_is_named_as_not_modelled(tmp_path):
    """MindFormers v1.2.0 research/baichuan2 finetune yamls tune LoRA adapters (model_config.pet_config,
    pet_type lora); ndplan counts the full model's states: a note says so."""
    doc = _set(_doc("mindformers_mixtral_8x7b.yaml"), {f"{MC}.pet_config": {"pet_type": "lora", "lora_rank": 8}})
    ci = _read(tmp_path, doc)
    assert any(n.startswith(f"{MC}.pet_config lora: not modelled") for n in ci.notes)
