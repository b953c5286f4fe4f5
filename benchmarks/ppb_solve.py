"""PPB solve times and gaps (prints a table; no assertions).

Instances: an embedding, n identical decoder layers (3 recompute modes) and a head, with
times and memory of a 70B-class layer at tp=8 (rounded), under several budgets.

Each row is solved twice in the deterministic mode (ppb/config.py DEFAULT_DETERMINISTIC_TIME unless
--deterministic-time) and the two plans compared ("same"); the wall time is printed beside it.
--time-limit solves once per row on the wall clock instead.

    python benchmarks/ppb_solve.py [--deterministic-time 3 | --time-limit 10] [--workers 2]
"""

from __future__ import annotations

import argparse

from ndplan.ppb.instance import Instance, Layer, Pipeline
from ndplan.ppb.simulate import simulate
from ndplan.ppb.solve import DEFAULT_DETERMINISTIC_TIME, Config, solve

GIB = 2**30


def instance(n, pp, vpp, m, schedule, budget_gib) -> Instance:
    emb = Layer(name="embedding", kind="embedding", forward_s=1e-3, backward_input_s=1e-3, backward_weight_s=0.5e-3,
                static_bytes=2 * 10**9, activation_bytes={"none": 10**8})
    dec = Layer(name="decoder", kind="dense", forward_s=4e-3, backward_input_s=4e-3, backward_weight_s=4e-3,
                static_bytes=10**9, activation_bytes={"none": 8 * 10**8, "selective": 5 * 10**8, "full": 10**8},
                recompute_s={"selective": 1e-3, "full": 4e-3})
    head = Layer(name="head", kind="head", forward_s=6e-3, backward_input_s=6e-3, backward_weight_s=6e-3,
                 static_bytes=3 * 10**9, activation_bytes={"none": 6 * 10**8})
    return Instance(layers=(emb,) + (dec,) * n + (head,),
                    pipeline=Pipeline(pp=pp, vpp=vpp, m=m, schedule=schedule, budget_bytes=int(budget_gib * GIB)))


CASES = [  # (layers, pp, vpp, m, schedule)
    (96, 16, 2, 32, "interleaved"), (96, 16, 2, 32, "zbv"), (96, 16, 1, 32, "1f1b"), (96, 8, 1, 16, "1f1b"),
    (128, 16, 2, 64, "interleaved"), (128, 32, 2, 64, "zbv"), (160, 16, 2, 32, "zbv"), (160, 16, 2, 32, "interleaved"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deterministic-time", type=float, default=DEFAULT_DETERMINISTIC_TIME)
    ap.add_argument("--time-limit", type=float, default=None, help="a wall-clock budget instead (one solve per row)")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    cfg = Config(time_limit_s=a.time_limit, deterministic_time=a.deterministic_time, workers=a.workers)
    budget = f"{a.time_limit:g} s wall clock" if a.time_limit else f"{a.deterministic_time:g} deterministic units"
    print(f"budget {budget}, {a.workers} workers")
    print(f"{'layers':>6} {'pp':>3} {'vpp':>3} {'m':>3} {'schedule':<12} {'budget':>7} {'status':<10} "
          f"{'wall s':>7} {'gap':>7} {'objective s':>11} {'bound s':>9} {'bound by':<16} {'replay s':>9} {'same':>5}")
    for n, pp, vpp, m, sched in CASES:
        for budget_gib in (40, 60, 200):
            inst = instance(n, pp, vpp, m, sched, budget_gib)
            sol = solve(inst, cfg)
            same = "-" if a.time_limit else ("yes" if solve(inst, cfg).plan == sol.plan else "NO")
            if sol.plan is None:
                print(f"{n:>6} {pp:>3} {vpp:>3} {m:>3} {sched:<12} {budget_gib:>5}Gi {sol.status:<10} "
                      f"{sol.wall_s:>7.2f} {'':>7} {'':>11} {'':>9} {'':<16} {'':>9} {same:>5}")
                continue
            rep = simulate(inst, sol.plan).step_s
            print(f"{n:>6} {pp:>3} {vpp:>3} {m:>3} {sched:<12} {budget_gib:>5}Gi {sol.status:<10} {sol.wall_s:>7.2f} "
                  f"{sol.gap:>7.2%} {sol.objective_s:>11.4f} {sol.bound_s:>9.4f} {sol.bound_source:<16} {rep:>9.4f} {same:>5}",
                  flush=True)


if __name__ == "__main__":
    main()
