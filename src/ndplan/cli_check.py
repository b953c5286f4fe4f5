"""``ndplan check FILE``: thin command over ndplan.interop (readers) and ndplan.check."""

from __future__ import annotations

import json
import sys

import click

from ndplan.cli_types import BATCH, DEVICES, SEQ, TOP, mem_limit_options
from ndplan.interop import FORMATS
from ndplan.units import fmt_bytes
from ndplan.vocab import RECOMPUTE_MODES

EXIT_DOES_NOT_FIT = 1


def _show(v) -> str:
    if isinstance(v, tuple) and len(v) == 2 and v[0] in RECOMPUTE_MODES:
        return v[0] if v[1] is None else f"{v[0]}[first {v[1]}]"
    return str(v)


def _strategy_line(s) -> str:
    rec = s.recompute if s.recompute_layers is None else f"{s.recompute}[first {s.recompute_layers}]"
    return (f"dp={s.dp} tp={s.tp} pp={s.pp} vpp={s.vpp} cp={s.cp} ep={s.ep} mbs={s.mbs} gbs={s.gbs} m={s.m} "
            f"seq={s.seq} zero={s.zero} sp={'on' if s.sp else 'off'} recompute={rec} schedule={s.schedule} "
            f"engine={s.engine}")


def _print(res) -> None:
    from ndplan.cli import stage_table, time_summary
    ci, est = res.input, res.estimate
    click.echo(f"{ci.path.name} ({ci.fmt}): {ci.model.name} [{ci.model_origin}] on {res.hardware.name} x {ci.gpus}")
    click.echo(f"  {_strategy_line(ci.strategy)}")
    click.echo("  from: " + "; ".join(f"{k} <- {v}" for k, v in ci.origin.items()))
    if ci.unknown:
        click.echo(f"  not used: {' '.join(ci.unknown)}")
    for n in ci.notes:
        click.echo(f"  note: {n}")
    click.echo(stage_table(est))
    verdict = "fits" if res.fits else f"DOES NOT FIT (over by {fmt_bytes(est.peak_bytes - res.limit_bytes)})"
    click.echo(f"peak {fmt_bytes(est.peak_bytes)} on stage {est.peak_stage}; limit {fmt_bytes(res.limit_bytes)} "
               f"({res.limit_source}): {verdict}")
    click.echo(time_summary(est))
    if res.fits:
        return
    click.echo("OOM caused by (largest terms of the peak stage covering the excess): " + ", ".join(
        f"{c['key']} {fmt_bytes(c['bytes'])} ({c['share']:.0%} of the peak)" for c in res.causes))
    if not res.proposals:
        click.echo("no fitting strategy at these devices, sequence length and global batch")
        return
    click.echo(f"nearest fitting strategies (fewest changed fields, then step time), as diffs of {ci.path.name}:")
    for i, p in enumerate(res.proposals, 1):
        ch = ", ".join(f"{k} {_show(a)} -> {_show(b)}" for k, (a, b) in p.changed.items())
        click.echo(f"\n#{i} [{p.distance} changed: {ch}] peak {fmt_bytes(p.estimate.peak_bytes)}, "
                   f"step {p.estimate.step_s:.3g} s, MFU {p.estimate.mfu:.1%}")
        click.echo(p.diff, nl=False)


def register(main):
    @main.command("check")
    @click.argument("file", type=click.Path(dir_okay=False))
    @click.option("--format", "fmt", type=click.Choice(("auto",) + FORMATS), default="auto", show_default=True,
                  help="File format (auto: by suffix, then content).")
    @click.option("--model", "-m", default=None,
                  help="Catalog name, model YAML or HF config.json; needed when the file has no architecture.")
    @click.option("--hardware", "-H", default=None,
                  help="Catalog name or hardware YAML (default: ascend-910b for MindFormers, else h100-sxm).")
    @click.option("--gpus", "-n", type=DEVICES, default=None,
                  help="Device count: needed when the file does not say it; for a Megatron script it replaces the "
                       "torchrun count (dp follows); a MindFormers yaml fixes it by its degrees.")
    @click.option("--seq", type=SEQ, default=None, help="Sequence length (DeepSpeed JSON; overrides the file).")
    @click.option("--gbs", type=BATCH, default=None, help="Global batch, sequences (overrides the file).")
    @mem_limit_options
    @click.option("--top", type=TOP, default=3, show_default=True, help="Fitting strategies to propose on OOM.")
    @click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
    def check_cmd(file, fmt, model, hardware, gpus, seq, gbs, mem_limit_gib, mem_fraction, top, as_json):
        """Estimate an existing Megatron-LM script / argument file, torchtitan TOML,
        DeepSpeed JSON or MindFormers YAML; on OOM name the terms that cause it and
        propose the nearest strategies that fit, each as a diff of FILE.

        Exit code: 0 fits, 1 does not fit, 2 bad input (one line naming field, value, fix).

        Nearest = fewest changed fields among dp, tp, pp, cp, ep, etp, vpp, mbs, zero, sp,
        recompute, schedule, layers_per_stage (same devices, seq and global batch), then the
        shorter step time. Each diff is checked: the edited file reads back as the proposal.

        \b
        Examples (files in the repository's examples/ folder):
          ndplan check examples/megatron/pretrain_llama2_7b.sh --top 3   # exits 1
          ndplan check examples/megatron/pretrain_llama2_7b.sh -H h200 --mem-limit-gib 120
          ndplan check examples/torchtitan/llama3_8b.toml --gpus 16
          ndplan check examples/deepspeed/ds_config_zero3.json -m llama3-8b --gpus 16 --seq 8192 --json
          ndplan check examples/mindformers/pretrain_llama3_8b.yaml --top 5   # exits 1
        """
        from ndplan.check import check
        from ndplan.interop import read_config
        ci = read_config(file, fmt, model=model, gpus=gpus, seq=seq, gbs=gbs)
        res = check(ci, hardware, mem_limit_gib=mem_limit_gib, mem_fraction=mem_fraction, top=top)
        if as_json:
            click.echo(json.dumps(res.to_json(), indent=2, default=str))
        else:
            _print(res)
        if not res.fits:
            sys.exit(EXIT_DOES_NOT_FIT)
    return check_cmd
