#!/usr/bin/env python3
"""Run the scheduler benchmark from a checkout and write its figures as JSON.

    .venv/bin/python benchmarks/scheduler.py --quick
    .venv/bin/python benchmarks/scheduler.py --out benchmarks/results-scheduler.json

Measures (see tryloop/bench/scheduler.py): the scheduler's overhead per episode, the
most concurrent episodes one process sustains, Ray vs local throughput on this machine,
and the simulated GPU-idle / sandbox-idle shares with and without adaptive admission.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tryloop.bench.scheduler import run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny numbers: a smoke run of every measurement")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args()
    results = run(quick=args.quick)
    text = json.dumps(results, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
