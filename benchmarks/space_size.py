"""Size and speed of the candidate space (ndplan.space.generate), all dimensions auto.

Prints, per model and GPU count: candidates generated, valid, rejected per rule
(first failing rule, RULES order), groups (categorical combinations) and wall time
(best of 3 runs). Run: ``python benchmarks/space_size.py [--model NAME ...] [--seq N] [--gbs N]``.
"""

from __future__ import annotations

import argparse
import time

import ndplan
from ndplan.space import RULES, generate

GPUS = (8, 64, 512, 4096, 16384)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", default=["llama3-70b", "deepseek-v3"])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--gbs", type=int, default=1024)
    args = ap.parse_args()
    names = [name for name, _ in RULES]
    header = f"{'model':<14} {'gpus':>6} {'generated':>11} {'valid':>9} " + " ".join(f"{n:>9}" for n in names) + \
             f" {'groups':>6} {'ms':>7}"
    print(f"seq={args.seq} gbs={args.gbs}; columns after 'valid' are rejections per rule")
    print(header)
    for name in args.model:
        model = ndplan.load_model(name)
        for gpus in GPUS:
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                cands = generate(model, gpus, args.seq, args.gbs)
                best = min(best, time.perf_counter() - t0)
            assert cands.generated == cands.valid + sum(cands.rejected.values())
            print(f"{name:<14} {gpus:>6} {cands.generated:>11,} {cands.valid:>9,} "
                  + " ".join(f"{cands.rejected[n]:>9,}" for n in names)
                  + f" {len(cands.groups):>6} {best * 1e3:>7.1f}")


if __name__ == "__main__":
    main()
