"""`tryloop bench reward`: what trust costs — verifier latency against a bare pytest run.

For each bundled multi-file task (real projects, real tests), interleaved in one
run: the bare test run (fresh sandbox, reference files and hidden tests written,
pytest with a report plugin — what a pipeline that trusts the exit code pays)
and the full verifier on the same reference solution (detectors, protected-path
restore, authenticated per-test records, rule components, version stamping).
The verifier is timed twice: with its default spec, where a passing solution gets
a decoy run (the tests again with their expected values changed,
tryloop.rewards.decoys), and with `decoys: false`. The verifier's one-off baseline
run per task is made before timing starts.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tryloop.config import TryloopConfig
from tryloop.rewards.spec import RewardSpec
from tryloop.rewards.submission import Submission
from tryloop.rewards.verifier import baseline, verify
from tryloop.sandbox import SandboxRuntime
from tryloop.tasks.factory import bundled_projects, multifile_bugs, multifile_task
from tryloop.tasks.testrun import run_tests


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


async def _measure(rt: SandboxRuntime, work: Path, rounds: int, n_tasks: int) -> dict:
    projects = {p.name: p for p in bundled_projects()}
    tasks = [multifile_task(projects[b["project"]], b, work) for b in multifile_bugs()[:n_tasks]]
    for t in tasks:
        await baseline(rt, t)
    bare: list[float] = []
    verified: list[float] = []
    no_decoy: list[float] = []
    states = []
    decoy_runs = 0
    for i in range(rounds):
        for t in tasks:
            t0 = time.perf_counter()
            run = await run_tests(rt, t, with_solution=True)
            bare.append(time.perf_counter() - t0)
            assert run.passed(t.meta.expected_tests or sorted(run.passing))
            sub = Submission(changes=dict(t.solution_files()))
            for spec, samples in sorted([(RewardSpec(), verified), (RewardSpec(decoys=False), no_decoy)],
                                        key=lambda x: x[0].decoys == bool(i % 2)):  # order alternates
                t0 = time.perf_counter()
                v = await verify(rt, t, sub, spec)
                samples.append(time.perf_counter() - t0)
                states.append(v.state)
                decoy_runs += "decoy" in v.meta
    row = lambda xs: {"p50_s": round(pct(xs, 50), 4), "p99_s": round(pct(xs, 99), 4),  # noqa: E731
                      "mean_s": round(statistics.fmean(xs), 4)}
    return {"tasks": [t.id for t in tasks], "rounds": rounds, "samples": len(bare),
            "bare_pytest": row(bare), "verifier": row(verified), "verifier_no_decoy": row(no_decoy),
            "ratio_p50": round(pct(verified, 50) / pct(bare, 50), 3),
            "ratio_p99": round(pct(verified, 99) / pct(bare, 99), 3),
            "ratio_no_decoy_p50": round(pct(no_decoy, 50) / pct(bare, 50), 3),
            "ratio_no_decoy_p99": round(pct(no_decoy, 99) / pct(bare, 99), 3),
            "verdicts": {s: states.count(s) for s in set(states)}, "decoy_runs": decoy_runs}


def run(cfg: TryloopConfig, *, quick: bool, out: Path | None, console: Console) -> dict:
    rounds, n_tasks = (2, 2) if quick else (10, 4)
    rt = SandboxRuntime(cfg.runtime)
    with tempfile.TemporaryDirectory() as tmp, console.status("verifier vs bare pytest ..."):
        res = asyncio.run(_measure(rt, Path(tmp), rounds, n_tasks))
    t = Table(title=f"verifier latency vs bare pytest ({res['samples']} runs each, {len(res['tasks'])} tasks)")
    for col in ("", "p50", "p99", "mean"):
        t.add_column(col)
    for name in ("bare_pytest", "verifier_no_decoy", "verifier"):
        r = res[name]
        t.add_row(name, f"{r['p50_s'] * 1000:.0f} ms", f"{r['p99_s'] * 1000:.0f} ms", f"{r['mean_s'] * 1000:.0f} ms")
    t.add_row("[bold]ratio, no decoy", f"[bold]{res['ratio_no_decoy_p50']:.2f}x",
              f"[bold]{res['ratio_no_decoy_p99']:.2f}x", "")
    t.add_row("[bold]ratio", f"[bold]{res['ratio_p50']:.2f}x", f"[bold]{res['ratio_p99']:.2f}x", "")
    console.print(t)
    if out:
        out.write_text(json.dumps(res, indent=1))
    return res
