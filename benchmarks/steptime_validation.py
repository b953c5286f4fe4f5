#!/usr/bin/env python
"""Predicted vs published step time, and MindFormers step-time rankings.

(a) Published cases (../shared/validation/published/cases.yaml beside the project root; NOTES.md there).
    Each source is compared in the quantity it publishes, turned into seconds per step
    only where the source's own formula makes that exact (NOTES.md "compare like with like"):

    source        measured quantity -> seconds per step
    narayanan     TFLOPS/GPU with Eq. 3, F = 96 B s l h^2 (1 + s/6h + V/16lh) (recompute counted):
                  step = F / (TFLOPS x GPUs)   (= derived.step_time_s, unrounded)
    korthikanti   Table 5 iteration time (s), as published
    mcore         TFLOPS/GPU with Megatron's model FLOPs 72 B s l h^2 (1 + s/6h + V/12lh):
                  step = F / (TFLOPS x GPUs)
    torchtitan    tokens/s/GPU: step = gbs x seq / (tokens/s/GPU x GPUs)
    llama3        TFLOPS/GPU, FLOP definition not published (NOTES.md): step = ndplan's model
                  FLOPs (causal attention) / (TFLOPS x GPUs), i.e. MFU compared under ndplan's
                  definition. A non-causal definition would make the 128K row's step 1.4x longer.
    bloom, mtnlg  log / paper seconds per iteration, as published
    nemo          NeMo model TFLOPS/GPU at FP8: step = NeMo's llama2 model FLOPs
                  B s L h^2 (12 + 12 g/a + 18 f/h + 12 s/h + 6 V/(L h)) (NVIDIA/NeMo
                  nemo/utils/flops_formulas.py ``llama2``: non-causal attention) / (TFLOPS x GPUs).
                  The 24.03 table may predate that file, so the definition is an assumption;
                  reported as its own source and kept out of the "core" median.

    Mapping to ndplan (one rule per field, the same for every case; ``notes`` per row say
    which defaults a case used):

    * model: catalog YAML (megatron-gpt-* for Narayanan/Korthikanti, mcore-gpt-* for the
      Megatron-Core table, llama*, bloom-176b, mtnlg-530b); hardware: the catalog preset of
      the case's GPU (h100-96gb-hbm2e for torchtitan's 96 GB H100).
    * dp/tp/pp/cp/vpp as published; vpp unknown -> 1.
    * schedule: interleaved when vpp > 1, else 1f1b (Megatron default). Llama 3's "modified
      interleaved" schedule has no published vpp, so it runs as 1f1b (bubble upper bound).
    * uneven layer counts (Llama 3: 126 layers on 16 stages): ceil(L/pp) per stage, the
      missing layers taken from the first and last stages alternately (the paper: "fewer
      layers on the first and last stages") -> 7, 8 x 14, 7.
    * micro-batch unknown -> 1 (Megatron-LM's default ``--micro-batch-size``); gbs as published
      (Llama 3: 16M tokens / seq).
    * recompute: "full..." -> full; "selective (attention...)" and torchtitan op-SAC ->
      selective; torchtitan layer-SAC -> full on every 2nd layer (L/2 per stage); unknown -> none.
    * zero: as published; unknown -> 1 where the source states --overlap-param-gather
      (which needs Megatron's distributed optimizer) or runs NeMo (distributed_fused_adam
      default), else 0 (Megatron-LM 2021 / DeepSpeed default).
    * sp: as published; unknown -> on when the source states --tp-comm-overlap (needs SP),
      else off.
    * engine: megatron (Narayanan, Korthikanti, Megatron-Core, NeMo), deepspeed (BLOOM,
      MT-NLG), fsdp (torchtitan, Llama 3's FSDP); stated overlap flags replace the engine's
      defaults in the time model (Megatron-Core README: --tp-comm-overlap -> overlap_tp_comm).
      The Megatron rows ran Megatron-Core r0.8 or older, whose distributed optimizer dispatched
      the first parameter all-gather in zero_grad (core_v0.8.0 distrib_optimizer.py:1336-1337),
      so the later stages' single bucket was gathered while they waited for the pipeline fill:
      stage_gather_at_first_forward = False (the engine profile follows d98e8a64, where the
      first forward's pre-hook dispatches it).
    * flash attention: on for sources from 2023 on (Megatron-Core r0.8, torchtitan, Llama 3,
      NeMo 24.03); off for 2021-22 Megatron/DeepSpeed runs (FlashAttention appeared mid-2022
      and is not in their code); it decides the attention-core efficiency and softmax bytes.
    * precision: FP8 rows (torchtitan float8, NeMo) use weight_dtype="fp8": the transformer
      layers' GEMMs at the FP8 dense peak with their operands' quantisation traffic; the
      attention core and the output layer stay at the bf16 peak (formulas/step.py).

    Metric: error = (predicted - measured) / measured per case; the median of |error| per
    source, over the core sources (all but nemo) and over all.

(b) MindFormers step-time sets (../shared/validation/mindformers/steptime_cases.yaml):
    time unit unknown, so per set: is the measured-fastest row ranked first by predicted
    step time, and Spearman's rank correlation (ties averaged) between predicted and measured.
    Mapping: dp/tp/pp/micro_batch_num per row, mbs = base micro_batch_size, gbs = mbs x dp x
    micro_batch_num, engine mindspore, zero 1 (parallel optimizer), recompute of the base yaml,
    SP and flash attention of the base yaml, 16-bit weights, 1f1b; hardware ascend-910b (A2) or
    ascend-a3 (A3). Per-row layer offsets / recompute picked by ND's balancer are not recorded
    upstream and are not modelled.

(c) ndplan calibrate on each source's runs of one hardware (>= 4 runs): the median |error|
    with the catalog constants, after fitting (the default forward selection of constants)
    and left out (each run predicted by the fit to the others).

Usage:
    python benchmarks/steptime_validation.py [--json out.json] [--set gemm_efficiency=0.7 ...]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import yaml

import ndplan
from ndplan.calibrate import Run, fit
from ndplan.catalog.model import model_from_config
from ndplan.engines import ENGINE_PROFILES
from ndplan.formulas import flops as FL
from ndplan.symbols import model_symbols

from shared_data import validation_dir  # noqa: E402 (benchmarks/shared_data.py)

SHARED = validation_dir()
PUB_CASES = SHARED / "published" / "cases.yaml"
MF_CASES = SHARED / "mindformers" / "steptime_cases.yaml"

SOURCES = {  # id prefix -> source label
    "narayanan2021_t1_": "narayanan",
    "korthikanti2022_t5_": "korthikanti",
    "mcore_r080_weak_": "mcore",
    "torchtitan_202408_": "torchtitan",
    "llama3_paper_": "llama3",
    "bloom_": "bloom",
    "mtnlg_": "mtnlg",
    "nemo_longseq_": "nemo",
}
CORE_EXCLUDED = ("nemo",)
FIT_SOURCES = ("narayanan", "korthikanti", "mcore", "torchtitan")
"""The sources catalog/mamf.TRAINING_GEMM_FRACTION was fitted on; the others are held out."""
HW = {"A100-SXM4-80GB": "a100-80gb", "H100-SXM5-80GB": "h100-sxm", "H100-96GB-HBM2e-500W": "h100-96gb-hbm2e"}
YEAR = {"narayanan": 2021, "korthikanti": 2022, "bloom": 2022, "mtnlg": 2022, "mcore": 2024,
        "torchtitan": 2024, "llama3": 2024, "nemo": 2024}
ENGINE = {"bloom": "deepspeed", "mtnlg": "deepspeed", "torchtitan": "fsdp", "llama3": "fsdp"}
FLASH_FROM_YEAR = 2023


class Skip(Exception):
    pass


def catalog_model(src: str, c: dict) -> str:
    m = c["model"]
    if src in ("narayanan", "korthikanti"):
        by_hidden = {(2304, 24): "1.7b", (3072, 30): "3.6b", (4096, 36): "7.5b", (6144, 40): "18b",
                     (6144, 48): "22b", (8192, 48): "39b", (10240, 60): "76b", (12288, 80): "145b",
                     (12288, 96): "175b", (16384, 96): "310b", (20480, 105): "530b", (25600, 128): "1t"}
        return "megatron-gpt-" + by_hidden[(m["hidden"], m["layers"])]
    if src == "mcore":
        return "mcore-gpt-" + c["id"].split("weak_")[1].replace("_", ".")
    if src == "bloom":
        return "bloom-176b"
    if src == "mtnlg":
        return "mtnlg-530b"
    if src == "nemo":
        return "llama2-7b"
    if src == "llama3":
        return "llama3.1-405b"
    name = m["name"].lower().replace("-", "").replace("llama", "llama")
    return {"llama3.1405b": "llama3.1-405b", "llama38b": "llama3-8b", "llama370b": "llama3-70b",
            "llama213b": "llama2-13b", "llama270b": "llama2-70b"}[name]


def uneven_split(L: int, pp: int) -> tuple[int, ...] | None:
    """ceil(L/pp) per stage, the missing layers taken from the first and last stages in turn."""
    if L % pp == 0:
        return None
    per = [math.ceil(L / pp)] * pp
    ends = [0, pp - 1]
    k = 0
    while sum(per) > L:
        per[ends[k % 2]] -= 1
        k += 1
    return tuple(per)


def measured_step(src: str, c: dict, model, strat) -> tuple[float, str]:
    """Seconds per step from the published quantity (see the module docstring)."""
    meas, m, gpus = c["measured"], c["model"], c["hardware"]["count"]
    B, s, L, h, V = strat.gbs, strat.seq, m["layers"], m["hidden"], m["vocab"]
    if src in ("korthikanti", "bloom", "mtnlg"):
        return float(meas["step_time_s"]), "published step time"
    if src == "torchtitan":
        return B * s / (meas["tokens_per_s_per_gpu"] * gpus), "gbs*seq/(tokens/s/GPU*GPUs)"
    tflops = float(meas["tflops_per_gpu"]) * 1e12 * gpus
    if src == "narayanan":
        F = 96 * B * s * L * h ** 2 * (1 + s / (6 * h) + V / (16 * L * h))
        return F / tflops, "Eq.3 FLOPs / (TFLOPS*GPUs)"
    if src == "mcore":
        F = 72 * B * s * L * h ** 2 * (1 + s / (6 * h) + V / (12 * L * h))
        return F / tflops, "Megatron model FLOPs / (TFLOPS*GPUs)"
    if src == "llama3":
        F = float(FL.model_flops_per_sequence(model, model_symbols(model), s)) * B
        return F / tflops, "ndplan model FLOPs (causal) / (TFLOPS*GPUs)"
    if src == "nemo":
        g, a, f = m["kv_heads"], m["heads"], m["ffn"]
        F = B * s * L * h ** 2 * (12 + 12 * g / a + 18 * f / h + 12 * s / h + 6 * V / (L * h))
        return F / tflops, "NeMo llama2 model FLOPs / (TFLOPS*GPUs)"
    raise Skip(f"no measured quantity for {src}")


def map_published(src: str, c: dict):
    p, notes = c["parallel"], []
    if c["measured"].get("oom"):
        raise Skip("OOM row (no throughput)")
    if p["tp"] is None or p["dp"] is None:
        raise Skip("parallel layout not published")
    model = ndplan.load_model(catalog_model(src, c))
    hw = ndplan.load_hardware(HW[c["hardware"]["gpu"]])
    tp, pp, dp, cp = p["tp"], p["pp"] or 1, p["dp"], p["cp"] or 1
    vpp = p["vpp"] or 1
    mbs = p["micro_batch"]
    if mbs is None:
        mbs = 1
        notes.append("mbs=1 (default)")
    seq = c["model"]["seq_len"]
    gbs = p["global_batch"] or p["global_batch_tokens"] // seq
    other = json.dumps(p.get("other") or {})
    zero = p["zero_stage"]
    if zero is None:
        zero = 1 if ("overlap-param-gather" in other or src == "nemo") else 0
        notes.append(f"zero={zero} (default)")
    sp = p["sp"]
    if sp is None:
        sp = "tp-comm-overlap" in other
    rc = str(p["recompute"] or "none")
    kw = {}
    if rc.startswith("full"):
        kw["recompute"] = "full"
    elif rc.startswith("selective (layer)"):
        kw["recompute"], kw["recompute_layers"] = "full", model.num_hidden_layers // pp // 2
        notes.append("layer-SAC -> full on every 2nd layer")
    elif rc.startswith("selective"):
        kw["recompute"] = "selective"
    else:
        kw["recompute"] = "none"
        if p["recompute"] is None:
            notes.append("recompute=none (default)")
    prec = str(p.get("precision") or "").lower()
    if "fp8" in prec or "float8" in prec or "float8" in c["id"]:
        kw["weight_dtype"] = "fp8"
        notes.append("fp8 GEMMs")
    lps = uneven_split(model.num_hidden_layers, pp * vpp)
    if lps:
        notes.append("layers " + ",".join(map(str, lps)) if len(set(lps)) > 2 else f"uneven split {lps[0]}/{max(lps)}")
    engine_name = ENGINE.get(src, "megatron")
    strat = ndplan.Strategy(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, mbs=mbs, gbs=gbs, seq=seq, zero=zero, sp=sp,
                            schedule="interleaved" if vpp > 1 else "1f1b", engine=engine_name,
                            flash_attention=YEAR[src] >= FLASH_FROM_YEAR, layers_per_stage=lps, **kw)
    engine = None
    if engine_name == "megatron":  # Megatron-Core <= r0.8 (module docstring)
        engine = replace(ENGINE_PROFILES[engine_name], stage_gather_at_first_forward=False)
    if src == "torchtitan":  # 2024: torch 2.4 nightly's SDPA order, flash first on sm90 (engine_time.attention_fa2)
        engine = replace(engine or ENGINE_PROFILES[engine_name], attention_fa2=True)
        notes.append("SDPA flash (FA2)")
        if kw.get("weight_dtype") == "fp8":  # train_configs/llama3_405b.toml:56-59 at 9515a140b (PR #554)
            engine = replace(engine, float8_all_gather=True)
            notes.append("float8 all-gather")
    if "tp-comm-overlap" in other or (p.get("other") or {}).get("async_tp"):  # torchtitan async TP: the same overlap
        engine = replace(engine or ENGINE_PROFILES[engine_name], overlap_tp_comm=True)
        notes.append("tp-comm-overlap" if "tp-comm-overlap" in other else "async TP")
    return model, hw, strat, engine, notes


TERM_COLS = (("compute", "time.compute"), ("recomp", "time.recompute"), ("tp", "time.tp_comm"),
             ("cp", "time.cp_comm"), ("bubble", "time.pp_bubble"), ("dp", "time.dp_comm"))


def run_published(overrides: dict) -> tuple[list[dict], list[dict]]:
    data = yaml.safe_load(PUB_CASES.read_text())
    rows, skipped = [], []
    for c in data["cases"]:
        src = next((v for k, v in SOURCES.items() if c["id"].startswith(k)), None)
        if src is None:
            continue
        try:
            model, hw, strat, engine, notes = map_published(src, c)
            hw = hw.with_overrides(overrides) if overrides else hw
            est = ndplan.estimate(model, hw, strat, c["hardware"]["count"], engine=engine)
            meas, how = measured_step(src, c, model, strat)
        except (Skip, ndplan.NdplanError) as e:
            skipped.append({"id": c["id"], "reason": str(e)})
            continue
        terms = est.time_terms
        span = vpp_span(c, model, hw, strat, engine)
        RUNS.append((src, Run(name=c["id"], model=model, hardware=hw, strategy=strat, step_s=meas, engine=engine)))
        rows.append({"id": c["id"], "source": src, "model": model.name, "hardware": hw.name,
                     "strategy": strat.as_dict(), "predicted_s": est.step_s, "measured_s": meas,
                     "measured_from": how, "error_pct": (est.step_s - meas) / meas * 100,
                     "mfu_pred": est.mfu, "terms": terms, "notes": notes, "vpp_span": span})
    return rows, skipped


def vpp_span(c: dict, model, hw, strat, engine) -> dict[int, float]:
    """Predicted seconds at each virtual-stage count the layers allow, for a row whose source
    states an interleaved schedule but not its vpp (the Llama 3 paper): the configuration is not
    fully known, so the benchmark prints the range instead of choosing one."""
    p = c["parallel"]
    if p["vpp"] is not None or "interleaved" not in str(p.get("pp_schedule") or "") or strat.pp == 1:
        return {}
    out, L, v = {}, model.num_hidden_layers, 2
    while strat.pp * v <= L:
        try:
            sv = replace(strat, vpp=v, schedule="interleaved", layers_per_stage=uneven_split(L, strat.pp * v))
            out[v] = ndplan.estimate(model, hw, sv, c["hardware"]["count"], engine=engine).step_s
        except ndplan.NdplanError:
            pass
        v *= 2
    return out


def summary(rows: list[dict]) -> dict:
    out = {}
    for src in dict.fromkeys(r["source"] for r in rows):
        out[src] = statistics.median(abs(r["error_pct"]) for r in rows if r["source"] == src)
    core = [abs(r["error_pct"]) for r in rows if r["source"] not in CORE_EXCLUDED]
    out["core"] = statistics.median(core) if core else float("nan")
    out["all"] = statistics.median(abs(r["error_pct"]) for r in rows)
    for group, keep in (("fitted", True), ("held_out", False)):
        errs = [abs(r["error_pct"]) for r in rows if (r["source"] in FIT_SOURCES) == keep]
        out[group] = statistics.median(errs) if errs else float("nan")
        out[group + "_mean"] = statistics.mean(errs) if errs else float("nan")
    return out


def print_published(rows, skipped, summ):
    print("== (a) published cases: predicted vs measured seconds per step")
    hdr = f"{'case':48s} {'pred s':>9s} {'meas s':>9s} {'err %':>7s} " + " ".join(f"{n:>7s}" for n, _ in TERM_COLS)
    print(hdr)
    for r in rows:
        t = r["terms"]
        print(f"{r['id']:48s} {r['predicted_s']:9.3f} {r['measured_s']:9.3f} {r['error_pct']:+7.1f} "
              + " ".join(f"{t.get(k, 0.0):7.2f}" for _, k in TERM_COLS) + "  " + "; ".join(r["notes"]))
    for r in rows:
        if r["vpp_span"]:
            lo, hi = min(r["vpp_span"].values()), max(r["predicted_s"], *r["vpp_span"].values())
            print(f"  {r['id']}: vpp not published; predicted {r['predicted_s']:.2f} s at vpp 1, "
                  + ", ".join(f"{t:.2f} s at vpp {v}" for v, t in r["vpp_span"].items())
                  + f"; measured {r['measured_s']:.2f} s {'inside' if lo <= r['measured_s'] <= hi else 'outside'} "
                  f"the range ({(lo - r['measured_s']) / r['measured_s'] * 100:+.1f} % at the fastest)")
    for s in skipped:
        print(f"  skipped {s['id']}: {s['reason']}")
    print("median |error| per source: " + ", ".join(f"{k} {v:.1f}% (n={sum(r['source'] == k for r in rows)})"
                                                   for k, v in summ.items() if k in SOURCES.values()))
    print(f"median |error| core (all but {', '.join(CORE_EXCLUDED)}): {summ['core']:.1f}%   "
          f"all {len(rows)} cases: {summ['all']:.1f}%")
    print(f"fitted sources ({', '.join(FIT_SOURCES)}; catalog/mamf.TRAINING_GEMM_FRACTION): median |error| "
          f"{summ['fitted']:.1f}%, mean {summ['fitted_mean']:.1f}%   held out (the others): median "
          f"{summ['held_out']:.1f}%, mean {summ['held_out_mean']:.1f}%")
    over = [r["id"] for r in rows if abs(r["error_pct"]) > 25]
    print(f"rows beyond 25 %: {len(over)} of {len(rows)}" + (f" ({', '.join(over)})" if over else ""))
    known = [r for r in rows if fully_known(r)]
    worst = max(known, key=lambda r: abs(r["error_pct"]))
    print(f"fully known rows (every field published, no default taken, the measured quantity converted by the "
          f"source's own formula): {len(known)} of {len(rows)}, max |error| {abs(worst['error_pct']):.1f}% "
          f"({worst['id']}); beyond 25 %: {sum(abs(r['error_pct']) > 25 for r in known)}")


EXACT_CONVERSION = ("narayanan", "korthikanti", "mcore", "torchtitan", "bloom", "mtnlg")
"""Sources whose measured quantity turns into seconds by their own stated formula (module
docstring); the Llama 3 paper's FLOP definition is not published and NeMo's is assumed."""


def fully_known(row: dict) -> bool:
    """The issue's 'configuration fully known': no field defaulted (notes say '(default)'), no
    unpublished vpp, and an exact conversion of the measured quantity."""
    return (row["source"] in EXACT_CONVERSION and not row["vpp_span"]
            and not any("(default)" in n for n in row["notes"]))


# --------------------------------------------------------------------------- (b) MindFormers


def ranks(xs: list[float]) -> list[float]:
    """1-based ranks, ties get the average of the positions they span."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(x: list[float], y: list[float]) -> float:
    """Pearson correlation of the (tie-averaged) ranks."""
    rx, ry = ranks(x), ranks(y)
    n = len(x)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / math.sqrt(vx * vy) if vx and vy else float("nan")


def mf_model(s: dict):
    m = s["model"]
    cfg = {"model_type": "llama", "hidden_size": m["hidden_size"], "num_hidden_layers": m["num_layers"],
           "num_attention_heads": m["num_heads"], "num_key_value_heads": m["num_kv_heads"],
           "intermediate_size": m["ffn_hidden_size"], "vocab_size": m["vocab_size"],
           "tie_word_embeddings": bool(m["tie_word_embeddings"])}
    return model_from_config(cfg, s["id"], str(MF_CASES))


def run_mindformers(overrides: dict) -> list[dict]:
    data = yaml.safe_load(MF_CASES.read_text())
    out = []
    for s in data["sets"]:
        model = mf_model(s)
        hw = ndplan.load_hardware("ascend-a3" if "A3" in s["device_type"] else "ascend-910b")
        hw = hw.with_overrides(overrides) if overrides else hw
        bp, bb, m = s["base_parallel"], s["base_batch"], s["model"]
        rec = s["recompute_base"]["mode"]
        preds, meas, rows = [], [], []
        for r in s["rows"]:
            dp, tp, pp = r["dp"], r["tp"], r["pp"]
            mbs = bb["micro_batch_size"]
            strat = ndplan.Strategy(dp=dp, tp=tp, pp=pp, cp=bp["cp"] or 1, mbs=mbs,
                                    gbs=mbs * dp * r["micro_batch_num"], seq=s["seq_length"], zero=1,
                                    sp=bool(bp["sp"]), recompute=rec if rec in ("none", "full", "selective") else "none",
                                    engine="mindspore", flash_attention=bool(m["use_flash_attention"]),
                                    weight_dtype="bf16", schedule="1f1b")
            est = ndplan.estimate(model, hw, strat, dp * tp * pp)
            preds.append(est.step_s)
            meas.append(float(r["time"]))
            rows.append({"dp": dp, "tp": tp, "pp": pp, "m": r["micro_batch_num"], "measured": r["time"],
                         "predicted_s": est.step_s})
        best = min(range(len(meas)), key=lambda i: meas[i])
        pred_first = min(range(len(preds)), key=lambda i: preds[i])
        out.append({"set": s["id"], "status": s["status"], "n": len(rows),
                    "rank1_ok": preds[best] == preds[pred_first],
                    "measured_fastest": rows[best], "predicted_fastest": rows[pred_first],
                    "pred_rank_of_measured_fastest": ranks(preds)[best],
                    "spearman": spearman(preds, meas), "rows": rows})
    return out


def print_mindformers(sets):
    print("\n== (b) MindFormers step-time sets: rank of the measured-fastest row, Spearman(pred, measured)")
    for s in sets:
        mf, pf = s["measured_fastest"], s["predicted_fastest"]
        print(f"{s['set']:32s} n={s['n']:2d} rank1 {'yes' if s['rank1_ok'] else 'NO '} "
              f"(measured fastest dp{mf['dp']}/tp{mf['tp']}/pp{mf['pp']}/m{mf['m']} at predicted rank "
              f"{s['pred_rank_of_measured_fastest']:.1f}; predicted fastest dp{pf['dp']}/tp{pf['tp']}/pp{pf['pp']}/m{pf['m']})  "
              f"Spearman {s['spearman']:+.2f}" + ("" if s["status"] == "complete" else f"  [{s['status']}]"))


# --------------------------------------------------------------------------- (c) calibrate

RUNS: list = []
"""(source, calibrate.Run) of every published case run_published mapped."""
MIN_GROUP = 4
"""Runs per group to fit: the default selection may fit up to 2 constants and still leave two
degrees of freedom, so that an interval and a leave-one-out error exist."""


def print_calibration() -> list[dict]:
    """ndplan calibrate (default selection) per source and hardware with >= MIN_GROUP runs:
    median |error| with the catalog constants, after the fit, and left out."""
    groups: dict[tuple[str, str], list] = {}
    for src, run in RUNS:
        groups.setdefault((src, run.hardware.name), []).append(run)
    print(f"\n== (c) ndplan calibrate per source and hardware (>= {MIN_GROUP} runs): median |error| %")
    print(f"{'source':12s} {'hardware':16s} {'n':>3s} {'before':>7s} {'after':>7s} {'left out':>9s}  fitted")
    out = []
    for (src, hw), runs in groups.items():
        if len(runs) < MIN_GROUP:
            continue
        try:
            f = fit(runs)
        except ndplan.NdplanError as e:
            print(f"{src:12s} {hw:16s} {len(runs):3d}  not fitted: {e}")
            continue
        j = f.to_json()
        med = j["median_abs_error_pct"]
        fitted = ", ".join(f"{k} {v:.3f}" for k, v in f.values.items())
        print(f"{src:12s} {hw:16s} {len(runs):3d} {med['before']:7.1f} {med['after']:7.1f} "
              f"{med['leave_one_out']:9.1f}  {fitted}")
        out.append({"source": src, "hardware": hw, "n": len(runs)} | j)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the rows to this path")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="hardware parameter override for every case (e.g. gemm_efficiency=0.7)")
    args = ap.parse_args(argv)
    overrides = {k: float(v) for k, v in (x.split("=", 1) for x in args.set)}
    rows, skipped = run_published(overrides)
    summ = summary(rows)
    print_published(rows, skipped, summ)
    sets = run_mindformers(overrides)
    print_mindformers(sets)
    calib = print_calibration()
    if args.json:
        Path(args.json).write_text(json.dumps({"published": {"rows": rows, "skipped": skipped, "median_abs_error_pct": summ},
                                               "mindformers": sets, "calibration": calib}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
