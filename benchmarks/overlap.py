"""Synchronous against overlapped training steps, side by side, on a local multi-node Ray cluster.

    python benchmarks/overlap.py [--steps 5] [--nodes 2] [--tasks-per-step 2] [--group-size 2]
                                 [--max-new-tokens 64] [--out FILE]

The real half of `tryloop bench train` (`tryloop bench train --real-only`; the code is in
tryloop/bench/train.py): builds a small store (HumanEval tasks, gated, with an approved reward gate)
in a temporary directory, starts a local Ray cluster (a head and `--nodes` sandbox nodes) and runs
`tryloop train` on the Ray engine twice with the same settings and seed, once synchronous, once
overlapped (`max_staleness: 1`), one after the other. Writes results-overlap.json beside this file
(or --out) and prints the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))
# The Ray nodes this starts inherit the environment: their workers import the same tryloop.
os.environ["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])

from tryloop.bench.train import REAL_DEFAULTS, run_real  # noqa: E402
from tryloop.errors import TryloopError  # noqa: E402

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in REAL_DEFAULTS.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    ap.add_argument("--out", type=Path, default=HERE / "results-overlap.json")
    args = ap.parse_args()
    try:
        results = run_real(**{k: getattr(args, k) for k in REAL_DEFAULTS}, out=args.out)
    except TryloopError as e:
        sys.exit(f"error: {e}")
    print(json.dumps({k: v for k, v in results.items() if k in ("ratios",)}, indent=1))


if __name__ == "__main__":
    main()
