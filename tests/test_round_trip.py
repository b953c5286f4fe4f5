"""Every ``--emit`` format read back by ``check`` (interop.read_config) for dense, MoE+EP,
PP+VPP, CP and ZeRO-3 strategies: the strategy read back is the one emitted, field by
field, except the fields each format cannot express; those are named here, and the
emitted file says so in a comment (or the emit refuses the strategy, naming the field).
"""

from __future__ import annotations

import dataclasses

import pytest

import ndplan
from ndplan.errors import NdplanError
from ndplan.export import EMITTERS, SUFFIX, emit
from ndplan.interop import read_config

ENGINE = {"megatron": "megatron", "torchtitan": "fsdp", "torchtitan-0.3": "fsdp", "deepspeed": "deepspeed",
          "mindformers": "mindspore", "devicemesh": "fsdp"}


def cases(fmt: str) -> dict:
    eng = ENGINE[fmt]
    fsdp = eng == "fsdp"
    extra = dict(flash_attention=False, weight_dtype="bf16") if eng == "mindspore" else {}
    zero = 2 if fsdp else 1

    def S(**kw):
        """The case under the format's engine, or, where that engine cannot run it (DeepSpeed:
        sp at tp > 1, interleaved; rules.py), under Megatron's: the emit must refuse it."""
        try:
            return ndplan.Strategy(**kw)
        except NdplanError:
            return ndplan.Strategy(**(kw | {"engine": "megatron"}))
    moe_model = "deepseek-v2-lite" if fmt == "torchtitan-0.3" else "mixtral-8x7b"  # 0.3.0 registers no Mixtral
    return {
        "dense": ("llama3-8b", S(dp=4, tp=2, gbs=32, zero=zero, engine=eng, seq=8192, **extra)),
        "moe-ep": (moe_model, S(dp=8, tp=2, ep=4, etp=1, gbs=64, zero=zero, engine=eng, seq=8192, **extra)),
        "pp-vpp": ("llama3-70b", S(dp=2, tp=8, pp=4, vpp=2, gbs=64, schedule="interleaved", zero=zero, engine=eng,
                                   seq=8192, **extra)),
        "cp": ("llama3-8b", S(dp=4, tp=2, cp=2, gbs=32, seq=8192, zero=zero, engine=eng, **extra)),
        "zero3": ("llama3-8b", S(dp=8, gbs=32, zero=3, engine=eng, seq=8192, **extra)),
    }


NOT_EXPRESSED = {
    # torchtitan 0.3 runs its own modules: check reads the launch with their engine settings
    ("torchtitan-0.3", "*"): ({"engine"}, "engine of torchtitan's own modules"),
    # MindFormers' parallel_config has no parameter sharding beyond the optimizer's
    ("mindformers", "zero3"): ({"zero"}, "zero=3 is not expressed"),
}
REFUSED = {  # (format, case) -> the field the emit names
    ("deepspeed", "dense"): "sp",  # AutoTP has no sequence parallelism: the cases with tp > 1 run sp=on
    ("deepspeed", "cp"): "sp",
    # AutoTP has no sequence parallelism (tp 2 runs sp=on); the ep=4 itself is AutoEP's expert_parallel.autoep_size
    # (DeepSpeed 0.19.8 runtime/config.py:171-176, 588; engine.py:828), folded with autotp_size 2 (etp 1, pp 1)
    ("deepspeed", "moe-ep"): "sp",
    ("deepspeed", "pp-vpp"): "schedule",  # the pipeline engine runs 1F1B, one chunk per stage
}
NEEDS = {"deepspeed": ("model", "seq")}
"""Formats that carry neither the architecture nor the sequence length: check gets -m and --seq."""


def _not_expressed(fmt: str, case: str) -> tuple[set, str]:
    return NOT_EXPRESSED.get((fmt, case)) or NOT_EXPRESSED.get((fmt, "*")) or (set(), "")


@pytest.mark.parametrize("case", ["dense", "moe-ep", "pp-vpp", "cp", "zero3"])
@pytest.mark.parametrize("fmt", sorted(EMITTERS))
def test_emit_reads_back(tmp_path, fmt, case):
    name, s = cases(fmt)[case]
    model = ndplan.load_model(name)
    if (fmt, case) in REFUSED:
        with pytest.raises(NdplanError) as e:
            emit(fmt, model, s)
        assert e.value.field == REFUSED[(fmt, case)]
        if REFUSED[(fmt, case)] != "sp":
            return
        s = dataclasses.replace(s, sp=False, engine=ENGINE[fmt])  # what the format can say
    text = emit(fmt, model, s)
    f = tmp_path / f"{case}{SUFFIX[fmt]}"
    f.write_text(text)
    given = NEEDS.get(fmt, ())
    ci = read_config(f, model=name if "model" in given else None, gpus=s.world,
                     seq=s.seq if "seq" in given else None)
    assert ci.model.name == name and ci.gpus == s.world
    back = ci.strategy
    differ = {k for k in s.__dataclass_fields__ if getattr(s, k) != getattr(back, k)}
    fields, said = _not_expressed(fmt, case)
    assert differ == fields, {k: (getattr(s, k), getattr(back, k)) for k in differ}
    if fields:
        assert said in text  # the emitted file says what it cannot express


def test_devicemesh_reads_back_partial_recompute(tmp_path):
    """The docstring's label writes ``recompute=full[first 4]`` (labels.recompute_text): one item."""
    s = ndplan.Strategy(dp=8, gbs=64, seq=4096, zero=3, engine="fsdp", recompute="full", recompute_layers=4)
    f = tmp_path / "mesh.py"
    f.write_text(emit("devicemesh", ndplan.load_model("llama3-8b"), s))
    assert read_config(f).strategy == s


def test_devicemesh_reads_a_mesh_given_as_a_list(tmp_path):
    """init_device_mesh takes a list as well as a tuple: ``MESH_SHAPE = [...]`` reads back the same."""
    s = ndplan.Strategy(dp=8, gbs=64, seq=4096, zero=3, engine="fsdp")
    text = emit("devicemesh", ndplan.load_model("llama3-8b"), s)
    line = next(x for x in text.splitlines() if x.startswith("MESH_SHAPE = ("))
    f = tmp_path / "mesh.py"
    f.write_text(text.replace(line, "MESH_SHAPE = [" + line.split("(", 1)[1].rsplit(")", 1)[0] + "]"))
    assert read_config(f).strategy == s
