"""CP-SAT model of pipeline balancing.

Decisions (index meanings: v virtual stage 0..V-1 in layer order, V = pp*vpp; s stage
0..pp-1; c chunk 0..vpp-1; k layer type (identical layers, scale.py); j recompute mode
index within type k's modes; mb micro-batch 0..m-1):

* ``b[v]``  first layer of virtual stage v; b[0] = 0, b[V] = L, b[v+1] >= b[v] + 1.
  Order and contiguity hold by construction: slice v is layers b[v] .. b[v+1]-1.
* ``N[k][v] = prefix_k[b[v]]`` (element constraint): type-k layers before slice v, so
  slice v holds cnt[v][k] = N[k][v+1] - N[k][v] of them.
* ``n[v][k][j]`` layers of type k in slice v recomputed with mode j; sum_j = cnt[v][k].
  Identical layers are interchangeable, so counts lose no optimum of the per-layer
  problem; the plan puts the deepest recompute on the first layers of the slice.

Per micro-batch (time units): F_v = sum_k cnt F_k, B_v = sum_k cnt B_k + sum_kj n rec_kj,
W_v = sum_k cnt W_k, stage time t_s = sum_c (F + B + W) of the slices it runs.

Memory (``_add_memory``): for every per-chunk held vector h of the stage
(``schedules.held_profiles``: the maximal vectors of micro-batches each chunk holds at
an instant the stage can peak), static_s + sum_c h_c * sum_kj n[v(s,c)][k][j] act_kj <=
budget. One vector for gpipe/1f1b/zbv/dualpipe(v) (the in-flight table); interleaved has several,
because chunk 0 refills while the last chunk drains, so a stage with uneven chunks peaks
above the table's split (the stage total is the same in every vector).

Objective (step time), per schedule:

* gpipe, 1f1b, interleaved, zbv: the makespan of the schedule's dependency DAG (dag.py):
  every stage runs its ops in ``schedules.op_order``, F(v, j) after F(v-1, j), B(v, j)
  after B(v+1, j), so the step time is the longest path, a sum of op durations. The
  DAG is fixed by (schedule, pp, vpp, m); only durations depend on the plan, so each
  path P gives a linear cut valid for every plan,
      Z >= sum_v nF_v(P) F_v + nB_v(P) (B_v + W_v),
  and Z = max over all paths is the step time. The model starts with one path per stage
  (forward fill to it, its m micro-batches of every chunk, backward drain from it:
  Z >= sum_{s'<s} (F + B + W)_(s', chunk 0) + m t_s; for equal stages and chunks, at
  s = pp-1, this is formulas/step.py's closed form m t + (pp-1) t / vpp (1f1b: vpp = 1),
  and on those plans the longest path has that length), and solve.py adds the critical path
  of every plan whose longest path exceeds Z until the optimum's Z is its longest path
  (lazy cuts: the relaxation's bound stays valid, the incumbent is replayed exactly).
  Unequal stages or chunks can make the longest path differ from either closed form in
  both directions: a light last stage hides under the bottleneck (1f1b below the closed
  form), uneven chunks stall the interleaved steady state (above it).
* zbv: the same longest path over the ZB-V op order (``schedules.op_order``: the
  paper's handcrafted V schedule), with W (weight gradient) its own op after B; on
  uniform stages it reaches formulas/step.py's bubble (pp-1) max(T_F, T_F + T_B - 2 T_W)
  per chunk (tests/test_ppb_simulate.py).
* dualpipe, dualpipev: the same over DeepSeek's op orders (dag.py: an overlapped pair starts
  when both its inputs are there; a whole backward sends after its W). Under dualpipe each
  slice runs on two stages (``plan.stage_slices``): a stage holds both its slices' static
  memory and activations, and the per-type layer counts over stages sum to twice the model.

"""

from __future__ import annotations

from ortools.sat.python import cp_model

from ndplan.formulas.schedules import held_profiles
from ndplan.ppb import dag
from ndplan.vocab import SPLIT_W_SCHEDULES
from ndplan.ppb.instance import Instance
from ndplan.ppb.plan import Plan, copies, stage_slices
from ndplan.ppb.scale import Scaled

class PPBModel:
    """Builds the CP-SAT model; ``objective`` is "time" (step time) or "memory" (the
    smallest peak memory over plans, for infeasibility diagnosis)."""

    def __init__(self, inst: Instance, sc: Scaled, *, objective: str = "time", enforce_memory: bool = True,
                 chunk_slack: int | None = None):
        self.inst, self.sc, self.p = inst, sc, inst.pipeline
        self.L, self.V = len(inst.layers), inst.pipeline.chunks
        self.model = cp_model.CpModel()
        self.lazy = objective == "time" and self.p.schedule in dag.FIXED_ORDER_SCHEDULES
        """True when the objective is the DAG longest path over cuts (``add_path_cut``)."""
        self._add_boundaries()
        self._add_type_counts()
        self._add_recompute_counts()
        self._add_stage_times()
        self._add_memory(enforce_memory)
        if chunk_slack is not None:
            self._add_chunk_balance(chunk_slack)
        if objective == "memory":
            self._add_memory_objective()
        elif self.lazy:
            self._add_path_objective()
        else:
            raise ValueError(f"PPB has no step-time objective for schedule {self.p.schedule!r}")

    # ---- decisions
    def _add_boundaries(self):
        md, L, V = self.model, self.L, self.V
        # b[v]: first layer of virtual stage v; slices are non-empty
        self.b = [md.NewConstant(0)] + [md.NewIntVar(v, L - (V - v), f"b{v}") for v in range(1, V)] + [md.NewConstant(L)]
        for v in range(V):
            md.Add(self.b[v + 1] >= self.b[v] + 1)

    def _add_type_counts(self):
        md = self.model
        # cnt[v][k]: layers of type k in slice v
        self.cnt = [[None] * len(self.sc.types) for _ in range(self.V)]
        Ns = []
        for k in range(len(self.sc.types)):
            prefix = self.sc.prefix(k)
            N = []  # N[v]: type-k layers before slice v
            for v in range(self.V + 1):
                if v in (0, self.V):
                    N.append(prefix[0] if v == 0 else prefix[-1])
                    continue
                x = md.NewIntVar(0, prefix[-1], f"N{k}_{v}")
                md.AddElement(self.b[v], prefix, x)
                N.append(x)
            for v in range(self.V):
                c = md.NewIntVar(0, prefix[-1], f"cnt{v}_{k}")
                md.Add(c == N[v + 1] - N[v])
                self.cnt[v][k] = c
            Ns.append(N)
        # redundant, for the LP relaxation and propagation: layers before slice v = sum over
        # types of type-k layers before it; every layer of a type is placed once; cs[s][k]
        # type-k layers on stage s (all its chunks), summing to the type's total
        for v in range(1, self.V):
            md.Add(self.b[v] == sum(N[v] for N in Ns))
        self.cs = []
        for s in range(self.p.pp):
            row = []
            for k in range(len(self.sc.types)):
                x = md.NewIntVar(0, self.sc.type_of.count(k), f"cs{s}_{k}")
                md.Add(x == sum(self.cnt[v][k] for v in self._slices(s)))
                row.append(x)
            self.cs.append(row)
        for k in range(len(self.sc.types)):
            md.Add(sum(self.cnt[v][k] for v in range(self.V)) == self.sc.type_of.count(k))
            md.Add(sum(row[k] for row in self.cs) == copies(self.p) * self.sc.type_of.count(k))

    def _add_recompute_counts(self):
        md = self.model
        # n[v][k][j]: layers of type k in slice v with mode j (type k's modes)
        self.n = []
        for v in range(self.V):
            row = []
            for k, t in enumerate(self.sc.types):
                total = self.sc.type_of.count(k)
                if len(t.modes) == 1:
                    row.append([self.cnt[v][k]])
                    continue
                xs = [md.NewIntVar(0, total, f"n{v}_{k}_{t.modes[j]}") for j in range(len(t.modes))]
                md.Add(sum(xs) == self.cnt[v][k])
                row.append(xs)
            self.n.append(row)
            self._one_select_list(v, row)

    def _one_select_list(self, v: int, row: list) -> None:
        """MindFormers recomputes a slice's first ``select_recompute`` and first
        ``select_comm_recompute`` layers, so a slice cannot hold selective-only and comm-only
        layers at once (one of the two prefixes contains the other): at most one kind per slice."""
        def of(mode):
            return [row[k][t.modes.index(mode)] for k, t in enumerate(self.sc.types) if mode in t.modes and len(t.modes) > 1]
        sel, comm = of("selective"), of("comm")
        if not sel or not comm:
            return
        total = len(self.sc.type_of)
        y = self.model.NewBoolVar(f"sel_not_comm{v}")
        self.model.Add(sum(sel) <= total * y)
        self.model.Add(sum(comm) <= total * (1 - y))

    # ---- derived quantities
    def _add_stage_times(self):
        md, types = self.model, self.sc.types
        self.F, self.B, self.W = [], [], []
        for v in range(self.V):
            self.F.append(sum(self.cnt[v][k] * t.F for k, t in enumerate(types)))
            self.B.append(sum(self.cnt[v][k] * t.B + sum(n * r for n, r in zip(self.n[v][k], t.rec))
                              for k, t in enumerate(types)))
            self.W.append(sum(self.cnt[v][k] * t.W for k, t in enumerate(types)))
        self.horizon = self.p.m * sum(t.F + t.B + t.W + max(t.rec) for t in (types[k] for k in self.sc.type_of))
        # t[s]: per-micro-batch time of stage s, all its chunks
        self.t = []
        for s in range(self.p.pp):
            x = md.NewIntVar(0, self.horizon, f"t{s}")
            base = sum(self.cs[s][k] * (t.F + t.B + t.W) for k, t in enumerate(types))
            rec = sum(n * r for v in self._slices(s) for k, t in enumerate(types) for n, r in zip(self.n[v][k], t.rec))
            md.Add(x == base + rec)
            self.t.append(x)

    def _slices(self, s: int) -> list[int]:
        return [v for _, v in stage_slices(self.p, s)]

    def _add_chunk_balance(self, slack: int):
        """Restriction (solve.py's first phase): the chunks of a stage hold layer counts
        within ``slack`` of each other."""
        for s in range(self.p.pp):
            sizes = [self.b[v + 1] - self.b[v] for v in self._slices(s)]
            for a, b in zip(sizes, sizes[1:] + sizes[:1]):
                if a is not b:
                    self.model.Add(a - b <= slack)
                    self.model.Add(b - a <= slack)

    def _add_memory(self, enforce: bool):
        types, p = self.sc.types, self.p
        # mem[s]: one expression per held vector of stage s (schedules.held_profiles)
        self.mem = []
        for s in range(p.pp):
            static, act = 0, [0] * p.vpp
            for c, v in stage_slices(p, s):
                for k, t in enumerate(types):
                    static += self.cnt[v][k] * t.static
                    act[c] += sum(n * a for n, a in zip(self.n[v][k], t.act))
            exprs = [static + sum(h_c * a_c for h_c, a_c in zip(h, act))
                     for h in held_profiles(p.schedule, s, p.pp, p.vpp, p.m)]
            self.mem.append(exprs)
            if enforce:
                for e in exprs:
                    self.model.Add(e <= self.sc.budget)

    # ---- objectives
    def _add_path_objective(self):
        p = self.p
        split_w = p.schedule in SPLIT_W_SCHEDULES
        # dur[kind, v]: one micro-batch's op on slice v (B includes recompute, and W unless split)
        self.dur = {}
        for v in range(self.V):
            self.dur["F", v] = self.F[v]
            self.dur["B", v] = self.B[v] + (0 if split_w else self.W[v])
            self.dur["W", v] = self.W[v]
        self.Z = self.model.NewIntVar(0, self.horizon, "step")  # >= every path added
        self.cuts: dict = {}  # path key -> None: insertion-ordered, so adding them elsewhere is reproducible
        graph = dag.build(p.schedule, p.pp, p.vpp, p.m)
        for s in range(p.pp):
            self.add_path_cut(dag.chain_counts(graph, s))
        self.model.Minimize(self.Z)

    def add_path_cuts(self, cuts) -> None:
        for key in cuts:
            self.add_path_cut(dict(key))

    def add_path_cut(self, counts) -> bool:
        """Z >= the path's length (counts[kind, v] ops of each kind and slice); False if known."""
        key = tuple(sorted(counts.items()))
        if key in self.cuts:
            return False
        self.cuts[key] = None
        self.model.Add(self.Z >= sum(n * self.dur[kv] for kv, n in counts.items()))
        return True

    def _add_memory_objective(self):
        z = self.model.NewIntVar(0, sum(t.static + self.p.m * max(t.act) for t in
                                        (self.sc.types[k] for k in self.sc.type_of)), "peak_mem")
        for exprs in self.mem:
            for e in exprs:
                self.model.Add(z >= e)
        self.model.Minimize(z)

    # ---- plans in and out
    def _counts(self, plan: Plan) -> list[list[list[int]]]:
        out = [[[0] * len(t.modes) for t in self.sc.types] for _ in range(self.V)]
        for v in range(self.V):
            for i in plan.layers(v):
                k = self.sc.type_of[i]
                out[v][k][self.sc.types[k].modes.index(plan.recompute[i])] += 1
        return out

    def _vars_and_values(self, plan: Plan):
        for v in range(1, self.V):
            yield self.b[v], plan.bounds[v]
        counts = self._counts(plan)
        for v in range(self.V):
            for k, t in enumerate(self.sc.types):
                if len(t.modes) > 1:
                    yield from zip(self.n[v][k], counts[v][k])

    def hint(self, plan: Plan) -> None:
        for var, val in self._vars_and_values(plan):
            self.model.AddHint(var, val)

    def fix(self, plan: Plan) -> None:
        for var, val in self._vars_and_values(plan):
            self.model.Add(var == val)

    def plan(self, solver: cp_model.CpSolver) -> Plan:
        """The solved plan; in each slice the deepest recompute goes to the first layers of each type."""
        bounds = tuple(solver.Value(x) for x in self.b)
        rec = [None] * self.L
        for v in range(self.V):
            for k, t in enumerate(self.sc.types):
                left = {t.modes[j]: solver.Value(x) for j, x in enumerate(self.n[v][k])}
                for i in range(bounds[v], bounds[v + 1]):
                    if self.sc.type_of[i] != k:
                        continue
                    mode = next(mo for mo in reversed(t.modes) if left[mo] > 0)
                    left[mode] -= 1
                    rec[i] = mode
        return Plan(bounds=bounds, recompute=tuple(rec))
