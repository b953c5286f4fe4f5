"""DeepEP's normal-mode communication buffer, as Megatron-LM's flex token dispatcher
allocates it (``--moe-token-dispatcher-type flex`` with the deepep backend).

Megatron-LM@d98e8a64 core/transformer/moe/fused_a2a.py:24-69 sizes one process-wide
``deep_ep.Buffer`` for the expert-tensor x expert-parallel group (token_dispatcher.py:1837-1843:
``tp_ep_group``, n = etp * ep ranks) from the larger of DeepEP's dispatch and combine configs,
with ``hidden_bytes = hidden x max(element size, 2)`` (bf16 tokens: 2h), and sets the SM count
(token_dispatcher.py:1287-1292: ``moe_flex_dispatcher_num_sms``, else 20). The sizes below are
deepseek-ai/DeepEP@dd758caf:

* configs per group size (deep_ep/buffers/legacy.py:245-289; any other size is refused by an
  assert, :259/:289): ``CONFIGS``;
* NVLink buffer (csrc/legacy/config.hpp:53-72), over ``channels = num_sms / 2``, ``nvl = min(n, 8)``
  peers and ``rdma = max(n / 8, 1)`` nodes: ``channels*nvl*(2*rdma + 3)*4`` bytes of counters plus,
  per received-token slot (``channels*nvl*nvl_recv``), the token, its 8-byte ``SourceMeta``
  (internode.cu:22-42), 128 int64 top-k indices, 128 fp32 weights and 128 fp32 scales; rounded up
  to 128 bytes;
* RDMA buffer (config.hpp:75-98), only when n > 8: ``channels*rdma*(8*2 + 2)*2*4`` plus, per slot
  (``channels*rdma*rdma_recv``, rdma_recv aligned up to rdma_send, :44-46), twice the token, source
  meta, indices, weights and scales and an int4, rounded to 128 bytes. It is NVSHMEM symmetric memory,
  which DeepEP grows in 2**29-byte granules (legacy.py:122 ``NVSHMEM_CUMEM_GRANULARITY``), so it takes
  whole 512 MiB granules;
* the NVLink buffer carries 8*4 + 8*8 + 8*8 bytes of barrier signals and peer pointers
  (csrc/legacy/buffer.hpp:101-103, 134-135), and every Buffer a 32 MiB workspace (:149,
  kernels/legacy/compiled.cuh:7).

The buffer lives for the run (fused_a2a.py:60-69 reallocates only to grow).
"""

from __future__ import annotations

import sympy as sp

from ndplan import symbols as S

NVL_PEERS = 8
"""LEGACY_NUM_MAX_NVL_PEERS (csrc/kernels/legacy/compiled.cuh:5)."""
WORKSPACE_BYTES = 32 * 1024 * 1024
"""LEGACY_NUM_WORKSPACE_BYTES (compiled.cuh:7)."""
NVSHMEM_GRANULE_BYTES = 2 ** 29
"""NVSHMEM_CUMEM_GRANULARITY DeepEP sets (deep_ep/buffers/legacy.py:122)."""
MEGATRON_DEFAULT_SMS = 20
"""token_dispatcher.py:1287-1292 (Megatron-LM): DeepEP's historical default."""
MAX_TOPK, MAX_SCALES = 128, 128
"""kNumMaxTopK, kNumMaxScales (config.hpp:56-57, 79-80)."""
TOPK_IDX_BYTES, SOURCE_META_BYTES, INT4_BYTES, INT_BYTES = 8, 8, 16, 4
"""int64 top-k indices (EP_NUM_TOPK_IDX_BITS 64, deep_ep/include/deep_ep/common/compiled.cuh:54-55),
SourceMeta's two ints (internode.cu:22-23), int4 and int."""

CONFIGS = {  # group size: ((nvl_send, nvl_recv, rdma_send, rdma_recv) dispatch, (...) combine)
    2: ((24, 256, 6, 128), (10, 256, 6, 128)),
    4: ((6, 256, 6, 128), (9, 256, 6, 128)),
    8: ((6, 256, 6, 128), (4, 256, 6, 128)),
    16: ((36, 288, 20, 128), (4, 288, 12, 128)),
    24: ((32, 288, 8, 128), (1, 288, 8, 128)),
    32: ((32, 288, 8, 128), (1, 288, 8, 128)),
    48: ((32, 288, 8, 128), (1, 288, 8, 128)),
    64: ((32, 288, 8, 128), (1, 288, 8, 128)),
    96: ((20, 480, 12, 128), (1, 480, 8, 128)),
    128: ((20, 560, 12, 128), (1, 560, 8, 128)),
    144: ((32, 720, 12, 128), (2, 720, 8, 128)),
    160: ((28, 720, 12, 128), (2, 720, 8, 128)),
}
"""Buffer.get_dispatch_config / get_combine_config (deep_ep/buffers/legacy.py:245-289)."""


def _align(x, a):
    return -(-x // a) * a


def _slot_bytes(hidden_bytes):
    return hidden_bytes + SOURCE_META_BYTES + MAX_TOPK * TOPK_IDX_BYTES + MAX_TOPK * 4 + MAX_SCALES * 4


def nvl_bytes(n: int, sms: int, nvl_recv: int, hidden_bytes: int) -> int:
    """Config::get_nvl_buffer_size_hint (config.hpp:53-72)."""
    rdma, nvl, ch = max(n // NVL_PEERS, 1), min(n, NVL_PEERS), sms // 2
    total = ch * nvl * (2 * rdma + 3) * INT_BYTES + ch * nvl * nvl_recv * _slot_bytes(hidden_bytes)
    return _align(total, 128)


def rdma_bytes(n: int, sms: int, rdma_send: int, rdma_recv: int, hidden_bytes: int) -> int:
    """Config::get_rdma_buffer_size_hint (config.hpp:75-98); 0 within one node."""
    if n <= NVL_PEERS:
        return 0
    rdma, ch, recv = n // NVL_PEERS, sms // 2, _align(rdma_recv, rdma_send)
    total = ch * rdma * (NVL_PEERS * 2 + 2) * 2 * INT_BYTES
    total += ch * rdma * recv * (2 * _slot_bytes(hidden_bytes) + 2 * INT4_BYTES)
    return _align(total, 128)


def buffer_bytes(n: int, sms: int, hidden_bytes: int) -> int:
    """Device bytes of the Buffer Megatron allocates for an n-rank group (module docstring)."""
    nvl = max(nvl_bytes(n, sms, c[1], hidden_bytes) for c in CONFIGS[n])
    rdma = max(rdma_bytes(n, sms, c[2], c[3], hidden_bytes) for c in CONFIGS[n])
    signals = NVL_PEERS * (INT_BYTES + 8 + 8)
    return nvl + signals + _align(rdma, NVSHMEM_GRANULE_BYTES) + WORKSPACE_BYTES


def buffer_expr(hidden: int, sms: int, n=None) -> sp.Expr:
    """buffer_bytes over the group n = etp * ep (a strategy symbol), as a Piecewise over DeepEP's
    group sizes; other sizes are refused by DeepEP, so they take infinite memory (never fit)."""
    n = S.ep * S.etp if n is None else n
    pieces = [(sp.Integer(buffer_bytes(k, sms, 2 * hidden)), sp.Eq(n, k)) for k in CONFIGS]
    return sp.Piecewise(*pieces, (sp.oo, True))
