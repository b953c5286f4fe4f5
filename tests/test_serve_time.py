"""The serving step's roofline (ndplan.serve.time) against hand-computed steps, and the steady
state of serve/estimate.py against its own definitions (Little's law, the max-load rule)."""

import pytest

import ndplan
from ndplan.serve.estimate import StepKernel, batch_latency_s, serve_estimate
from ndplan.serve.layout import ServeLayout, WeightRecipe

HW = ndplan.load_hardware("h100-sxm")
H, F, V, L, A, KV, D = 4096, 14336, 128256, 32, 32, 8, 128  # meta-llama/Meta-Llama-3-8B config.json


def _kernel(tp=1, recipe=WeightRecipe()):
    spec = ndplan.load_model("llama3-8b")
    return StepKernel(spec, ServeLayout(tp=tp), recipe, "bf16", HW.kernel_values(fp8=recipe.dtype == "fp8"))


def test_decode_step_by_hand():
    """One sequence, 1000 tokens of context, tp 1: every GEMM is bandwidth-bound at M = 1 (it reads
    its 16-bit weight and writes a 16-bit row), the attention core reads the sequence's K and V
    (2 x 8 heads x 128 x 2 B per token and layer), the output layer reads its V x h weight."""
    bw = HW.hbm_gb_per_s * 1e9 * HW.hbm_efficiency
    gemms = [(H, (A + 2 * KV) * D), (A * D, H), (H, 2 * F), (F, H)]  # (K, N): qkv, o, gate+up, down
    gemm = L * sum(2 * (k + k * n + n) for k, n in gemms) / bw
    attention = L * 1000 * 2 * KV * D * 2 / bw
    head = 2 * (H + H * V + V) / bw
    step = _kernel()(1, 1000, 0, 0)
    assert step["serve.step.gemm"] == pytest.approx(gemm, rel=1e-12)
    assert step["serve.step.attention"] == pytest.approx(attention, rel=1e-12)
    assert step["serve.step.head"] == pytest.approx(head, rel=1e-12)
    assert step["serve.step.comm"] == step["serve.step.pp"] == 0


def test_prefill_step_by_hand():
    """8192 prompt tokens alone: compute-bound GEMMs at the 16-bit GEMM rate and the causal core,
    2 x P x heads x 2d x (PCTX + 200) FLOPs at the attention rate (the length factor at L = 2 PCTX)."""
    p = 8192
    gemm_flops = L * 2 * p * sum(k * n for k, n in [(H, (A + 2 * KV) * D), (A * D, H), (H, 2 * F), (F, H)])
    core = L * 2 * p * A * 2 * D * (p / 2 + 200)
    step = _kernel()(0, 0, p, p / 2)
    assert step["serve.step.gemm"] == pytest.approx(gemm_flops / (HW.bf16_tflops * 1e12 * HW.gemm_efficiency), rel=1e-12)
    assert step["serve.step.attention"] == pytest.approx(core / (HW.bf16_tflops * 1e12 * HW.attention_efficiency),
                                                          rel=1e-12)


def test_tp_splits_the_weights_read_and_adds_two_all_reduces_per_layer():
    one, two = _kernel(1)(1, 1000, 0, 0), _kernel(2)(1, 1000, 0, 0)
    assert two["serve.step.gemm"] == pytest.approx(one["serve.step.gemm"] / 2, rel=0.01)
    # two all-reduces of one 16-bit row per layer over NVLink: 2 (n-1)/n x bytes / bw + 2 (n-1) latencies
    per = 2 * 0.5 * 2 * H / (HW.intra_node_gb_per_s * 1e9 * HW.intra_node_efficiency) + 2 * HW.intra_node_latency_us * 1e-6
    assert two["serve.step.comm"] == pytest.approx(L * 2 * per, rel=1e-12)


def test_steady_state_is_littles_law():
    spec = ndplan.load_model("llama3-8b")
    est = serve_estimate(spec, HW, ServeLayout(), isl=1000, osl=200, concurrency=8)
    life = est.ttft_s + 199 * est.tpot_s
    assert est.output_tokens_per_s_per_gpu == pytest.approx(8 * 200 / life, rel=1e-12)
    assert est.concurrency == 8 and est.fits


def test_max_load_is_capped_by_the_kv_cache_and_the_engine_batch():
    spec = ndplan.load_model("llama3-8b")
    long = serve_estimate(spec, HW, ServeLayout(), isl=30000, osl=2000)
    assert long.concurrency == long.max_concurrency == long.kv_cache_tokens // 32000
    short = serve_estimate(spec, HW, ServeLayout(), isl=100, osl=100)
    assert short.concurrency == 256 < short.max_concurrency  # vLLM's max_num_seqs


def test_queueing_beyond_the_kv_cache_lengthens_ttft_not_tpot():
    spec = ndplan.load_model("llama3-8b")
    fit = serve_estimate(spec, HW, ServeLayout(), isl=30000, osl=2000)
    over = serve_estimate(spec, HW, ServeLayout(), isl=30000, osl=2000, concurrency=4 * fit.max_concurrency)
    assert over.tpot_s == fit.tpot_s and over.ttft_s > 3 * fit.ttft_s


def test_batch_latency_is_one_prefill_and_the_decode_steps():
    k = _kernel()
    expect = sum(k(0, 0, 8 * 32, 16).values()) + 127 * sum(k(8, 32 + 64, 0, 0).values())
    assert batch_latency_s(k, 8, 32, 128) == pytest.approx(expect, rel=1e-12)


def test_host_step_is_in_every_step_once():
    """serve.step.host is the same at any batch and adds to the roofline terms (time.HOST_STEP_S)."""
    from ndplan.serve.time import HOST_STEP_S
    k = _kernel()
    assert k(1, 1000, 0, 0)["serve.step.host"] == k(256, 4000, 512, 500)["serve.step.host"] == HOST_STEP_S


def test_trtllm_bench_limits_by_hand():
    """tensorrt_llm/bench/build/tuning.py worked by hand. Llama-3.3-70B FP8 (70,553,706,496 params), FP8 KV,
    tp 2 on 139.59 GiB devices, ISL = OSL = 1024, fraction 0.9: per token 2 x 80 x max(2, 8) x 128 x 1 B;
    (2 x 139.59 - 65.71 GiB) x 0.9 / (that x 2048) = 614.8 requests -> 128 x ceil(614.8 / 128) = 640;
    tokens 614.8 x 2 = 1229.6 -> at least 2048, and at least ISL + batch = 1664 (no chunked prefill).
    DeepSeek-R1 FP8 (its config's 128 KV heads of hidden / heads = 56, 61 layers, 682.6e9 params with
    the MTP module) at tp 8 on H200: 260 requests -> 128 x ceil(260 / 128) = 384 per rank."""
    from ndplan.serve.engines import trtllm_bench_limits
    assert trtllm_bench_limits(70_553_706_496, 1.0, 8, 128, 80, 1, 139.59, 2, 1, 1024, 1024, 0.9) == (640, 2048)
    assert trtllm_bench_limits(682_600_000_000, 1.0, 128, 56, 61, 1, 139.59, 8, 1, 1024, 1024, 0.9) == (384, 2048)
    # a long prompt without chunked prefill: max_num_tokens covers it
    assert trtllm_bench_limits(70_553_706_496, 1.0, 8, 128, 80, 1, 139.59, 2, 1, 8192, 1024, 0.9)[1] >= 8192


def test_deepep_dispatch_and_combine_by_hand():
    """DeepSeek-V3 over EP 32 (4 nodes of 8), attention DP 32, 8192 prompt tokens per rank, fp8 weights:
    each of the 58 MoE layers sends every token once per remote node holding one of its 8 experts,
    3 (1 - (3/4)^8) nodes on average, over the NIC (fp8 + a 4-byte scale per 128 to dispatch, 16-bit to
    combine), while NVLink forwards it to 32 (1 - (31/32)^8) ranks; each pass the slower leg plus one
    inter-node latency. The nccl backend sends 16-bit copies to every such rank instead."""
    hw = ndplan.load_hardware("h100-sxm")
    spec = ndplan.load_model("deepseek-v3")
    v = hw.kernel_values(fp8=True)
    t, h = 8192, 7168
    remote, ranks = 3 * (1 - 0.75 ** 8), 32 * (1 - (31 / 32) ** 8)
    per_layer = 0.0
    for nbytes in (1 + 4 / 128, 2):
        rdma = t * remote * h * nbytes / (v["bw_inter"] * v["eff_inter"])
        nvlink = t * ranks * h * nbytes / (v["bw_intra"] * v["eff_intra"])
        per_layer += max(rdma, nvlink) + v["lat_inter"]
    lay = ServeLayout(tp=32, ep=32, dp_attention=32, dense_with_attention=True, a2a="deepep")
    step = StepKernel(spec, lay, WeightRecipe("fp8"), "bf16", v)(0, 0, t, 512)
    assert step["serve.step.comm"] == pytest.approx(58 * per_layer, rel=1e-12)
    nccl = StepKernel(spec, ServeLayout(tp=32, ep=32, dp_attention=32, dense_with_attention=True),
                      WeightRecipe("fp8"), "bf16", v)(0, 0, t, 512)
    assert nccl["serve.step.comm"] > 2 * step["serve.step.comm"]
