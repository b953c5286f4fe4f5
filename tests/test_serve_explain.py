"""``ndplan serve --explain``: every printed Term's value is its SymPy expression at the point, and
the compiled step kernel (ndplan.lambdify) gives the same numbers at any workload point."""

import pytest
from hypothesis import given, settings, strategies as st

import ndplan
from ndplan.serve.estimate import StepKernel, serve_estimate
from ndplan.serve.explain import explain_rows
from ndplan.serve.layout import ServeLayout, WeightRecipe

HW = ndplan.load_hardware("h100-sxm")


def test_explained_terms_add_up_to_the_estimate():
    spec = ndplan.load_model("llama3.1-8b")
    est = serve_estimate(spec, HW, ServeLayout(tp=2), isl=1000, osl=200)
    rows = {r["key"]: r["value"] for r in explain_rows(spec, HW, est, WeightRecipe(), "bf16", 1000, 200)}
    assert rows["serve.weights"] == pytest.approx(est.weights_bytes, abs=1)
    assert rows["serve.kv_per_token"] == est.kv_bytes_per_token
    assert sum(v for k, v in rows.items() if k.startswith("serve.step.")) == pytest.approx(est.tpot_s, rel=1e-9)


@settings(max_examples=12, deadline=None)
@given(b=st.floats(0, 512), ctx=st.floats(0, 32768), p=st.floats(0, 8192), pctx=st.floats(0, 16384),
       other=st.floats(0, 8192), tp=st.sampled_from([1, 2, 4, 8]), moe=st.booleans())
def test_the_step_kernel_equals_its_sympy_terms(b, ctx, p, pctx, other, tp, moe):
    from ndplan import symbols as S
    from ndplan.serve import memory as SM
    from ndplan.serve import time as ST
    spec = ndplan.load_model("qwen3-30b-a3b" if moe else "llama3.1-8b")
    lay = ServeLayout(tp=tp, ep=tp if moe else 1, dp_attention=tp if moe else 1).check(spec)
    hw_values = HW.kernel_values()
    kernel = StepKernel(spec, lay, WeightRecipe(), "bf16", hw_values)(b, ctx, p, pctx, other)
    values = {S.BY_NAME[k]: v for k, v in hw_values.items()} | SM.values(lay) | {
        ST.B: b, ST.CTX: ctx, ST.P: p, ST.PCTX: pctx, ST.OTHER: other}
    for t in ST.step_terms(spec, lay, WeightRecipe(), "bf16"):
        assert kernel[t.key] == pytest.approx(float(t.expr.subs(values)), rel=1e-9, abs=1e-15)


def _hybrid():
    """llama3.1-8b with its first 6 layers full and 26 sliding over 512 tokens: on 5 stages the stage
    with the fewest KV tokens (the first) is not the one holding the fewest requests."""
    import dataclasses
    spec = ndplan.load_model("llama3.1-8b")
    return dataclasses.replace(spec, name="hybrid", attention_windows=(0,) * 6 + (512,) * 26)


@pytest.mark.parametrize("name, layout, conc", [("llama3.1-8b", dict(tp=1), None), ("llama3.1-70b", dict(tp=4, pp=2), 400),
                                                ("qwen3-30b-a3b", dict(tp=4, ep=4, dp_attention=4), None),
                                                ("hybrid", dict(tp=1, pp=5), None)])
def test_explained_derived_numbers_are_the_estimates(name, layout, conc):
    """--explain's pool, capacity, concurrency, TPOT, TTFT and throughput rows evaluate their printed
    formula to the very numbers the estimate ranks by (one function, serve/derived.py)."""
    spec = _hybrid() if name == "hybrid" else ndplan.load_model(name)
    lay = ServeLayout(**layout).check(spec)
    isl = 30000 if name == "hybrid" else 2000
    est = serve_estimate(spec, HW, lay, isl=isl, osl=300, concurrency=conc)
    rows = {r["key"]: r["value"] for r in explain_rows(spec, HW, est, WeightRecipe(), "bf16", isl, 300)}
    if name == "hybrid":
        assert est.details["capacity_stage"] != est.details["stage"]
    assert rows["serve.kv_cache_tokens"] == est.kv_cache_tokens
    assert rows["serve.max_concurrency"] == est.max_concurrency
    assert rows["serve.tpot"] == est.tpot_s
    assert rows["serve.ttft"] == pytest.approx(est.ttft_s, rel=1e-12)
    assert rows["serve.output_tokens_per_s_per_gpu"] == pytest.approx(est.output_tokens_per_s_per_gpu, rel=1e-12)
    assert rows["serve.kv_pool"] == pytest.approx(est.details["pool_bytes"], rel=1e-12)
