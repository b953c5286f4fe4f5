#!/usr/bin/env python
"""Predicted vs published serving measurements (../shared/validation/inference/cases.yaml; NOTES.md
there defines every metric), per source and metric, like the training benchmarks.

Mapping (one rule per field, the same for every row; a row that cannot be mapped is printed as
unsupported with the reason):

* model: the catalog entry of the same architecture (Llama-3.3-70B has Llama-3.1-70B's; the
  DeepSeek-R1 and V3 rows deepseek-v3's); gpt-oss-120b has no catalog entry.
* hardware: the catalog preset of the GPU; RTX 3090 / RTX PRO 6000 / unnamed 80 GB GPUs have none
  (their memory rows use the logged total_gpu_memory with the H100's rates: memory only).
* engine: trtllm-bench rows (TensorRT-LLM's performance overviews) -> trtllm-bench, whose batch
  limits are trtllm-bench's own tuning heuristic (serve/engines.py trtllm_bench_limits), never a
  per-row batch; NIM and NVIDIA's MLPerf harness -> trtllm; SGLang -> sglang; vLLM -> vllm.
* weights: fp8 when the precision says fp8, else 16-bit; nvfp4 is not modelled. KV cache fp8 where
  the row states it (the DeepSeek rows) and for NVIDIA's ModelOpt FP8 checkpoints, whose
  hf_quant_config.json carries kv_cache_quant_algo FP8 (ModelOpt's export, the form its own
  config-conversion docstring shows), which TensorRT-LLM and vLLM follow at kv dtype "auto".
* layout: tp as published (SGLang's and DeepSeek's EP-n rows: tp = ep = n); attention DP on ->
  dp_attention = tp; data-parallel replicas (MLPerf dp 8 of tp 1) are separate instances; an engine
  naming DeepEP -> ``a2a`` deepep; SGLang's ``--moe-dense-tp-size 1`` -> the dense FFN with the
  attention. Two-batch overlap, which the SGLang rows name, is not modelled (comm and compute add).
* workload: ISL / OSL as published; offline rows run at the max-load rule of serve/estimate.py
  (KV-capacity concurrency capped by the engine's default maximum batch, never a per-row batch);
  online rows at their concurrency; fixed-batch rows at their batch.
* vLLM memory rows: the engine version's profile workspace, max(max_model_len, 2048) tokens
  without chunked prefill (V0), 256 sequences; total memory as logged, else the preset's.

Metrics: output tokens/s per GPU (total / GPUs where the source gives the total), TTFT, ITL/TPOT,
fixed-batch end-to-end latency, prefill input tokens/s per node, decode output tokens/s per node,
KV-cache tokens, weights per GPU. Error = (predicted - measured) / measured.

Usage: python benchmarks/inference_validation.py [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys

import yaml

import ndplan
from ndplan.serve.engines import engine
from ndplan.serve.estimate import StepKernel, batch_latency_s, engine_layout, serve_estimate
from ndplan.serve.layout import ServeLayout, WeightRecipe
from ndplan.units import GIB

from shared_data import validation_dir  # noqa: E402 (benchmarks/shared_data.py)

CASES = validation_dir() / "inference" / "cases.yaml"
SOURCES = {"trtllm_po1_": "trtllm-v1.0", "trtllm_po_": "trtllm-guide", "sglang_": "sglang", "deepseek_": "deepseek",
           "mlperf41_": "mlperf", "nim180_": "nim", "vllm_bk": "vllm-ci", "vllm_pr2031": "vllm-#2031",
           "vllm_i10517": "vllm-#10517", "vllm_pr10511": "vllm-#10511", "vllm_i6746": "vllm-#6746"}
MODELS = (("deepseek", "deepseek-v3"), ("llama-3.3-70b", "llama3.1-70b"), ("llama-3.1-405b", "llama3.1-405b"),
          ("llama-3.1-8b", "llama3.1-8b"), ("llama-3-8b", "llama3-8b"), ("llama-3-70b", "llama3-70b"),
          ("qwen3-235b", "qwen3-235b-a22b"),
          ("mixtral-8x7b", "mixtral-8x7b"), ("llama-2-70b", "llama2-70b"), ("llama-2-7b", "llama2-7b"),
          ("llama2-70b", "llama2-70b"), ("llama 8b", "llama3-8b"), ("llama 70b", "llama3-70b"), ("mixtral", "mixtral-8x7b"))
HARDWARE = {"H100-SXM5-80GB": "h100-sxm", "H200-SXM-141GB": "h200", "B200-180GB": "b200", "H800-SXM-80GB": "h800",
            "A100-SXM4-80GB": "a100-80gb"}
ENGINES = (("trtllm-bench", "trtllm-bench"), ("tensorrt", "trtllm"), ("nim", "trtllm"), ("mlperf", "trtllm"), ("sglang", "sglang"), ("vllm", "vllm"))


class Unsupported(Exception):
    pass


def _model(c):
    name = (c["model"]["name"] + " " + str(c["model"].get("hf_id") or "")).lower()
    for key, cat in MODELS:
        if key in name:
            return ndplan.load_model(cat)
    raise Unsupported(f"no catalog model for {c['model']['name']}")


def _engine(c):
    text = (c["serving"]["engine"] + " " + c["source"]["title"]).lower()
    for key, eng in ENGINES:
        if key in text:
            return eng
    raise Unsupported(f"engine {c['serving']['engine']} not modelled")


def _recipe(c):
    prec = str(c["serving"].get("precision") or "").lower()
    if "fp4" in prec:
        raise Unsupported("fp4 weights not modelled")
    return WeightRecipe("fp8") if "fp8" in prec else WeightRecipe()


def _layout(c, spec):
    s = c["serving"]
    tp = s["tp"] or s["ep"] or 1
    if s["tp"] is None and s["dp"] and not s["ep"]:
        tp = 1
    dpa = tp if s["dp_attention"] is True else 1
    ep = s["ep"] if (s["ep"] and spec.is_moe) else 1
    a2a = "deepep" if "deepep" in str(s["engine"]).lower() else "nccl"
    return ServeLayout(tp=tp, pp=s["pp"] or 1, ep=ep, dp_attention=dpa, a2a=a2a).check(spec)


def _batch(c):
    m = re.match(r"(\d+)", str(c["workload"].get("batch") or ""))
    return int(m.group(1)) if m else None


def predict(c) -> list[tuple[str, float, float]]:
    """[(metric, predicted, measured)] for one case."""
    meas, wl, srv = c["measured"], c["workload"], c["serving"]
    spec, eng_name = _model(c), _engine(c)
    recipe = _recipe(c)
    modelopt_fp8 = "(modelopt)" in c["model"]["name"].lower() and recipe.dtype == "fp8"
    kv_dtype = "fp8" if srv.get("kv_dtype") == "fp8" or modelopt_fp8 else "bf16"
    gpu = c["hardware"]["gpu"]
    hw_name = HARDWARE.get(gpu)
    total = meas.get("total_gpu_memory_gib")
    if hw_name is None and not (c["kind"] in ("kv_capacity", "memory_breakdown") and total):
        raise Unsupported(f"no hardware preset for {gpu}")
    hw = ndplan.load_hardware(hw_name or "h100-sxm")
    layout = _layout(c, spec)
    out = []
    if c["kind"] in ("kv_capacity", "memory_breakdown"):
        mml = srv.get("max_model_len") or spec.max_position_embeddings
        if "405b" in spec.name:  # the July-2024 checkpoint: 16 KV heads, Meta's FP8 recipe (case notes)
            spec = dataclasses.replace(spec, num_key_value_heads=16)
            recipe = WeightRecipe("fp8", keep_pieces=("attn",), keep_layers=(0, spec.num_hidden_layers - 1),
                                  channel_scales=True)
        est = serve_estimate(spec, hw, layout, isl=1, osl=1, recipe=recipe, engine_name="vllm",
                             mem_fraction=srv.get("gpu_memory_utilization") or 0.9, gpu_mem_gib=total,
                             max_tokens=max(mml, 2048), max_seqs=256)
        for key in ("weights_gib", "weights_gb", "weights_gib_per_gpu", "weights_gb_per_gpu"):
            if meas.get(key):
                out.append(("weights", est.weights_bytes / GIB, float(meas[key])))
        if meas.get("gpu_blocks"):
            out.append(("kv_tokens", est.kv_cache_tokens / layout.dp_attention, meas["gpu_blocks"] * 16))
        if meas.get("available_kv_cache_gib"):
            out.append(("kv_gib", est.kv_cache_tokens * est.kv_bytes_per_token / GIB, meas["available_kv_cache_gib"]))
        return out
    isl, osl, conc, batch = wl.get("isl"), wl.get("osl"), wl.get("concurrency"), _batch(c)
    run_layout = engine_layout(engine(eng_name), layout)  # as the engine runs it (serve_estimate does the same)
    if "moe-dense-tp-size 1" in str(srv.get("extra") or ""):  # SGLang's dense FFN per attention-DP rank
        run_layout = dataclasses.replace(run_layout, dense_with_attention=True)
    if c["kind"] in ("prefill_throughput", "decode_throughput"):
        kernel = StepKernel(spec, run_layout, recipe, kv_dtype, hw.kernel_values(fp8=recipe.dtype == "fp8"))
        if c["kind"] == "prefill_throughput":
            tokens = batch or 8192
            step = sum(kernel(0, 0, tokens, isl / 2).values())
            out.append(("prefill_tok_s_per_node", 8 * tokens / step, meas["input_tok_s_per_node"]))
        else:
            ctx = meas.get("kv_cache_length") or isl
            step = sum(kernel(batch, ctx, 0, 0).values())
            out.append(("decode_tok_s_per_node", 8 * batch / step, meas["output_tok_s_per_node"]))
        return out
    if not isl or not osl:
        raise Unsupported("ISL/OSL not published (variable-length dataset)")
    if c["kind"] == "batch_latency":
        kernel = StepKernel(spec, run_layout, recipe, kv_dtype, hw.kernel_values(fp8=recipe.dtype == "fp8"))
        return [("e2e_latency_s", batch_latency_s(kernel, batch, isl, osl), meas["e2e_latency_mean_ms"] / 1e3)]
    est = serve_estimate(spec, hw, layout, isl=isl, osl=osl, concurrency=conc, recipe=recipe, kv_dtype=kv_dtype,
                         engine_name=eng_name)
    gpus = c["hardware"]["count"]
    if meas.get("output_tok_s_per_gpu"):
        out.append(("output_tok_s_per_gpu", est.output_tokens_per_s_per_gpu, meas["output_tok_s_per_gpu"]))
    if meas.get("output_tok_s_total"):
        out.append(("output_tok_s_per_gpu", est.output_tokens_per_s_per_gpu, meas["output_tok_s_total"] / gpus))
    if meas.get("ttft_ms"):
        out.append(("ttft_s", est.ttft_s, meas["ttft_ms"] / 1e3))
    if meas.get("itl_ms"):
        out.append(("tpot_s", est.tpot_s, meas["itl_ms"] / 1e3))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the rows as JSON")
    args = ap.parse_args(argv)
    rows, skipped = [], []
    for c in yaml.safe_load(CASES.read_text())["cases"]:
        src = next(v for k, v in SOURCES.items() if c["id"].startswith(k))
        try:
            for metric, pred, meas in predict(c):
                rows.append({"id": c["id"], "source": src, "metric": metric, "predicted": pred, "measured": meas,
                             "error_pct": (pred - meas) / meas * 100})
        except (Unsupported, ndplan.NdplanError) as e:
            skipped.append((c["id"], str(e)))
    print(f"{'case':48s} {'metric':24s} {'predicted':>12s} {'measured':>12s} {'err %':>7s}")
    for r in rows:
        print(f"{r['id']:48s} {r['metric']:24s} {r['predicted']:12.4g} {r['measured']:12.4g} {r['error_pct']:+7.1f}")
    for cid, why in skipped:
        print(f"  unsupported {cid}: {why}")
    print("median |error| per source and metric:")
    for key in sorted({(r["source"], r["metric"]) for r in rows}):
        errs = [abs(r["error_pct"]) for r in rows if (r["source"], r["metric"]) == key]
        print(f"  {key[0]:14s} {key[1]:24s} n={len(errs):2d}  {statistics.median(errs):6.1f} %")
    print(f"rows compared: {len(rows)} metrics of {len({r['id'] for r in rows})} cases; unsupported {len(skipped)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "unsupported": skipped}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
