"""ndplan command line: thin commands over the library API.

Every error (NdplanError, click usage errors) becomes one line on stderr and exit
code 2 (cli_types.Cli); numeric options are checked against ndplan.limits on parsing.
"""

from __future__ import annotations

import json

import click

from ndplan import limits
from ndplan.catalog import list_hardware, list_models
from ndplan.cli_emit import check_emit_out, emit_cli, emit_options, one_stdout
from ndplan.cli_format import estimate_text, explained_text, hardware_lines, models_lines
from ndplan.cli_options import build, strategy_options
from ndplan.cli_sweep import register as register_sweep
from ndplan.cli_trace import register as register_trace
from ndplan.cli_types import Cli, Count
from ndplan.errors import NdplanError
from ndplan.export import emit
from ndplan.paths import output_file
from ndplan.estimate import estimate as run_estimate
from ndplan.report import cli as report_cli


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
      ndplan trace    llama3-8b --policy full
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

    Memory is printed as allocated (live tensors, what torch.cuda.max_memory_allocated
    reports), reserved (allocated x the engine's caching-allocator slack, what
    max_memory_reserved and torchtitan's log report) and the peak = reserved + the engine
    reserve (CUDA context, NCCL), which the verdict compares with HBM.

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
    form = emit(emit_fmt, model, strat) if emit_fmt else None  # a form that cannot express it fails here
    if export_layers:
        _export_layers(export_layers, model, hw, strat)
    est = run_estimate(model, hw, strat, gpus)
    if report_cli.estimate(est, kw):  # writes --report; True when it printed --csv
        return
    if emit_cli(emit_fmt, emit_out, model, strat, text=form):
        return
    if as_json:
        from ndplan.bands import band
        doc = est.to_json()
        doc["time"]["band_95"] = band(est).to_json()
        click.echo(json.dumps(doc, indent=2, sort_keys=False))
        return
    click.echo(estimate_text(est, model, hw, strat))


def _export_layers(path: str, model, hw, strat) -> None:
    from pathlib import Path

    import yaml

    from ndplan.ppb.export import layers_from_model
    from ndplan.ppb.instance import layers_to_doc
    layers, meta = layers_from_model(model, hw, strat)
    doc = layers_to_doc(layers, meta)
    text = json.dumps(doc, indent=2) if path.endswith(".json") else yaml.safe_dump(doc, sort_keys=False)
    Path(path).write_text(text)


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
        click.echo(explained_text(it, latex))
    if term is None or term.startswith("time."):
        from ndplan.catalog.hardware import EFFICIENCY_DEFAULTS, EFFICIENCY_FIELDS, FA2_FIELD
        from ndplan.engines import profile
        fa2 = hw.attention_field(profile(strat.engine).attention_fa2) == FA2_FIELD
        from ndplan.engines import fp8_gemms
        unread = {FA2_FIELD: not fa2, "attention_efficiency": fa2,
                  "fp8_gemm_efficiency": not fp8_gemms(strat.weight_dtype, profile(strat.engine))}
        click.echo(f"hardware constants of the time Terms ({hw.name}):")
        for f in EFFICIENCY_FIELDS:
            if getattr(hw, f) is None or (f == "fp8_gemm_efficiency" and not hw.fp8_tflops):
                continue  # FlashAttention-2 is the device's reference kernel; no FP8
            src = hw.sources.get(f) or EFFICIENCY_DEFAULTS.get(f, (None, "set in Python"))[1]
            mark = (" [not read: " + ("the GEMMs are 16-bit" if f.startswith("fp8") else
                                      "the engine's attention kernel is the other one") + "]") if unread.get(f) else ""
            click.echo(f"  {f} = {getattr(hw, f):.4g}{mark}  ({src})")


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
    from ndplan.symbols import model_symbols
    rows = []
    for m in list_models():
        rows.append({"name": m.name, "model_type": m.model_type, "architecture": m.architecture,
                     "layers": m.num_hidden_layers, "hidden_size": m.hidden_size,
                     "params_total": int(params_total(m, model_symbols(m))), "source": m.source})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for line in models_lines(rows):
        click.echo(line)


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
             "mamf_bf16_tflops": h.mamf_bf16_tflops, "mamf_fp8_tflops": h.mamf_fp8_tflops,
             "gemm_efficiency": h.gemm_efficiency, "fp8_gemm_efficiency": h.fp8_gemm_efficiency,
             "unverified": sorted(k for k, v in h.sources.items() if "(unverified)" in v)} for h in list_hardware()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for line in hardware_lines(rows):
        click.echo(line)


register_sweep(main)
main.lazy = {"balance": "ndplan.cli_balance", "check": "ndplan.cli_check",
             "calibrate": "ndplan.cli_calibrate", "profile": "ndplan.cli_profile",
             "serve": "ndplan.cli_serve"}  # imported when asked for
register_trace(main)

if __name__ == "__main__":
    main()
