"""The tables and notes printed from a results document."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from tryloop.bench.sandbox.common import LATENCY_ROWS


def _fmt(ms: float | None) -> str:
    if ms is None:
        return "—"
    if ms < 1:
        return f"{ms * 1000:.0f} µs"
    if ms < 100:
        return f"{ms:.2f} ms"
    return f"{ms:.0f} ms"


def _ratio(r: float | None) -> str:
    if r is None:
        return "—"
    return f"{r:.3f}×" if r < 0.1 else f"{r:.2f}×"


def _verdict_cell(v: str | None) -> str:
    if v is None:
        return ""
    return f"[green]{v}[/]" if v.startswith("meets") else f"[bold red]{v}[/]"


def render(results: dict[str, Any], console: Console) -> None:
    """The results table, the density and leak tables, then notes."""
    if not console.is_terminal:  # a log or a pipe: 80 columns would squeeze the table unreadably
        console = Console(file=console.file, width=max(console.width, 124), highlight=False)
    h = results["host"]
    t = Table(title=f"tryloop bench sandbox{' --quick' if results['quick'] else ''} — "
                    f"Linux {h['kernel']}, {h['cpus']} CPUs, cgroups {h['cgroups']}"
                    + (f", code {h['git_head']}{' + changes' if h['sandbox_code_modified'] else ''}"
                       if h.get("git_head") else ""))
    for col, just in (("operation", "left"), ("p50", "right"), ("p99", "right"), ("baseline", "left"),
                      ("p50", "right"), ("p99", "right"), ("ours ÷ base", "right"), ("target", "left"),
                      ("verdict", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    notes: list[str] = []
    for key in LATENCY_ROWS:
        r = results["rows"][key]
        o = r["ours"]
        for j, b in enumerate(r["baselines"]):
            first = j == 0
            if b.get("unavailable"):
                cells = [f"{b['label']} [dim]({b['unavailable']})[/]", "", "", "—"]
            else:
                cells = [b["label"], _fmt(b.get("p50_ms")), _fmt(b.get("p99_ms")), _ratio(b.get("ratio"))]
            t.add_row(r["title"] if first else "", _fmt(o.get("p50_ms")) if first else "",
                      _fmt(o.get("p99_ms")) if first else "", *cells,
                      (r["target"] or "") if first else "", _verdict_cell(r["verdict"]) if first else "",
                      end_section=j == len(r["baselines"]) - 1)
        counts = ", ".join([f"ours {o['n']}"] + [f"{b['label']} {b['n']}" for b in r["baselines"] if b["n"]])
        notes.append(f"{r['title']}: samples {counts}.")
        extra = r.get("extra", {})
        for k, label in (("init_side", "init side"), ("snapshot_state_only", "snapshot_state() alone"),
                         ("release_to_idle", "release → idle again")):
            s = extra.get(k)
            if s and s.get("n"):
                notes.append(f"{r['title']}: {label} p50 {_fmt(s['p50_ms'])}, p99 {_fmt(s['p99_ms'])}.")
        notes += [f"{r['title']}: {n}" for n in r["notes"]]
    console.print(t)

    d = results["density"]
    if d:
        dt = Table(title=f"density: {d['held']}/{d['n']} idle sandboxes at once "
                         f"(memory {d['config']['memory_mb']} MiB, disk {d['config']['disk_mb']} MiB each)")
        dt.add_column("metric")
        dt.add_column("value", justify="right")
        kb = d["kernel_breakdown_per_sandbox_kib"]
        rate = d["create_per_s"]
        for name, value in (
            ("host memory per sandbox (MemAvailable drop ÷ N)", f"{d['mem_available_per_sandbox_kib']:.0f} KiB"),
            ("kernel memory growth per sandbox (Slab + KernelStack + PageTables + Percpu)",
             f"{d['kernel_per_sandbox_kib']:.0f} KiB (" + ", ".join(f"{k} {v:.0f}" for k, v in kb.items()) + ")"),
            ("init RSS: sum · per sandbox · private (RssAnon) per sandbox",
             f"{d['init_rss_sum_mib']:.1f} MiB · {d['init_rss_per_sandbox_kib']:.0f} KiB · "
             f"{d['init_rss_anon_per_sandbox_kib']:.0f} KiB"),
            (f"creation rate ({d['create_concurrency']} at a time)",
             f"{rate:.0f} /s ({d['create_s']:.2f} s)" if rate else "—"),
            ("teardown of all", f"{d['teardown_all_s']:.2f} s"),
            ("responsive (ping) · errors", f"{d['responsive']} · {d['n_errors']}"),
            (f"target: {d['target']}", _verdict_cell(d["verdict"])),
        ):
            dt.add_row(name, value)
        console.print(dt)
        if d.get("top_slab_caches_per_sandbox_kib"):
            notes.append("density: largest slab caches per sandbox (KiB): " + ", ".join(
                f"{k} {v:.0f}" for k, v in d["top_slab_caches_per_sandbox_kib"].items()) + ".")
        notes.append("density: MemAvailable counts reclaimable slab as available, so it can fall by less "
                     "than the kernel's growth; init RSS counts the shared static binary in every sandbox.")
        notes += [f"density: {n}" for n in d["notes"]]
        notes += [f"density: error: {e}" for e in d["errors"]]

    lk = results["leaks"]
    if lk:
        lt = Table(title=f"leaks after {lk['cycles']} acquire/release cycles ({lk['execs']} execs, "
                         f"{lk['hits']} hits / {lk['misses']} misses, {lk['wall_s']:.1f} s)")
        lt.add_column("left behind")
        lt.add_column("count", justify="right")
        for k, v in lk["counts"].items():
            lt.add_row(k.replace("_", " "), f"[green]{v}[/]" if v == 0 else f"[bold red]{v}[/]")
        a = lk["acquire_under_churn"]
        lt.add_row("acquire under churn: p50 · p99", f"{_fmt(a['p50_ms'])} · {_fmt(a['p99_ms'])}")
        lt.add_row(f"target: {lk['target']}", _verdict_cell(lk["verdict"]))
        console.print(lt)
    for n in notes:
        console.print(f"[dim]· {n}[/]")
