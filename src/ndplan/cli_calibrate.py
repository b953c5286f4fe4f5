"""``ndplan calibrate RUNS.yaml``: thin command over ndplan.calibrate."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ndplan.paths import output_file


def _pct(x) -> str:
    return "   n/a" if x is None else f"{100 * x:+6.1f}"


def report_text(f, out: str | None) -> str:
    from ndplan.calibrate import OUTLIER_FACTOR, OUTLIER_FLOOR, _median_abs
    lines = [f"fitted on {len(f.runs)} runs ({f.dof} degrees of freedom), hardware {f.runs[0].hardware.name}:"]
    for k, v in f.values.items():
        iv = f.intervals[k]
        was = f"{f.was(k):.4g}"
        span = f"95 % interval {iv[0]:.3f}-{iv[1]:.3f}" if iv else "no interval (as many runs as constants)"
        bound = "; AT A BOUND: the runs disagree with the model's structure, not this constant" \
            if k in f.at_bound else ""
        lines.append(f"  {k:24s} {v:.3f}  ({span}; was {was}{bound})")
    for k, why in f.not_fitted.items():
        lines.append(f"  {k:24s} kept: {why}")
    lines.append(f"{'run':40s} {'measured s':>11s} {'before %':>9s} {'after %':>8s} {'leave-one-out %':>16s}")
    for r, b, a, lo in zip(f.runs, f.before, f.after, f.loo):
        lines.append(f"{r.name[:40]:40s} {r.step_s:11.4g} {_pct(b):>9s} {_pct(a):>8s} {_pct(lo):>16s}")
    med = {k: _median_abs(v) for k, v in (("before", f.before), ("after", f.after), ("loo", f.loo))}
    lines.append("median |error|: before " + (f"{100 * med['before']:.1f} %" if med["before"] is not None else "n/a")
                 + ", after " + f"{100 * med['after']:.1f} %"
                 + ", leave-one-out " + (f"{100 * med['loo']:.1f} %" if med["loo"] is not None else "n/a"))
    peaks = [(r.name, pk) for r, pk in zip(f.runs, f.peaks) if pk]
    for name, (pred, meas) in peaks:
        lines.append(f"peak memory {name[:40]}: predicted {pred:.2f} GiB, measured {meas:.2f} GiB "
                     f"({100 * (pred - meas) / meas:+.1f} %)")
    if f.outliers:
        lines.append(f"outliers (leave-one-out |error| > {OUTLIER_FACTOR:g}x the median and > {100 * OUTLIER_FLOOR:g} %): "
                     + ", ".join(f.outliers))
    if out:
        lines.append(f"wrote {out}: use it as -H {out} with any command")
    return "\n".join(lines)


def register(main):
    @main.command("calibrate")
    @click.argument("runs_file", metavar="RUNS.yaml", type=click.Path(dir_okay=False))
    @click.option("--fit", "names", default=None,
                  help="Comma-separated constants to fit (default: every one the runs can tell apart): "
                       "gemm_efficiency, fp8_gemm_efficiency, attention_efficiency, hbm_efficiency, "
                       "intra_node_efficiency, inter_node_efficiency.")
    @click.option("--out", "-o", default=None, type=click.Path(dir_okay=False),
                  help="Write the runs' hardware entry with the fitted values as a hardware YAML (-H FILE).")
    @click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
    def calibrate_cmd(runs_file, names, out, as_json):
        """Fit the step-time model's efficiency constants to measured runs.

        RUNS.yaml lists runs, each a model and a strategy (or a launch file that
        `ndplan check` reads), the hardware, and the measured seconds per step:

        \b
          hardware: a100-80gb
          runs:
            - name: llama3-8b op-SAC
              model: llama3-8b
              strategy: {dp: 64, mbs: 1, gbs: 64, seq: 8192, zero: 3, engine: fsdp, recompute: selective}
              step_time_s: 2.7555
            - name: my launch
              file: pretrain.sh        # relative to RUNS.yaml
              step_time_s: 1.84

        The constants are fitted by least squares on ln(predicted / measured), with
        95 % intervals, each run's error before and after, its leave-one-out error
        (refit without it) and outliers; a constant the runs do not move is kept and
        named. --out writes the hardware YAML with the fitted values and their source,
        which every command takes as -H FILE. One hardware entry per RUNS file.

        \b
        Examples (files in the repository's examples/ folder):
          ndplan calibrate examples/calibrate/torchtitan_a100_runs.yaml
          ndplan calibrate examples/calibrate/torchtitan_a100_runs.yaml --fit gemm_efficiency -o a100-fit.yaml
          ndplan calibrate examples/calibrate/torchtitan_a100_runs.yaml --json
        """
        from ndplan.calibrate import fit, hardware_yaml, load_runs
        path = Path(runs_file)
        fields = [n.strip() for n in names.split(",") if n.strip()] if names is not None else None
        target = output_file("--out", out) if out else None
        runs = load_runs(path)
        if not as_json:
            click.echo(f"calibrate: {len(runs)} runs from {path.name}, fitting and leaving each out", err=True)
        result = fit(runs, fields)
        if target is not None:
            target.write_text(hardware_yaml(result, path.name))
        click.echo(json.dumps(result.to_json(), indent=2) if as_json else report_text(result, out))
