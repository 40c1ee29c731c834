"""`tryloop sandbox ...`: doctor, run, shell, gc, build."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import termios
import tty
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tryloop.cli.main import ConfigOpt, console, load_config, run_cli

app = typer.Typer(help="Kernel sandboxes: check the host, run commands, clean up.", no_args_is_help=True)

Workspace = Annotated[Path | None, typer.Option("--workspace", "-w", help="directory copied into /workspace")]
Network = Annotated[bool | None, typer.Option("--network/--no-network", help="sandbox.network")]
MemoryMb = Annotated[int | None, typer.Option("--memory-mb", help="sandbox.limits.memory_mb")]
DiskMb = Annotated[int | None, typer.Option("--disk-mb", help="sandbox.limits.disk_mb")]
Timeout = Annotated[float | None, typer.Option("--timeout", help="sandbox.limits.exec_timeout_s")]
StoreDir = Annotated[Path | None, typer.Option("--store-dir", help="runtime.store_dir")]
ImageOpt = Annotated[str | None, typer.Option("--image", help="images.run_image (name or id; default: the host root)")]


def _overrides(**kw) -> dict[str, object]:
    names = {"network": "sandbox.network", "memory_mb": "sandbox.limits.memory_mb",
             "disk_mb": "sandbox.limits.disk_mb", "timeout": "sandbox.limits.exec_timeout_s",
             "store_dir": "runtime.store_dir", "image": "images.run_image"}
    return {names[k]: v for k, v in kw.items()}


@app.command()
def doctor(
    live: Annotated[bool, typer.Option("--live/--no-live", help="also start a sandbox and probe it")] = True,
    config: ConfigOpt = None,
) -> None:
    """Report what isolation this host offers and what would be degraded."""
    from tryloop.sandbox.doctor import checks

    cfg = run_cli(load_config, config, {})
    table = Table(title="tryloop sandbox doctor")
    table.add_column("check")
    table.add_column("status")
    table.add_column("detail")
    results = checks(cfg.runtime, probe_network=True)
    for c in results:
        status = "[green]ok[/]" if c.ok else ("[red]MISSING[/]" if c.required else "[yellow]absent[/]")
        detail = c.detail + (f" — {c.fix}" if not c.ok and c.fix else "")
        table.add_row(c.name, status, detail)
    console.print(table)
    missing = [c for c in results if c.required and not c.ok]
    if missing:
        console.print(f"[bold red]{len(missing)} required feature(s) missing:[/] sandboxes will refuse to "
                      f"start rather than run with weaker isolation: {', '.join(c.name for c in missing)}")
        raise typer.Exit(1)
    if live:
        probe = run_cli(lambda: asyncio.run(_live_probe(cfg)))
        t = Table(title="live probe (inside a fresh sandbox)")
        t.add_column("property")
        t.add_column("value")
        for k, v in probe.items():
            t.add_row(k, v)
        console.print(t)
    console.print("[bold green]all required isolation features are available[/]")


async def _live_probe(cfg) -> dict[str, str]:
    from tryloop.sandbox import SandboxRuntime

    rt = SandboxRuntime(cfg.runtime)
    async with await rt.create(None, cfg.sandbox) as sb:
        r = await sb.exec("id -u; hostname; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\\t' ' ';"
                          " ls /proc | grep -c '^[0-9]'; cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '")
        lines = r.text().split("\n")
        init_uid = Path(f"/proc/{sb.init_pid}/status").read_text().split("Uid:")[1].split()[0]
        userns = (f"own range: uid 0 inside is host uid {init_uid}, uid {lines[0]} is host uid "
                  f"{sb.host_id(int(lines[0]))}" if sb.id_base else "none: uids are the host's")
        return {"uid": lines[0], "user namespace": userns, "hostname": lines[1], "capabilities": lines[2], "no_new_privs": lines[3],
                "seccomp mode": lines[4], "visible processes": lines[5],
                "network interfaces": " ".join(x for x in lines[6:] if x)}


async def _with_sandbox(cfg, workspace: Path | None, fn):
    from tryloop.sandbox import SandboxRuntime
    from tryloop.sandbox.layers import Snapshot

    rt = SandboxRuntime(cfg.runtime)
    image = None
    if cfg.images.run_image:
        from tryloop.errors import ConfigError
        from tryloop.sandbox.catalog import resolve

        try:
            image = rt.image(resolve(rt.store, cfg.images.run_image))
        except KeyError as e:
            raise ConfigError(f"images.run_image: {e.args[0]}") from None
    if workspace:
        snap = rt.workspace_snapshot(workspace, image=image, config=cfg.sandbox)
    else:
        snap = Snapshot(image.id) if image is not None else rt.base_snapshot(cfg.sandbox)
    async with await rt.create(snap, cfg.sandbox) as sb:
        return await fn(sb)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    cmd: Annotated[list[str], typer.Argument(help="command and arguments (use -- before options)")],
    workspace: Workspace = None, network: Network = None, memory_mb: MemoryMb = None,
    disk_mb: DiskMb = None, timeout: Timeout = None, store_dir: StoreDir = None, config: ConfigOpt = None,
    shell: Annotated[bool, typer.Option("--shell", help="run CMD as one /bin/sh -c string")] = False,
    image: ImageOpt = None,
) -> None:
    """Run one command in a fresh sandbox and print its output and resource use."""
    cfg = run_cli(load_config, config, _overrides(network=network, memory_mb=memory_mb, disk_mb=disk_mb,
                                                    timeout=timeout, store_dir=store_dir, image=image))

    async def go(sb):
        def echo(stream: str, chunk: bytes) -> None:
            (sys.stdout if stream == "stdout" else sys.stderr).buffer.write(chunk)
            (sys.stdout if stream == "stdout" else sys.stderr).flush()

        proc = await sb.start(" ".join(cmd) if shell else cmd, on_output=echo)
        return await proc.wait()

    res = run_cli(lambda: asyncio.run(_with_sandbox(cfg, workspace, go)))
    how = f"exit {res.exit_code}" if res.signal is None else f"signal {res.signal}"
    flags = [f for f, on in (("timed out", res.timed_out), ("OOM-killed", res.oom_killed),
                             ("output truncated", res.stdout_truncated or res.stderr_truncated)) if on]
    console.print(f"[dim]{how}{' (' + ', '.join(flags) + ')' if flags else ''}; wall {res.wall_s * 1000:.1f} ms, "
                  f"cpu {res.cpu_s * 1000:.1f} ms, peak rss {res.peak_memory_bytes / 2**20:.1f} MiB[/]")
    raise typer.Exit(res.exit_code if res.exit_code is not None else 128 + (res.signal or 0))


@app.command()
def shell(
    workspace: Workspace = None, network: Network = None, memory_mb: MemoryMb = None,
    store_dir: StoreDir = None, config: ConfigOpt = None, image: ImageOpt = None,
) -> None:
    """An interactive shell in a fresh sandbox (everything is discarded on exit)."""
    cfg = run_cli(load_config, config, _overrides(network=network, memory_mb=memory_mb, store_dir=store_dir,
                                                  timeout=24 * 3600.0, image=image))

    async def go(sb):
        master, slave = os.openpty()
        env = {"TERM": os.environ.get("TERM", "xterm"), "PS1": r"sandbox:\w\$ "}
        proc = await sb.start(["/bin/bash", "--norc", "-i"], terminal_fd=slave, timeout=24 * 3600, env=env)
        os.close(slave)
        loop = asyncio.get_running_loop()
        stdin = sys.stdin.fileno()
        done = loop.create_future()

        def from_sandbox() -> None:
            try:
                data = os.read(master, 65536)
            except OSError:
                data = b""
            if not data:
                done.done() or done.set_result(None)
                return
            os.write(sys.stdout.fileno(), data)

        def to_sandbox() -> None:
            data = os.read(stdin, 65536)
            if data:
                os.write(master, data)

        loop.add_reader(master, from_sandbox)
        loop.add_reader(stdin, to_sandbox)
        old = termios.tcgetattr(stdin) if os.isatty(stdin) else None
        if old:
            tty.setraw(stdin)
        try:
            await asyncio.wait([done, asyncio.ensure_future(proc.wait())], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if old:
                termios.tcsetattr(stdin, termios.TCSADRAIN, old)
            loop.remove_reader(master)
            loop.remove_reader(stdin)
            with contextlib.suppress(OSError):
                os.close(master)
        return await proc.wait()

    console.print("[dim]sandbox shell: private namespaces, uid 1000, no network; exit to discard[/]")
    run_cli(lambda: asyncio.run(_with_sandbox(cfg, workspace, go)))


@app.command()
def gc(config: ConfigOpt = None, store_dir: StoreDir = None) -> None:
    """Reclaim cgroups, processes and records left by sandbox owners that died."""
    from tryloop.sandbox import SandboxRuntime

    cfg = run_cli(load_config, config, _overrides(store_dir=store_dir))
    rt = run_cli(SandboxRuntime, cfg.runtime, gc=False)
    report = rt.gc()
    for line in report.details:
        console.print(f"  {line}")
    console.print(f"gc: {report.records} record(s), {report.cgroups} cgroup(s), {report.processes} process(es), "
                  f"{report.tmp_dirs} temp dir(s), {report.id_ranges} id range(s), "
                  f"{report.networks} sandbox network item(s) reclaimed; {report.kept} live sandbox(es) of running owners kept")


@app.command()
def build(
    spec: Annotated[Path, typer.Argument(help="image spec YAML (base, pip, files, run steps)")],
    config: ConfigOpt = None, store_dir: StoreDir = None,
) -> None:
    """Build an image from a spec; each step becomes a cached layer."""
    from tryloop.sandbox import SandboxRuntime
    from tryloop.sandbox.build import build_image, load_spec

    cfg = run_cli(load_config, config, _overrides(store_dir=store_dir))
    image_spec = run_cli(load_spec, spec)
    rt = run_cli(SandboxRuntime, cfg.runtime)

    def progress(i: int, n: int, step: str, cached: bool) -> None:
        console.print(f"  step {i}/{n} {step} {'[dim](cached)[/]' if cached else '[green]built[/]'}")

    image = run_cli(lambda: asyncio.run(build_image(rt, image_spec, on_step=progress)))
    console.print(f"image [bold]{image.id}[/] ({len(image.layers)} layers)")
    print(image.id)
