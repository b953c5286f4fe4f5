"""Live tensor bytes on CPU, by the part of the model that allocated them.

A ``TorchDispatchMode`` sees every aten op; each output whose storage is new is counted
until Python frees the storage (``weakref.finalize`` on the untyped storage, the way
torch's own ``torch.distributed._tools.mem_tracker.MemTracker`` follows storages). Views
share their base's storage and are counted once. Storages that exist before the step
(parameters, buffers, the inputs) are never counted. A DTensor is counted by its local
shard (what the rank holds; ``plain_tensors``).

What is recorded for one forward + backward:
- ``stored[site]``: bytes still alive at the end of the forward, by the site (embedding,
  decoder layer i, head) whose forward allocated them: what that site keeps for backward;
- ``forward_peak[site]``: the largest live total while the site's forward ran, minus the
  live total when it began (the site's own forward transient, stored bytes included);
- ``backward_peak``: the largest live total of storages made in backward that are not
  parameter gradients, i.e. gradient-of-activation and recompute workspace above what the
  forward stored.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten


def plain_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The tensors that own storage behind ``t``: ``t`` itself, or a DTensor's local shard
    (tensor subclasses name their inner tensors in ``__tensor_flatten__``)."""
    if not is_traceable_wrapper_subclass(t):
        return [t]
    out = []
    for name in t.__tensor_flatten__()[0]:
        inner = getattr(t, name)
        if isinstance(inner, torch.Tensor):
            out += plain_tensors(inner)
    return out


def storage_ptrs(tensors) -> set[int]:
    """data_ptrs of the storages behind ``tensors`` (DTensors: their local shards)."""
    return {p.untyped_storage().data_ptr() for t in tensors for p in plain_tensors(t)}


class LiveBytes(TorchDispatchMode):
    """Counts storages the ops of one step create, by site and phase."""

    def __init__(self, known: set[int]):
        super().__init__()
        self._known = set(known)  # data_ptrs of storages that existed before (params, buffers, inputs)
        self._live: dict[int, tuple[int, str, str]] = {}  # ptr -> (bytes, site, phase)
        self.site = "embedding"
        self.phase = "forward"
        self.total = 0
        self._site_start = 0
        self.forward_peak: dict[str, int] = {}
        self._bwd_nongrad = 0
        self.backward_peak = 0
        self.grad_ptrs: set[int] = set()

    # -- bookkeeping -------------------------------------------------------------------
    def enter(self, site: str) -> None:
        """The forward of ``site`` begins (recomputed forwards in backward change nothing)."""
        if self.phase != "forward":
            return
        self.site = site
        self._site_start = self.total
        self.forward_peak.setdefault(site, 0)

    def _count(self, t: torch.Tensor) -> None:
        for local in plain_tensors(t):
            self._count_plain(local)

    def _count_plain(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        ptr, nbytes = st.data_ptr(), st.nbytes()
        if nbytes == 0 or ptr in self._live or ptr in self._known:
            return
        self._live[ptr] = (nbytes, self.site, self.phase)
        self.total += nbytes
        if self.phase == "forward":
            peak = self.total - self._site_start
            if peak > self.forward_peak.get(self.site, 0):
                self.forward_peak[self.site] = peak
        else:
            self._bwd_nongrad += nbytes
            self.backward_peak = max(self.backward_peak, self._bwd_nongrad)
        weakref.finalize(st, self._free, ptr)

    def _free(self, ptr: int) -> None:
        nbytes, _, phase = self._live.pop(ptr)
        self.total -= nbytes
        if phase == "backward" and ptr not in self.grad_ptrs:
            self._bwd_nongrad -= nbytes

    def mark_grad(self, t: torch.Tensor) -> None:
        """A parameter gradient: not workspace (AccumulateGrad keeps it)."""
        for local in plain_tensors(t):
            self._mark_plain(local)

    def _mark_plain(self, t: torch.Tensor) -> None:
        ptr = t.untyped_storage().data_ptr()
        if ptr in self._live and ptr not in self.grad_ptrs:
            self.grad_ptrs.add(ptr)
            if self._live[ptr][2] == "backward":
                self._bwd_nongrad -= self._live[ptr][0]

    def stored(self) -> dict[str, int]:
        """Bytes alive now, by the site that allocated them (call at the end of the forward)."""
        out: dict[str, int] = {}
        for nbytes, site, phase in self._live.values():
            if phase == "forward":
                out[site] = out.get(site, 0) + nbytes
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._count(t)
        return out
