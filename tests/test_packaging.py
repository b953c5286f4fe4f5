"""The wheel works outside the clone, and the catalogs are never silently empty.

* pyproject's explicit package list equals the packages under src/ (a new subpackage
  cannot be left out of the wheel);
* a wheel built from this tree (``pip wheel``), installed into a scratch folder and
  run from outside the clone, lists the whole catalog and estimates a catalog model;
* a missing or empty built-in catalog is an error, never an empty list;
* ``NDPLAN_HOME`` adds the user's own entries, found before the built-in ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from ndplan.catalog import files
from ndplan.cli import main
from ndplan.errors import NdplanError

ROOT = Path(__file__).resolve().parents[1]
N_MODELS = len(list((ROOT / "models").glob("*.yaml")))
N_HARDWARE = len(list((ROOT / "hardware").glob("*.yaml")))


def test_package_list_matches_src():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = {".".join(p.parent.relative_to(ROOT / "src").parts) for p in (ROOT / "src").rglob("__init__.py")}
    assert found <= listed, f"subpackages missing from pyproject: {sorted(found - listed)}"
    data = {k for k in listed if k.startswith("ndplan._catalog")}
    assert {cfg["package-dir"][k] for k in data} == {"models", "hardware"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """ndplan installed from a freshly built wheel into a scratch folder (no deps: they
    are the test venv's)."""
    tmp = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), str(ROOT)],
                           capture_output=True, text=True)
    if build.returncode:
        pytest.fail(f"pip wheel failed: {build.stderr[-2000:]}")
    wheel = next((tmp / "dist").glob("ndplan-*.whl"))
    target = tmp / "site"
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                          capture_output=True, text=True)
    assert inst.returncode == 0, inst.stderr[-2000:]
    return target


def _run_installed(target: Path, *args: str) -> subprocess.CompletedProcess:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import ndplan.cli as c; "
            "assert c.__file__.startswith(sys.argv[1]), c.__file__; c.main(sys.argv[2:])")
    env = {k: v for k, v in os.environ.items() if k not in ("NDPLAN_HOME", "PYTHONPATH")}
    return subprocess.run([sys.executable, "-c", code, str(target), *args], capture_output=True, text=True,
                          cwd=target.parent, env=env, timeout=300)


def test_wheel_ships_the_catalogs(installed):
    models = _run_installed(installed, "models", "--json")
    assert models.returncode == 0, models.stderr
    import json
    assert len(json.loads(models.stdout)) == N_MODELS
    hw = _run_installed(installed, "hardware", "--json")
    assert hw.returncode == 0 and len(json.loads(hw.stdout)) == N_HARDWARE
    est = _run_installed(installed, "estimate", "-m", "llama3-8b", "--dp", "8", "--gbs", "8", "--json")
    assert est.returncode == 0, est.stderr
    assert json.loads(est.stdout)["model"]["params_total"] == 8_030_261_248  # Meta's published 8.03 B


def test_empty_builtin_catalog_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    monkeypatch.setattr(files, "PACKAGE", tmp_path / "pkg")
    monkeypatch.setattr(files, "SOURCE_ROOT", tmp_path)
    with pytest.raises(NdplanError, match="missing or empty"):
        files.catalog_names("models")
    r = CliRunner().invoke(main, ["models"])
    assert r.exit_code == 2 and r.stdout == "" and "reinstall" in r.stderr
    r = CliRunner().invoke(main, ["hardware"])
    assert r.exit_code == 2 and "hardware" in r.stderr


def test_user_catalog_folder(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    tiny = ("model_type: llama\nhidden_size: 256\nnum_hidden_layers: 4\nnum_attention_heads: 8\n"
            "intermediate_size: 512\nvocab_size: 1000\n")
    (tmp_path / "models" / "my-tiny.yaml").write_text(tiny)
    (tmp_path / "models" / "llama3-8b.yaml").write_text(tiny)  # replaces the built-in entry
    monkeypatch.setenv("NDPLAN_HOME", str(tmp_path))
    names = files.catalog_names("models")
    assert "my-tiny" in names and len(names) == N_MODELS + 1
    assert files.resolve("models", "llama3-8b", "model") == tmp_path / "models" / "llama3-8b.yaml"
    assert files.catalog_names("hardware")  # no user hardware folder: the built-in one
    monkeypatch.setenv("NDPLAN_HOME", str(tmp_path / "nope"))
    with pytest.raises(NdplanError, match="NDPLAN_HOME"):
        files.catalog_names("models")


def test_wheel_ships_the_kernels(installed, tmp_path):
    """The installed wheel carries the prebuilt kernels and the catalog models' derived values
    (prebuilt.py) and its formula sources match them: a catalog model's sweep (one of
    ndplan.prebuild's cases) in an empty kernel cache compiles nothing and imports no SymPy."""
    assert (installed / "ndplan" / "prebuilt_kernels.json.xz").is_file()
    assert (installed / "ndplan" / "prebuilt_derived.json").is_file()
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import ndplan; from ndplan import kernels; "
            "assert ndplan.__file__.startswith(sys.argv[1]); n = []; "
            "ctx = kernels.compile_listener(lambda: n.append(1)); ctx.__enter__(); "
            "from ndplan.sweep import sweep; "
            "sweep(ndplan.load_model('llama3-8b'), ndplan.load_hardware('h100-sxm'), 1024, 4096, 1024, top=3); "
            "print(len(n), 'sympy' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("NDPLAN_HOME", "PYTHONPATH", "NDPLAN_PREBUILT")}
    env["NDPLAN_CACHE_DIR"] = str(tmp_path / "empty")
    r = subprocess.run([sys.executable, "-c", code, str(installed)], capture_output=True, text=True,
                       cwd=installed.parent, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["0", "False"]
