"""``ndplan balance``: thin command over ndplan.ppb (pipeline balancing with CP-SAT)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ndplan.cli_emit import check_emit_out, emit_cli, emit_options, one_stdout
from ndplan.errors import NdplanError, warn
from ndplan import limits
from ndplan.cli_types import Count, Real
from ndplan.paths import output_file
from ndplan.ppb.instance import Instance, Pipeline, layers_from_doc, load_layer_doc, stage_constant_bytes
from ndplan.ppb.userplan import user_plan as user_plan_of
from ndplan.ppb.config import DEFAULT_DETERMINISTIC_TIME, DEFAULT_TIME_LIMIT_S, DEFAULT_WORKERS
from ndplan.ppb.scale import TIME_UNIT_S, Scale
from ndplan.report import cli as report_cli
from ndplan.vocab import PPB_RECOMPUTE_MODES as MODES
from ndplan.vocab import SCHEDULES
from ndplan.units import GIB, fmt_bytes, fmt_seconds
from ndplan.points import default_schedule


def _budget(meta: dict, budget_gib, hardware, reserve_gib) -> int:
    """Given budget, or the hardware's HBM minus the reserve (default: the layer file's
    overhead_bytes); ``meta`` is the parsed layer file."""
    if budget_gib is not None:
        if hardware is not None or reserve_gib is not None:
            raise NdplanError("--budget-gib", budget_gib, "given with --hardware/--reserve-gib",
                              "give either --budget-gib or --hardware (and --reserve-gib)")
        return int(budget_gib * GIB)
    if hardware is not None:
        from ndplan.catalog import load_hardware
        hw = load_hardware(hardware)
        hbm = hw.hbm_bytes
        if meta.get("hardware") not in (None, hw.name):
            warn("--hardware", hardware, f"differs from the layer file's hardware {meta['hardware']}",
                 "the layer times stay those of the file; only the memory budget comes from --hardware")
    elif "hbm_bytes" in meta:
        hbm = limits.real("hbm_bytes", meta["hbm_bytes"], 0.0, limits.MAX_GIB * GIB, what="bytes (in the layer file)")
    else:
        raise NdplanError("--budget-gib", None, "no memory budget", "give --budget-gib, or --hardware (HBM minus --reserve-gib)")
    if reserve_gib is not None:
        reserve = reserve_gib * GIB
    else:
        reserve = limits.real("overhead_bytes", meta.get("overhead_bytes", 0), 0.0, limits.MAX_GIB * GIB,
                              lo_open=False, what="bytes (in the layer file)")
    if reserve >= hbm:
        raise NdplanError("--reserve-gib", reserve / GIB, f"leaves nothing of the device's {hbm / GIB:g} GiB",
                          "give a smaller reserve, or --budget-gib")
    return int(hbm - reserve)


def _auto(inst, pp, vpp, m, cfg):
    """--schedule auto: every schedule balanced (ppb/auto.py); (choices, the recommended result)."""
    from ndplan.ppb.auto import candidates, choose
    n = len(candidates(pp, vpp))
    choices, best = choose(inst.layers, pp, vpp, m, inst.pipeline.budget_bytes, cfg,
                           lambda i, name: click.echo(f"balancing {name} ({i + 1}/{n})", err=True))
    if best is None:
        raise NdplanError("--schedule", "auto", f"no schedule's plan fits the budget "
                          f"{fmt_bytes(inst.pipeline.budget_bytes)}", "raise --budget-gib, or give more stages or "
                          "recompute in the layer file")
    return choices, best.result


def _print_choices(choices, inst) -> None:
    click.echo("schedule     vpp  balanced    even split  status")
    for c in choices:
        j = c.to_json()
        step = fmt_seconds(j["balanced_step_s"]) if j["balanced_step_s"] else "-"
        even = fmt_seconds(j["even_step_s"]) if j["even_step_s"] else "does not fit"
        click.echo(f"{c.schedule:<12} {c.vpp:>3}  {step:<11} {even:<11} {j['why'] or j['status']}")
    click.echo(f"recommended: {inst.pipeline.schedule} (vpp {inst.pipeline.vpp}); its plan:")


def _index_note(layers) -> str:
    """What the layer indices of the table count."""
    n = len(layers) - 1
    if layers[0].kind == "embedding" and layers[-1].kind == "head":
        return (f"layers are indices into the layer file: 0 is the embedding, {n} the head (and loss); "
                f"decoder layer i is index i+1")
    return f"layers are indices 0..{n} into the layer file's entries (embedding and head count as layers)"


def _ranges(layers: list[int]) -> str:
    return f"{layers[0]}-{layers[-1]}" if layers else "-"


def _emit_balanced(meta: dict, res, fmt: str, out: str | None) -> bool:
    """--emit the balanced plan with the strategy the layer file was exported at
    (``ndplan estimate --export-layers``), pp/vpp/m/schedule from this command."""
    from ndplan.catalog import load_model
    from ndplan.export import Balance
    from ndplan.ppb.result import balanced_strategy
    if not isinstance(meta.get("strategy"), dict) or "model" not in meta:
        raise NdplanError("--emit", fmt, "the layer file has no model and strategy",
                          "export it with `ndplan estimate --export-layers`")
    strat = balanced_strategy(meta["strategy"], res.inst, res.plan)
    return emit_cli(fmt, out, load_model(meta["model"]), strat, balance=Balance(res.inst, res.plan))


def _check_outputs(emit_fmt, emit_out, as_json, as_csv, timeline) -> None:
    """Before any work: the output options fit together and their paths can be written."""
    check_emit_out(emit_fmt, emit_out)
    one_stdout(json=as_json, csv=as_csv, emit=emit_fmt and not emit_out)
    if timeline:
        if not str(timeline).lower().endswith(".svg"):
            raise NdplanError("--timeline", timeline, "the timeline is an SVG drawing", "end the path in .svg")
        output_file("--timeline", timeline)


def _print_forms(out: dict) -> None:
    mf, mg = out["mindformers"], out["megatron"]
    click.echo(f"MindFormers: {mf['error'] if 'error' in mf else json.dumps(mf)}")
    if "error" in mg:
        click.echo(f"Megatron-LM: {mg['error']}")
        return
    click.echo("Megatron-LM: " + (" ".join(mg["args"]) or "(even split, no recompute: no extra flags)"))
    for n in mg["notes"]:
        click.echo(f"  note: {n}")


def _print_text(out: dict, res) -> None:
    """The human-readable answer: status, per-stage table, baselines, framework forms."""
    sol, sim, pipe = res.solution, res.simulation, res.inst.pipeline
    gap = f", gap {sol.gap:.2%}" if sol.gap else ""
    click.echo(f"{sol.status}: step {fmt_seconds(sol.objective_s)} (bound {fmt_seconds(sol.bound_s)} from "
               f"{sol.bound_source}{gap}; "
               f"replay {fmt_seconds(sim.step_s)}) in {sol.wall_s:.1f} s; budget {fmt_bytes(pipe.budget_bytes)}")
    click.echo(_index_note(res.inst.layers))
    comm = any(m in r["recompute"] for r in out["stages"] for m in ("comm", "selective+comm"))
    click.echo("stage chunk  layers      full " + ("s+c comm " if comm else "") +
               "sel  t/mb      peak        bubble    imbalance recompute")
    for r in out["stages"]:
        rec = r["recompute"]
        both = f"{rec.count('selective+comm'):>3} {rec.count('comm'):>4} " if comm else ""
        click.echo(f"{r['stage']:>5} {r['chunk']:>5}  {_ranges(r['layers']):<10} {rec.count('full'):>4} {both}"
                   f"{rec.count('selective'):>3}  {fmt_seconds(r['time_s']):<9} "
                   f"{fmt_bytes(r['peak_bytes']):<11} {fmt_seconds(r['bubble_s']):<9} "
                   f"{fmt_seconds(r['imbalance_s']):<9} {fmt_seconds(r['recompute_s'])}")
    for name, c in out["baselines"].items():
        click.echo(f"vs {name:<13} {fmt_seconds(c['objective_s']):<10} "
                   f"{'fits' if c['fits'] else 'does not fit'}; gain {c['gain']:+.1%}")
    _print_forms(out)


def _no_plan(res, out: dict, as_json: bool, time_limit, budget) -> None:
    """No plan: the JSON answer, or the one error line (infeasible budget, or the limit)."""
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    if res.diagnosis is not None:
        raise NdplanError("budget", fmt_bytes(res.inst.pipeline.budget_bytes), res.diagnosis.message(),
                          "raise --budget-gib, or give more stages or recompute in the layer file")
    flag, value = ("--time-limit", time_limit) if time_limit is not None else ("--deterministic-time", budget)
    raise NdplanError(flag, value, f"solver status {res.solution.status}: no plan found", "raise it")


def _instance(doc: dict, pp, vpp, m, schedule, budget) -> Instance:
    """The instance of the layer file under the options; the budget less what every stage holds
    besides its layers (SAPP's stage_const_mem, instance.stage_constant_bytes)."""
    layers = layers_from_doc(doc)
    total, const = _budget(doc, *budget), stage_constant_bytes(doc)
    if const >= total:
        raise NdplanError("stage_const_mem", fmt_bytes(const), f"leaves nothing of the budget {fmt_bytes(total)}",
                          "raise --budget-gib, or lower stage_const_mem in the layer file")
    pipe = Pipeline(pp=pp, vpp=vpp, m=m, schedule=schedule or default_schedule(vpp), budget_bytes=total - const)
    return Instance(layers=layers, pipeline=pipe)


def _seconds(what: str):
    return Real(lambda f, v: limits.real(f, v, 0.0, limits.MAX_TIME_LIMIT_S, what=what))


OPTIONS = [
    click.option("--layers", "layers_file", required=True, type=click.Path(dir_okay=False),
                 help="Layer description (ndplan-layers/1 JSON/YAML, or a SAPP layers_description file)."),
    click.option("--pp", type=Count(hi=limits.MAX_PP, what="a stage count"), required=True, help="Pipeline stages."),
    click.option("--vpp", type=Count(hi=limits.MAX_PP, what="a chunk count"), default=1, show_default=True,
                 help="Chunks per stage."),
    click.option("--m", "m", type=Count(hi=limits.MAX_MICROBATCHES, what="a micro-batch count"), required=True,
                 help="Micro-batches per step."),
    click.option("--schedule", type=click.Choice((*SCHEDULES, "auto")), default=None,
                 help="Default: 1f1b, interleaved if vpp>1. auto: balance every schedule (one-chunk ones at vpp 1, "
                      "interleaved at --vpp or 2, zbv, dualpipe, dualpipev at 2), each with the whole budget, and recommend the fastest "
                      "that fits."),
    click.option("--budget-gib", type=Real(limits.gib), default=None, help="Per-device memory for static + activations."),
    click.option("--hardware", "-H", default=None, help="Budget = this device's HBM minus --reserve-gib."),
    click.option("--reserve-gib", type=Real(lambda f, v: limits.gib(f, v, lo_open=False)), default=None,
                 help="Default: the layer file's overhead_bytes."),
    click.option("--deterministic-time", type=_seconds("CP-SAT deterministic time units"), default=None,
                 help=f"The solver's budget in CP-SAT deterministic time (default {DEFAULT_DETERMINISTIC_TIME:g}: "
                      "about 9 s on 2 cores for 96 layers x 16 stages x vpp 2): the same plan on every machine "
                      "and under any load, for given --workers."),
    click.option("--time-limit", type=_seconds("seconds"), default=None,
                 help=f"Instead: a wall-clock budget, e.g. {DEFAULT_TIME_LIMIT_S:g} (CP-SAT passes and local "
                      "search); the plan found then depends on the machine and its load."),
    click.option("--workers", type=Count(hi=limits.MAX_WORKERS, what="a worker count"), default=DEFAULT_WORKERS,
                 show_default=True, help="CP-SAT search workers. A fixed count, not the machine's cores: the plan "
                                         "found within a limit depends on it, so fixing it keeps results comparable."),
    click.option("--time-resolution-us", type=Real(lambda f, v: limits.real(f, v, 0.0, 1e6, what="microseconds")),
                 default=TIME_UNIT_S * 1e6, show_default=True, help="Time unit of the CP-SAT model."),
    click.option("--plan", "user_plan", default=None,
                 help="A plan to replay and compare: layers per virtual stage (the layer file's layers, embedding "
                      "and head included), e.g. 21,20,20,21; a Megatron-LM layout, e.g. 'Et*20|t*20|t*20|t*20L'; "
                      "or a MindFormers YAML/JSON file with offset and recompute, select_recompute and "
                      "select_comm_recompute."),
    click.option("--plan-recompute", default=None,
                 help=f"Recompute of a sizes or layout --plan: one mode for every layer, or one per layer, "
                      f"comma-separated ({', '.join(MODES)})."),
    click.option("--timeline", type=click.Path(dir_okay=False), default=None, help="Write an SVG timeline here."),
    click.option("--json", "as_json", is_flag=True),
    emit_options,
    report_cli.report_csv_options,
]
"""``ndplan balance``'s options, top to bottom as --help lists them."""


def register(main: click.Group) -> None:
    def balance_cmd(layers_file, pp, vpp, m, schedule, budget_gib, hardware, reserve_gib, time_limit,
                    deterministic_time, workers, time_resolution_us, user_plan, plan_recompute, timeline, as_json,
                    emit_fmt, emit_out, **report_kw):
        """Stage-layer allocation and per-layer recompute that minimise step time under a memory budget.

        \b
        Example:
          ndplan estimate -m llama3-70b --tp 8 --pp 4 --dp 2 --gbs 64 --export-layers l70.yaml
          ndplan balance --layers l70.yaml --pp 4 --m 32 -H h100-sxm --json
          ndplan balance --layers l70.yaml --pp 4 --m 32 -H h100-sxm --emit mindformers
          ndplan balance --layers l70.yaml --pp 4 --m 32 -H h100-sxm --schedule auto --deterministic-time 1
        """
        _check_outputs(emit_fmt, emit_out, as_json, report_kw.get("report_csv"), timeline)
        doc = load_layer_doc(layers_file)
        auto = schedule == "auto"
        if auto and user_plan is not None:
            raise NdplanError("--plan", user_plan, "given with --schedule auto, which balances several schedules "
                              "(each its own split)", "give the plan's --schedule, or drop --plan")
        inst = _instance(doc, pp, vpp, m, None if auto else schedule, (budget_gib, hardware, reserve_gib))
        from ndplan.ppb.result import balance  # ortools: import on use (0.3 s)
        from ndplan.ppb.config import Config
        if time_limit is not None and deterministic_time is not None:
            raise NdplanError("--time-limit", time_limit, "given with --deterministic-time",
                              "give one budget: --deterministic-time (reproducible) or --time-limit (wall clock)")
        cfg = Config(time_limit_s=time_limit, deterministic_time=deterministic_time or DEFAULT_DETERMINISTIC_TIME,
                     workers=workers, scale=Scale(time_s=time_resolution_us * 1e-6))
        choices = None
        if auto:
            choices, res = _auto(inst, pp, vpp, m, cfg)
            inst = res.inst
        else:
            res = balance(inst, cfg, user_plan_of(inst, user_plan, plan_recompute))
        out = res.as_dict()
        if choices is not None:
            out["schedules"] = [c.to_json() for c in choices]
            out["recommended"] = {"schedule": inst.pipeline.schedule, "vpp": inst.pipeline.vpp}
        if res.plan is None:
            return _no_plan(res, out, as_json, time_limit, cfg.deterministic_time)
        if timeline:
            from ndplan.ppb.svg import timeline_svg
            Path(timeline).write_text(timeline_svg(res.simulation, f"{inst.pipeline.schedule} pp={pp} vpp={inst.pipeline.vpp} m={m}"))
            out["timeline"] = timeline
        inputs = {"layers": layers_file, "pp": pp, "vpp": inst.pipeline.vpp, "m": m, "schedule": inst.pipeline.schedule}
        if report_cli.balance(out, res.simulation, inputs, report_kw):  # writes --report; True when it printed --csv
            return
        if emit_fmt and _emit_balanced(doc, res, emit_fmt, emit_out):
            return
        if as_json:
            click.echo(json.dumps(out, indent=2))
            return
        if choices is not None:
            _print_choices(choices, inst)
        _print_text(out, res)

    for option in reversed(OPTIONS):
        balance_cmd = option(balance_cmd)
    main.command("balance")(balance_cmd)
