"""``ndplan check FILE``: thin command over ndplan.interop (readers) and ndplan.check."""

from __future__ import annotations

import json
import sys

import click

from dataclasses import replace

from ndplan.cli_format import stage_table, time_summary
from ndplan.cli_options import ACTIVATIONS_OPTION, with_activations
from ndplan.check import MAX_DEVICE_FACTOR
from ndplan.cli_types import BATCH, DEVICES, SEQ, TOP, mem_limit_options
from ndplan.interop import FORMATS
from ndplan.labels import label, recompute_text
from ndplan.units import fmt_bytes
from ndplan.vocab import RECOMPUTE_MODES

EXIT_DOES_NOT_FIT = 1


def _show(v) -> str:
    if isinstance(v, tuple) and len(v) == 2 and v[0] in RECOMPUTE_MODES:
        return recompute_text(*v)
    return str(v)


def _read_lines(res) -> list[str]:
    """What was read: the file, the strategy, where each value came from, notes."""
    ci = res.input
    lines = [f"{ci.path.name} ({ci.fmt}): {ci.model.name} [{ci.model_origin}] on {res.hardware.name} x {ci.gpus}",
             f"  {label(ci.strategy, full=True)}",
             "  from: " + "; ".join(f"{k} <- {v}" for k, v in ci.origin.items())]
    if ci.unknown:
        lines.append(f"  not used: {' '.join(ci.unknown)}")
    return lines + [f"  note: {n}" for n in ci.notes]


def _verdict_lines(res) -> list[str]:
    est = res.estimate
    verdict = "fits" if res.fits else f"DOES NOT FIT (over by {fmt_bytes(est.peak_bytes - res.limit_bytes)})"
    return [stage_table(est),
            f"peak {fmt_bytes(est.peak_bytes)} on stage {est.peak_stage}; limit {fmt_bytes(res.limit_bytes)} "
            f"({res.limit_source}): {verdict}",
            time_summary(est)]


def _oom_text(res) -> str:
    """The terms that cause the OOM and the nearest fitting strategies, each as a diff
    (ends in a newline)."""
    name = res.input.path.name
    lines = ["OOM caused by (largest terms of the peak stage covering the excess): " + ", ".join(
        f"{c['key']} {fmt_bytes(c['bytes'])} ({c['share']:.0%} of the peak)" for c in res.causes)]
    if not res.proposals:
        return "\n".join(lines + ["no fitting strategy at these devices, sequence length and global batch, nor on "
                                  f"up to {MAX_DEVICE_FACTOR}x the devices (tried {_counts(res.tried_gpus)})", ""])
    if res.scaled_gpus:
        lines.append(f"nothing fits on {res.input.gpus} devices at this sequence length and global batch; "
                     f"the smallest device count that fits is {res.scaled_gpus} (tried {_counts(res.tried_gpus)}); "
                     "the proposals change the device count and keep the sequence length and global batch")
    lines.append(f"nearest fitting strategies (fewest changed fields, then step time), as diffs of {name}:")
    text = "\n".join(lines)
    for i, p in enumerate(res.proposals, 1):
        ch = ", ".join(f"{k} {_show(a)} -> {_show(b)}" for k, (a, b) in p.changed.items())
        text += (f"\n\n#{i} [{p.distance} changed: {ch}] peak {fmt_bytes(p.estimate.peak_bytes)}, "
                 f"step {p.estimate.step_s:.3g} s, MFU {p.estimate.mfu:.1%}\n"
                 + (f"note: {p.launch}\n" if p.launch else "") + p.diff)
    return text


def _counts(counts: list[int]) -> str:
    return ", ".join(map(str, counts)) + " devices" if counts else "none: the file's count is at the limit"


def _print(res) -> None:
    click.echo("\n".join(_read_lines(res) + _verdict_lines(res)))
    if not res.fits:
        click.echo(_oom_text(res), nl=False)


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
    @ACTIVATIONS_OPTION
    @click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
    def check_cmd(file, fmt, model, hardware, gpus, seq, gbs, mem_limit_gib, mem_fraction, top, activations, as_json):
        """Estimate an existing Megatron-LM script / argument file, torchtitan TOML (0.2.x)
        or 0.3 launch script (torchrun -m torchtitan.train --module M --config F ...),
        DeepSpeed JSON, MindFormers YAML or a DeviceMesh module written by --emit devicemesh
        (read, never run); on OOM name the terms that cause it and propose the nearest
        strategies that fit, each as a diff of FILE. When nothing fits on the file's
        devices, the proposals run on the smallest whole number of nodes above them that
        fits, up to 32 times as many (doubling, then every node count below; sequence length
        and global batch kept), and the diff sets torchrun's --nnodes / --nproc_per_node
        where the script sets them.

        Exit code: 0 fits, 1 does not fit, 2 bad input (one line naming field, value, fix).

        Nearest = fewest changed fields among dp, tp, pp, cp, ep, etp, vpp, mbs, zero, sp,
        recompute, schedule, layers_per_stage (same seq and global batch), then the shorter
        step time. Each diff is checked: the edited file reads back as the proposal.

        \b
        Examples (files in the repository's examples/ folder):
          ndplan check examples/megatron/pretrain_llama2_7b.sh --top 3   # exits 1
          ndplan check examples/megatron/pretrain_llama2_7b.sh -H h200 --mem-limit-gib 120
          ndplan check examples/torchtitan/llama3_8b.toml --gpus 16
          ndplan check examples/torchtitan/run_train_llama3_8b.sh
          ndplan check examples/deepspeed/ds_config_zero3.json -m llama3-8b --gpus 16 --seq 8192 --json
          ndplan check examples/mindformers/pretrain_llama3_8b.yaml --top 5   # exits 1
          ndplan check examples/devicemesh/llama3_8b_mesh.py
        """
        from ndplan.check import check
        from ndplan.interop import read_config
        ci = read_config(file, fmt, model=model, gpus=gpus, seq=seq, gbs=gbs)
        if activations == "traced":  # the model's HF config: -m, else the catalog entry the file names
            ci = replace(ci, model=with_activations(ci.model, model or ci.model.name, activations,
                                                    ci.strategy.flash_attention))
        res = check(ci, hardware, mem_limit_gib=mem_limit_gib, mem_fraction=mem_fraction, top=top)
        if as_json:
            click.echo(json.dumps(res.to_json(), indent=2, default=str))
        else:
            _print(res)
        if not res.fits:
            sys.exit(EXIT_DOES_NOT_FIT)
    return check_cmd
