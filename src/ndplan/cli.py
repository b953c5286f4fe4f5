"""ndplan command line: thin commands over the library API.

Every error (NdplanError, click usage errors) becomes one line on stderr and exit
code 2 (cli_types.Cli); numeric options are checked against ndplan.limits on parsing.
"""

from __future__ import annotations

import json

import click

from ndplan import limits
from ndplan.catalog import list_hardware, list_models, load_hardware, load_model
from ndplan.cli_balance import register as register_balance
from ndplan.cli_check import register as register_check
from ndplan.cli_emit import check_emit_out, emit_cli, emit_options, one_stdout
from ndplan.cli_sweep import register as register_sweep
from ndplan.cli_types import BATCH, DEGREE, DEVICES, SEQ, Cli, Count
from ndplan.errors import NdplanError
from ndplan.paths import output_file
from ndplan.estimate import estimate as run_estimate
from ndplan.report import cli as report_cli
from ndplan.strategy import ENGINES, RECOMPUTE_MODES, SCHEDULES, Strategy
from ndplan.units import GIB, fmt_bytes, fmt_count, fmt_seconds


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


def _one_or_tuple(v):
    return None if v is None else (v[0] if len(v) == 1 else v)


def strategy_options(fn):
    """Shared options: model, hardware, cluster, batch and every strategy dimension."""
    opts = [
        click.option("--model", "-m", required=True, help="Catalog name, model YAML, or HF model dir/config.json."),
        click.option("--hardware", "-H", default="h100-sxm", show_default=True, help="Catalog name or hardware YAML."),
        click.option("--gpus", "-n", type=DEVICES, default=None, help="Device count; must equal dp*tp*pp*cp (default: that product)."),
        click.option("--seq", type=SEQ, default=4096, show_default=True, help="Sequence length, tokens."),
        click.option("--gbs", type=BATCH, default=None, help="Global batch, sequences (default: dp*mbs*pp)."),
        click.option("--dp", type=DEGREE, default=None, help="Data-parallel degree (default: gpus/(tp*pp*cp))."),
        click.option("--tp", type=DEGREE, default=1, show_default=True, help="Tensor-parallel degree."),
        click.option("--pp", type=DEGREE, default=1, show_default=True, help="Pipeline stages."),
        click.option("--cp", type=DEGREE, default=1, show_default=True, help="Context-parallel degree."),
        click.option("--ep", type=DEGREE, default=1, show_default=True, help="Expert-parallel degree (carved from dp*cp*tp)."),
        click.option("--etp", type=DEGREE, default=1, show_default=True, help="Expert tensor-parallel degree."),
        click.option("--vpp", type=Count(hi=limits.MAX_LAYERS, what="a chunk count"), default=1, show_default=True,
                     help="Virtual chunks per stage."),
        click.option("--mbs", type=BATCH, default=1, show_default=True, help="Micro-batch size."),
        click.option("--zero", type=click.IntRange(0, 3), default=1, show_default=True,
                     help="0 none, 1 optimizer (distributed optimizer), 2 +grads, 3 +weights (FSDP)."),
        click.option("--sp/--no-sp", default=True, show_default=True, help="Sequence parallelism on the TP group."),
        click.option("--recompute", type=click.Choice(RECOMPUTE_MODES), default="none", show_default=True),
        click.option("--recompute-layers", callback=_int_list, default=None,
                     help="Apply --recompute only to the first N layers of each stage chunk; one N, or one per stage (4,2,0,0)."),
        click.option("--schedule", type=click.Choice(SCHEDULES), default=None,
                     help="Pipeline schedule (default: 1f1b, interleaved when vpp>1)."),
        click.option("--engine", type=click.Choice(ENGINES), default="megatron", show_default=True),
        click.option("--flash/--no-flash", default=True, show_default=True, help="FlashAttention (no s^2 scores)."),
        click.option("--layers-per-stage", callback=_int_list, default=None,
                     help="Uneven split: layers per (virtual) stage, comma-separated."),
        click.option("--grad-dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True),
        click.option("--weight-dtype", type=click.Choice(["auto", "fp32", "bf16", "fp8"]), default="auto", show_default=True,
                     help="Persistent weight dtype (auto: the engine's; fp8 keeps an fp32 master)."),
        click.option("--offload-optimizer", is_flag=True, help="Optimizer states and master weights on host."),
        click.option("--order", default="tp-cp-ep-dp-pp", show_default=True,
                     help="Rank placement, innermost axis first (decides which groups stay in a node)."),
        click.option("--set", "overrides", multiple=True, metavar="NAME=VALUE",
                     help="Override a hardware parameter or an engine setting, e.g. --set gemm_efficiency=0.7 "
                          "--set inter_node_gb_per_s=25 --set overlap_tp_comm=1."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


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


def apply_overrides(hardware: str, engine: str, items) -> tuple:
    """(hardware, engine name) with ``--set`` applied: hardware fields replace values of
    the hardware entry (checked by catalog.hardware.FIELD_RULES), engine settings derive a
    named engine profile (engines.derive)."""
    from ndplan import engines
    from ndplan.catalog.hardware import FIELD_RULES
    sets = parse_overrides(items)
    for k in sets:
        if k not in FIELD_RULES and k not in engines.engine_fields():
            import difflib
            close = difflib.get_close_matches(k, sorted(set(FIELD_RULES) | engines.engine_fields()), n=3)
            raise NdplanError("--set", k, "unknown parameter",
                              (f"did you mean {', '.join(close)}? " if close else "")
                              + "hardware fields are in hardware/*.yaml, engine settings in engines.EngineProfile")
    eng = {k: v for k, v in sets.items() if k in engines.engine_fields()}
    hw = load_hardware(hardware).with_overrides({k: v for k, v in sets.items() if k not in eng})
    return hw, engines.derive(engine, eng)


def build(kw: dict):
    """(model, hardware, strategy, gpus) from the shared options."""
    model = load_model(kw["model"])
    hw, engine = apply_overrides(kw["hardware"], kw["engine"], kw.get("overrides"))
    kw["engine"] = engine
    tp, pp, cp = kw["tp"], kw["pp"], kw["cp"]
    gpus = kw["gpus"]
    dp = kw["dp"]
    if dp is None:
        if gpus is None:
            dp = 1
        elif gpus % (tp * pp * cp):
            raise NdplanError("--gpus", gpus, f"not divisible by tp*pp*cp={tp * pp * cp}", "change a degree or --gpus")
        else:
            dp = gpus // (tp * pp * cp)
    gbs = kw["gbs"] if kw["gbs"] is not None else dp * kw["mbs"] * pp
    schedule = kw["schedule"] or ("interleaved" if kw["vpp"] > 1 else "1f1b")
    strat = Strategy(dp=dp, tp=tp, pp=pp, cp=cp, ep=kw["ep"], etp=kw["etp"], vpp=kw["vpp"], mbs=kw["mbs"],
                     gbs=gbs, seq=kw["seq"], zero=kw["zero"], sp=kw["sp"], recompute=kw["recompute"],
                     recompute_layers=_one_or_tuple(kw["recompute_layers"]), schedule=schedule, engine=kw["engine"],
                     flash_attention=kw["flash"], layers_per_stage=kw["layers_per_stage"],
                     grad_dtype=kw["grad_dtype"], weight_dtype=kw["weight_dtype"],
                     offload_optimizer=kw["offload_optimizer"], order=kw["order"])
    strat.check(model, gpus)
    return model, hw, strat, gpus


@click.group(cls=Cli, name="ndplan", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ndplan")
def main():
    """ndplan: plan N-dimensional parallel training (DP/ZeRO, TP+SP, PP+VPP, CP, EP).

    Every error is one line, `error: <field>=<value>: <what is wrong>; <how to fix>`, with
    exit code 2; `ndplan COMMAND --help` shows each command's options and examples.

    \b
    Examples:
      ndplan models
      ndplan estimate -m llama3-70b -H h100-sxm --gpus 64 --tp 8 --pp 2 --gbs 64 --seq 8192
      ndplan explain  -m llama3-8b --dp 8 --term mem.activations --symbolic
      ndplan sweep    -m llama3-70b -H h100-sxm --gpus 1024 --seq 8192 --gbs 1024
      ndplan compare  -m llama2-70b -H a100-80gb --gpus 64 --gbs 128 "dp=4,tp=8,pp=2" "dp=8,tp=8,pp=1"
      ndplan check    examples/torchtitan/llama3_8b.toml --gpus 16
    """


@main.command()
@strategy_options
@click.option("--json", "as_json", is_flag=True, help="Print the estimate as JSON (schema in DESIGN.md).")
@click.option("--export-layers", type=click.Path(dir_okay=False), default=None,
              help="Write the per-layer description for `ndplan balance` (YAML, or JSON by extension).")
@emit_options
@report_cli.report_csv_options
def estimate(as_json, export_layers, emit_fmt, emit_out, **kw):
    """Per-stage peak memory of one strategy, with every term, and its step time.

    Exit code 0 with an estimate (the verdict, fits or DOES NOT FIT, is printed; `check`
    and `sweep` exit 1 when nothing fits), 2 for bad input.

    \b
    Examples:
      ndplan estimate -m llama3-70b -H h100-sxm --gpus 64 --tp 8 --pp 4 --gbs 128 \\
          --seq 8192 --recompute selective --json
      ndplan estimate -m llama3-70b --gpus 64 --tp 8 --pp 4 --gbs 128 --emit megatron
    """
    check_emit_out(emit_fmt, emit_out)
    one_stdout(json=as_json, csv=kw.get("report_csv"), emit=emit_fmt and not emit_out)
    if export_layers:
        output_file("--export-layers", export_layers)
    model, hw, strat, gpus = build(kw)
    if export_layers:
        _export_layers(export_layers, model, hw, strat)
    est = run_estimate(model, hw, strat, gpus)
    if report_cli.estimate(est, kw):  # writes --report; True when it printed --csv
        return
    if emit_cli(emit_fmt, emit_out, model, strat):
        return
    if as_json:
        click.echo(json.dumps(est.to_json(), indent=2, sort_keys=False))
        return
    s = strat
    click.echo(f"{model.name} ({model.architecture}; {fmt_count(est.params_total)} params"
               + (f", {fmt_count(est.params_active)} active" if est.params_active else "") + f") on {hw.name} "
               f"x {s.world}: dp={s.dp} tp={s.tp} pp={s.pp} vpp={s.vpp} cp={s.cp} ep={s.ep} etp={s.etp} "
               f"mbs={s.mbs} gbs={s.gbs} m={s.m} seq={s.seq} zero={s.zero} sp={'on' if s.sp else 'off'} "
               f"recompute={s.recompute}{'' if s.recompute_layers is None else f'[first {s.recompute_layers}]'} "
               f"schedule={s.schedule} engine={s.engine}")
    click.echo(stage_table(est))
    verdict = "fits" if est.fits else "DOES NOT FIT"
    click.echo(f"peak {fmt_bytes(est.peak_bytes)} on stage {est.peak_stage} of {hw.hbm_gib:g} GiB HBM: {verdict}"
               + (f"; host {fmt_bytes(est.host_bytes)} per device" if est.host_bytes else ""))
    click.echo(time_summary(est))


def stage_table(est) -> str:
    """Per-stage peak, static, dynamic and every memory term, GiB, one row per stage."""
    keys = list(est.per_stage[0]["terms"])
    short = [k.split(".", 1)[1] for k in keys]
    head = ["stage", "peak GiB", "static", "dynamic"] + short
    rows = [[str(r["stage"]), f"{r['peak_bytes'] / GIB:.2f}", f"{r['static_bytes'] / GIB:.2f}",
             f"{r['dynamic_bytes'] / GIB:.2f}"] + [f"{r['terms'][k] / GIB:.2f}" for k in keys]
            for r in est.per_stage]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [head] + rows)


def _export_layers(path: str, model, hw, strat) -> None:
    from pathlib import Path

    import yaml

    from ndplan.ppb.export import layers_from_model
    from ndplan.ppb.instance import layers_to_doc
    layers, meta = layers_from_model(model, hw, strat)
    doc = layers_to_doc(layers, meta)
    text = json.dumps(doc, indent=2) if path.endswith(".json") else yaml.safe_dump(doc, sort_keys=False)
    Path(path).write_text(text)


def time_summary(est) -> str:
    """Step time, MFU/HFU, tokens/s and the non-zero time terms, two lines."""
    parts = ", ".join(f"{k.split('.', 1)[1]} {fmt_seconds(v)}" for k, v in est.time_terms.items() if v > 5e-7)
    return (f"step {fmt_seconds(est.step_s)}  MFU {est.mfu:.1%}  HFU {est.hfu:.1%}  "
            f"{est.tokens_per_s:,.0f} tokens/s/device\n  time: {parts}\n"
            "  (MFU: 3 x forward GEMM + causal attention FLOPs, no recompute, over bf16 dense peak)")


@main.command()
@strategy_options
@click.option("--term", default=None, help="Only this term key (e.g. mem.activations).")
@click.option("--stage", type=Count(lo=0, hi=limits.MAX_DEVICES, what="a stage index"), default=None,
              help="Pipeline stage to evaluate at (default: the peak stage).")
@click.option("--symbolic", is_flag=True, help="Keep model sizes as symbols (h, L, a, kv, d, f, V, ...).")
@click.option("--latex", is_flag=True, help="Print formulas as LaTeX.")
@click.option("--json", "as_json", is_flag=True)
def explain(term, stage, symbolic, latex, as_json, **kw):
    """Closed form of every term, its value at the strategy, unit and source.

    \b
    Examples:
      ndplan explain -m llama3-8b --dp 8 --seq 8192
      ndplan explain -m llama3-70b --tp 8 --pp 4 --gbs 64 --term mem.activations --symbolic --latex
      ndplan explain -m llama3-70b -H h100-sxm --tp 8 --pp 4 --gbs 64 --term time.tp_comm
    """
    from ndplan.explain import explain as run_explain
    model, hw, strat, gpus = build(kw)
    if stage is None:
        if term is not None:  # an unknown term fails here, before kernels compile for the peak stage
            run_explain(model, strat, stage=0, symbolic=symbolic, term=term, hardware=hw)
        stage = run_estimate(model, hw, strat, gpus).peak_stage
    elif not 0 <= stage < strat.pp:
        raise NdplanError("--stage", stage, f"no such stage with pp={strat.pp}", f"give a stage in 0..{strat.pp - 1}")
    items = run_explain(model, strat, stage=stage, symbolic=symbolic, term=term, hardware=hw)
    if as_json:
        click.echo(json.dumps([vars(i) for i in items], indent=2))
        return
    for it in items:
        val = (fmt_bytes(it.value) if it.unit == "bytes" else fmt_count(it.value) + f" ({int(it.value):,})"
               if it.unit == "count" else fmt_seconds(it.value) if it.unit == "s" else f"{it.value:g} {it.unit}")
        click.echo(f"{it.key} = {val}   [{it.unit}; {it.note}]" if it.note else f"{it.key} = {val}   [{it.unit}]")
        click.echo(f"  = {it.latex if latex else it.formula}")
        click.echo(f"  source: {it.source}")
        click.echo("")


@main.command()
@click.option("--json", "as_json", is_flag=True)
def models(as_json):
    """List the model catalog (models/*.yaml, and $NDPLAN_HOME/models/*.yaml).

    \b
    Examples:
      ndplan models
      ndplan models --json
    """
    from ndplan.formulas.params import params_total
    rows = []
    for m in list_models():
        rows.append({"name": m.name, "model_type": m.model_type, "architecture": m.architecture,
                     "layers": m.num_hidden_layers, "hidden_size": m.hidden_size,
                     "params_total": int(params_total(m, m.symbols())), "source": m.source})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(f"{r['name']:<18} {fmt_count(r['params_total']):>9}  {r['layers']:>3} layers  h={r['hidden_size']:<6} {r['architecture']}")


@main.command()
@click.option("--json", "as_json", is_flag=True)
def hardware(as_json):
    """List the hardware catalog (hardware/*.yaml, and $NDPLAN_HOME/hardware/*.yaml).

    \b
    Examples:
      ndplan hardware
      ndplan hardware --json
    """
    rows = [{"name": h.name, "display_name": h.display_name, "bf16_tflops": h.bf16_tflops, "fp8_tflops": h.fp8_tflops,
             "hbm_gib": h.hbm_gib, "hbm_gb_per_s": h.hbm_gb_per_s, "intra_node_gb_per_s": h.intra_node_gb_per_s,
             "inter_node_gb_per_s": h.inter_node_gb_per_s, "devices_per_node": h.devices_per_node,
             "unverified": sorted(k for k, v in h.sources.items() if "(unverified)" in v)} for h in list_hardware()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        flag = f"  unverified: {', '.join(r['unverified'])}" if r["unverified"] else ""
        name_w = max(len(x["name"]) for x in rows)
        link = f"{r['intra_node_gb_per_s']:g}/{r['inter_node_gb_per_s']:g}"
        click.echo(f"{r['name']:<{name_w}} {r['bf16_tflops']:>7g} TFLOPS bf16  {r['hbm_gib']:>5g} GiB  "
                   f"{link:>8} GB/s intra/inter  {r['devices_per_node']:>2}/node  {r['display_name']}{flag}")


register_sweep(main, apply_overrides)
register_balance(main)
register_check(main)

if __name__ == "__main__":
    main()
