"""Pipeline balancing (PPB): stage-layer allocation and per-layer recomputation.

instance.py  layer description + pipeline configuration (validated), file formats
scale.py     integer scaling (time resolution, memory rounded up) in one place
dag.py       the schedule's op DAG (schedules.op_order), longest path and path cuts
model.py     CP-SAT builder, one ``_add_*`` method per constraint family
config.py    Config: time limit or deterministic budget, workers, seed, scale
solve.py     Solution, lazy path cuts, infeasibility diagnosis
local.py     a plan in model units; local search (layer shifts, recompute moves)
simulate.py  discrete-event replay of a plan, independent of the CP-SAT model
result.py    BalanceResult: solved plan, replay, baselines and gains (ndplan balance)
svg.py       hand-written SVG timeline
"""
