"""DeepSpeed config JSON, continued: AutoEP's ``expert_parallel`` block, the Hugging Face
Trainer's ``"auto"`` precision switches, and a file with no batch key (``--gbs``).

Expected values come from DeepSpeed 0.19.8 (the release CI installs; paths relative to the
``deepspeed`` package) and transformers 5.17.0 (``transformers/...``), run on CPU wherever
they run there: DeepSpeedConfig on the fixture, AutoEP's own validators and layer detection on
tiny randomly initialised Hugging Face models, the Trainer's own ``trainer_config_process``.
None is copied from ndplan's output.
"""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

import ndplan
from ndplan.cli import main
from ndplan.errors import NdplanError
from ndplan.export import deepspeed as X
from ndplan.export import emit
from ndplan.export.common import flatten, nest
from ndplan.interop import deepspeed as R
from ndplan.interop import read_config

AUDIT_AUTOEP = ('{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,\n'
                ' "bf16": {"enabled": true},\n'
                ' "zero_optimization": {"stage": 2},\n'
                ' "expert_parallel": {"enabled": true, "autoep_size": 8, "preset_model": "mixtral"}}\n')
"""/tmp/audit14/ds_autoep.json of the audit (read with -m mixtral-8x7b --gpus 64 --seq 4096)."""


def _write(tmp_path: Path, doc, name="ds.json") -> Path:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2))
    return p


def _ds_config(doc: dict, world: int, monkeypatch):
    """DeepSpeed's own DeepSpeedConfig on ``doc`` with ``world`` ranks (runtime/config.py:457-471)."""
    C = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(C.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(C.dist, "get_world_size", lambda *a, **k: world)
    return C.DeepSpeedConfig(doc)


# --------------------------------------------------------------------------- AutoEP: what DeepSpeed runs

def _autoep_deepspeed(doc: dict, gpus: int, num_experts: int, moe: bool, monkeypatch) -> int:
    """The expert-parallel degree DeepSpeed 0.19.8 runs ``doc`` with on ``gpus`` ranks, or its exception.
    DeepSpeedConfig parses the block (runtime/config.py:171-176, 588); DeepSpeedEngine.
    _configure_expert_parallel (runtime/engine.py:816-913) returns at once unless ``enabled`` (:820-822),
    takes ep_size = autoep_size (:828), pp from the pipeline (the mpu, :832-840; ``pipeline.stages`` here),
    sp = the Ulysses degree (:830), calls validate_autoep_config (:842) and validate_folding_global
    (:843-864) with the ZeRO stage, offload sections and presets, then, after detecting ``moe`` layers,
    validate_autoep_post_detection (:889-890); at ZeRO-3 the engine's _validate_zero3_moe_compatibility
    (:2197-2232, called at :2710) refuses what AutoEP cannot partition."""
    pytest.importorskip("deepspeed")  # the oracle: DeepSpeed 0.19.8, a CI extra
    from deepspeed.module_inject.auto_ep_config import validate_autoep_config, validate_autoep_post_detection
    pytest.importorskip("deepspeed")  # the oracle: DeepSpeed 0.19.8, a CI extra
    from deepspeed.module_inject.auto_ep_folding import build_folding_spec, validate_folding_global
    pp = doc.get("pipeline", {}).get("stages", 1)
    sp = doc.get("sequence_parallel_size", 1)
    # the ranks DeepSpeedConfig's batch rule counts: the pipeline's and AutoTP's data-parallel world (the
    # reader's dp = gpus / (tp pp cp)), which it divides by sequence_parallel_size itself (config.py:468-469)
    cfg = _ds_config(doc, gpus // (pp * max(doc.get("tensor_parallel", {}).get("autotp_size", 1), 1)), monkeypatch)
    ep = cfg.expert_parallel_config
    if not ep.enabled:
        return 1
    tp = cfg.tensor_parallel_config.autotp_size
    validate_autoep_config(ep, gpus, pp, tp, sp)
    spec = build_folding_spec(world_size=gpus, pp_size=pp, tp_size=max(tp, 1), ep_size=ep.autoep_size,
                              etp_size=ep.expert_tensor_parallel_size, mp_mode="tp" if tp > 1 else "sp")
    validate_folding_global(spec, zero_stage=cfg.zero_optimization_stage, sp_size=sp,
                            use_data_before_expert_parallel=cfg.use_data_before_expert_parallel_,
                            autoep_enabled=True, tp_preset=cfg.tensor_parallel_config.preset_model,
                            ep_preset=ep.preset_model,
                            zero_offload_optimizer=cfg.zero_config.offload_optimizer is not None,
                            zero_offload_param=cfg.zero_config.offload_param is not None)
    if not moe:
        return 1  # no layer replaced (runtime/engine.py:889)
    layer = types.SimpleNamespace(num_experts=num_experts, moe_module_name="model.layers.0.mlp", score_apply="post",
                                  num_expert_groups=None, num_limited_groups=None)
    validate_autoep_post_detection(ep, [layer])
    if cfg.zero_optimization_stage == 3:
        _zero3_moe_check(cfg, sp)
    return ep.autoep_size


def _zero3_moe_check(cfg, sp: int) -> None:
    """DeepSpeedEngine._validate_zero3_moe_compatibility (runtime/engine.py:2197-2232) on an engine
    holding one AutoEP layer, with the config's ZeRO settings and the Ulysses degree."""
    E = pytest.importorskip("deepspeed.runtime.engine")
    from deepspeed.module_inject.auto_ep_layer import AutoEPMoELayer
    layer = AutoEPMoELayer.__new__(AutoEPMoELayer)  # isinstance is all the check asks of it

    class Engine:
        check = E.DeepSpeedEngine._validate_zero3_moe_compatibility
        has_moe_layers, sequence_parallel_size, _config = True, sp, cfg
        module = types.SimpleNamespace(named_modules=lambda: [("model.layers.0.mlp", layer)])

        def zero_quantized_gradients(self):
            return cfg.zero_config.zero_quantized_gradients

    Engine().check()


BASE = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1},
        "expert_parallel": {"enabled": True, "autoep_size": 8, "preset_model": "mixtral"}}


def _doc(change: dict) -> dict:
    """BASE with dotted keys set (export.common's flatten / nest: later keys win)."""
    return nest(flatten(BASE) | change)


def test_audit_autoep_file_sets_ep(tmp_path, monkeypatch):
    """The audit's file on 64 GPUs: AutoEP on, ep_size = autoep_size = 8 (runtime/engine.py:828); the
    expert groups are 8 consecutive ranks of the stage and the experts' ZeRO group the 64 / 8 = 8 ranks
    at the same place in each (module_inject/auto_ep_folding.py:118-158), ndplan's edp = dp*cp*tp/(ep*etp)."""
    pytest.importorskip("deepspeed")  # the oracle: DeepSpeed 0.19.8, a CI extra
    from deepspeed.module_inject.auto_ep_folding import build_folding_spec, expected_folding_group_tables
    doc = json.loads(AUDIT_AUTOEP)
    assert _autoep_deepspeed(doc, 64, 8, True, monkeypatch) == 8
    ci = read_config(_write(tmp_path, AUDIT_AUTOEP), model="mixtral-8x7b", gpus=64, seq=4096)
    s = ci.strategy
    assert (s.ep, s.etp, s.dp, s.zero) == (8, 1, 64, 2)
    assert ci.origin["ep"] == "line 4: expert_parallel.autoep_size"
    assert not [k for k in ci.unknown if k.startswith("expert_parallel")]
    spec = build_folding_spec(world_size=64, pp_size=1, tp_size=1, ep_size=8)
    tables = expected_folding_group_tables(spec)
    assert tables.ep_groups[0] == tuple(range(8)) and len(tables.edp_groups[0]) == spec.edp_size
    assert s.dp * s.cp * s.tp // (s.ep * s.etp) == spec.edp_size == 8
    r = CliRunner().invoke(main, ["check", str(tmp_path / "ds.json"), "-m", "mixtral-8x7b", "--gpus", "64",
                                  "--seq", "4096"])
    assert " ep=8 " in r.output and "not used: expert_parallel" not in r.output


CASES = {  # name: (change to BASE, gpus, the key ndplan's one-line error names; None: it reads ep)
    "etp-2": ({"expert_parallel.expert_tensor_parallel_size": 2}, 64, "expert_parallel.expert_tensor_parallel_size"),
    "tp-with-pipeline": ({"tensor_parallel.autotp_size": 2, "pipeline.stages": 2}, 64, "tensor_parallel.autotp_size"),
    "tp-with-ulysses": ({"tensor_parallel.autotp_size": 2, "sequence_parallel_size": 2}, 64,
                        "tensor_parallel.autotp_size"),
    "tp-with-ep-1": ({"tensor_parallel.autotp_size": 2, "expert_parallel.autoep_size": 1}, 64,
                     "expert_parallel.autoep_size"),
    "tp-with-offload": ({"tensor_parallel.autotp_size": 2, "zero_optimization.offload_optimizer": {"device": "cpu"}},
                        64, "zero_optimization.offload_optimizer"),
    "ep-does-not-tile": ({"expert_parallel.autoep_size": 3}, 64, "expert_parallel.autoep_size"),
    "ep-above-experts": ({"expert_parallel.autoep_size": 16}, 64, "expert_parallel.autoep_size"),
    "async-split-folded": ({"tensor_parallel.autotp_size": 2, "expert_parallel.async_split_plan": True}, 64,
                           "expert_parallel.async_split_plan"),
    "fused-combine-folded": ({"tensor_parallel.autotp_size": 2, "expert_parallel.combine_impl": "fused_weighted_sum"},
                             64, "expert_parallel.combine_impl"),
    "unknown-preset": ({"expert_parallel.preset_model": "llama"}, 64, "expert_parallel.preset_model"),
    "presets-differ": ({"tensor_parallel.preset_model": "qwen3_moe"}, 64, "expert_parallel.preset_model"),
    "load-balance-coeff": ({"expert_parallel.load_balance_coeff": 0.1}, 64, "expert_parallel.load_balance_coeff"),
    "zero3-ulysses": ({"zero_optimization.stage": 3, "sequence_parallel_size": 2}, 64, "sequence_parallel_size"),
    "zero3-hpz": ({"zero_optimization.stage": 3, "zero_optimization.zero_hpz_partition_size": 8}, 64,
                  "zero_optimization.zero_hpz_partition_size"),
    "zero3-qgz": ({"zero_optimization.stage": 3, "zero_optimization.zero_quantized_gradients": True}, 64,
                  "zero_optimization.zero_quantized_gradients"),
    # what DeepSpeed runs
    "folded-tp-2": ({"tensor_parallel.autotp_size": 2}, 64, None),
    "ulysses-zero2": ({"sequence_parallel_size": 2, "zero_optimization.stage": 2}, 64, None),
    "zero3": ({"zero_optimization.stage": 3}, 64, None),
    "offload-without-tp": ({"zero_optimization.offload_optimizer": {"device": "cpu"}}, 64, None),
    "ep-8-of-16-ranks": ({"expert_parallel.autoep_size": 8}, 16, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_autoep_refuses_what_deepspeed_refuses(tmp_path, monkeypatch, name):
    """Each layout DeepSpeed's AutoEP refuses (the validators of ``_autoep_deepspeed``, run here) is a
    one-line error naming its key; each it runs is read with ep = autoep_size (mixtral: 8 experts)."""
    change, gpus, field = CASES[name]
    doc = _doc(change)
    try:
        want = _autoep_deepspeed(doc, gpus, 8, True, monkeypatch)
    except (ValueError, AssertionError) as err:
        assert "batch" not in str(err)  # refused by AutoEP, not by the harness's batch keys
        want = None
    path = _write(tmp_path, doc)
    if field is None:
        assert want == 8
        assert read_config(path, model="mixtral-8x7b", gpus=gpus, seq=4096).strategy.ep == want
        return
    assert want is None, "DeepSpeed runs it"
    with pytest.raises(NdplanError) as e:
        read_config(path, model="mixtral-8x7b", gpus=gpus, seq=4096)
    assert e.value.field == field
    r = CliRunner().invoke(main, ["check", str(path), "-m", "mixtral-8x7b", "--gpus", str(gpus), "--seq", "4096"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and field in r.output


def _tiny(kind: str):
    """A randomly initialised Hugging Face model of ``kind`` (a few thousand parameters, CPU)."""
    tf = pytest.importorskip("transformers")
    small = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=32)
    mla = dict(moe_intermediate_size=8, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
               first_k_dense_replace=0, kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4,
               v_head_dim=4)
    build = {
        "mixtral": lambda: tf.MixtralForCausalLM(tf.MixtralConfig(**small, num_local_experts=4, num_experts_per_tok=2)),
        "qwen3_moe": lambda: tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(**small, moe_intermediate_size=8, num_experts=4,
                                                                      num_experts_per_tok=2, head_dim=8)),
        "deepseek_v3": lambda: tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(**small, **mla)),
        "llama4_text": lambda: tf.Llama4ForCausalLM(tf.Llama4TextConfig(**small, intermediate_size_mlp=32, head_dim=8,
                                                                        num_local_experts=4, num_experts_per_tok=1,
                                                                        interleave_moe_layer_step=1)),
        "llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**small)),
    }
    return build[kind]()


def _pipeline_named(model):
    """The decoder layers as DeepSpeed's PipelineModule registers them: by index (runtime/pipe/
    module.py:250-255), so a block is "0.mlp", not "model.layers.0.mlp"."""
    import torch.nn as nn
    pipe = nn.Module()
    for i, layer in enumerate(model.model.layers):
        pipe.add_module(str(i), layer)
    return pipe


DETECTION = {  # name: (tiny model kind, catalog model of the same model_type, extra block keys, pipeline stages)
    "mixtral": ("mixtral", "mixtral-8x7b", {}, 1),
    "qwen3-moe-auto-detected": ("qwen3_moe", "qwen3-30b-a3b", {"preset_model": None}, 1),
    "deepseek-v3-auto-detected": ("deepseek_v3", "deepseek-v3", {"preset_model": None}, 1),
    "llama4-no-preset": ("llama4_text", "llama4-scout", {"preset_model": None}, 1),
    "dense-no-preset": ("llama", "llama3-8b", {"preset_model": None}, 1),
    "dense-with-preset": ("llama", "llama3-8b", {}, 1),
    "pipeline-no-preset": ("mixtral", "mixtral-8x7b", {"preset_model": None}, 2),
    "pipeline-with-preset": ("mixtral", "mixtral-8x7b", {}, 2),
}


@pytest.mark.parametrize("name", sorted(DETECTION))
def test_autoep_replaces_the_layers_deepspeed_finds(tmp_path, name):
    """AutoEP's ep_parser (module_inject/auto_ep.py:417-629) on a tiny model of the catalog model's type:
    the blocks it finds get ep = autoep_size; none found is a warning and ep 1 (auto_ep.py:625), or, with a
    preset or pattern named, its ValueError (:622-624), which ndplan's reader raises too."""
    pytest.importorskip("deepspeed")  # the oracle: DeepSpeed 0.19.8, a CI extra
    from deepspeed.module_inject.auto_ep import AutoEP
    pytest.importorskip("deepspeed")  # the oracle: DeepSpeed 0.19.8, a CI extra
    from deepspeed.module_inject.auto_ep_config import parse_autoep_config
    kind, catalog, extra, stages = DETECTION[name]
    block = {k: v for k, v in ({"enabled": True, "autoep_size": 2, "preset_model": "mixtral"} | extra).items()
             if v is not None}
    model = _tiny(kind)
    assert model.config.model_type == ndplan.load_model(catalog).model_type
    target = _pipeline_named(model) if stages > 1 else model
    try:
        found = bool(AutoEP(target, parse_autoep_config(block)).ep_parser())
    except ValueError:
        found = None
    doc = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1},
           "expert_parallel": block} | ({"pipeline": {"stages": stages}} if stages > 1 else {})
    path = _write(tmp_path, doc)
    if found is None:
        with pytest.raises(NdplanError) as e:
            read_config(path, model=catalog, gpus=16, seq=4096)
        assert e.value.field == "expert_parallel.preset_model"
        return
    ci = read_config(path, model=catalog, gpus=16, seq=4096)
    assert ci.strategy.ep == (2 if found else 1)
    if not found:
        assert any(n.startswith("expert_parallel.autoep_size 2:") and "ep 1" in n for n in ci.notes)


def test_autoep_tables_are_deepspeeds():
    """The keys parse_autoep_config reads (module_inject/auto_ep_config.py:42-101, the fields of
    AutoEPConfig) and the model types of each preset (auto_ep_presets/registry.py:20-29)."""
    pytest.importorskip("deepspeed")  # the oracle: DeepSpeed 0.19.8, a CI extra
    from deepspeed.module_inject.auto_ep_config import PRESET_MODELS, AutoEPConfig
    fields = {f.name for f in dataclasses.fields(AutoEPConfig) if not f.name.startswith("_")}
    assert set(R.AUTOEP_KEYS) == fields and len(R.AUTOEP_KEYS) == len(fields)
    assert X.AUTOEP_PRESETS == {name: tuple(p.hf_model_types) for name, p in PRESET_MODELS.items()}


def test_autoep_off_and_unknown_keys(tmp_path, monkeypatch):
    """Without ``enabled`` AutoEP is off (auto_ep_config.py:48 defaults it to false; engine.py:820-822):
    ep 1, said in a note; a key parse_autoep_config never reads is listed as not used."""
    doc = _doc({})
    del doc["expert_parallel"]["enabled"]
    doc["expert_parallel"]["experts_per_rank"] = 1
    assert _autoep_deepspeed(doc, 64, 8, True, monkeypatch) == 1
    ci = read_config(_write(tmp_path, doc), model="mixtral-8x7b", gpus=64, seq=4096)
    assert ci.strategy.ep == 1 and "expert_parallel.experts_per_rank" in ci.unknown
    assert any(n.startswith("expert_parallel.enabled false") for n in ci.notes)
    # no block at all: the MoE note names both ways DeepSpeed sets the degree
    del doc["expert_parallel"]
    ci = read_config(_write(tmp_path, doc), model="mixtral-8x7b", gpus=64, seq=4096)
    assert ci.strategy.ep == 1 and any("MoE(ep_size=...)" in n and "autoep_size" in n for n in ci.notes)


def test_autoep_routing_and_deepep_keys_are_stated(tmp_path):
    """top_k overrides the model's (auto_ep.py:492-494), comm_backend deepep allocates DeepEP's buffers:
    read, stated, not modelled; the other block keys in one note."""
    doc = _doc({"expert_parallel.top_k": 4, "expert_parallel.comm_backend": "deepep",
                "expert_parallel.comm_max_tokens_per_rank": 4096, "expert_parallel.use_grouped_mm": True})
    ci = read_config(_write(tmp_path, doc), model="mixtral-8x7b", gpus=64, seq=4096)
    assert ci.strategy.ep == 8
    assert any(n.startswith("expert_parallel.top_k 4:") and "mixtral-8x7b's 2" in n for n in ci.notes)
    assert any(n.startswith("expert_parallel.comm_backend deepep:") for n in ci.notes)
    assert any(n.startswith("expert_parallel.{use_grouped_mm, comm_max_tokens_per_rank}") for n in ci.notes)


def test_enabled_must_be_a_switch(tmp_path):
    """DeepSpeed tests ``enabled`` by its truth (runtime/engine.py:821, parse_autoep_config takes it as
    written, module_inject/auto_ep_config.py:48), so even "false" would switch AutoEP on: anything but
    true/false is a one-line error."""
    pytest.importorskip("deepspeed")  # the oracle: DeepSpeed 0.19.8, a CI extra
    from deepspeed.module_inject.auto_ep_config import parse_autoep_config
    assert parse_autoep_config({"enabled": "false"}).enabled == "false"  # truthy
    path = _write(tmp_path, _doc({"expert_parallel.enabled": "yes"}))
    r = CliRunner().invoke(main, ["check", str(path), "-m", "mixtral-8x7b", "--gpus", "64", "--seq", "4096"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "expert_parallel.enabled" in r.output


# --------------------------------------------------------------------------- AutoEP in the emitted JSON

EMITTED = {  # name: (model, strategy)
    "mixtral-folded-tp": ("mixtral-8x7b", ndplan.Strategy(dp=8, tp=2, ep=4, gbs=64, zero=1, sp=False,
                                                          engine="deepspeed", seq=4096)),
    "qwen3-zero3": ("qwen3-30b-a3b", ndplan.Strategy(dp=16, ep=8, gbs=64, zero=3, engine="deepspeed", seq=4096)),
    "mixtral-ulysses": ("mixtral-8x7b", ndplan.Strategy(dp=8, cp=2, ep=8, gbs=64, zero=2, engine="deepspeed",
                                                        seq=8192)),
}


@pytest.mark.parametrize("name", sorted(EMITTED))
def test_autoep_emit_runs_in_deepspeed_and_reads_back(tmp_path, monkeypatch, name):
    """ep > 1 is written as AutoEP's block with the model type's preset; DeepSpeed's validators run it
    with ep_size = s.ep, and the reader gives the strategy back."""
    model, s = EMITTED[name]
    spec = ndplan.load_model(model)
    doc = json.loads(emit("deepspeed", spec, s))
    assert doc["expert_parallel"] == {"enabled": True, "autoep_size": s.ep,
                                      "preset_model": spec.model_type}
    assert _autoep_deepspeed(doc, s.world, spec.num_experts, True, monkeypatch) == s.ep
    assert read_config(_write(tmp_path, doc), model=model, gpus=s.world, seq=s.seq).strategy == s


@pytest.mark.parametrize("model,s,field", [
    ("mixtral-8x7b", ndplan.Strategy(dp=8, pp=2, ep=8, gbs=64, zero=1, engine="deepspeed"), "ep"),
    ("mixtral-8x7b", ndplan.Strategy(dp=8, tp=2, cp=2, ep=8, gbs=64, zero=1, sp=False, engine="deepspeed"), "ep"),
    ("mixtral-8x7b", ndplan.Strategy(dp=16, cp=2, ep=8, gbs=64, zero=3, engine="deepspeed"), "ep"),
    ("mixtral-8x7b", ndplan.Strategy(dp=8, tp=2, ep=4, etp=2, gbs=64, zero=1, sp=False, engine="deepspeed"), "etp"),
    ("llama4-scout", ndplan.Strategy(dp=16, ep=8, gbs=64, zero=1, engine="deepspeed"), "ep"),
], ids=["pipeline", "folded-tp-ulysses", "zero3-ulysses", "etp", "no-preset"])
def test_autoep_emit_refuses_what_autoep_cannot_run(model, s, field):
    """PipelineModule names its layers by index, not as the presets expect (runtime/pipe/module.py:
    250-255); AutoTP with Ulysses (auto_ep_folding.py:210-212); ZeRO-3 with Ulysses (engine.py:2219-2221);
    etp > 1 (auto_ep_folding.py:214-218); a model type with no preset (registry.py:20-29)."""
    with pytest.raises(NdplanError) as e:
        emit("deepspeed", ndplan.load_model(model), s)
    assert e.value.field == field


# --------------------------------------------------------------------------- "auto" precision switches

class _TrainerConfig:
    """transformers' HfTrainerDeepSpeedConfig, whose base class (accelerate's HfDeepSpeedConfig) is
    replaced by its node lookup: fill_match and trainer_config_process run as transformers 5.17.0 wrote
    them (integrations/deepspeed.py:105-191)."""

    def __new__(cls, doc: dict):
        hf = pytest.importorskip("transformers.integrations.deepspeed")

        class Config(hf.HfTrainerDeepSpeedConfig):
            def __init__(self, config):
                self.config, self.mismatches, self._dtype = config, [], None

            def find_config_node(self, key):
                node, *parents = self.config, *key.split(".")[:-1]
                for p in parents:
                    node = node.get(p)
                    if node is None:
                        return None, key.split(".")[-1]
                return node, key.split(".")[-1]

            def get_value(self, key, default=None):
                node, leaf = self.find_config_node(key)
                return default if node is None else node.get(leaf, default)

            def is_true(self, key):
                return self.get_value(key) is True

        return Config(doc)


def _trainer_args(**flags):
    """TrainingArguments' defaults (transformers/training_args.py; bf16 / fp16 False at :872-895), on 8 ranks
    with the batch of the test's file (64 = 1 x 8 x 8)."""
    from transformers import TrainingArguments
    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments)
                if f.default is not dataclasses.MISSING}
    return types.SimpleNamespace(**(defaults | {"world_size": 8, "per_device_train_batch_size": 1,
                                                 "gradient_accumulation_steps": 8} | flags))


@pytest.mark.parametrize("auto", [("bf16",), ("fp16",), ("bf16", "fp16")])
def test_auto_precision_is_the_trainers_default(tmp_path, monkeypatch, auto):
    """The Trainer fills "auto" bf16.enabled / fp16.enabled with args.bf16 / args.fp16 (or their
    _full_eval), false by default; DeepSpeed alone drops "auto" for its default, false
    (runtime/config_utils.py:54-56). The file reads as the filled one, with one note saying what to write
    for a run with --bf16, which the Trainer fills true."""
    doc = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
    doc |= {k: {"enabled": "auto"} for k in auto}
    filled = _TrainerConfig(json.loads(json.dumps(doc)))
    filled.trainer_config_process(_trainer_args())
    assert all(filled.config[k]["enabled"] is False for k in auto) and not filled.mismatches
    c = _ds_config(json.loads(json.dumps(doc)), 8, monkeypatch)
    assert (c.bfloat16_config.enabled, c.float16_config.enabled) == (False, False)
    ci = read_config(_write(tmp_path, doc), model="llama3-8b", gpus=8, seq=4096)
    assert ci.strategy == read_config(_write(tmp_path, filled.config, "filled.json"), model="llama3-8b", gpus=8,
                                      seq=4096).strategy
    said = [n for n in ci.notes if "'auto': false" in n]
    assert len(said) == 1 and all(f"--{k}" in said[0] and f'"{k}": {{"enabled": true}}' in said[0] for k in auto)
    # a run with --bf16: the Trainer fills true, the file written so reads as explicit bf16
    with_flag = _TrainerConfig(json.loads(json.dumps(doc)))
    with_flag.trainer_config_process(_trainer_args(**{k: True for k in auto[:1]}))
    assert with_flag.config[auto[0]]["enabled"] is True
    explicit = read_config(_write(tmp_path, with_flag.config, "flag.json"), model="llama3-8b", gpus=8, seq=4096)
    assert explicit.strategy != ci.strategy  # bf16/fp16 gradients are reduced in 2 bytes, fp32 in 4


@pytest.mark.parametrize("doc", [
    {"bf16": {"immediate_grad_update": False}, "bfloat16": {"enabled": True}},  # precision_config.py:34-38
    {"bf16": {"enabled": "false"}},  # pydantic's lax bool
    {"bfloat16": {"enabled": "auto"}},  # not filled by the Trainer; DeepSpeed drops "auto"
], ids=["bf16-shadows-bfloat16", "string-false", "old-section-auto"])
def test_bf16_switch_as_deepspeed_reads_it(tmp_path, monkeypatch, doc):
    """A ``bf16`` section hides the old ``bfloat16`` one (runtime/precision_config.py:34-38); "false" is
    false to pydantic's bool; "auto" is dropped for the default false (runtime/config_utils.py:54-56):
    DeepSpeedConfig trains these in fp32, and the reader says so."""
    doc = doc | {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1}
    assert _ds_config(json.loads(json.dumps(doc)), 8, monkeypatch).bfloat16_config.enabled is False
    ci = read_config(_write(tmp_path, doc), model="llama3-8b", gpus=8, seq=4096)
    assert any(n.startswith("neither fp16 nor bf16 is enabled") for n in ci.notes)


# --------------------------------------------------------------------------- no batch key: --gbs

@pytest.mark.parametrize("gas", [None, 2])
def test_no_batch_key_takes_gbs(tmp_path, monkeypatch, gas):
    """DeepSpeed's ZeRO-3 template shape: no train_batch_size, no micro batch. --gbs 64 is the
    train_batch_size; DeepSpeed's rule on 8 ranks then gives gas 1 and micro 64 // 8 = 8
    (runtime/config.py:637-640), or with gas 2, micro 64 // 8 // 2 = 4 (:625-629)."""
    doc = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}
    if gas:
        doc["gradient_accumulation_steps"] = gas
    c = _ds_config(doc | {"train_batch_size": 64}, 8, monkeypatch)
    want = (c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps, c.train_batch_size)
    assert want == ((8, 1, 64) if gas is None else (4, 2, 64))
    path = _write(tmp_path, doc)
    ci = read_config(path, model="llama3-8b", gpus=8, seq=4096, gbs=64)
    assert (ci.strategy.mbs, ci.strategy.m, ci.strategy.gbs) == want
    assert ci.origin["gbs"] == "--gbs" and any("--gbs 64 taken as train_batch_size" in n for n in ci.notes)
    r = CliRunner().invoke(main, ["check", str(path), "-m", "llama3-8b", "--gpus", "8", "--seq", "4096", "--gbs", "64"])
    assert f"mbs={want[0]} gbs=64 m={want[1]}" in r.output and "Traceback" not in r.output


def test_no_batch_key_without_gbs_is_one_line(tmp_path, monkeypatch):
    """DeepSpeed asserts one of the two keys (runtime/config.py:646-650); the error says --gbs fixes it."""
    doc = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}
    with pytest.raises(AssertionError, match="Either train_batch_size or train_micro_batch_size_per_gpu"):
        _ds_config(doc, 8, monkeypatch)
    path = _write(tmp_path, doc)
    r = CliRunner().invoke(main, ["check", str(path), "-m", "llama3-8b", "--gpus", "8", "--seq", "4096"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert "train_micro_batch_size_per_gpu" in r.output and "--gbs" in r.output


def test_auto_micro_batch_without_train_batch_size_takes_gbs(tmp_path):
    """DeepSpeedExamples training/autotuning/hf/dsconfigs/ds_config_z3.json: only the micro
    batch ("auto", the Trainer's --per_device_train_batch_size) and stage 3. With --gbs 32 on
    8 ranks DeepSpeed's rule gives micro = 32 / (1 x 8) = 4 (runtime/config.py:625-629,
    gradient_accumulation_steps 1 by default)."""
    path = _write(tmp_path, {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 3}})
    s = read_config(path, model="llama3-8b", gpus=8, seq=2048, gbs=32).strategy
    assert (s.mbs, s.gbs, s.m, s.zero) == (4, 32, 1, 3)
