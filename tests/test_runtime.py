"""The parallel runtime measured on the CPU: FSDP2 (fully_shard) on a gloo group of 2 ranks.

Independent reference: the real torch.distributed.fsdp running a transformers Llama as
torchtitan shards it, with every live tensor storage counted per rank
(ndplan.trace.runtime). ndplan's fsdp-profile Terms (engines.FSDP / HF: sharded states,
the FSDP2 gather and reduce-scatter buffers, the pipelined no-sync form) must match it
within 3 % per rank. Two spawns (2 and 4 processes), about 40 s.
"""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("torch", reason="ndplan[trace] (torch CPU) is installed by .ci/run")
pytest.importorskip("transformers", reason="ndplan[trace] (transformers) is installed by .ci/run")

from ndplan import engines  # noqa: E402
from ndplan.catalog.model import model_from_config  # noqa: E402
from ndplan.formulas import params as P  # noqa: E402
from ndplan.symbols import model_symbols  # noqa: E402
from ndplan.trace import runtime as R  # noqa: E402

CASES = tuple(R.Case(f"{mode}-w{w}", mode=mode, world=w, microbatches=2 if mode == "fsdp-pp" else 1)
              for w in (2, 4) for mode in ("fsdp", "fsdp-pp"))


@functools.lru_cache(maxsize=1)
def _measured():
    return R.run(list(CASES))


def _params() -> int:
    spec = model_from_config(dict(R.CONFIG), "runtime", "test")
    return int(P.params_total(spec, model_symbols(spec)))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_terms_match_the_runtime_per_rank(case):
    want = R.predicted(case)
    rows = [m for m in _measured() if m.case == case.name]
    assert len(rows) == case.world
    for m in rows:
        assert abs(m.states - want["states"]) <= 0.01 * m.states, (m, want)
        assert abs(m.peak - want["peak"]) <= 0.03 * m.peak, (m, want)


def test_states_are_sharded_fp32_weights_grads_and_adam():
    """FSDP2 with MixedPrecisionPolicy(bf16, fp32): 4 + 4 + 8 bytes per parameter over the ranks;
    after zero_grad(set_to_none) the 4 gradient bytes are gone."""
    n = _params()
    for m in _measured():
        world = int(m.case.rsplit("w", 1)[1])
        assert abs(m.states - 16 * n / world) <= 1024 and abs(m.base - 12 * n / world) <= 1024


def test_pipelined_fsdp_keeps_unsharded_weights_and_fp32_grads():
    """Every micro-batch without gradient sync or resharding (PipelineStage's FSDP branch):
    after the micro-batches' backward each rank holds the whole model's 16-bit weights and
    fp32 accumulated gradients unsharded, 2 + 4 bytes per parameter, beside its states."""
    n = _params()
    for m in (m for m in _measured() if m.case.startswith("fsdp-pp")):
        assert abs((m.held - m.base) - engines.FSDP.pp_unsharded_stage_bytes * n) <= 0.01 * 6 * n
