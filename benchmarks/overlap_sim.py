#!/usr/bin/env python3
"""Synchronous against overlapped training steps in the simulator, side by side (docs/train.md, docs/scaling.md).

    .venv/bin/python benchmarks/overlap_sim.py                  # prints the table
    .venv/bin/python benchmarks/overlap_sim.py --out benchmarks/results-overlap-sim.json
    .venv/bin/python benchmarks/overlap_sim.py --preset real-run   # one preset
    .venv/bin/python benchmarks/overlap_sim.py --from-real FILE    # real-run presets from another real run

The simulator half of `tryloop bench train` (`tryloop bench train --sim-only`; the code and the
presets are in tryloop/bench/train.py). Each run is one `tryloop.scheduler.sim.simulate_training`:
the real scheduler on virtual time, modelled GPUs and sandbox slots, and a modelled learner whose
update takes a set time and whose weight push stops every sampling GPU for `push_s` and empties its
prefix cache. Every run of a preset has the same workload and seed.

Presets: real-run and real-run-overlapped-timings take their timings from the synchronous and the
overlapped half of the real run in results-overlap.json (or --from-real); gpu-64 is 64 sampler GPUs
with an assumed learner, gpu-64-fast-learner and gpu-64-adaptive vary its update and admission.

Deterministic: the same arguments give the same figures (`wall_s` aside).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tryloop.bench.train import PRESETS, real_vs_sim_markdown, run_sim, sim_markdown  # noqa: E402
from tryloop.errors import TryloopError  # noqa: E402

HERE = Path(__file__).resolve().parent
REAL = HERE / "results-overlap.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", nargs="+", choices=list(PRESETS), default=list(PRESETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--from-real", type=Path, default=REAL, help="the real run's results (results-overlap.json)")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args()
    try:
        results = run_sim(tuple(args.preset), args.seed, real=args.from_real)
    except TryloopError as e:
        sys.exit(f"error: {e}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(sim_markdown(results))
    if real := real_vs_sim_markdown(results):
        print()
        print(real)


if __name__ == "__main__":
    main()
