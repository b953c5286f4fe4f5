"""``ndplan profile``: thin command over ndplan.profile_run (measure) and ndplan.profile_file (read)."""

from __future__ import annotations

import functools
import json

import click

from ndplan import limits
from ndplan.cli_options import MODEL, SEQ_OPTION, apply
from ndplan.cli_types import BATCH
from ndplan.paths import output_file
from ndplan.profile_run import DEFAULT_MAX_MIB

MAX_ITERS = 1000


def _tps(ctx, param, value: str) -> list[int]:
    from ndplan.errors import NdplanError
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise NdplanError("--tp", value, "not a comma-separated list of degrees", "write e.g. 1,2,4,8") from None
    if not out:
        raise NdplanError("--tp", value, "empty", "write e.g. 1,2,4,8")
    return [limits.count("--tp", t, 1, limits.MAX_DEVICES, "a tensor-parallel degree") for t in out]


def register(main):
    @main.command("profile")
    @functools.partial(apply, MODEL + [SEQ_OPTION])
    @click.option("--mbs", type=BATCH, default=1, show_default=True, help="Micro-batch size of the timed shapes.")
    @click.option("--tp", "tps", default="1", show_default=True, callback=_tps,
                  help="Tensor-parallel degrees whose GEMM and attention shapes are timed, e.g. 1,2,4,8.")
    @click.option("--max-mib", type=click.IntRange(1, 65536), default=DEFAULT_MAX_MIB, show_default=True,
                  help="Largest collective buffer, MiB (16 at most on CPU).")
    @click.option("--warmup", type=click.IntRange(0, MAX_ITERS), default=3, show_default=True,
                  help="Untimed runs before each measurement (the first collective also sets the backend up).")
    @click.option("--iters", type=click.IntRange(1, MAX_ITERS), default=10, show_default=True,
                  help="Timed runs per measurement (the median is kept).")
    @click.option("--out", "-o", required=True, type=click.Path(dir_okay=False),
                  help="Profile YAML to write (rank 0); give it to other commands as --profile FILE.")
    @click.option("--json", "as_json", is_flag=True, help="Also print the constants it gives as JSON.")
    def profile_cmd(model, hardware, seq, mbs, tps, max_mib, warmup, iters, out, as_json):
        """Measure this machine: the model's GEMMs and attention, a memory copy, collectives.

        Run one process per device with the launcher you use for training; rank 0
        writes the profile YAML (device, library versions, date, raw timings).
        estimate, explain, sweep and compare then take --profile FILE and use the
        measured constants instead of the catalog's (GEMM rates interpolated in log space
        at the planned model's shapes); `ndplan explain` names them. Needs torch. The
        collectives run on NCCL (CUDA), HCCL (Ascend, with torch_npu) or, on CPU, gloo:
        all-reduce, all-gather, reduce-scatter, all-to-all and send/recv.

        \b
        Examples:
          ndplan profile -m llama3-8b -H h100-sxm --seq 256 --iters 2 --warmup 1 -o prof.yaml
          torchrun --nproc_per_node 8 -m ndplan profile -m llama3-70b -H h100-sxm --tp 1,2,4,8 -o h100.yaml
          ndplan estimate -m llama3-8b -H h100-sxm --dp 8 --gbs 64 --profile examples/profile/cpu_gloo_2ranks.yaml
        """
        from ndplan.catalog import load_hardware, load_model
        from ndplan.errors import NdplanError
        from ndplan.strategy import Strategy
        target = output_file("--out", out)
        spec, hw = load_model(model), load_hardware(hardware)
        for t in tps:  # the timed shapes must be ones a run at that tp has (heads, widths divide)
            Strategy(tp=t, seq=seq, mbs=mbs, gbs=mbs, zero=0).check(spec, t)
        try:
            import torch  # noqa: F401
        except ImportError:
            raise NdplanError("profile", "torch", "not installed", "pip install torch (or 'ndplan[trace]')") from None
        from ndplan import profile_file, profile_run
        doc = profile_run.run(spec, hw.name, seq, mbs, tps, max_mib, warmup, iters,
                              progress=lambda msg: click.echo(f"profile: {msg}", err=True))
        if doc is None:  # not rank 0
            return
        profile_run.write(doc, target)
        found = profile_file.overrides(doc, hw, spec, seq, tps[0], where=f"profile {out}")
        if as_json:
            click.echo(json.dumps({k: v for k, (v, _) in found.items()}, indent=2))
            return
        click.echo(f"wrote {out}: {len(doc['gemm'])} GEMMs, {len(doc['attention'])} attention shapes, "
                   f"{len(doc['collectives'])} collective timings on {doc['meta']['world']} rank(s)")
        for k, (v, _) in found.items():
            click.echo(f"  {k:24s} {v:.4g}")
        click.echo(f"use it as --profile {out} with estimate, explain, sweep and compare")
