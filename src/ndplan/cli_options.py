"""The option blocks the commands share, defined once, and what they turn into.

* ``model_options``: ``--model``/``-m`` and ``--hardware``/``-H`` (estimate, explain,
  sweep, compare);
* ``run_options``: the fields a sweep keeps fixed (engine, FlashAttention, placement
  order, gradient and weight dtypes), ``--set`` and ``--profile`` (estimate, explain, sweep,
  compare);
* ``strategy_options``: model, devices, sequence, batch, every strategy dimension and
  the run options (estimate, explain).

``build`` turns the parsed options into (model, hardware, Strategy, gpus) through
``points.strategy_from_point``; ``apply_overrides`` applies ``--profile`` and ``--set``.
"""

from __future__ import annotations

import difflib

import click

from ndplan import limits
from ndplan.cli_types import BATCH, DEGREE, DEVICES, SEQ, Count
from ndplan.errors import NdplanError
from ndplan.vocab import ENGINES, GRAD_DTYPES, RECOMPUTE_MODES, SCHEDULES, WEIGHT_DTYPES, ZERO_LEVELS


def apply(opts: list, fn):
    """Decorate ``fn`` with ``opts`` (click decorators), first one shown first in --help."""
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _int_list(ctx, param, value):
    if value is None:
        return None
    items = value.replace(" ", "").split(",")
    try:
        out = tuple(int(x) for x in items)
    except ValueError:
        raise NdplanError(param.opts[0], value, "not a comma-separated list of integers",
                          "write e.g. 15,16,16,17") from None
    for x in out:
        limits.count(param.opts[0], x, 0, limits.MAX_LAYERS, "a layer count")
    return out


MODEL = [
    click.option("--model", "-m", required=True, help="Catalog name, model YAML, or HF model dir/config.json."),
    click.option("--hardware", "-H", default="h100-sxm", show_default=True, help="Catalog name or hardware YAML."),
]
SEQ_OPTION = click.option("--seq", type=SEQ, default=4096, show_default=True, help="Sequence length, tokens.")

ACTIVATION_SOURCES = ("closed-form", "traced")
ACTIVATIONS_OPTION = click.option(
    "--activations", type=click.Choice(ACTIVATION_SOURCES), default="closed-form", show_default=True,
    help="Activation bytes: the closed-form Terms, or traced = what `ndplan trace` measures on the real "
         "transformers modules (sdpa; eager with --no-flash), per layer kind, with the degrees kept symbolic. "
         "Needs pip install 'ndplan[trace]'; traces once per model and caches it.")

def _engine_help() -> str:
    from ndplan.rules import ENGINE_SCOPES, RULES
    rules = "; ".join(r.text for r in RULES if r.scope in ENGINE_SCOPES)
    return ("Whose memory profile and rules apply: megatron (Megatron-LM/Core), fsdp (torchtitan, FSDP2), deepspeed "
            "(DeepSpeed's runtime), mindspore (MindSpore/MindFormers), hf (HF Trainer). Engine rules: " + rules + ".")


RUN = [
    click.option("--engine", type=click.Choice(ENGINES), default="megatron", show_default=True, help=_engine_help()),
    click.option("--flash/--no-flash", default=True, show_default=True, help="FlashAttention (no s^2 scores)."),
    click.option("--order", default="tp-cp-ep-dp-pp", show_default=True,
                 help="Rank placement, innermost axis first (decides which groups stay in a node)."),
    click.option("--grad-dtype", type=click.Choice(GRAD_DTYPES), default="fp32", show_default=True),
    click.option("--weight-dtype", type=click.Choice(WEIGHT_DTYPES), default="auto", show_default=True,
                 help="Persistent weight dtype (auto: the engine's; fp8 keeps an fp32 master)."),
    ACTIVATIONS_OPTION,
    click.option("--set", "overrides", multiple=True, metavar="NAME=VALUE",
                 help="Override a hardware parameter or an engine setting, e.g. --set gemm_efficiency=0.7 "
                      "--set inter_node_gb_per_s=25 --set overlap_tp_comm=1."),
    click.option("--profile", "profile_path", default=None, type=click.Path(dir_okay=False),
                 help="A profile YAML from `ndplan profile`: its measured constants replace the hardware's "
                      "(--set still wins)."),
]

DIMENSIONS = [
    click.option("--dp", type=DEGREE, default=None, help="Data-parallel degree (default: gpus/(tp*pp*cp))."),
    click.option("--tp", type=DEGREE, default=1, show_default=True, help="Tensor-parallel degree."),
    click.option("--pp", type=DEGREE, default=1, show_default=True, help="Pipeline stages."),
    click.option("--cp", type=DEGREE, default=1, show_default=True, help="Context-parallel degree."),
    click.option("--ep", type=DEGREE, default=1, show_default=True, help="Expert-parallel degree (carved from dp*cp*tp)."),
    click.option("--etp", type=DEGREE, default=1, show_default=True, help="Expert tensor-parallel degree."),
    click.option("--vpp", type=Count(hi=limits.MAX_LAYERS, what="a chunk count"), default=1, show_default=True,
                 help="Virtual chunks per stage."),
    click.option("--mbs", type=BATCH, default=1, show_default=True, help="Micro-batch size."),
    click.option("--zero", type=click.IntRange(min(ZERO_LEVELS), max(ZERO_LEVELS)), default=1, show_default=True,
                 help="0 none, 1 optimizer (distributed optimizer), 2 +grads, 3 +weights (FSDP)."),
    click.option("--sp/--no-sp", default=None,
                 help="Sequence parallelism on the TP group [default: on; off for --engine deepspeed at --tp > 1, "
                      "whose AutoTP has none]."),
    click.option("--recompute", type=click.Choice(RECOMPUTE_MODES), default="none", show_default=True),
    click.option("--recompute-layers", callback=_int_list, default=None,
                 help="Apply --recompute only to the first N layers of each stage chunk; one N, or one per stage (4,2,0,0)."),
    click.option("--schedule", type=click.Choice(SCHEDULES), default=None,
                 help="Pipeline schedule (default: 1f1b, interleaved when vpp>1)."),
    click.option("--layers-per-stage", callback=_int_list, default=None,
                 help="Uneven split: layers per (virtual) stage, comma-separated."),
    click.option("--offload-optimizer", is_flag=True, help="Optimizer states and master weights on host."),
]


def model_options(fn):
    return apply(MODEL, fn)


def run_options(fn):
    return apply(RUN, fn)


def strategy_options(fn):
    """Model, hardware, devices, sequence, batch, every strategy dimension, run options."""
    return apply(MODEL + [
        click.option("--gpus", "-n", type=DEVICES, default=None,
                     help="Device count; must equal dp*tp*pp*cp (default: that product)."),
        SEQ_OPTION,
        click.option("--gbs", type=BATCH, default=None, help="Global batch, sequences (default: dp*mbs*pp)."),
    ] + DIMENSIONS + RUN, fn)


def run_fields(kw: dict) -> dict:
    """The Strategy fields of the run options (a sweep's ``base``)."""
    return {"engine": kw["engine"], "flash_attention": kw["flash"], "order": kw["order"],
            "grad_dtype": kw["grad_dtype"], "weight_dtype": kw["weight_dtype"]}


def strategy_point(kw: dict) -> dict:
    """The Strategy fields of ``strategy_options`` (None where points derives them)."""
    rl = kw["recompute_layers"]
    return {**{k: kw[k] for k in ("dp", "tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "gbs", "seq", "zero", "sp",
                                  "recompute", "schedule", "layers_per_stage", "offload_optimizer")},
            "recompute_layers": None if rl is None else rl[0] if len(rl) == 1 else rl, **run_fields(kw)}


def parse_overrides(items) -> dict[str, float]:
    out = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise NdplanError("--set", item, "not NAME=VALUE", "write e.g. --set gemm_efficiency=0.7")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise NdplanError(name.strip(), value, "not a number",
                              f"write a number, e.g. --set {name.strip()}=0.7 (on/off settings take 0 or 1)") from None
    return out


def apply_overrides(hardware: str, engine: str, items, profile: str | None = None, model=None,
                    seq: int | None = None, tp: int = 1, mbs: int | None = None, cp: int = 1) -> tuple:
    """(hardware, engine name) with ``--profile`` and ``--set`` applied: the profile's measured
    constants (profile_file.apply, at ``model``'s GEMM shapes) replace the entry's, then hardware
    fields from ``--set`` (checked by catalog.hardware.FIELD_RULES); engine settings derive a
    named engine profile (engines.derive)."""
    from ndplan import engines
    from ndplan.catalog import load_hardware
    from ndplan.catalog.hardware import FIELD_RULES
    sets = parse_overrides(items)
    known = set(FIELD_RULES) | engines.engine_fields()
    for k in sets:
        if k not in known:
            close = difflib.get_close_matches(k, sorted(known), n=3)
            raise NdplanError("--set", k, "unknown parameter",
                              (f"did you mean {', '.join(close)}? " if close else "")
                              + "hardware fields are in hardware/*.yaml, engine settings in engines.EngineProfile")
    eng = {k: v for k, v in sets.items() if k in engines.engine_fields()}
    hw = load_hardware(hardware)
    if profile:
        from ndplan.profile_file import apply as apply_profile
        hw = apply_profile(profile, hw, model, seq, tp, mbs, cp)
    hw = hw.with_overrides({k: v for k, v in sets.items() if k not in eng})
    return hw, engines.derive(engine, eng)


def build(kw: dict):
    """(model, hardware, strategy, gpus) from ``strategy_options`` (``kw["engine"]``
    becomes the engine profile ``--set`` derives)."""
    from ndplan.catalog import load_model
    from ndplan.points import strategy_from_point
    model = load_model(kw["model"])
    hw, kw["engine"] = apply_overrides(kw["hardware"], kw["engine"], kw.get("overrides"), kw.pop("profile_path", None),
                                       model, kw["seq"], kw["tp"], kw["mbs"], kw["cp"])
    strat = strategy_from_point(strategy_point(kw), kw["gpus"])
    strat.check(model, kw["gpus"])
    model = with_activations(model, kw["model"], kw["activations"], kw["flash"])  # the long part, after the checks
    return model, hw, strat, kw["gpus"]


def with_activations(model, name_or_path: str, source: str, flash: bool):
    """``model`` as ``--activations`` asks: unchanged for closed-form; for traced, with the
    activation bytes ndplan.trace measures on the modules transformers builds from the
    config (a progress line on stderr while it traces, and its notes)."""
    if source != "traced":
        return model
    from ndplan.trace.measured import traced_spec
    out = traced_spec(name_or_path, model, flash=flash, progress=_trace_progress(name_or_path))
    for note in out.traced.notes:
        click.echo(f"note: traced activations of {name_or_path}: {note}", err=True)
    return out


def _trace_progress(name: str):
    def show(j: int, n: int) -> None:
        click.echo(f"\rtracing {name} on the CPU (--activations traced, cached after this run): shape {j}/{n}",
                   nl=j == n, err=True)
    return show
