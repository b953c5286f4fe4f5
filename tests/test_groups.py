"""Quantities that several formulas share (formulas/groups.py) agree wherever they are used.

Each test is a copy that disagreed before groups.py held the one source; the expected
values are derived here by hand from what the framework keeps and streams.
"""

from __future__ import annotations

import dataclasses

import pytest

import ndplan

LLAMA = ndplan.load_model("llama3-8b")
H100 = ndplan.load_hardware("h100-sxm")


def test_dp_gradient_volume_uses_the_bytes_memory_holds():
    """MindSpore accumulates gradients in the parameter dtype (MindFormers ``accu_grad``;
    engines.py ``grads_in_weight_dtype``): fp32 weights mean 4-byte gradients in memory,
    and the data-parallel all-reduce moves those same 4 bytes per element, twice the bf16
    case (ring all-reduce time is linear in bytes; 8B parameters make latency negligible).
    Before: memory said 4 bytes, the DP traffic 2 (ratio 1)."""
    times, grad_bytes = {}, {}
    for w in ("fp32", "bf16"):
        s = ndplan.Strategy(dp=8, gbs=16, zero=0, engine="mindspore[overlap_grad_reduce=0]", weight_dtype=w)
        e = ndplan.estimate(LLAMA, H100, s)
        times[w] = e.time_terms["time.dp_comm"]
        grad_bytes[w] = e.per_stage[0]["terms"]["mem.grads"] / e.params_total  # pp = tp = 1: every parameter
    assert grad_bytes == {"fp32": 4.0, "bf16": 2.0}
    assert times["fp32"] / times["bf16"] == pytest.approx(2.0, rel=2e-3)


def test_optimizer_step_streams_the_fp8_master():
    """FP8 weights keep an fp32 master (Transformer Engine; memory's mem.master is 4
    bytes/param), so under FSDP (whose fp32 shards are otherwise the master) the Adam step
    reads the 4-byte fp32 gradient, reads and writes the 4-byte master (8) and both fp32
    moments (16), and writes the 1-byte FP8 copy: 29 bytes per parameter at HBM bandwidth
    (dp = 1: one device holds every parameter). Before: 22 (no master, 1-byte "master")."""
    e = ndplan.estimate(LLAMA, H100, ndplan.Strategy(dp=1, gbs=1, zero=1, engine="fsdp", weight_dtype="fp8"))
    assert e.per_stage[0]["terms"]["mem.master"] == 4 * e.params_total
    expected = 29 * e.params_total / (H100.hbm_gb_per_s * 1e9 * H100.hbm_efficiency)
    assert e.time_terms["time.optimizer"] == pytest.approx(expected, rel=1e-12)


def test_host_memory_shards_as_the_optimizer_states_it_holds():
    """MindSpore's optimizer parallelism does not shard the input embedding (engines.py
    ``embedding_zero_sharded=False``): with the states offloaded, host memory per device is
    8 bytes (fp32 m, v; no separate master) x ((P - E)/dp + E), E = vocab x hidden the
    embedding, exactly the mem.optimizer the same strategy keeps in HBM without offload.
    Before: 8 x P/dp (the embedding sharded on host but not in HBM)."""
    s = ndplan.Strategy(dp=4, gbs=8, zero=1, engine="mindspore", offload_optimizer=True)
    e = ndplan.estimate(LLAMA, H100, s)
    P, E = e.params_total, LLAMA.vocab_size * LLAMA.hidden_size
    assert e.host_bytes == 8 * ((P - E) // 4 + E)
    kept = ndplan.estimate(LLAMA, H100, dataclasses.replace(s, offload_optimizer=False)).per_stage[0]["terms"]
    assert e.host_bytes == kept["mem.master"] + kept["mem.optimizer"]
