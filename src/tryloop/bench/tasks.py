"""`tryloop bench tasks`: validated tasks per minute and yield of the task factory.

Synthesizes mutation tasks from bundled projects and gates HumanEval problems
into a scratch store, twice side by side: with the default gate (K runs per
state) and with a single run per state (K=1, the baseline a pipeline without
repeat runs would pay — and whose flaky tasks it would let through). Then
the generated families (data analysis, structured documents, operations): their candidates
through the default gate, with throughput and yield per family and tier.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tryloop.config import TryloopConfig
from tryloop.sandbox import SandboxRuntime
from tryloop.tasks.factory import admit, build_family, bundled_projects, synthesize
from tryloop.tasks.gate import GateConfig, GateReport
from tryloop.tasks.store import TaskStore


async def _measure(rt: SandboxRuntime, work: Path, k: int, projects: list[str], candidates: int,
                   humaneval: int) -> dict:
    from tryloop.tasks.sources.humaneval import humaneval_tasks

    store = TaskStore(work / f"store-k{k}")
    report = GateReport()
    t0 = time.perf_counter()
    by_name = {p.name: p for p in bundled_projects()}
    for name in projects:
        await synthesize(rt, store, by_name[name], work / f"cand-k{k}", keep=candidates, seed=0,
                         gate=GateConfig(k=k, require_pass_to_pass=True), report=report,
                         max_candidates=candidates)
    for task in humaneval_tasks(work / f"he-k{k}", limit=humaneval):
        await admit(rt, store, task, report, "humaneval", GateConfig(k=k))
    wall = time.perf_counter() - t0
    seen = report.total_kept + report.total_rejected
    return {
        "k": k, "wall_s": round(wall, 2), "candidates": seen, "kept": report.total_kept,
        "tasks_per_min": round(report.total_kept / wall * 60, 2),
        "candidates_per_min": round(seen / wall * 60, 2),
        "yield": round(report.total_kept / seen, 3) if seen else None,
        "test_seconds": round(report.test_seconds, 1),
        "by_group": {g: {"kept": report.kept[g], "rejected": dict(report.rejected[g]),
                         "yield": round(report.yield_of(g), 3)} for g in report.groups()},
    }


async def _measure_family(rt: SandboxRuntime, work: Path, family: str, k: int, count: int) -> dict:
    store = TaskStore(work / f"store-{family}")
    t0 = time.perf_counter()
    report = await build_family(rt, store, work / f"cand-{family}", family, gate=GateConfig(k=k), eval_fraction=0.25,
                                per_family=count, count=count)
    wall = time.perf_counter() - t0
    seen = report.total_kept + report.total_rejected
    return {"family": family, "k": k, "wall_s": round(wall, 2), "candidates": seen, "kept": report.total_kept,
            "tasks_per_min": round(report.total_kept / wall * 60, 2),
            "yield": round(report.total_kept / seen, 3) if seen else None,
            "by_group": {g: {"kept": report.kept[g], "rejected": dict(report.rejected[g]),
                             "yield": round(report.yield_of(g), 3)} for g in report.groups()}}


def run(cfg: TryloopConfig, *, quick: bool, out: Path | None, console: Console) -> dict:
    projects = ["strutils", "inventory"] if quick else ["strutils", "mathkit", "inventory", "minijson"]
    candidates = 4 if quick else 10
    humaneval = 4 if quick else 12
    rt = SandboxRuntime(cfg.runtime)
    with tempfile.TemporaryDirectory(prefix="tryloop-bench-tasks-") as tmp:
        results = {}
        for k in (cfg.tasks.gate_k, 1):
            with console.status(f"gating with K={k} ..."):
                results[f"k{k}"] = asyncio.run(_measure(rt, Path(tmp), k, projects, candidates, humaneval))
    default, base = results[f"k{cfg.tasks.gate_k}"], results["k1"]
    t = Table(title="task factory throughput and yield (2 cores)")
    for col in ("gate", "candidates", "kept", "yield", "validated tasks / min", "candidates / min", "wall s"):
        t.add_column(col)
    for name, r in ((f"K={cfg.tasks.gate_k} (default)", default), ("K=1 (baseline)", base)):
        t.add_row(name, str(r["candidates"]), str(r["kept"]), f"{(r['yield'] or 0):.0%}", f"{r['tasks_per_min']:.1f}",
                  f"{r['candidates_per_min']:.1f}", f"{r['wall_s']:.0f}")
    console.print(t)
    g = Table(title=f"yield by source / operator (K={cfg.tasks.gate_k})")
    for col in ("group", "kept", "rejected", "yield"):
        g.add_column(col)
    for name, d in default["by_group"].items():
        g.add_row(name, str(d["kept"]), ", ".join(f"{r}: {n}" for r, n in d["rejected"].items()) or "-",
                  f"{d['yield']:.0%}")
    console.print(g)
    if base["tasks_per_min"]:
        console.print(f"the default gate costs {base['tasks_per_min'] / max(default['tasks_per_min'], 1e-9):.2f}x "
                      "the time per validated task of a single-run gate")
    per_family = 8 if quick else 36
    with tempfile.TemporaryDirectory(prefix="tryloop-bench-families-") as tmp, \
            console.status("gating the generated families ..."):
        families = {f: asyncio.run(_measure_family(rt, Path(tmp), f, cfg.tasks.gate_k, per_family))
                    for f in ("data", "docs", "ops")}
    f = Table(title=f"generated families (K={cfg.tasks.gate_k})")
    for col in ("family", "candidates", "kept", "yield", "validated tasks / min", "wall s", "by tier"):
        f.add_column(col)
    for name, r in families.items():
        tiers = ", ".join(f"{g.split(':')[-1]} {d['kept']}/{d['kept'] + sum(d['rejected'].values())}"
                          for g, d in r["by_group"].items())
        f.add_row(name, str(r["candidates"]), str(r["kept"]), f"{(r['yield'] or 0):.0%}", f"{r['tasks_per_min']:.1f}",
                  f"{r['wall_s']:.0f}", tiers)
    console.print(f)
    doc = {"benchmark": "tasks", "projects": projects, "candidates_per_project": candidates,
           "humaneval": humaneval, "results": results, "families": families}
    if out:
        out.write_text(json.dumps(doc, indent=1))
    return doc
