"""PPB solve times and gaps (prints a table; no assertions).

Instances: an embedding, n identical decoder layers (3 recompute modes) and a head, with
times and memory of a 70B-class layer at tp=8 (rounded), under several budgets.

    python benchmarks/ppb_solve.py [--time-limit 10] [--workers 2]
"""

from __future__ import annotations

import argparse

from ndplan.ppb.instance import Instance, Layer, Pipeline
from ndplan.ppb.simulate import simulate
from ndplan.ppb.solve import Config, solve

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
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    print(f"{'layers':>6} {'pp':>3} {'vpp':>3} {'m':>3} {'schedule':<12} {'budget':>7} {'status':<10} "
          f"{'solve s':>7} {'gap':>7} {'objective s':>11} {'replay s':>9}")
    for n, pp, vpp, m, sched in CASES:
        for budget in (40, 60, 200):
            inst = instance(n, pp, vpp, m, sched, budget)
            sol = solve(inst, Config(time_limit_s=a.time_limit, workers=a.workers))
            name = sched
            if sol.plan is None:
                print(f"{n:>6} {pp:>3} {vpp:>3} {m:>3} {name:<12} {budget:>5}Gi {sol.status:<10} {sol.wall_s:>7.2f}")
                continue
            rep = simulate(inst, sol.plan).step_s
            print(f"{n:>6} {pp:>3} {vpp:>3} {m:>3} {name:<12} {budget:>5}Gi {sol.status:<10} {sol.wall_s:>7.2f} "
                  f"{sol.gap:>7.2%} {sol.objective_s:>11.4f} {rep:>9.4f}", flush=True)


if __name__ == "__main__":
    main()
