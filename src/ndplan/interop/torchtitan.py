"""torchtitan job TOML -> Strategy (the inverse of export/torchtitan.py, with its key
table ``KEY``); the model comes from ``-m``, or from ``[model] name``/``flavor`` when the
catalog has ``<name>-<flavor>`` (``llama3`` + ``8B`` -> ``llama3-8b``).

Mapping (torchtitan job_config defaults where a key is absent): dp = replicate x shard
(``data_parallel_shard_degree = -1`` takes the devices the other degrees leave, so it
needs ``--gpus``); zero 0 when only replicated (DDP), else from
``fsdp_reshard_after_forward``: ``never`` -> 2, ``always`` -> 3, ``default`` (absent) ->
3 without pipeline, 2 with it (torchtitan reshards after forward unless PP); tp / cp /
pp / ep / etp <- the degrees; schedule and vpp <- ``pipeline_parallel_schedule`` and the
stage count (L / ``pipeline_parallel_layers_per_stage``, or the split points + 1);
mbs <- ``pipeline_parallel_microbatch_size`` with pp, else ``local_batch_size`` (older:
``batch_size``); gbs <- ``global_batch_size`` (absent or -1: local x dp); seq <- ``seq_len``
(default 2048); recompute <- ``[activation_checkpoint] mode`` (default selective; selective
with a numeric ``selective_ac_option`` N is per-layer SAC: full recompute of floor(layers / N)
blocks, ``_layer_sac``); sp on
(torchtitan's TP always shards norms on the sequence); engine fsdp, with the settings
``_engine_settings`` reads: ``compiled_blocks`` / ``compiled_loss`` from ``[compile] enable``
and ``components`` (default model and loss; older files: ``training.compile``, which compiles
both since bbb1b616), ``float8_all_gather`` from a float8 converter in ``model.converters``
with ``enable_fsdp_float8_all_gather`` (``[float8]``, later ``[quantize.linear.float8]``),
which torchtitan applies only when dp_shard > 1.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from ndplan.catalog.files import catalog_names
from ndplan.engines import derive
from ndplan.errors import NdplanError
from ndplan.export import torchtitan as X
from ndplan.export.common import flatten
from ndplan.layouts import virtual_stage
from ndplan.interop.base import CheckInput, positive, resolve_model, world_dp
from ndplan.interop.textedit import toml_edit, toml_locate
from ndplan.strategy import Strategy
from ndplan.vocab import ONE_CHUNK_SCHEDULES, RECOMPUTE_MODES

KEY = X.KEY
SCHEDULE_OF = {v: k for k, v in X.SCHEDULES.items()}
DEFAULTS = {"dp_replicate": 1, "dp_shard": -1, "tp": 1, "cp": 1, "pp": 1, "ep": 1, "etp": 1, "schedule": "1F1B",
            "mbs": 1, "gbs": -1, "seq": 2048, "ac_mode": "selective", "reshard": "default", "offload": False}
"""torchtitan/config/job_config.py defaults of the keys read."""


def _catalog_model(flat: dict):
    """The catalog model of ``[model] name/flavor``: torchtitan's flavor tables (X.FLAVORS, and
    X.FLAVOR_VARIANTS, the 0.2.x flavors that differ only in attention), else
    ``<name>-<flavor>`` when the catalog has it."""
    name, flavor = flat.get(KEY["model_name"]), flat.get(KEY["model_flavor"])
    if (name, flavor) in X.FLAVORS:
        return X.FLAVORS[(name, flavor)]
    if (name, flavor) in X.FLAVOR_VARIANTS:
        return X.FLAVOR_VARIANTS[(name, flavor)][0]
    if name and flavor and f"{name}-{str(flavor).lower()}" in catalog_names("models"):
        return f"{name}-{str(flavor).lower()}"
    return None


def _parse(path: Path, text: str) -> dict:
    try:
        flat = flatten(tomllib.loads(text))
    except tomllib.TOMLDecodeError as e:
        raise NdplanError("FILE", path.name, f"malformed TOML: {e}", "fix the syntax") from None
    if not any(k.startswith("parallelism.") for k in flat):
        old = [k for k in flat if k.startswith(LEGACY_SECTIONS) and k.endswith(LEGACY_SUFFIXES)]
        if old:
            raise NdplanError("FILE", path.name, f"a torchtitan job config of the schema before v0.1.0 ({old[0]}: the "
                              "degrees under [training] and [experimental]), which ndplan does not read",
                              "move the *_degree and pipeline_parallel_* keys under [parallelism] (torchtitan >= "
                              "v0.1.0 job_config.py), with pipeline_parallel_microbatch_size for the microbatches")
        raise NdplanError("FILE", path.name, "has no [parallelism] table",
                          "give a torchtitan job config, or --format for another framework")
    return flat


LEGACY_SECTIONS = ("training.", "experimental.")
LEGACY_SUFFIXES = ("_degree", "pipeline_parallel_schedule", "pipeline_parallel_split_points")
"""Where torchtitan's config_manager.py kept the parallel degrees before [parallelism]
(57387af0: --training.tensor_parallel_degree, --experimental.pipeline_parallel_degree, ...)."""


PARAM_DTYPES = ("bfloat16", "float32")
"""``training.mixed_precision_param``: Literal["bfloat16", "float32"] (v0.2.2 config/job_config.py:282)."""
FLOAT8_LINEAR_CONVERTERS = ("float8", "quantize.linear.float8")
"""torchtitan's name of the float8 linear converter (2025; v0.2.x components/quantization/float8.py:238);
quantize.grouped_mm.float8 (the MoE grouped GEMMs) is not one of them."""
FLOAT8_ALL_GATHER_KEYS = ("float8.enable_fsdp_float8_all_gather", "quantize.linear.float8.enable_fsdp_float8_all_gather")
"""Where torchtitan's job config kept the float8 all-gather switch (2025; late 2025 to 2026-04)."""


TITAN_OPTIMIZERS = {"Adam": {}, "AdamW": {}, "DistMuon": {"optimizer_bytes": 4}}
"""[optimizer] name values torchtitan builds and their engine settings: 0.2.2
components/optimizer.py:315-319 (optimizer_classes = {"Adam": torch.optim.Adam, "AdamW":
torch.optim.AdamW}, else NotImplementedError), two fp32 moments each, the profile's
optimizer_bytes = 8 (ndplan.optimizers); 0.3.0 components/optimizer/optimizer.py:143-147 adds
"DistMuon", one fp32 momentum_buffer per parameter it is given (distributed/flex_shard/
dist_muon.py:568-576)."""


def _engine_settings(flat: dict, shard: int) -> dict[str, int]:
    """Engine settings (engines.derive) that the job config's compile and float8 keys imply."""
    settings = {}
    if flat.get("compile.enable") or flat.get("training.compile"):
        parts = (_names(flat, "compile.components", ["model", "loss"], '["model", "loss"]')
                 if flat.get("compile.enable") else ["model", "loss"])
        settings |= {"compiled_blocks": 1} if "model" in parts else {}
        settings |= {"compiled_loss": 1} if "loss" in parts else {}
    name = flat.get("optimizer.name", "AdamW")
    if name not in TITAN_OPTIMIZERS:
        raise NdplanError("optimizer.name", name, "not an optimizer torchtitan builds (components/optimizer.py:315-319 "
                          "at 0.2.2; 0.3.0 adds DistMuon)", f"give one of {', '.join(TITAN_OPTIMIZERS)}")
    settings |= TITAN_OPTIMIZERS[name]
    converters = _names(flat, "model.converters", [], '["float8"]')
    if any(c in FLOAT8_LINEAR_CONVERTERS for c in converters):
        settings["fp8_gemm_compute"] = 1  # torchao Float8Linear (engine_fields.py)
        if shard > 1 and any(flat.get(k) for k in FLOAT8_ALL_GATHER_KEYS):
            settings["float8_all_gather"] = 1
    if flat.get(KEY["offload"]):  # FSDP2's CPUOffloadPolicy (engine_fields.py grads_offloaded)
        settings |= X.OFFLOAD_SETTINGS
    return settings


def _names(flat: dict, key: str, default: list[str], example: str) -> list[str]:
    """A list-of-names key, given as a TOML list or a comma-separated string (torchtitan's CLI form)."""
    value = flat.get(key, default)
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise NdplanError(key, value, "not a list of names", f"give a list of strings, e.g. {example}")
    return [v.strip() for v in value]


def _data_parallel(get, path: Path, gpus, tp: int, pp: int, cp: int):
    """(replicate, shard, devices, where the device count came from)."""
    rep = positive(KEY["dp_replicate"], get("dp_replicate"), path.name)
    shard = get("dp_shard")
    if shard == -1:
        gpus, rest = world_dp(gpus, tp * rep, pp, cp, "data_parallel_shard_degree = -1", path.name)
        return rep, rest, gpus, "--gpus"
    shard = positive(KEY["dp_shard"], shard, path.name)
    world = rep * shard * tp * pp * cp
    if gpus is not None and gpus != world:
        raise NdplanError("gpus", gpus, f"{path.name} uses replicate*shard*tp*pp*cp = {world} devices; "
                                        "drop --gpus or set data_parallel_shard_degree = -1")
    return rep, shard, world, "product of the [parallelism] degrees"


def _zero(get, flat: dict, shard: int, pp: int) -> tuple[int, str]:
    """FSDP2's reshard_after_forward policy as a ZeRO level (never: 2, always: 3, default:
    3 without a pipeline, 2 with one), and the policy as written."""
    reshard = str(get("reshard"))
    if shard == 1 and KEY["reshard"] not in flat:
        return 0, reshard
    if reshard in ("never", "always", "default"):
        return {"never": 2, "always": 3}.get(reshard, 3 if pp == 1 else 2), reshard
    raise NdplanError(KEY["reshard"], reshard, "unknown reshard policy", "give default, always or never")


def _pipeline(get, flat: dict, path: Path, L: int, pp: int, notes: list[str]):
    """(schedule, layers per virtual stage or None, vpp) of the [parallelism] table."""
    sched_name = str(get("schedule"))
    if pp > 1 and sched_name not in SCHEDULE_OF:
        raise NdplanError(KEY["schedule"], sched_name, "not a schedule ndplan models",
                          f"use one of {', '.join(SCHEDULE_OF)}")
    schedule = SCHEDULE_OF.get(sched_name, "1f1b") if pp > 1 else "1f1b"
    if pp == 1:
        return schedule, None, 1
    first_less, last_less = (positive(KEY[k], flat.get(KEY[k], X.LESS_LAYERS_DEFAULT), path.name)
                             if flat.get(KEY[k], 1) != 0 else 0 for k in ("first_less", "last_less"))
    if KEY["fqns"] in flat:
        parts = flat[KEY["fqns"]]
        if not isinstance(parts, list) or not all(isinstance(p, list) for p in parts):
            raise NdplanError(KEY["fqns"], parts, "not a list of module-name lists", 'write e.g. [["tok_embeddings", '
                              '"layers.0"], ["layers.1", "norm", "output"]]')
        lps = tuple(sum(1 for m in p if str(m).startswith("layers.")) for p in parts)
        return schedule, lps, _vpp(len(lps), pp, KEY["fqns"], parts)
    if KEY["split_points"] in flat:  # torchtitan before 0.2
        cuts = [int(str(c).rsplit(".", 1)[-1]) for c in flat[KEY["split_points"]]]
        bounds = [0] + cuts + [L]
        lps = tuple(b - a for a, b in zip(bounds, bounds[1:]))
        return schedule, lps, len(lps) // pp
    if KEY["layers_per_stage"] in flat:
        per = positive(KEY["layers_per_stage"], flat[KEY["layers_per_stage"]], path.name)
        stages = X.stage_count(L, per, first_less, last_less)
        if stages % pp:  # torchtitan's ValueError in _get_pipeline_metadata
            raise NdplanError(KEY["layers_per_stage"], per, f"torchtitan makes ceil(({L} layers + {first_less} + "
                              f"{last_less}) / {per}) = {stages} stages, not a multiple of pp={pp}",
                              "change it, or set the first/last_stage_less_layers to 0")
    else:
        stages = pp * (1 if schedule in ONE_CHUNK_SCHEDULES else 2)
        if stages > pp:
            notes.append(f"{sched_name} without pipeline_parallel_layers_per_stage: 2 stages per rank "
                         "(torchtitan's default)")
    try:
        lps = tuple(X.titan_split(L, stages, first_less, last_less))
    except ValueError as e:
        raise NdplanError(KEY["layers_per_stage"], flat.get(KEY["layers_per_stage"]), str(e),
                          "use fewer stages or lower the first/last_stage_less_layers") from None
    if first_less or last_less:
        notes.append(f"torchtitan counts the embedding as {first_less} and the output as {last_less} layer(s): "
                     f"decoder layers per stage {list(lps)}")
    return schedule, lps, stages // pp


def _vpp(stages: int, pp: int, key: str, value) -> int:
    if stages % pp:
        raise NdplanError(key, value, f"{stages} model parts, not a multiple of pp={pp}", "give pp x vpp parts")
    return stages // pp


def _layer_sac(mode: str, option: str, L: int, pp: int, vpp: int, schedule: str, lps,
               notes: list[str]) -> tuple[str, int | None]:
    """(recompute mode, recompute_layers) for torchtitan's per-layer SAC (``selective`` with
    ``selective_ac_option = "N"``): full recompute of layer_sac_count(rank's layers, N) blocks per
    rank, given to ndplan as that count per chunk (the first ones; torchtitan wraps every N-th,
    the same activation total); op SAC (``"op"``) stays ``selective``."""
    if mode != "selective" or option == "op":
        return mode, None
    if not option.isdigit():  # torchtitan raises "Invalid selective AC option" (_apply_ac_to_transformer_block)
        raise NdplanError(KEY["ac_option"], option, "not a selective activation-checkpointing option",
                          'give "op" (op-level SAC) or a whole number N (every N-th block checkpointed)')
    per_rank = ([L // pp] if lps is None else
                [sum(lps[virtual_stage(schedule, r, c, pp)] for c in range(vpp)) for r in range(pp)])
    counts = {X.layer_sac_count(n, int(option)) for n in per_rank}
    wrapped, n = min(counts), min(per_rank)
    if len(counts) > 1:
        notes.append(f"per-layer SAC every {option}: ranks wrap {sorted(counts)} blocks; ndplan uses {wrapped}")
    if wrapped == 0:
        return "none", None
    if wrapped % vpp:
        notes.append(f"per-layer SAC wraps {wrapped} blocks over {vpp} chunks; ndplan gives {wrapped // vpp} per chunk")
    per_chunk = wrapped // vpp
    return ("full", None) if per_chunk * vpp >= n else ("full", per_chunk) if per_chunk else ("none", None)


def _origins(loc: dict, pp: int, gsrc: str, reshard: str, given: dict) -> tuple[dict, dict]:
    """(where each strategy field came from, line of each key); ``loc``: key -> 0-based line;
    ``given``: key -> where a value the file does not write came from (torchtitan 0.3's registered
    config), else torchtitan's default."""

    def src(key):
        return f"line {loc[key] + 1}: {key}" if key in loc else given.get(key, f"torchtitan default ({key})")

    org = {f: src(KEY[k]) for f, k in (("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("seq", "seq"),
                                       ("recompute", "ac_mode"), ("gbs", "gbs"), ("schedule", "schedule"))}
    org |= {"gpus": gsrc, "dp": "data_parallel_replicate_degree x data_parallel_shard_degree",
            "zero": f"{KEY['reshard']} = {reshard}", "mbs": src(KEY["mbs"] if pp > 1 else KEY["local_batch"])}
    return org, {k: v + 1 for k, v in loc.items()}


def read(path: Path, text: str, *, model=None, gpus=None, seq=None, gbs=None) -> CheckInput:
    return read_flat(path, text, _parse(path, text), model=model, gpus=gpus, seq=seq, gbs=gbs)


def read_flat(path: Path, text: str, flat: dict, *, model=None, gpus=None, seq=None, gbs=None, settings=None,
              fmt: str = "torchtitan", notes=(), lines: dict | None = None,
              gpus_origin: str | None = None, given: dict | None = None, unknown=()) -> CheckInput:
    """``read`` of the dotted keys ``flat`` (a TOML job config, or torchtitan 0.3's registered
    config with overrides: interop/torchtitan03.py, which gives its engine ``settings``, where
    the values not on the command line came from, ``given``, and the options it does not know)."""

    def get(k):
        return flat.get(KEY[k], DEFAULTS.get(k))

    guess = _catalog_model(flat) if model is None else None
    named = (flat.get(KEY["model_name"]), flat.get(KEY["model_flavor"]))
    what = "torchtitan's test model, not a catalog model" if named in X.DEBUG_FLAVORS else "not a catalog model"
    spec, origin = resolve_model(model if guess is None else guess, None, "",
                                 f"{path.name} names the model only as [model] name/flavor "
                                 f"({named[0]!r}/{named[1]!r}), {what}")
    if guess:
        origin = f"[model] name/flavor -> catalog {guess}"
    notes: list[str] = list(notes)
    if spec.mtp_layers:  # torchtitan's flavors build none (0.3.0 models/deepseek_v3/__init__.py num_mtp_layers=0;
        import dataclasses  # only config_registry's deepseek_v3_debugmodel_mtp passes 1; 0.2.x has no MTP)
        notes.append(f"{spec.name}'s {spec.mtp_layers} MTP layer(s) left out: torchtitan builds none for this flavor")
        spec = dataclasses.replace(spec, mtp_layers=0)
    variant = X.FLAVOR_VARIANTS.get((flat.get(KEY["model_name"]), flat.get(KEY["model_flavor"])))
    if variant:
        notes.append(variant[1])
    tp, cp, pp = (positive(KEY[k], get(k), path.name) for k in ("tp", "cp", "pp"))
    rep, shard, gpus, gsrc = _data_parallel(get, path, gpus, tp, pp, cp)
    dp = rep * shard
    zero, reshard = _zero(get, flat, shard, pp)
    if rep > 1 and shard > 1:
        notes.append(f"HSDP {rep} x {shard}: ndplan shards over the whole dp={dp} (memory under-counted)")
    schedule, lps, vpp = _pipeline(get, flat, path, spec.num_hidden_layers, pp, notes)
    local = positive(KEY["local_batch"], flat.get(KEY["local_batch"], flat.get("training.batch_size", 8)), path.name)
    mbs = positive(KEY["mbs"], get("mbs"), path.name) if pp > 1 else local
    glob = get("gbs")
    gbs_ = gbs or (local * dp if glob in (-1, None) else positive(KEY["gbs"], glob, path.name))
    mode = str(get("ac_mode"))
    if mode not in RECOMPUTE_MODES:
        raise NdplanError(KEY["ac_mode"], mode, "unknown activation checkpointing mode", "give none, selective or full")
    mode, rec_layers = _layer_sac(mode, str(flat.get(KEY["ac_option"], "op")), spec.num_hidden_layers, pp, vpp,
                                  schedule, lps, notes)
    ep, etp = _experts(get, spec, tp, notes)
    param_dtype = flat.get(KEY["param_dtype"], "bfloat16")
    if param_dtype not in PARAM_DTYPES:
        raise NdplanError(KEY["param_dtype"], param_dtype, "not a dtype torchtitan takes (v0.2.2 job_config.py:282)",
                          f"give {' or '.join(PARAM_DTYPES)}")
    if param_dtype != "bfloat16":  # MixedPrecisionPolicy(param_dtype=...) (v0.2.2 job_config.py:282-288)
        notes.append(f"{KEY['param_dtype']} {param_dtype}: FSDP gathers and computes in it; not modelled: "
                     "estimated with bf16 gathered weights, activations and GEMMs")
    strat = Strategy(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs, gbs=gbs_,
                     seq=seq if seq is not None else positive(KEY["seq"], get("seq"), path.name), zero=zero, sp=True,
                     recompute=mode, recompute_layers=rec_layers, schedule=schedule, engine=derive("fsdp", (settings or {}) | _engine_settings(flat, shard)),
                     offload_optimizer=bool(get("offload")),
                     layers_per_stage=lps if lps and len(set(lps)) > 1 else None)
    strat.check(spec, gpus)
    org, lines = _origins(toml_locate(text) if lines is None else lines, pp, gpus_origin or gsrc, reshard,
                          given or {})
    return CheckInput(path=path, fmt=fmt, text=text, model=spec, model_origin=origin, strategy=strat,
                      gpus=gpus, origin=org, lines=lines, unknown=tuple(unknown), notes=tuple(notes))


def _experts(get, spec, tp: int, notes: list) -> tuple[int, int]:
    """(ep, etp) as torchtitan runs them: with ep 1 it splits a MoE model's routed experts over
    tp whatever etp says (rules.py's fsdp experts rule cites the lines), so etp = tp."""
    ep, etp = positive(KEY["ep"], get("ep"), "parallelism"), positive(KEY["etp"], get("etp"), "parallelism")
    if spec.is_moe and ep == 1 and etp != tp:
        if tp > 1:
            notes.append(f"expert parallelism off: torchtitan splits the routed experts over tp={tp} (read as etp={tp})")
        etp = tp
    return ep, etp


fields = X.fields
edit = toml_edit
