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

Memory (``_add_memory``): static_s + sum_c inflight(schedule, s, c, pp, vpp, m) *
sum_kj n[v][k][j] act_kj <= budget, with the in-flight table of formulas/schedules.py.

Objective (step time), per schedule:

* gpipe / 1f1b (and interleaved with ``exact=True``): the exact makespan of the
  schedule's dependency DAG. Start times start[F|B, v, mb] obey the data dependencies
  (F of slice v after F of v-1; B of v after B of v+1; the last slice's B after its F)
  and each stage's fixed op order (``schedules.op_order``: 1F1B warm-up, steady F/B
  pairs, cool-down; GPipe all F then B in reverse; Megatron's interleaved order). Minimising the makespan over start times gives the
  longest path, so the optimum is the true step time of the best plan. The closed form
  sum_s t_s + (m-1) max_s t_s (formulas/step.py) is exact for equal stages; with
  unequal stages the makespan can be lower (a light last stage hides under the
  bottleneck), which the DAG captures. Redundant cuts: makespan >= sum_{s'<s} F_s' +
  m t_s + sum_{s'<s} B_s' for every s (fill, s's own work, drain).
* interleaved (Narayanan et al. 2021 Sec. 2.2.2; formulas/step.py): the steady state
  runs m micro-batches at the bottleneck, m * t_max, and fill/drain cross chunk
  boundaries, so the 1F1B bubble sum_s t_s - t_max shrinks by vpp:
      T = m t_max + (sum_s t_s - t_max) / vpp = ((vpp m - 1) t_max + sum_s t_s) / vpp.
  Kept as integers: objective units = vpp x time units.
* zbv (Qi et al. 2024 Sec. 6): per chunk (half a stage) the bubble is
  (pp-1)(T_F + T_B - 2 T_W); with stage totals t = 2(T_F + T_B + T_W), W = 2 T_W this is
  (pp-1)(t - 3W)/2, formulas/step.py's (t-3W)/(2t) factor on the 1F1B bubble (pp-1) t.
  For unequal stages the bottleneck form (t_s - 3 W_s taken at its maximum over s) keeps
  the model linear:
      T = m t_max + (pp-1)/2 * max(0, max_s (t_s - 3 W_s)),
  objective units = 2 x time units. Equal to formulas/step.py on uniform stages.

The interleaved and zbv forms are closed forms, not replays; simulate.py measures how
the replay of those schedules compares (tests/test_ppb_simulate.py states the relation).
The closed interleaved form assumes equal chunks within a stage; a plan with uneven
chunks can replay much slower than it predicts, which the ``exact`` DAG objective
prices correctly (at the cost of weaker bounds: 96 layers x 16 stages is not proven
within 10 s, benchmarks/ppb_solve.py).
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from ndplan.formulas.schedules import inflight, op_order, virtual_stage
from ndplan.ppb.instance import Instance
from ndplan.ppb.plan import Plan, slot
from ndplan.ppb.scale import Scaled

DAG_SCHEDULES = ("gpipe", "1f1b")
"""Schedules whose objective is always the exact DAG makespan (interleaved too with ``exact``)."""


class PPBModel:
    """Builds the CP-SAT model; ``objective`` is "time" (step time) or "memory" (the
    smallest peak memory over plans, for infeasibility diagnosis)."""

    def __init__(self, inst: Instance, sc: Scaled, *, objective: str = "time", enforce_memory: bool = True,
                 exact: bool = False):
        self.inst, self.sc, self.p = inst, sc, inst.pipeline
        self.L, self.V = len(inst.layers), inst.pipeline.chunks
        self.model = cp_model.CpModel()
        self.divisor = 1
        """Objective units per time unit (interleaved: vpp, zbv: 2)."""
        self._add_boundaries()
        self._add_type_counts()
        self._add_recompute_counts()
        self._add_stage_times()
        self._add_memory(enforce_memory)
        if objective == "memory":
            self._add_memory_objective()
        elif self.p.schedule in DAG_SCHEDULES or (exact and self.p.schedule == "interleaved"):
            self._add_dag_objective()
        elif self.p.schedule == "interleaved":
            self._add_interleaved_objective()
        else:
            self._add_zbv_objective()

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
            md.Add(sum(row[k] for row in self.cs) == self.sc.type_of.count(k))

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
        self.tmax = md.NewIntVar(0, self.horizon, "tmax")  # >= every t[s]; = max_s t[s] at an optimum
        for x in self.t:
            md.Add(self.tmax >= x)

    def _slices(self, s: int) -> list[int]:
        return [v for v in range(self.V) if slot(self.p, v)[0] == s]

    def _add_memory(self, enforce: bool):
        types, p = self.sc.types, self.p
        self.mem = []
        for s in range(p.pp):
            expr = 0
            for v in self._slices(s):
                k_inflight = inflight(p.schedule, s, slot(p, v)[1], p.pp, p.vpp, p.m)
                for k, t in enumerate(types):
                    expr += self.cnt[v][k] * t.static
                    expr += k_inflight * sum(n * a for n, a in zip(self.n[v][k], t.act))
            self.mem.append(expr)
            if enforce:
                self.model.Add(expr <= self.sc.budget)

    # ---- objectives
    def cap_stage_time(self, T: int) -> None:
        """Feasibility form: every stage time <= T, no objective."""
        for x in self.t:
            self.model.Add(x <= T)
        self.model.ClearObjective()

    def floor_stage_time(self, T: int) -> None:
        """Cut: no plan has all stage times below T (proven by cap_stage_time(T - 1))."""
        self.model.AddMaxEquality(self.tmax, self.t)
        self.model.Add(self.tmax >= T)
        if hasattr(self, "makespan"):
            self.model.Add(self.makespan >= self.p.m * self.tmax)

    def _add_dag_objective(self):
        md, p, H = self.model, self.p, self.horizon
        V, m = self.V, p.m
        dur = {"F": self.F, "B": [self.B[v] + self.W[v] for v in range(V)]}
        # start[kind, v, j]: start of op kind on virtual stage v for micro-batch j
        start = {(kind, v, j): md.NewIntVar(0, H, f"s{kind}{v}_{j}") for kind in "FB"
                 for v in range(V) for j in range(m)}
        end = lambda kind, v, j: start[kind, v, j] + dur[kind][v]  # noqa: E731
        self.makespan = md.NewIntVar(0, H, "makespan")
        for v in range(V):
            for j in range(m):
                if v > 0:
                    md.Add(start["F", v, j] >= end("F", v - 1, j))
                if v < V - 1:
                    md.Add(start["B", v, j] >= end("B", v + 1, j))
                else:
                    md.Add(start["B", v, j] >= end("F", v, j))
        for s in range(p.pp):
            ops = [(k, virtual_stage(p.schedule, s, c, p.pp), j) for k, c, j in op_order(p.schedule, s, p.pp, p.vpp, m)]
            for a, b in zip(ops, ops[1:]):
                md.Add(start[b] >= end(*a))
            md.Add(self.makespan >= end(*ops[-1]))
            # redundant cut: forward fill to stage s, its own work, backward drain from it
            md.Add(self.makespan >= sum(self.F[:s]) + m * self.t[s] + sum(dur["B"][:s]))
        self.start = start
        md.Minimize(self.makespan)

    def _add_interleaved_objective(self):
        self.divisor = self.p.vpp
        self.model.Minimize((self.p.vpp * self.p.m - 1) * self.tmax + sum(self.t))

    def _add_zbv_objective(self):
        md, p = self.model, self.p
        self.divisor = 2
        umax = md.NewIntVar(0, self.horizon, "umax")  # max(0, max_s t_s - 3 W_s)
        for s in range(p.pp):
            md.Add(umax >= self.t[s] - 3 * sum(self.W[v] for v in self._slices(s)))
        md.Minimize(2 * p.m * self.tmax + (p.pp - 1) * umax)

    def _add_memory_objective(self):
        z = self.model.NewIntVar(0, sum(t.static + self.p.m * max(t.act) for t in
                                        (self.sc.types[k] for k in self.sc.type_of)), "peak_mem")
        for e in self.mem:
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
