"""The kernels shipped with the package (ndplan/prebuilt.py, built by ``python -m ndplan.prebuild``).

- The store is current: built from today's formula sources (else every look-up misses and a
  first run waits for SymPy again; rebuild it).
- A first run of the README's sweep with an empty kernel cache compiles nothing.
- A shipped kernel equals the kernel SymPy builds now for the same key (store off, another
  empty cache), at random points of every argument: the store is a cache, never a source.
- The shipped @derived values of the catalog models (prebuilt_derived.json) are the values
  these sources compute, and a catalog sweep (empty cache, warm, a second model of the class)
  never imports SymPy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import OrderedDict

import numpy as np
import pytest

import ndplan
from ndplan import kernels, prebuilt, readlog
from ndplan.estimate import memory_kernel, time_kernel
from ndplan.space import generate
from ndplan.structure import structure
from ndplan.sweep import row_strategy, sweep, sweep_view

HW = ndplan.load_hardware("h100-sxm")


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NDPLAN_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("NDPLAN_PREBUILT", "1")
    monkeypatch.delenv("NDPLAN_HOME", raising=False)  # the catalog's own llama3-70b and h100-sxm
    monkeypatch.setattr(kernels, "_MEMORY", OrderedDict())
    monkeypatch.setattr(kernels, "_READ_SETS", {})
    monkeypatch.setattr(kernels._ModelMemo, "_BY_SPEC", {})
    return tmp_path


def test_the_shipped_store_is_built_from_these_sources():
    m = prebuilt.manifest()
    assert m is not None, f"{prebuilt.STORE} is missing or unreadable: run python -m ndplan.prebuild"
    assert m["sources"] == kernels._sources_digest(), (
        "the shipped kernels were built from other formula sources: run `python -m ndplan.prebuild` "
        "(about 10 minutes on 2 cores) and commit src/ndplan/prebuilt_kernels.json.xz")
    assert m["kernels"] > 1000


def test_the_readme_sweep_compiles_nothing_on_an_empty_cache(empty_cache):
    built = []
    with kernels.compile_listener(lambda: built.append(1)):
        r = sweep(ndplan.load_model("llama3-70b"), HW, 1024, 8192, 1024, top=1)
    assert r.feasible > 0
    assert built == []
    # their code copied into the disk cache: the sweep needs about 120 kernels since megatron sweeps hold
    # Megatron-LM's ZeRO rules (rules.py: no zero 2, zero 3 only at pp 1), about 260 before
    assert len(list((empty_cache / "kernels").glob("*.kc"))) >= 100


def test_a_warm_lookup_never_opens_the_store(empty_cache, monkeypatch):
    """Once a kernel is in the disk cache, looking it up again opens no shipped store, even when
    the disk knows other name lists under the same key that miss for this model (another
    model's reads): each probe of those used to decompress the store (0.2 s a run)."""
    spec = ndplan.load_model("llama3-8b")
    view = structure(spec, ndplan.Strategy(dp=8, gbs=64, seq=4096))
    memory_kernel(spec, view)  # now on disk
    monkeypatch.setattr(kernels, "_MEMORY", OrderedDict())
    monkeypatch.setattr(kernels._ModelMemo, "_BY_SPEC", {})  # and the key it resolved to forgotten
    real = kernels._read_sets
    monkeypatch.setattr(kernels, "_read_sets", lambda base, use_disk: [("vocab_size",)] + real(base, use_disk))

    def opened(*_):
        raise AssertionError("the shipped store was opened")
    monkeypatch.setattr(prebuilt, "entry", opened)
    monkeypatch.setattr(prebuilt, "read_sets", opened)
    assert memory_kernel(spec, view) is not None


@pytest.mark.parametrize("name", ["llama3-8b", "qwen3-30b-a3b", "deepseek-v3"])
def test_a_shipped_kernel_equals_a_fresh_build(name, empty_cache, monkeypatch):
    model = ndplan.load_model(name)
    cands = generate(model, 1024, 4096, 1024, None)
    rng = np.random.default_rng(0)
    groups = [cands.groups[i] for i in rng.choice(len(cands.groups), size=4, replace=False)]
    views = []
    for g in groups:
        row = {k: v[0] for k, v in g.grid.items()} | {"schedule": g.schedule, "vpp": g.vpp,
                                                        "recompute": g.recompute, "zero": g.zero, "sp": g.sp}
        views.append(sweep_view(model, structure(model, row_strategy(row, 4096, 1024, {},
                                                                     model.num_hidden_layers))))
    built = []
    with kernels.compile_listener(lambda: built.append(1)):
        shipped = [(memory_kernel(model, v), time_kernel(model, v)) for v in views]
    assert built == []
    monkeypatch.setenv("NDPLAN_PREBUILT", "0")
    monkeypatch.setenv("NDPLAN_CACHE_DIR", str(empty_cache / "fresh"))
    monkeypatch.setattr(kernels, "_MEMORY", OrderedDict())
    monkeypatch.setattr(kernels, "_READ_SETS", {})
    with kernels.compile_listener(lambda: built.append(1)):
        fresh = [(memory_kernel(model, v), time_kernel(model, v)) for v in views]
    assert len(built) == 2 * len(views)
    for pair_a, pair_b in zip(shipped, fresh):
        for a, b in zip(pair_a, pair_b):
            assert a.keys == b.keys
            args = {x: rng.integers(1, 64, size=50).astype(float) for x in a.kernel.args
                    if x not in a.model_values}
            out_a, out_b = a(**args), b(**args)
            for k in a.keys:  # the same source when SymPy is the store's version; else the same values
                np.testing.assert_allclose(out_a[k], out_b[k], rtol=1e-12, atol=0)


def test_the_shipped_derived_values_are_what_these_sources_compute(monkeypatch):
    monkeypatch.setenv("NDPLAN_PREBUILT", "1")
    prebuilt.reset()
    doc = json.loads(prebuilt.DERIVED.read_text())
    assert doc["sources"] == kernels._sources_digest(), (
        "src/ndplan/prebuilt_derived.json was built from other formula sources: run `python -m ndplan.prebuild`")
    assert doc["names"], "the shipped read lists name no @derived read"
    for name in ("llama3-8b", "deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b"):
        spec = ndplan.load_model(name)
        assert prebuilt.derived_values(kernels._digest(repr(spec))) == {
            n: repr(readlog._value(spec, n)) for n in doc["names"]}


PROBE = """import sys
from ndplan.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(code, "sympy" in sys.modules, file=sys.stderr)
"""
SWEEP = ["-H", "h100-sxm", "--gpus", "64", "--seq", "4096", "--gbs", "1024", "--top", "3"]


def test_a_catalog_sweep_never_imports_sympy(tmp_path):
    """SymPy (0.3 s to import) is for building kernels: a catalog model's sweep on an empty cache
    (kernels from the store), the same sweep warm, and another model of its class warm, each in
    a fresh process, import none of it."""
    env = {**os.environ, "NDPLAN_CACHE_DIR": str(tmp_path), "NDPLAN_PREBUILT": "1"}
    env.pop("NDPLAN_HOME", None)
    for model in ("llama3-8b", "llama3-8b", "llama3-70b"):
        r = subprocess.run([sys.executable, "-c", PROBE, "sweep", "-m", model, *SWEEP], env=env,
                           capture_output=True, text=True, timeout=120)
        code, sympy_loaded = r.stderr.split()[-2:]
        assert code in ("0", "1"), r.stderr
        assert sympy_loaded == "False", f"ndplan sweep -m {model} imported SymPy"
    assert list(tmp_path.glob("model-*.json")), "no model memo was written"
