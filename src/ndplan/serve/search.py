"""Every serving layout of a model on a GPU budget, ranked by output tokens/s over the budget's
GPUs (idle ones count) under the latency limits (``ndplan serve``).

Layouts: tp a power of two up to the node (and dividing the heads), pp a power of two with tp x
pp devices within the budget, for MoE models ep in {1, tp}, for MLA models (and MoE) attention-DP
in {1, tp}; an instance is replicated over the budget (replicas = GPUs // (tp x pp)). A given
--tp/--pp/--ep/--dp-attention fixes that degree.

Load per replica: a total concurrency C splits evenly over the replicas (over C of them when C is
smaller), and a replica whose share exceeds what it runs at once queues, which fails the load; a
request rate R (req/s)
gives each replica R / replicas and its concurrency solves Little's law, c = r x lifetime(c)
(fixed-point iteration; a rate above the replica's max-load throughput is rejected); neither:
max load (serve/estimate.py's rule). Under latency limits without a load the replica runs the
largest concurrency that meets them (bisection: TTFT and TPOT grow with it).
"""

from __future__ import annotations

from dataclasses import dataclass

from ndplan import limits
from ndplan.catalog.hardware import Hardware
from ndplan.catalog.model import ModelSpec
from ndplan.errors import NdplanError
from ndplan.serve.engines import engine
from ndplan.serve.derived import lifetime
from ndplan.serve.estimate import ServeEstimate, StepKernel, engine_layout, serve_estimate
from ndplan.serve.layout import ServeLayout, WeightRecipe

RATE_ITERATIONS = 50


@dataclass(frozen=True)
class ServeRow:
    estimate: ServeEstimate
    """One replica at its share of the load."""
    replicas: int
    total_output_tokens_per_s: float
    """Over every replica that has requests."""
    gpus: int
    """The budget: idle GPUs count against a layout."""
    meets: bool
    why: str = ""
    """Why it was rejected (empty when it meets every limit)."""

    @property
    def per_budget_gpu(self) -> float:
        """Output tokens/s over the budget's GPUs, the ranking key."""
        return self.total_output_tokens_per_s / self.gpus

    def to_json(self) -> dict:
        return self.estimate.to_json() | {"replicas": self.replicas, "gpus": self.estimate.devices * self.replicas,
                                          "total_output_tokens_per_s": self.total_output_tokens_per_s,
                                          "output_tokens_per_s_per_budget_gpu": self.per_budget_gpu,
                                          "meets_limits": self.meets, "rejected_because": self.why or None}


def _pow2(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def candidate_layouts(spec: ModelSpec, gpus: int, node: int, fixed: dict) -> list[ServeLayout]:
    """Valid layouts (module docstring); ``fixed`` maps tp/pp/ep/dp_attention to given degrees, checked
    against the model and the budget first (one-line errors), and a2a to the all-to-all backend."""
    if fixed:
        lay = ServeLayout(**{"tp": fixed.get("tp") or max(fixed.get("ep") or 1, fixed.get("dp_attention") or 1)}
                          | {k: v for k, v in fixed.items() if k != "tp"}).check(spec)
        if lay.devices > gpus:
            raise NdplanError("--gpus", gpus, f"below the {lay.devices} devices of tp {lay.tp} x pp {lay.pp}",
                              "give at least that many GPUs")
    out = []
    tps = [fixed["tp"]] if fixed.get("tp") else _pow2(min(node, gpus))
    for tp in tps:
        pps = [fixed["pp"]] if fixed.get("pp") else _pow2(max(1, gpus // tp))
        eps = [fixed["ep"]] if fixed.get("ep") else ([1, tp] if spec.is_moe and tp > 1 else [1])
        dpas = [fixed["dp_attention"]] if fixed.get("dp_attention") else (
            [1, tp] if (spec.is_mla or spec.is_moe) and tp > 1 else [1])
        for pp in pps:
            if tp * pp > gpus:
                continue
            for ep in eps:
                for dpa in dpas:
                    lay = ServeLayout(tp=tp, pp=pp, ep=ep, dp_attention=dpa, a2a=fixed.get("a2a", "nccl"))
                    try:
                        out.append(lay.check(spec))
                    except NdplanError:  # a combination the model cannot run; a fixed layout was checked above
                        pass
    return sorted(set(out), key=lambda x: (x.devices, x.tp, x.pp, x.ep, x.dp_attention))


def _meets(est: ServeEstimate, ttft_s, tpot_s) -> str:
    if not est.fits:
        return "weights and one request's KV cache do not fit"
    if est.concurrency > est.running:
        return f"{est.concurrency - est.running} of {est.concurrency} requests queue (it runs {est.running} at once)"
    if ttft_s is not None and est.ttft_s > ttft_s:
        return f"TTFT {est.ttft_s * 1e3:.0f} ms > {ttft_s * 1e3:.0f} ms"
    if tpot_s is not None and est.tpot_s > tpot_s:
        return f"TPOT {est.tpot_s * 1e3:.1f} ms > {tpot_s * 1e3:.1f} ms"
    return ""


def _at_rate(run, rate: float, osl: int):
    """The estimate whose concurrency solves c = rate x lifetime(c), or None when ``rate`` is above
    the max-load throughput (running requests / lifetime)."""
    top = run(None)
    if not top.fits or rate * lifetime(top.ttft_s, top.tpot_s, osl) > top.concurrency:
        return None
    c = 1.0
    for _ in range(RATE_ITERATIONS):
        est = run(max(1, round(c)))
        nxt = min(top.concurrency, rate * lifetime(est.ttft_s, est.tpot_s, osl))
        if abs(nxt - c) < 0.5:
            break
        c = nxt
    return run(max(1, round(c)))


def serve_search(spec: ModelSpec, hw: Hardware, gpus: int, *, isl: int, osl: int, concurrency: int | None = None,
                 rate: float | None = None, ttft_s: float | None = None, tpot_s: float | None = None,
                 recipe: WeightRecipe = WeightRecipe(), kv_dtype: str = "bf16", engine_name: str = "vllm",
                 mem_fraction: float | None = None, fixed: dict | None = None, progress=None) -> list[ServeRow]:
    """Every layout on ``gpus`` devices, best first (module docstring)."""
    gpus = limits.count("--gpus", gpus, 1, limits.MAX_DEVICES)
    if concurrency is not None and rate is not None:
        raise NdplanError("--rate", rate, "given with --concurrency", "give one load: a concurrency or a request rate")
    if rate is not None:
        limits.real("--rate", rate, 0.0, 1e9, what="requests per second")
    for name, v in (("--ttft-ms", ttft_s), ("--tpot-ms", tpot_s)):
        if v is not None:
            limits.real(name, v * 1e3, 0.0, 1e9, what="milliseconds")
    layouts = candidate_layouts(spec, gpus, hw.devices_per_node, fixed or {})
    if not layouts:
        raise NdplanError("--gpus", gpus, f"no layout of {spec.name} fits in that many devices", "give more GPUs")
    hw_values = hw.kernel_values(fp8=recipe.dtype == "fp8")
    rows = []
    for i, lay in enumerate(layouts):
        if progress:
            progress(i, len(layouts), lay)
        replicas = gpus // lay.devices
        kernel = StepKernel(spec, engine_layout(engine(engine_name), lay), recipe, kv_dtype, hw_values)

        def run(c, lay=lay, kernel=kernel):
            return serve_estimate(spec, hw, lay, isl=isl, osl=osl, concurrency=c, recipe=recipe, kv_dtype=kv_dtype,
                                  engine_name=engine_name, mem_fraction=mem_fraction, kernel=kernel)
        share = 1.0  # the replicas' total over one replica's output
        if concurrency is not None:
            active = min(concurrency, replicas)  # a request per replica at most, when there are fewer
            each = -(-concurrency // active)
            est, share = run(each), concurrency / each
        elif rate is not None:
            est, share = _at_rate(run, rate / replicas, osl), replicas
            if est is None:
                top = run(None)
                rows.append(ServeRow(top, replicas, 0.0, gpus, False, f"rate {rate / replicas:.3g} req/s per replica "
                                                                       "above its max-load throughput"))
                continue
        else:
            est, share = _largest_meeting(run, ttft_s, tpot_s), replicas
        why = _meets(est, ttft_s, tpot_s)
        total = est.output_tokens_per_s_per_gpu * est.devices * share
        rows.append(ServeRow(est, replicas, total, gpus, not why, why))
    return sorted(rows, key=lambda r: (not r.meets, -r.per_budget_gpu, r.estimate.devices, r.estimate.layout.tp))


def largest_true(lo: int, hi: int, ok) -> int:
    """The largest x in lo..hi with ok(x), for ok true at lo and monotone (true, then false)."""
    if ok(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def _largest_meeting(run, ttft_s, tpot_s) -> ServeEstimate:
    """Max load, or under latency limits the largest concurrency meeting them (TTFT and TPOT grow with it)."""
    top = run(None)
    if (ttft_s is None and tpot_s is None) or not top.fits or not _meets(top, ttft_s, tpot_s):
        return top
    if _meets(run(1), ttft_s, tpot_s):  # not even one request meets them: report that one
        return run(1)
    return run(largest_true(1, top.concurrency, lambda c: not _meets(run(c), ttft_s, tpot_s)))


def pareto(rows: list[ServeRow]) -> list[ServeRow]:
    """The rows no other row beats on both TPOT (lower) and output tokens/s per budget GPU (higher)."""
    fits = [r for r in rows if r.estimate.fits]
    out = []
    for r in sorted(fits, key=lambda r: (r.estimate.tpot_s, -r.per_budget_gpu)):
        if not out or r.per_budget_gpu > out[-1].per_budget_gpu:
            out.append(r)
    return out


def min_gpus(spec: ModelSpec, hw: Hardware, **kw) -> tuple[int, ServeRow] | None:
    """The fewest GPUs (powers of two up to limits.MAX_DEVICES) whose best layout meets the load and the
    limits; None when none does."""
    n = 1
    while n <= limits.MAX_DEVICES:
        try:
            rows = serve_search(spec, hw, n, **kw)
        except NdplanError:
            rows = []
        good = [r for r in rows if r.meets]
        if good:
            return n, good[0]
        n *= 2
    return None

