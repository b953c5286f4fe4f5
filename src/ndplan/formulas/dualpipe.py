"""DualPipe and DualPipeV op orders, with what each op waits for and when it sends (plain Python).

``plan(schedule, stage, pp, m)`` gives (ops, waits, release) of one stage (schedules.comm_plan):
the eight steps of deepseek-ai/DualPipe@3da1bbe ``DualPipe.step`` (dualpipe.py:358-420) and
``DualPipeV.step`` (dualpipev.py:330-396), which torch's ScheduleDualPipeV writes out in the same
order (``_calculate_single_rank_operations``, torch 2.13 schedules.py:3461-3620). With n = pp/2
half ranks, r = min(stage, pp-1-stage) and M = m/2 micro-batches per direction (DualPipe), or
n = pp, r = stage, M = m (DualPipeV):

1. 2(n-r-1) F0;  2. r+1 x (F0, F1);  3. n-r-1 x (B1 input-gradient, W, F1);
4. M-2n+r+1 x ((F0 & B1), (F1 & B0)), each pair overlapped, except the first (F0, B1) of the last
   rank (DualPipeV) or of the middle ranks (DualPipe), run apart;
5. n-r-1 x (B1, (F1 & B0));  6. r+1 x (B1, B0), input-gradient only from the middle iteration on
   (from B1 when r is odd, from B0 when even);  7. n-r-1 x (W, B0 input-gradient);  8. r+1 x W.

A backward is full (B then its W, sent after the W) unless input-gradient; a W op runs the oldest
pending weight gradient (``WeightGradStore``, FIFO); a pair (F&B) runs its F, then its B and W,
and sends both outputs after them (``_forward_backward_chunk``). Receives and sends follow the
code's recv/send flags (step 2 sends F0 after F1; the last/middle rank keeps its last F1 until
step 4). Chunk c is DualPipe's phase: under DualPipe the slice this stage's micro-batches reach
first is chunk 0 (layouts.virtual_stage), whose micro-batches are 0..M-1 on stages < pp/2 and
M..2M-1 (those entering at stage pp-1) on the others.

An op waits for its own input (a pair's F for its B's too). DualPipe's code waits for every
receive posted since its previous compute (``_commit_and_wait_comm``: step 3's W also waits for
the next F1's input); torch's runtime and the published figures wait for an op's own inputs
(tests/test_dualpipe.py: both give the figures' 66-unit step, the figures' op starts need this form).
"""

from __future__ import annotations

from functools import lru_cache


class _Rank:
    """One stage's ops as DualPipe's step() emits them: its compute calls (``f``, ``b``, ``w``,
    ``pair``) and its receives and sends (``recv``, ``send``)."""

    def __init__(self, schedule: str, stage: int, pp: int, m: int):
        if schedule == "dualpipe":
            self.n, self.r, self.M = pp // 2, min(stage, pp - 1 - stage), m // 2
            self.base = (0, self.M) if stage < pp // 2 else (self.M, 0)  # micro-batch ids of chunks 0, 1
            # the end stages: chunk 0 is the first slice, chunk 1 the last
            self.no_recv = {("F", 0), ("B", 1)} if self.r == 0 else set()
        else:
            self.n, self.r, self.M, self.base = pp, stage, m, (0, 0)
            # stage 0 runs the first and last slice, the last rank hands chunk 0 to chunk 1 itself
            self.no_recv = (({("F", 0), ("B", 1)} if stage == 0 else set())
                            | ({("F", 1), ("B", 0)} if stage == pp - 1 else set()))
        self.special = self.r == self.n - 1  # DualPipeV's last rank, DualPipe's two middle ranks
        self.bidirectional = schedule == "dualpipe"
        self.count = {(k, c): 0 for k in ("F", "B", "rF", "rB") for c in (0, 1)}
        self.ops: list[tuple[str, int, int]] = []
        self.waits: list[tuple] = []
        self.release: dict[int, int] = {}
        self.posted: list[tuple[str, int, int]] = []
        self.unsent = {("F", 0): [], ("F", 1): [], ("B", 0): [], ("B", 1): []}
        self.pending: list[tuple[int, int]] = []  # weight gradients deferred by input-gradient B's

    def _append(self, op, waits=()) -> None:
        self.ops.append(op)
        self.waits.append(tuple(waits))

    def _emit(self, op, also=None) -> None:
        """Wait for the op's own input (and its pair partner's), then compute (module docstring)."""
        mine = [k for k in self.posted if k == op or k == also]
        for k in mine:
            self.posted.remove(k)
        self._append(op, mine)

    def recv(self, kind: str, c: int) -> None:
        """_recv_forward / _recv_backward: nothing to receive at a slice's own end."""
        if (kind, c) not in self.no_recv:
            self.posted.append((kind, c, self.base[c] + self.count["r" + kind, c]))
        self.count["r" + kind, c] += 1

    def send(self, kind: str, c: int) -> None:
        self.release[self.unsent[kind, c].pop(0)] = len(self.ops) - 1

    def f(self, c: int, rcv=True, snd=True, also=None) -> None:
        if rcv:
            self.recv("F", c)
        self._emit(("F", c, self.base[c] + self.count["F", c]), also)
        self.count["F", c] += 1
        self.unsent["F", c].append(len(self.ops) - 1)
        if snd:
            self.send("F", c)

    def b(self, c: int, zb=False, rcv=True, snd=True, in_pair=False) -> None:
        """A backward: input-gradient only (``zb``, its W deferred) or whole (B then its W)."""
        if rcv and not in_pair:
            self.recv("B", c)
        j = self.base[c] + self.count["B", c]
        self.count["B", c] += 1
        if in_pair:  # no wait of its own: the pair's F waited for both inputs
            self._append(("B", c, j))
        else:
            self._emit(("B", c, j))
        self.unsent["B", c].append(len(self.ops) - 1)
        if zb:
            self.pending.append((c, j))
        else:
            self._append(("W", c, j))
        if snd:
            self.send("B", c)

    def w(self) -> None:
        if self.pending:
            c, j = self.pending.pop(0)
            self._emit(("W", c, j))

    def pair(self, c_f: int, c_b: int, rcv_f=True) -> None:
        """An overlapped forward & backward: both receives, F, then the other chunk's whole B, both sends."""
        if rcv_f:
            self.recv("F", c_f)
        self.recv("B", c_b)
        self.f(c_f, rcv=False, snd=False, also=("B", c_b, self.base[c_b] + self.count["B", c_b]))
        self.b(c_b, snd=False, in_pair=True)
        self.send("F", c_f)
        self.send("B", c_b)


def _warm_up(k: _Rank) -> None:
    """Steps 1-3: forwards of chunk 0, then (F0, F1) pairs, then zero-bubble (B1, W, F1)."""
    n, r = k.n, k.r
    for _ in range(2 * (n - r - 1)):
        k.f(0)
    k.recv("F", 0)
    send_f0 = k.special and k.bidirectional  # DualPipe's middle ranks send F0 at once
    for i in range(r + 1):
        k.f(0, rcv=False, snd=send_f0)
        k.recv("F", 0)
        k.f(1, snd=(not k.special) or i < r)
        if not send_f0:
            k.send("F", 0)
    for _ in range(n - r - 1):
        k.b(1, zb=True)
        k.recv("F", 1)
        k.w()
        k.f(1, rcv=False)


def _steady(k: _Rank) -> None:
    """Steps 4-5: overlapped pairs (F0 & B1), (F1 & B0); then (B1, F1 & B0)."""
    for i in range(k.M - 2 * k.n + k.r + 1):
        if i == 0 and k.special:  # "We don't overlap these two chunks to further reduce bubble size."
            k.f(0, rcv=False, snd=False)
            k.send("F", 1)
            k.b(1, snd=False)
            k.send("F", 0)
            k.send("B", 1)
        else:
            k.pair(0, 1, rcv_f=i > 0)
        k.pair(1, 0)
    for _ in range(k.n - k.r - 1):
        k.b(1)
        k.pair(1, 0)


def _cool_down(k: _Rank) -> None:
    """Steps 6-8: (B1, B0), input-gradient only from the middle iteration on; (W, B0); the last W's."""
    r, zb = k.r, False
    for i in range(r + 1):
        if i == (r + 1) // 2 and r % 2 == 1:
            zb = True
        k.b(1, zb)
        if i == (r + 1) // 2 and r % 2 == 0:
            zb = True
        k.b(0, zb)
    for _ in range(k.n - r - 1):
        k.w()
        k.b(0, zb=True)
    for _ in range(r + 1):
        k.w()


@lru_cache(maxsize=4096)
def plan(schedule: str, stage: int, pp: int, m: int) -> tuple[tuple, tuple, tuple[int, ...]]:
    """(ops, waits, release) of ``stage`` (module docstring; schedules.comm_plan)."""
    k = _Rank(schedule, stage, pp, m)
    _warm_up(k)
    _steady(k)
    _cool_down(k)
    return tuple(k.ops), tuple(k.waits), tuple(k.release.get(i, i) for i in range(len(k.ops)))
