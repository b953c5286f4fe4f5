"""Communication time: alpha-beta cost per collective on a two-level topology.

Rank placement. Ranks are laid out axis by axis, innermost first, in ``order``
(default ``tp-cp-ep-dp-pp``, Megatron-Core's RankGenerator order). The stride of an
axis is the product of the degrees of the axes inside it; a group of ``n`` ranks with
stride ``r`` spans ``r*n`` consecutive ranks and stays inside a node when
``r*n <= node`` (devices per node; degrees are powers of two or divide the node in
every catalog case). Dense layers use the mesh (tp, cp, dp, pp) with ep = 1; routed
experts use Megatron's expert mesh, where tp becomes etp, cp folds into the
expert-data-parallel degree edp = dp*cp*tp/(ep*etp), and ep keeps its place.

Link. Inside a node: ``bw_intra * eff_intra`` bytes/s and ``lat_intra`` per step;
across nodes every device drives its own NIC (``bw_inter * eff_inter``, ``lat_inter``).
A collective that leaves the node runs on all the NICs its members in the node own
(NCCL multi-rail: one ring/channel per NIC, each carrying 1/n_in of the buffer). With
n_in = min(n, node * n / span) group members per node, a ring over n ranks crosses into
each node once per channel, so a node receives the ring's (n-1)/n * B (all-gather;
twice that for all-reduce) through n_in NICs: the inter-node bus bandwidth is
``n_in * bw_inter * eff_inter`` (nccl-tests on DGX A100, 8 x 200 Gb/s: multi-node
all-reduce busbw approaches the node's 8 x 25 GB/s, not one NIC's 25 GB/s). A group
with one member per node (stride >= node, e.g. DP over tp = 8) keeps one NIC: n_in = 1.

Cost of one collective over n ranks, B = bytes of the full (unsharded) buffer
(Thakur, Rabenseifner and Gropp 2005; NCCL's ``busbw`` convention):

* all-reduce (ring): 2*(n-1)/n * B / bw + 2*(n-1) * lat
* all-gather, reduce-scatter: (n-1)/n * B / bw + (n-1) * lat
  (bw: ``bandwidth(span, n)``, multi-rail across nodes)
* all-to-all of B bytes per rank: the (n_in - 1)/n share to peers in the node at intra
  bandwidth and the (n - n_in)/n share to other nodes at NIC bandwidth, concurrently:
  max of the two, + (n-1) * lat, with n_in = min(n, node/stride) group members per node.
* point-to-point: B / bw + lat.
"""

from __future__ import annotations

import sympy as sp

from ndplan import symbols as S
from ndplan.errors import NdplanError
from ndplan.formulas import groups as G

DEFAULT_ORDER = "tp-cp-ep-dp-pp"


def vmax(*args) -> sp.Expr:
    """Max without SymPy's pairwise simplification (slow on large sums); lambdifies to
    numpy.maximum."""
    return sp.Max(*args, evaluate=False)


def vmin(*args) -> sp.Expr:
    return sp.Min(*args, evaluate=False)
AXES = ("tp", "cp", "ep", "dp", "pp")


def check_order(order: str) -> tuple[str, ...]:
    axes = tuple(order.split("-"))
    if sorted(axes) != sorted(AXES):
        raise NdplanError("order", order, "not a placement order",
                          f"give a permutation of {'-'.join(AXES)} joined by '-', innermost first (default {DEFAULT_ORDER})")
    return axes


def _degrees(mesh: str) -> dict[str, sp.Expr]:
    if mesh == "expert":
        return {"tp": S.etp, "cp": sp.Integer(1), "ep": S.ep, "dp": G.expert_shard_ranks(),
                "pp": S.pp}
    return {"tp": S.tp, "cp": S.cp, "ep": sp.Integer(1), "dp": S.dp, "pp": S.pp}


def stride(order: str, axis: str, mesh: str = "dense") -> sp.Expr:
    """Rank distance between neighbours of ``axis``'s group."""
    deg = _degrees(mesh)
    axes = check_order(order)
    return sp.Mul(*[deg[a] for a in axes[:axes.index(axis)]])


def span(order: str, axes: tuple[str, ...], mesh: str = "dense") -> sp.Expr:
    """Consecutive ranks covered by a group made of ``axes`` (e.g. dp and cp together)."""
    deg = _degrees(mesh)
    outer = max(axes, key=check_order(order).index)
    return stride(order, outer, mesh) * deg[outer]


def _intra(sp_: sp.Expr):
    return sp_ <= S.node


def members_per_node(n, group_span) -> sp.Expr:
    """Group members inside one node: n ranks at stride span/n, node/stride of them per node
    (at least 1, at most n)."""
    return vmin(n, vmax(1, S.node * n / group_span))


def bandwidth(group_span: sp.Expr, n=1) -> sp.Expr:
    """Bus bandwidth of a group of ``n`` ranks spanning ``group_span`` consecutive ranks: the
    device's intra-node link, or across nodes the NICs of the members per node (multi-rail)."""
    inter = S.bw_inter * S.eff_inter * (members_per_node(n, group_span) if n != 1 else 1)
    return sp.Piecewise((S.bw_intra * S.eff_intra, _intra(group_span)), (inter, True))


def latency(group_span: sp.Expr) -> sp.Expr:
    return sp.Piecewise((S.lat_intra, _intra(group_span)), (S.lat_inter, True))


def all_reduce(n, nbytes, group_span) -> sp.Expr:
    return 2 * (n - 1) / n * nbytes / bandwidth(group_span, n) + 2 * (n - 1) * latency(group_span)


def all_gather(n, nbytes, group_span) -> sp.Expr:
    """Also the cost of a reduce-scatter of the same full buffer."""
    return (n - 1) / n * nbytes / bandwidth(group_span, n) + (n - 1) * latency(group_span)


def all_to_all(n, nbytes, group_stride) -> sp.Expr:
    group_span = group_stride * n
    n_in = vmin(n, vmax(1, S.node / group_stride))
    intra = (n_in - 1) / n * nbytes / (S.bw_intra * S.eff_intra)
    inter = (n - n_in) / n * nbytes / (S.bw_inter * S.eff_inter)
    return vmax(intra, inter) + (n - 1) * latency(group_span)


def p2p(nbytes, group_span) -> sp.Expr:
    return nbytes / bandwidth(group_span) + latency(group_span)
