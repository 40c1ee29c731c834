"""`tryloop demo`: the main job until `tryloop train` exists.

Runs the bundled project's real test suite in warm-pooled sandboxes with
scripted agents (some fix a planted bug, some break things, one tries to
escape), forks a sandbox mid-episode into branches, and reports what happened
and how fast.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Annotated

import typer
from rich.progress import Progress
from rich.table import Table

from tryloop.cli.main import ConfigOpt, console, load_config, run_cli

BUG = ("return a + b", "return a - b")
ATTACKS = {
    "read host /etc/shadow": "cat /etc/shadow",
    "list host /root": "ls /root",
    "reach the network": "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)\"",
    "mount a filesystem": "mount -t tmpfs none /tmp",
    "become root": "python3 -c 'import os; os.setuid(0)'",
    "see host processes": "test $(ls /proc | grep -c '^[0-9]') -gt 10",
}


def demo(
    episodes: Annotated[int, typer.Option("--episodes", help="episodes to run (pool.size sandboxes kept warm)")] = 24,
    concurrency: Annotated[int, typer.Option("--concurrency", help="episodes in flight at once")] = 4,
    config: ConfigOpt = None,
) -> None:
    """Run real test suites in pooled sandboxes with scripted agents; show isolation and speed."""
    cfg = run_cli(load_config, config, {})
    run_cli(lambda: asyncio.run(_demo(cfg, episodes, concurrency)))


async def _episode(pool, i: int) -> dict:
    t_acq = time.perf_counter()
    sb = await pool.acquire()
    acquire_s = time.perf_counter() - t_acq
    try:
        t0 = time.perf_counter()
        kind = ("fix", "noop", "break")[i % 3]
        if kind == "fix":
            src = sb.read_file("calc/__init__.py").decode().replace(BUG[1], BUG[0])
            sb.write_file("calc/__init__.py", src)
        elif kind == "break":
            await sb.exec("sed -i 's/sum(xs)/max(xs)/' calc/__init__.py")
        res = await sb.exec(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider"], timeout=60)
        return {"kind": kind, "passed": res.exit_code == 0, "wall": time.perf_counter() - t0,
                "acquire": acquire_s,
                "summary": res.text().strip().splitlines()[-1] if res.stdout else res.text("stderr")[-80:]}
    finally:
        pool.release(sb)


async def _demo(cfg, episodes: int, concurrency: int) -> None:
    from tryloop.assets import CALC_PROJECT
    from tryloop.sandbox import SandboxRuntime, WarmPool
    from tryloop.sandbox.layers import tree_digest

    console.rule("[bold]tryloop demo: sandboxes on this host's kernel")
    rt = SandboxRuntime(cfg.runtime)
    # The task: the bundled project with a planted bug (add subtracts).
    files = {str(p.relative_to(CALC_PROJECT)): p.read_text() for p in CALC_PROJECT.rglob("*.py")}
    files["calc/__init__.py"] = files["calc/__init__.py"].replace(*BUG)
    snap = rt.workspace_snapshot(files, config=cfg.sandbox)
    console.print(f"task snapshot [cyan]{snap.id[:16]}[/] (image {snap.image[:12]} + workspace layer)")

    async with WarmPool(rt, snap, cfg.sandbox, cfg.pool, name="demo") as pool:
        results = []
        sem = asyncio.Semaphore(concurrency)

        async def bounded(i: int) -> dict:
            async with sem:
                return await _episode(pool, i)

        with Progress(console=console) as progress:
            bar = progress.add_task("episodes", total=episodes)
            for coro in asyncio.as_completed([bounded(i) for i in range(episodes)]):
                results.append(await coro)
                progress.advance(bar)
        table = Table(title=f"{episodes} episodes: real pytest runs in pooled sandboxes")
        for col in ("agent", "episodes", "tests passed", "median wall (ms)", "last pytest line"):
            table.add_column(col)
        for kind in ("fix", "noop", "break"):
            rs = [r for r in results if r["kind"] == kind]
            table.add_row(kind, str(len(rs)), f"{sum(r['passed'] for r in rs)}/{len(rs)}",
                          f"{statistics.median(r['wall'] for r in rs) * 1000:.0f}", rs[-1]["summary"][:60])
        console.print(table)

        # Mid-episode fork: edit, snapshot, branch three ways.
        sb = await pool.acquire()
        initial = tree_digest(sb.root_dir() / "workspace", id_base=sb.id_base)
        await sb.exec("echo '# work in progress' >> calc/__init__.py")
        t0 = time.perf_counter()
        branches = await sb.fork(3)
        fork_ms = (time.perf_counter() - t0) * 1000
        edits = [BUG[1], "return b + a", "return a + b"]
        ft = Table(title=f"fork: 3 branches from one live sandbox in {fork_ms:.1f} ms")
        ft.add_column("branch")
        ft.add_column("edit")
        ft.add_column("tests")
        for k, (child, edit) in enumerate(zip(branches, edits, strict=True)):
            await child.exec(f"sed -i 's/{BUG[1]}/{edit}/' calc/__init__.py")
            r = await child.exec(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider"])
            ft.add_row(str(k), edit, "[green]pass[/]" if r.exit_code == 0 else "[red]fail[/]")
            await child.close()
        console.print(ft)

        # Isolation: each attack must fail; then a reset restores the exact snapshot.
        it = Table(title="isolation: attacks from inside a sandbox")
        it.add_column("attempt")
        it.add_column("result")
        for name, cmd in ATTACKS.items():
            r = await sb.exec(cmd, timeout=10)
            it.add_row(name, "[green]blocked[/]" if r.exit_code != 0 else "[bold red]SUCCEEDED[/]")
        console.print(it)
        t0 = time.perf_counter()
        await sb.reset()
        reset_ms = (time.perf_counter() - t0) * 1000
        restored = tree_digest(sb.root_dir() / "workspace", id_base=sb.id_base) == initial
        pool.release(sb)

        acq = sorted(r["acquire"] for r in results)
        st = Table(title="warm pool")
        st.add_column("metric")
        st.add_column("value")
        st.add_row("acquires (hit / miss)", f"{pool.hits} / {pool.misses}")
        st.add_row("acquire p50 / max", f"{acq[len(acq) // 2] * 1e6:.0f} µs / {acq[-1] * 1e6:.0f} µs")
        st.add_row("reset after the attacks", f"{reset_ms:.2f} ms")
        st.add_row("workspace byte-identical to the snapshot after reset",
                   "[green]yes[/]" if restored else "[bold red]NO[/]")
        console.print(st)
    await _factory(rt)
    console.print("[bold green]demo finished[/]: every sandbox, cgroup and mount was released")


async def _factory(rt) -> None:
    """Two tasks from the task factory: planted bugs, gated in fresh sandboxes."""
    import tempfile
    from pathlib import Path

    from tryloop.tasks.factory import bundled_projects, synthesize
    from tryloop.tasks.gate import GateConfig, GateReport
    from tryloop.tasks.store import TaskStore

    project = next(p for p in bundled_projects() if p.name == "strutils")
    with tempfile.TemporaryDirectory(prefix="tryloop-demo-") as tmp:
        store, report = TaskStore(Path(tmp) / "store"), GateReport()
        with console.status("task factory: planting bugs in a bundled project and gating them (K=3) ..."):
            kept = await synthesize(rt, store, project, Path(tmp) / "work", keep=2, seed=1,
                                    gate=GateConfig(k=3, require_pass_to_pass=True), report=report)
        t = Table(title=f"task factory: {len(kept)} gated task(s) from `{project.name}` "
                        f"({report.total_rejected} candidate(s) rejected)")
        for col in ("task", "tier", "fail→pass", "pass→pass", "instruction (bug report, never the fix)"):
            t.add_column(col)
        for e in kept:
            task = store.get(e.fingerprint)
            first = next(line for line in task.instruction.splitlines() if line.strip())
            t.add_row(e.id, e.meta.tier or "-", str(len(e.meta.fail_to_pass)), str(len(e.meta.pass_to_pass)),
                      first[:70])
        console.print(t)
