"""The torchtitan 0.3 launch reader (interop/torchtitan03.py) against torchtitan 0.3.0 itself.

Each value asserted is the one torchtitan 0.3.0 uses, derived from its code (file:line under
torchtitan/ of the 0.3.0 wheel, cited in each docstring); where torchtitan is importable (a CI
extra) the same words also go through its own ConfigManager and pipeline helpers.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import types
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

import ndplan
from ndplan.cli import main
from ndplan.export import emit
from ndplan.export import torchtitan03 as X
from ndplan.export.torchtitan import stage_count, titan_split
from ndplan.errors import NdplanError
from ndplan.interop import read_config
from ndplan.interop import torchtitan03 as R
from ndplan.interop.torchtitan import KEY

DSV3 = ("torchrun --nproc_per_node=8 --nnodes 32 -m torchtitan.train \\\n"
        "    --module deepseek_v3 --config deepseek_v3_671b \\\n"
        "    --parallelism.pipeline_parallel_degree 8 --parallelism.expert_parallel_degree 32 \\\n"
        "    --training.global_batch_size 256\n")
L405 = ("torchrun --nproc_per_node=8 --nnodes 64 -m torchtitan.train --module llama3 --config llama3_405b \\\n"
        "    --parallelism.pipeline_parallel_degree 8 \\\n"
        "    --training.global_batch_size 128\n")
AC_OF = {"SelectiveAC.Config": "selective", "FullAC.Config": "full", "NoneType": "none"}
"""distributed/activation_checkpoint.py:332-336: the policy subcommands' Config classes."""
SCHEDULE_OF = {"1F1B": "1f1b", "Interleaved1F1B": "interleaved", "GPipe": "gpipe", "ZBVZeroBubble": "zbv"}


@pytest.fixture
def env(monkeypatch):
    for name in ("NGPU", "MODULE", "CONFIG"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _launch(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "run_train.sh"
    f.write_text("#!/usr/bin/bash\n" + text)
    return f


def _words(text: str) -> list[str]:
    """The words after ``-m torchtitan.train`` (what torchtitan's ConfigManager parses)."""
    words = text.replace("\\\n", " ").split()
    return words[words.index("torchtitan.train") + 1:]


def _titan(monkeypatch=None):
    """torchtitan 0.3.0's ConfigManager (skip without it); with ``monkeypatch``, its float8 converter
    is let build on the CPU (components/quantization/float8.py:85-96 asks for an SM89 GPU; the
    config, not a kernel, is what is compared)."""
    pytest.importorskip("triton")
    pytest.importorskip("torchtitan.models.llama3.config_registry")
    if monkeypatch is not None:
        pytest.importorskip("torchao.float8")
        monkeypatch.setattr(importlib.import_module("torchtitan.components.quantization.float8"),
                            "has_cuda_capability", lambda *a: True)
    from torchtitan.config.manager import ConfigManager
    return ConfigManager()


def _titan_split(c, pp: int) -> tuple[int, list[int]]:
    """(virtual stages, decoder layers per stage) as torchtitan 0.3.0 makes them:
    distributed/pipeline_parallel.py ``_get_pipeline_metadata`` (L194-263: two stages per rank
    for a multi-stage schedule without layers_per_stage) and ``_generate_llm_fqn_per_model_part``
    (L366)."""
    from torchtitan.distributed import pipeline_parallel as P
    stages, layers, first, last = P._get_pipeline_metadata(types.SimpleNamespace(pp=pp), c.parallelism,
                                                           c.model_spec.model)
    parts = P._generate_llm_fqn_per_model_part(stages, layers, first, last)
    return stages, [sum(1 for m in part if m.startswith("layers.")) for part in parts]


def _float8_linears(c) -> bool:
    from torchtitan.components.quantization.float8 import Float8Linear
    return Float8Linear is not None and any(True for _ in c.model_spec.traverse(Float8Linear.Config))


# --------------------------------------------------------------------------- 1: the registered config's values

def test_dsv3_671b_takes_the_registered_interleaved_schedule(tmp_path, env):
    """deepseek_v3_671b sets pipeline_parallel_schedule = "Interleaved1F1B" (models/deepseek_v3/
    config_registry.py:236), local_batch_size 4 / seq_len 4096 (:230-231), expert_parallel_degree 2
    (:237, overridden here to 32), SelectiveAC (:240) and compiles the loss (:241). Without
    pipeline_parallel_layers_per_stage torchtitan gives a multi-stage schedule two stages per rank
    (distributed/pipeline_parallel.py:257-262): 16 stages over pp 8, so vpp 2; 61 layers + the
    embedding and output weights (1 + 1, config/configs.py:191-201) = 63 over 16 stages: 3 each and
    the first 15 one more, the first and last one less (``_generate_llm_fqn_per_model_part``):
    [3, 4 x 14, 2]. 256 devices / (pp 8) = dp 32; m = 256 / 32 = 8 micro-batches of
    pipeline_parallel_microbatch_size 1 (configs.py:226)."""
    ci = read_config(_launch(tmp_path, DSV3))
    s = ci.strategy
    assert (s.dp, s.pp, s.vpp, s.ep, s.schedule, s.seq, s.mbs, s.m, s.recompute) == (
        32, 8, 2, 32, "interleaved", 4096, 1, 8, "selective")
    assert s.layers_per_stage == (3,) + (4,) * 14 + (2,)
    assert "compiled_loss=1" in s.engine and "compiled_blocks" not in s.engine
    cite = "models/deepseek_v3/config_registry.py"
    assert ci.origin["schedule"] == f"--config deepseek_v3_671b: {KEY['schedule']} (torchtitan 0.3.0 {cite}:236)"
    assert ci.origin["seq"].endswith(f"{cite}:231)") and ci.origin["recompute"].endswith(f"{cite}:240)")
    assert ci.origin["tp"] == f"torchtitan default ({KEY['tp']})"  # deepseek_v3_671b does not set it
    assert ci.origin["pp"].startswith("line 4:") and ci.unknown == ()
    c = _titan().parse_args(_words(DSV3))
    assert c.parallelism.pipeline_parallel_schedule == "Interleaved1F1B"
    stages, lps = _titan_split(c, s.pp)
    assert stages == s.pp * s.vpp and tuple(lps) == s.layers_per_stage


@pytest.mark.parametrize("key", sorted(X.REGISTERED), ids="/".join)
def test_registered_values_are_the_config_functions(key):
    """REGISTERED holds exactly the arguments each config function passes that ndplan reads (the
    ``TrainingConfig`` / ``ParallelismConfig`` / ``CompileConfig`` keywords, the AC policy class,
    the flavor and a float8 converter given to ``model_registry``), with their values and lines,
    read from torchtitan 0.3.0's models/<module>/config_registry.py (skipped without torchtitan)."""
    found = importlib.util.find_spec("torchtitan")
    if found is None:
        pytest.skip("torchtitan is not installed (a CI extra)")
    module, name = key
    path = Path(found.origin).parent / "models" / module / "config_registry.py"
    fn = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == name)
    read = set(KEY.values()) | {X.COMPILE, X.COMPONENTS, X.ASYNC_TP, X.NO_CUDA_GRAPHS}
    got = {}
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        call = ast.unparse(node.func)
        section = {"TrainingConfig": "training", "ParallelismConfig": "parallelism", "CompileConfig": "compile"}
        if call in section:
            got |= {f"{section[call]}.{k.arg}": (ast.literal_eval(k.value), k.lineno) for k in node.keywords
                    if f"{section[call]}.{k.arg}" in read}
        elif call == "model_registry":
            got["flavor"] = (ast.literal_eval(node.args[0]), node.args[0].lineno)
            for k in node.keywords:
                if k.arg == "converters" and "Float8LinearConverter" in ast.unparse(k.value):
                    got[X.CONVERTERS] = ([X.FLOAT8], k.lineno)
        elif call == "Trainer.Config":
            for k in node.keywords:
                if k.arg == "activation_checkpoint":
                    got[KEY["ac_mode"]] = (AC_OF[ast.unparse(k.value.func).removesuffix("()")], k.lineno)
    assert got == X.REGISTERED[key]


@pytest.mark.parametrize("key", sorted(X.REGISTERED), ids="/".join)
def test_bare_registered_launch_is_what_torchtitan_builds(key, tmp_path, env, monkeypatch):
    """A launch of the registered config with only a pipeline degree added: ndplan's strategy is
    torchtitan 0.3.0's parsed config (ConfigManager.parse_args, config/manager.py:34-46): the
    degrees, seq_len, the AC policy, the schedule, and torchtitan's own stage split
    (``_titan_split``); local_batch_size / pipeline_parallel_microbatch_size micro-batches per
    accumulation step; global batch local x dp (global_batch_size -1, configs.py:43-47); compile ->
    the compiled_* engine settings; ChunkedLossWrapper's chunks; the float8 note iff the built model
    has Float8Linear layers. Every value not set by the config is torchtitan's generic default."""
    module, name = key
    tp = X.REGISTERED[key].get(KEY["tp"], (1,))[0]
    pp, dp = 2, 8
    text = (f"torchrun --nproc_per_node 8 --nnodes {tp * pp * dp // 8} -m torchtitan.train --module {module} "
            f"--config {name} --parallelism.pipeline_parallel_degree {pp} --training.disable_cuda_graphs\n")
    ci = read_config(_launch(tmp_path, text))
    s = ci.strategy
    c = _titan(monkeypatch).parse_args(_words(text))
    p, t = c.parallelism, c.training
    assert (s.tp, s.pp, s.cp, s.dp) == (p.tensor_parallel_degree, p.pipeline_parallel_degree,
                                        p.context_parallel_degree, dp)
    assert s.ep == (p.expert_parallel_degree if ci.model.is_moe else 1)
    assert (s.seq, s.mbs, s.gbs) == (t.seq_len, p.pipeline_parallel_microbatch_size, t.local_batch_size * dp)
    assert t.global_batch_size == -1
    assert s.recompute == AC_OF[type(c.activation_checkpoint).__qualname__]
    assert s.schedule == SCHEDULE_OF[p.pipeline_parallel_schedule]
    stages, lps = _titan_split(c, pp)
    assert stages == s.pp * s.vpp and list(s.layers_per_stage or [ci.model.num_hidden_layers // stages] * stages) == lps
    k = c.compile
    assert ("compiled_blocks=1" in s.engine) == (k.enable and "model" in k.components)
    assert ("compiled_loss=1" in s.engine) == (k.enable and "loss" in k.components)
    assert f"loss_chunks={c.loss.num_chunks}" in s.engine
    assert any("float8" in n for n in ci.notes) == _float8_linears(c)
    assert c.model_spec.flavor == X.REGISTERED[key]["flavor"][0]
    assert X.REGISTRY[ci.model.name] == key


# --------------------------------------------------------------------------- 2: llama3_405b (float8)

def test_llama3_405b_is_read_with_its_float8_note(tmp_path, env, monkeypatch):
    """llama3_405b (models/llama3/config_registry.py:295-346): flavor 405B (:301), float8 linears
    but lm_head (:302-309), compile on with async TP (:296-299, default components model and loss,
    config/configs.py:298), local_batch_size 2 / seq_len 8192 (:329-330), TP 8 (:337), FullAC
    (:340). 512 devices / (tp 8 x pp 8) = dp 8; 126 layers + 2 over 8 stages: 16 each, the
    first and last 15; m = 128 / 8 = 16. float8 leaves memory as bf16 (the TOML reader's rule for a
    float8 converter without the float8 all-gather, which 0.3.0 does not have). As written (pp 8,
    CUDA graphs on by default, config/configs.py:66) torchtitan refuses the launch
    (trainer.py:183-187): a note says so."""
    ci = read_config(_launch(tmp_path, L405))
    s = ci.strategy
    assert ci.model.name == "llama3.1-405b"
    assert (s.dp, s.tp, s.pp, s.vpp, s.seq, s.mbs, s.m, s.recompute, s.schedule) == (
        8, 8, 8, 1, 8192, 1, 16, "full", "1f1b")
    assert s.layers_per_stage == (15,) + (16,) * 6 + (15,) and s.weight_dtype == "auto"
    assert "compiled_blocks=1" in s.engine and "compiled_loss=1" in s.engine and "float8" not in s.engine
    assert any("float8" in n and "config_registry.py:302" in n for n in ci.notes)
    assert any("enable_async_tensor_parallel" in n for n in ci.notes)
    assert ci.origin["tp"].endswith("models/llama3/config_registry.py:337)")
    refused = [n for n in ci.notes if n.startswith("torchtitan 0.3.0 refuses this launch")]
    assert len(refused) == 1 and "--training.disable_cuda_graphs" in refused[0]  # trainer.py:183-187
    cm = _titan(monkeypatch)
    with pytest.raises(SystemExit):
        cm.parse_args(_words(L405))
    c = cm.parse_args(_words(L405) + ["--training.disable_cuda_graphs"])
    assert (c.parallelism.tensor_parallel_degree, c.training.seq_len, c.training.local_batch_size) == (8, 8192, 2)
    assert type(c.activation_checkpoint).__qualname__ == "FullAC.Config" and _float8_linears(c)
    assert c.compile.enable and c.compile.enable_async_tensor_parallel
    assert _titan_split(c, 8) == (8, [15] + [16] * 6 + [15])


@pytest.mark.parametrize("strat", [  # 126 layers: even splits, and torchtitan's own uneven one at pp 8
    ndplan.Strategy(dp=8, tp=8, pp=2, gbs=128, zero=2, seq=8192, recompute="full", engine="fsdp"),
    ndplan.Strategy(dp=4, tp=8, pp=7, vpp=2, gbs=56, zero=2, seq=8192, recompute="full", schedule="interleaved",
                    engine="fsdp"),
    ndplan.Strategy(dp=8, tp=8, pp=8, gbs=64, zero=2, seq=8192, recompute="full", engine="fsdp",
                    layers_per_stage=(15,) + (16,) * 6 + (15,)),
])
def test_llama3_405b_emit_parses_and_reads_back(strat, tmp_path, env, monkeypatch):
    """--emit torchtitan-0.3 writes Llama-3.1-405B as --module llama3 --config llama3_405b: the
    overrides restate every degree, batch and policy (torchtitan's own parse gives them back and
    its stage split is ndplan's), check reads the launch back to the same strategy, and the
    header says what the registered config keeps (float8, async TP)."""
    import dataclasses
    model = ndplan.load_model("llama3.1-405b")
    text = emit("torchtitan-0.3", model, strat)
    words, _ = X.fields(model, strat)
    assert words[:4] == ["--module", "llama3", "--config", "llama3_405b"]
    notes = [line for line in text.splitlines() if line.startswith("# note:")]
    assert any("float8" in n for n in notes) and any("enable_async_tensor_parallel" in n for n in notes)
    f = tmp_path / "run.sh"
    f.write_text(text)
    back = read_config(f)
    assert dataclasses.replace(back.strategy, engine="fsdp") == strat
    c = _titan(monkeypatch).parse_args(words)
    p, t = c.parallelism, c.training
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, t.global_batch_size, t.seq_len) == (
        strat.tp, strat.pp, strat.gbs, strat.seq)
    assert p.data_parallel_shard_degree == strat.dp and type(c.activation_checkpoint).__qualname__ == "FullAC.Config"
    first, last = p.pipeline_parallel_first_stage_less_layers, p.pipeline_parallel_last_stage_less_layers
    stages = stage_count(126, p.pipeline_parallel_layers_per_stage, first, last)
    want = list(strat.layers_per_stage) if strat.layers_per_stage else titan_split(126, stages, 0, 0)
    assert _titan_split(c, strat.pp) == (stages, want) and stages == strat.pp * strat.vpp


# --------------------------------------------------------------------------- 3: options torchtitan 0.3.0 lacks

UNKNOWN = {
    "typo": ("--trainin.seq_len 4096", "--trainin.seq_len", "did you mean --training.seq_len?"),
    "newer": ("--training.num_tokens_per_microbatch_per_dp_rank 16384",
              "--training.num_tokens_per_microbatch_per_dp_rank", "after 0.3.0 (main b5bcd76c config/configs.py:37)"),
    "newer-pp": ("--parallelism.num-pp-microbatches 4", "--parallelism.num-pp-microbatches", "configs.py:232"),
    "toml-mode": ("--activation_checkpoint.mode full", "--activation_checkpoint.mode", "activation_checkpoint:MODE"),
    "switch-value": ("--compile.enable false", "--compile.enable false", "a switch takes no value"),
    "toml-section": ("--float8.enable_fsdp_float8_all_gather", "--float8.enable_fsdp_float8_all_gather",
                     "0.2.x's TOML job config"),
}


@pytest.mark.parametrize("name", sorted(UNKNOWN))
def test_unknown_option_is_listed_not_applied(name, tmp_path, env):
    """An option torchtitan 0.3.0's dataclasses lack (config/configs.py:36-110 TrainingConfig,
    :112-287 ParallelismConfig; the other sections in interop/torchtitan03.py KNOWN) stops its tyro
    parser ("Unrecognized options", exit 2): check lists it in ``unknown`` (--json too) with a
    one-line note, and the registered value stays (llama3_8b: seq_len 8192, SelectiveAC,
    models/llama3/config_registry.py:204, 211)."""
    words, flag, says = UNKNOWN[name]
    text = (f"torchrun --nproc_per_node 8 -m torchtitan.train --module llama3 --config llama3_8b \\\n"
            f"    --training.global_batch_size 32 {words}\n")
    f = _launch(tmp_path, text)
    ci = read_config(f)
    assert ci.unknown == (flag,)
    notes = [n for n in ci.notes if n.startswith(flag + ":")]
    assert len(notes) == 1 and says in notes[0] and "not applied" in notes[0] and "\n" not in notes[0]
    assert (ci.strategy.seq, ci.strategy.recompute) == (8192, "selective")
    r = CliRunner().invoke(main, ["check", str(f), "--json"])
    assert r.exit_code in (0, 1), r.output
    out = json.loads(r.output)
    assert out["unknown"] == [flag] and notes[0] in out["notes"]
    try:
        cm = _titan()
    except pytest.skip.Exception:
        return
    with pytest.raises(SystemExit) as e:
        cm.parse_args(_words(text))
    assert e.value.code == 2


def test_known_options_are_torchtitan_s_parser_s(monkeypatch):
    """KNOWN / SWITCHES against the options torchtitan 0.3.0's tyro parser builds for each
    registered config (ConfigManager._load_config + tyro over Trainer.Config with the loaded
    config as default, config/manager.py:34-46; every switch has its --no- form, the policy
    subcommands are distributed/activation_checkpoint.py:332-336)."""
    cm = _titan(monkeypatch)
    tyro = pytest.importorskip("tyro")
    from torchtitan.config.manager import custom_registry
    want = ({f"--{k}" for k in R.OPTIONS} | {f"--{k.rpartition('.')[0]}.no_{k.rpartition('.')[2]}" for k in R.SWITCHES}
            | {f"activation_checkpoint:{m}" for m in ("selective", "full", "memory_budget", "none")})
    if getattr(tyro.extras, "get_parser", None) is None:
        pytest.skip("this tyro has no extras.get_parser")
    for module, name in X.REGISTERED:
        loaded, _ = cm._load_config(["--module", module, "--config", name])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # tyro 1.0 deprecates get_parser
            parser = tyro.extras.get_parser(type(loaded), default=loaded, registry=custom_registry)
        got = set()

        def walk(p):
            for a in p._actions:
                if isinstance(getattr(a, "choices", None), dict) and not a.option_strings:
                    for choice, sub in a.choices.items():
                        got.add(choice)
                        walk(sub)
                else:
                    got.update(o for o in a.option_strings if o.startswith("--") and o != "--help")

        walk(parser)
        got = {"--" + g[2:].replace("-", "_") if g.startswith("--") else g.replace("-", "_") for g in got}
        assert got == want, name
    assert not set(R.NEWER) & R.OPTIONS


def test_switches_subcommand_dashes_and_chunks(tmp_path, env):
    """tyro's forms (config/manager.py:40-42): ``--compile.no-enable`` turns deepseek_v3_16b's
    compiled loss off (config_registry.py:169), ``activation-checkpoint:full`` is FullAC,
    ``--loss.num-chunks 4`` sets ChunkedLossWrapper.Config.num_chunks (components/loss.py:610),
    ``--optimizer.param_groups.0.optimizer_name DistMuon`` the one default_adamw group's optimizer
    (components/optimizer/optimizer.py:143-147, 385-398)."""
    text = ("torchrun --nproc_per_node 8 -m torchtitan.train --module deepseek_v3 --config deepseek_v3_16b \\\n"
            "    --compile.no-enable --loss.num-chunks 4 --optimizer.param_groups.0.optimizer_name DistMuon \\\n"
            "    activation-checkpoint:full\n")
    ci = read_config(_launch(tmp_path, text))
    s = ci.strategy
    assert s.recompute == "full" and "compiled_loss" not in s.engine and ci.unknown == ()
    assert "loss_chunks=4" in s.engine and "optimizer_bytes=4" in s.engine
    try:
        c = _titan().parse_args(_words(text))
    except pytest.skip.Exception:
        return
    assert (c.compile.enable, c.loss.num_chunks, c.optimizer.param_groups[0].optimizer_name) == (False, 4, "DistMuon")
    assert type(c.activation_checkpoint).__qualname__ == "FullAC.Config"


def test_bad_chunks_and_optimizer_are_one_line(tmp_path, env):
    """One-line errors (NdplanError: field, value, fix) for the two values the reader takes beyond
    the strategy's: ChunkedLossWrapper needs num_chunks >= 1, the optimizer must be one
    ``_resolve_optimizer_factory`` builds (components/optimizer/optimizer.py:143-150)."""
    group = "--optimizer.param_groups.0.optimizer_name"
    for words, field in (("--loss.num_chunks 0", "--loss.num_chunks"), (f"{group} SGD", group)):
        f = _launch(tmp_path, "torchrun --nproc_per_node 8 -m torchtitan.train --module llama3 --config llama3_8b "
                              f"{words}\n")
        r = CliRunner().invoke(main, ["check", str(f)])
        lines = [x for x in r.output.splitlines() if x.startswith("error:")]
        assert r.exit_code == 2 and len(lines) == 1 and f"error: {field}=" in lines[0], r.output


def test_a_torchtitan_0_2_launcher_points_to_its_toml(tmp_path):
    """torchtitan 0.2.x's run_train.sh passes --job.config_file (CONFIG_FILE, default
    debug_model.toml): the job is that TOML, which `check` reads; one line says so."""
    f = tmp_path / "run_train.sh"
    f.write_text('CONFIG_FILE=${CONFIG_FILE:-"./torchtitan/models/llama3/train_configs/debug_model.toml"}\n'
                 'torchrun --nproc_per_node=8 -m torchtitan.train --job.config_file ${CONFIG_FILE} "$@"\n')
    with pytest.raises(NdplanError) as e:
        read_config(f, fmt="torchtitan-0.3")
    assert "debug_model.toml" in e.value.problem and "TOML" in e.value.fix


def test_a_config_ndplan_does_not_know_reads_defaults_and_overrides_with_a_model(tmp_path, monkeypatch):
    """A launch of a registered config ndplan has no table for (torchtitan HEAD run_train.sh with
    CONFIG=qwen3_moe_deepep): without -m a one-line error says to give -m; with -m the launch's
    overrides over torchtitan's defaults are read, and a note says the config's own values are not."""
    monkeypatch.setenv("MODULE", "qwen3")
    monkeypatch.setenv("CONFIG", "qwen3_moe_deepep")
    f = tmp_path / "run_train.sh"
    f.write_text((Path(__file__).parent / "data/recipes/torchtitan03_run_train.sh").read_text())
    with pytest.raises(NdplanError) as e:
        read_config(f)
    assert e.value.field == "--config" and "-m MODEL" in e.value.fix
    ci = read_config(f, model="qwen3-30b-a3b")
    assert (ci.strategy.tp, ci.strategy.gbs, ci.strategy.recompute) == (2, 32, "full")
    assert any("a config ndplan does not know" in n and "not read" in n for n in ci.notes)
