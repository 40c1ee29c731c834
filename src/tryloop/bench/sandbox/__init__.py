"""`tryloop bench sandbox`: sandbox latency, density and leaks, each next to its baseline.

Every latency row runs in this one process, interleaved with its baselines
(ours, baseline, baseline, ours, ...), so drift and noise hit both sides; it is
reported as median, p99 and the ratio of the medians. What each row measures,
and why the targets are what they are, is in benchmarks/README.md.

    from tryloop.bench.sandbox import run
    results = run(TryloopConfig(), quick=True, out=Path("results.json"))

The parts: common (row keys, sizes), stats (series, targets, rows), host (probes of
the host and the baselines' runners), workspace (the reset/fork workspace and its
mutations), rows (the benchmark itself), report (the printed tables); `run` here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from tryloop.bench.sandbox.common import FULL, LATENCY_ROWS, LEAK_CHECKS, QUICK, BenchError
from tryloop.bench.sandbox.report import render
from tryloop.bench.sandbox.rows import Bench
from tryloop.config import TryloopConfig

__all__ = ["LATENCY_ROWS", "LEAK_CHECKS", "BenchError", "run"]


def run(cfg: TryloopConfig | None = None, *, quick: bool = False, density: int | None = None,
        cycles: int | None = None, out: Path | str | None = None,
        console: Console | None = None) -> dict[str, Any]:
    """Run every row, print the tables, write JSON to `out` if given; returns the results.

    `quick` takes fewer samples and caps `density` at 100 and `cycles` at 500.
    """
    cfg = cfg or TryloopConfig()
    console = console or Console(stderr=True)
    sizes = QUICK if quick else FULL
    n_density = sizes.density if density is None else density
    n_cycles = sizes.cycles if cycles is None else cycles
    if quick:
        n_density, n_cycles = min(n_density, QUICK.density), min(n_cycles, QUICK.cycles)
    if n_density < 1 or n_cycles < 1:
        raise BenchError("--density and --cycles must be at least 1")
    sizes = dataclasses.replace(sizes, density=n_density, cycles=n_cycles)
    bench = Bench(cfg, sizes, console)
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    asyncio.run(bench.main())
    results: dict[str, Any] = {
        "benchmark": "sandbox", "format": 1, "quick": quick,
        "started": started.isoformat(timespec="seconds"), "duration_s": round(time.perf_counter() - t0, 1),
        "host": bench.host, "sizes": dataclasses.asdict(sizes),
        "rows": {k: bench.rows[k].to_json() for k in LATENCY_ROWS},
        "density": bench.density, "leaks": bench.leaks,
    }
    render(results, console)
    if out is not None:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
        console.print(f"results written to {path}")
    return results
