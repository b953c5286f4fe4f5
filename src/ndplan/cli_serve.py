"""``ndplan serve``: thin command over ndplan.serve (search.py, estimate.py)."""

from __future__ import annotations

import functools
import json

import click

from ndplan import limits
from ndplan.cli_options import MODEL, apply
from ndplan.cli_types import DEGREE, DEVICES, FRACTION, SEQ, TOP, Count, Real
from ndplan.report import cli as report_cli
from ndplan.serve.emit import EMIT_ENGINES
from ndplan.serve.engines import ENGINES
from ndplan.serve.layout import A2A_BACKENDS, KV_DTYPES, WEIGHT_DTYPES


def _rows_text(rows, top: int) -> list[str]:
    lines = [f"{'tp':>3s} {'pp':>3s} {'ep':>3s} {'dpa':>4s} {'repl':>5s} {'conc':>6s} {'KV tokens':>11s} "
             f"{'TTFT ms':>9s} {'TPOT ms':>8s} {'out tok/s/GPU':>14s}  verdict (tok/s over every GPU of --gpus)"]
    for r in rows[:top]:
        e, lay = r.estimate, r.estimate.layout
        verdict = "meets" if r.meets else f"no: {r.why}"
        lines.append(f"{lay.tp:3d} {lay.pp:3d} {lay.ep:3d} {lay.dp_attention:4d} {r.replicas:5d} {e.concurrency:6d} "
                     f"{e.kv_cache_tokens:11,d} {e.ttft_s * 1e3:9.1f} {e.tpot_s * 1e3:8.2f} "
                     f"{r.per_budget_gpu:14.1f}  {verdict}")
    return lines


def _check_lengths(spec, isl: int, osl: int, max_model_len: int | None) -> None:
    from ndplan.errors import NdplanError
    context = max_model_len or spec.max_position_embeddings
    if spec.max_position_embeddings and max_model_len and max_model_len > spec.max_position_embeddings:
        raise NdplanError("--max-model-len", max_model_len, f"above {spec.name}'s context of "
                          f"{spec.max_position_embeddings:,} tokens", "give at most the model's max_position_embeddings")
    if context and isl + osl > context:
        raise NdplanError("--isl", isl, f"ISL + OSL = {isl + osl:,} tokens is above the context of {context:,}",
                          "shorten the request or raise --max-model-len (up to the model's context)")


def _disaggregate(spec, hw, kw: dict, rate, as_json: bool) -> None:
    from ndplan.errors import NdplanError
    from ndplan.serve.disagg import disaggregated
    if rate is None:
        raise NdplanError("--disaggregate", True, "needs a request rate", "give --rate")
    args = {k: kw[k] for k in ("isl", "osl", "ttft_s", "tpot_s", "recipe", "kv_dtype", "engine_name", "mem_fraction")}
    pools = disaggregated(spec, hw, rate=rate, **args)
    total = sum(p.gpus for p in pools.values())
    if as_json:
        click.echo(json.dumps({"gpus": total, **{k: p.to_json() for k, p in pools.items()}}, indent=2))
        return
    click.echo(f"{spec.name} on {hw.name}, {rate:g} req/s of ISL {kw['isl']} / OSL {kw['osl']}, disaggregated: "
               f"{total} GPUs")
    for role, p in pools.items():
        lay = p.layout
        what = f"TTFT {p.latency_s * 1e3:.0f} ms" if role == "prefill" else f"TPOT {p.latency_s * 1e3:.1f} ms"
        click.echo(f"  {role:8s} {p.instances} x (tp {lay.tp}, pp {lay.pp}, ep {lay.ep}, dpa {lay.dp_attention}) = "
                   f"{p.gpus} GPUs, {p.requests_per_s:.3g} req/s each, {what}")


def _explained(spec, hw, row, kw: dict, isl: int, osl: int) -> list[dict]:
    from ndplan.serve.explain import explain_rows
    return explain_rows(spec, hw, row.estimate, kw["recipe"], kw["kv_dtype"], isl, osl)


def _launch(engine_name: str, model: str, row, kw: dict, mem_fraction, max_model_len: int) -> str:
    from ndplan.serve.emit import launch
    from ndplan.serve.engines import engine
    eng = engine(engine_name)
    return launch(engine_name, model, row.estimate, kw["recipe"], kw["kv_dtype"],
                  eng.default_fraction if mem_fraction is None else mem_fraction, max_model_len, eng.max_seqs,
                  eng.max_tokens)


SERVE_OPTIONS = [
    click.option("--gpus", type=DEVICES, default=8, show_default=True, help="GPUs to serve on (replicas fill them)."),
    click.option("--isl", type=SEQ, required=True, help="Input (prompt) tokens per request."),
    click.option("--osl", type=SEQ, required=True, help="Output tokens per request."),
    click.option("--concurrency", type=Count(hi=10 ** 9, what="a number of requests"), default=None,
                 help="Requests in flight over all replicas (default: max load, every replica as full as its "
                      "KV cache and the engine's batch limit allow)."),
    click.option("--rate", type=Real(lambda f, v: limits.real(f, v, 0.0, 1e9, what="requests per second")),
                 default=None, help="Requests per second over all replicas (instead of --concurrency)."),
    click.option("--ttft-ms", type=Real(lambda f, v: limits.real(f, v, 0.0, 1e9, what="milliseconds")), default=None,
                 help="Latency limit: time to first token."),
    click.option("--tpot-ms", type=Real(lambda f, v: limits.real(f, v, 0.0, 1e9, what="milliseconds")), default=None,
                 help="Latency limit: time per output token."),
    click.option("--tp", type=DEGREE, default=None, help="Fix the tensor-parallel degree (default: search)."),
    click.option("--pp", type=DEGREE, default=None, help="Fix the pipeline-parallel degree."),
    click.option("--ep", type=DEGREE, default=None, help="Fix the expert-parallel degree (divides tp)."),
    click.option("--dp-attention", type=DEGREE, default=None,
                 help="Fix the attention data-parallel degree (divides tp; SGLang --enable-dp-attention --dp, "
                      "TensorRT-LLM enable_attention_dp: = tp)."),
    click.option("--ep-a2a", type=click.Choice(list(A2A_BACKENDS)), default=None,
                 help="The MoE dispatch/combine under --ep: nccl (default; each token sent once per destination "
                      "rank) or deepep (DeepEP's kernels: one RDMA copy per destination node, fp8 dispatch under "
                      "--weight-dtype fp8; SGLang --moe-a2a-backend deepep, vLLM --all2all-backend "
                      "deepep_high_throughput)."),
    click.option("--engine", "engine_name", type=click.Choice(list(ENGINES)), default=None,
                 help="Serving engine: its KV-pool rule, page size and batch limits (default: --emit's, else vllm)."),
    click.option("--emit", "emit_engine", type=click.Choice(list(EMIT_ENGINES)), default=None,
                 help="Print the best layout's launch command for that engine (vllm serve, sglang.launch_server, "
                      "trtllm-serve with its --config file)."),
    click.option("--engine-mem-fraction", type=FRACTION, default=None,
                 help="The engine's own memory knob: vLLM gpu_memory_utilization (of total, default 0.9), SGLang "
                      "mem_fraction_static (weights + KV of total, 0.88), TensorRT-LLM free_gpu_memory_fraction "
                      "(of what is free after loading, 0.9)."),
    click.option("--max-model-len", type=SEQ, default=None,
                 help="Longest request the engine accepts (default: the model's context)."),
    click.option("--kv-dtype", type=click.Choice(list(KV_DTYPES)), default="bf16", show_default=True,
                 help="KV-cache dtype."),
    click.option("--weight-dtype", type=click.Choice(list(WEIGHT_DTYPES)), default="bf16", show_default=True,
                 help="Weights of the decoder layers' linears (int4: weight-only, group 128)."),
    click.option("--find-min-gpus", is_flag=True,
                 help="Find the fewest GPUs (powers of two) that carry the load (--rate or --concurrency) "
                      "within the latency limits."),
    click.option("--disaggregate", is_flag=True,
                 help="Size a prefill pool and a decode pool apart for --rate (prefill-decode disaggregation): "
                      "each pool's layout needing the fewest GPUs (up to 64 per instance; --gpus is not used), "
                      "TTFT with the KV cache's transfer, TPOT without prompts in the step."),
    click.option("--top", type=TOP, default=10, show_default=True, help="Rows to print."),
    click.option("--json", "as_json", is_flag=True, help="Print every layout as JSON."),
    report_cli._REPORT,
    click.option("--explain", "explain", is_flag=True,
                 help="Print the first layout's Terms: value, unit, source and closed form (memory over tp "
                      "and dpa, the step over the batch B, context CTX, prompt tokens P and their context PCTX)."),
]
"""ndplan serve's options after -m/-H, in --help order."""


def _settings(spec, o: dict) -> dict:
    """The search's keyword arguments from the options, after the checks that need no search
    (one-line errors)."""
    from ndplan.errors import NdplanError
    from ndplan.serve.layout import WeightRecipe
    _check_lengths(spec, o["isl"], o["osl"], o["max_model_len"])
    if o["engine_name"] and o["emit_engine"] and o["engine_name"] != o["emit_engine"]:
        raise NdplanError("--emit", o["emit_engine"], f"differs from --engine {o['engine_name']}, whose memory rule "
                          "was planned", "give the same engine to both, or --emit alone")
    if o["find_min_gpus"] and o["concurrency"] is None and o["rate"] is None:
        raise NdplanError("--find-min-gpus", True, "needs a load", "give --rate or --concurrency")
    if o["find_min_gpus"] and o["report_path"]:
        raise NdplanError("--report", o["report_path"], "reports the search on --gpus, not --find-min-gpus",
                          "run the search at the GPU count found, with --report")
    if o["disaggregate"]:
        given = [flag for flag, key in (("--tp", "tp"), ("--pp", "pp"), ("--ep", "ep"), ("--dp-attention", "dp_attention"),
                                        ("--concurrency", "concurrency"), ("--emit", "emit_engine"),
                                        ("--explain", "explain"), ("--find-min-gpus", "find_min_gpus"),
                                        ("--report", "report_path"), ("--ep-a2a", "ep_a2a")) if o[key]]
        if given:
            raise NdplanError(given[0], True, "does not apply to --disaggregate, which sizes both pools itself",
                              "leave it out")
    _check_a2a(spec, o)
    ms = lambda v: None if v is None else v / 1e3  # noqa: E731
    return dict(isl=o["isl"], osl=o["osl"], concurrency=o["concurrency"], rate=o["rate"], ttft_s=ms(o["ttft_ms"]),
                tpot_s=ms(o["tpot_ms"]), recipe=WeightRecipe(o["weight_dtype"]), kv_dtype=o["kv_dtype"],
                engine_name=o["engine_name"] or o["emit_engine"] or "vllm", mem_fraction=o["engine_mem_fraction"],
                fixed={k: o[k] for k in ("tp", "pp", "ep", "dp_attention") if o[k]}
                | ({"a2a": o["ep_a2a"]} if o["ep_a2a"] else {}))


def _check_a2a(spec, o: dict) -> None:
    """--ep-a2a deepep only where it acts: a MoE model, expert parallelism, an engine with DeepEP."""
    from ndplan.errors import NdplanError
    if o["ep_a2a"] != "deepep":
        return
    engine_name = o["engine_name"] or o["emit_engine"] or "vllm"
    if not spec.is_moe:
        raise NdplanError("--ep-a2a", "deepep", f"{spec.name} has no experts to dispatch", "leave --ep-a2a out")
    if o["ep"] == 1:
        raise NdplanError("--ep-a2a", "deepep", "given with --ep 1 (no all-to-all)", "give --ep above 1, or drop it")
    if engine_name.startswith("trtllm"):
        raise NdplanError("--ep-a2a", "deepep", f"engine {engine_name} has no DeepEP backend in ndplan's model "
                          "(its MoE communication is its own)", "use --engine vllm or sglang, or drop --ep-a2a")


def _min_gpus(spec, hw, kw: dict, as_json: bool) -> None:
    from ndplan.errors import NdplanError
    from ndplan.serve.search import min_gpus
    found = min_gpus(spec, hw, **kw)
    if found is None:
        raise NdplanError("--find-min-gpus", True, f"no GPU count up to {limits.MAX_DEVICES:,} carries the load "
                          "within the limits", "lower the load or relax --ttft-ms / --tpot-ms")
    gpus, row = found
    if as_json:
        click.echo(json.dumps({"min_gpus": gpus, "best": row.to_json()}, indent=2))
        return
    click.echo(f"fewest GPUs: {gpus} ({spec.name} on {hw.name}, {kw['engine_name']}, ISL {kw['isl']} / OSL {kw['osl']})")
    for line in _rows_text([row], 1):
        click.echo(line)


def _check_rows(spec, hw, gpus: int, rows, kw: dict) -> None:
    """One-line errors when no layout fits, the rate is above every layout, or no layout meets a limit
    (naming the best one reached)."""
    from ndplan.errors import NdplanError
    if not any(r.estimate.fits for r in rows):
        raise NdplanError("--gpus", gpus, f"no layout of {spec.name} fits its weights and one request's KV cache "
                          f"on {gpus} x {hw.name}", "add GPUs, use --weight-dtype fp8 or int4, or raise "
                          "--engine-mem-fraction")
    if kw["rate"] is not None and not any(r.total_output_tokens_per_s for r in rows):
        raise NdplanError("--rate", kw["rate"], "above every layout's max-load throughput", "lower the rate or add GPUs")
    if any(r.meets for r in rows) or (kw["ttft_s"] is None and kw["tpot_s"] is None):
        return
    by_tpot = kw["tpot_s"] is not None
    best = min((r for r in rows if r.estimate.fits),
               key=lambda r: r.estimate.tpot_s if by_tpot else r.estimate.ttft_s)
    field, value = ("--tpot-ms", kw["tpot_s"] * 1e3) if by_tpot else ("--ttft-ms", kw["ttft_s"] * 1e3)
    raise NdplanError(field, value, f"no layout meets it; the best is TPOT {best.estimate.tpot_s * 1e3:.1f} ms / TTFT "
                      f"{best.estimate.ttft_s * 1e3:.0f} ms at tp {best.estimate.layout.tp}, pp {best.estimate.layout.pp}",
                      "relax the limit, lower the load or add GPUs")


def _layout_label(r) -> str:
    lay = r.estimate.layout
    return (f"tp{lay.tp}/pp{lay.pp}{'/ep' + str(lay.ep) if lay.ep > 1 else ''}"
            f"{'/dpa' + str(lay.dp_attention) if lay.dp_attention > 1 else ''}")


def _print_search(spec, hw, o: dict, kw: dict, rows, command, terms) -> None:
    from ndplan.serve.search import pareto
    good = [r for r in rows if r.meets]
    click.echo(f"{spec.name} on {o['gpus']} x {hw.name}, {kw['engine_name']}, ISL {kw['isl']} / OSL {kw['osl']}, weights "
               f"{o['weight_dtype']}, KV {kw['kv_dtype']}: {len(rows)} layouts, {len(good)} meet the limits")
    for line in _rows_text(rows, o["top"]):
        click.echo(line)
    click.echo("Pareto front (TPOT vs output tok/s/GPU): " + ", ".join(
        f"{_layout_label(r)} {r.estimate.tpot_s * 1e3:.1f} ms {r.per_budget_gpu:.0f}" for r in pareto(rows)))
    for t in terms or ():
        click.echo(f"{t['key']} = {t['value']:.6g} {t['unit']}  ({t['source']}; {t['note']})")
        click.echo(f"    = {t['formula']}")
    if command:
        click.echo(f"launch ({o['emit_engine']}, the first layout, one replica):")
        click.echo(command)


def _report_inputs(spec, hw, o: dict, kw: dict, rows) -> dict:
    limits_ms = {k: v * 1e3 for k, v in (("TTFT limit ms", kw["ttft_s"]), ("TPOT limit ms", kw["tpot_s"])) if v}
    load = ({"concurrency": kw["concurrency"]} if kw["concurrency"] else {"rate req/s": kw["rate"]} if kw["rate"]
            else {"load": "max load"})
    return {"model": spec.name, "hardware": hw.name, "gpus": o["gpus"], "engine": kw["engine_name"], "isl": kw["isl"],
            "osl": kw["osl"], **load, **limits_ms, "weights": o["weight_dtype"], "kv cache": kw["kv_dtype"],
            "layouts": f"{len(rows)}, {sum(r.meets for r in rows)} meet the limits"}


def _search(spec, hw, o: dict, kw: dict) -> None:
    from ndplan.serve.search import pareto, serve_search
    rows = serve_search(spec, hw, o["gpus"], **kw)
    _check_rows(spec, hw, o["gpus"], rows, kw)
    good = [r for r in rows if r.meets]
    first = good[0] if good else rows[0]
    command = (_launch(o["emit_engine"], o["model"], first, kw, o["engine_mem_fraction"],
                       o["max_model_len"] or kw["isl"] + kw["osl"]) if o["emit_engine"] else None)
    terms = _explained(spec, hw, first, kw, kw["isl"], kw["osl"]) if o["explain"] or o["report_path"] else None
    report_cli.serve(_report_inputs(spec, hw, o, kw, rows), rows, pareto(rows), terms, o)
    terms = terms if o["explain"] else None
    if o["as_json"]:
        click.echo(json.dumps({"model": spec.name, "hardware": hw.name, "gpus": o["gpus"], "engine": kw["engine_name"],
                               "isl": kw["isl"], "osl": kw["osl"], "candidates": [r.to_json() for r in rows],
                               "pareto": [r.to_json() for r in pareto(rows)], "launch": command,
                               "terms": terms}, indent=2))
        return
    _print_search(spec, hw, o, kw, rows, command, terms)
    if not good:
        raise SystemExit(1)


def register(main):
    @main.command("serve")
    @functools.partial(apply, MODEL + SERVE_OPTIONS)
    def serve_cmd(**o):
        """Plan serving: memory, KV capacity, latency and throughput of every layout.

        Sweeps tp, pp, ep and attention-DP on the GPU budget (replicas fill it), runs each
        at the load given (or at max load) and ranks the layouts by output tokens/s over
        the budget's GPUs among those meeting the latency limits (a load that queues does
        not meet them); prints the TPOT / throughput Pareto front. A fixed layout is --tp/--pp/--ep/--dp-attention. Roofline prefill and decode
        steps, the engine's KV-pool rule and continuous batching (src/ndplan/serve/).

        \b
        Examples:
          ndplan serve -m llama3.1-8b -H h100-sxm --gpus 1 --isl 1000 --osl 1000
          ndplan serve -m llama3.1-70b -H h100-sxm --gpus 8 --isl 2000 --osl 500 --tpot-ms 50 --weight-dtype fp8
          ndplan serve -m llama3.1-70b --gpus 2 --tp 2 --isl 5000 --osl 500 --concurrency 50 --engine trtllm --json
          ndplan serve -m qwen3-30b-a3b -H h100-sxm --isl 1000 --osl 1000 --rate 20 --ttft-ms 500 --find-min-gpus
          ndplan serve -m qwen3-235b-a22b -H h200 --gpus 8 --isl 1024 --osl 1024 --weight-dtype fp8 --emit trtllm
          ndplan serve -m llama3.1-70b -H h100-sxm --isl 2000 --osl 500 --rate 20 --ttft-ms 1000 --tpot-ms 50 --disaggregate
        """
        from ndplan.catalog import load_hardware, load_model
        spec, hw = load_model(o["model"]), load_hardware(o["hardware"])
        kw = _settings(spec, o)
        if o["disaggregate"]:
            _disaggregate(spec, hw, kw, o["rate"], o["as_json"])
        elif o["find_min_gpus"]:
            _min_gpus(spec, hw, kw, o["as_json"])
        else:
            _search(spec, hw, o, kw)
