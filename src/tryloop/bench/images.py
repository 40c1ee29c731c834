"""`tryloop bench images`: what images built without a container engine cost.

In a scratch store (so "cold" is cold): a Debian root of the Essential packages plus
`packages` built twice (the second time found by its package digest), a Dockerfile on
it built twice (the second time every step cached, the same image id), then create,
exec and reset medians of sandboxes on the host-derived root and on the Debian root,
side by side in one run, and the disk each image takes.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tryloop.config import RuntimeConfig, SandboxConfig, TryloopConfig
from tryloop.sandbox import SandboxRuntime
from tryloop.sandbox.catalog import list_images, tag_image
from tryloop.sandbox.debian import debian_root
from tryloop.sandbox.dockerfile import BuildOptions, build_dockerfile
from tryloop.sandbox.layers import Snapshot

DOCKERFILE = """\
FROM bench-base
ENV GREETING=hello
WORKDIR /srv/app
COPY data.json .
RUN jq -r .name data.json > name.txt
RUN for i in $(seq 100); do echo "line $i" >> lines.txt; done
"""


async def _latency(rt: SandboxRuntime, image_id: str, n: int) -> dict:
    creates, execs, resets = [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        sb = await rt.create(Snapshot(image_id), SandboxConfig())
        creates.append(time.perf_counter() - t0)
        try:
            for _ in range(5):
                t0 = time.perf_counter()
                res = await sb.exec(["true"])
                execs.append(time.perf_counter() - t0)
                if not res.ok:
                    raise RuntimeError(f"`true` failed in a sandbox on {image_id[:12]}: {res}")
            t0 = time.perf_counter()
            await sb.reset()
            resets.append(time.perf_counter() - t0)
        finally:
            await sb.close()
    return {k: round(statistics.median(v) * 1000, 3) for k, v in
            (("create_ms", creates), ("exec_ms", execs), ("reset_ms", resets))}


async def _run(cfg: TryloopConfig, work: Path, packages: list[str], n: int, console: Console) -> dict:
    state = Path(tempfile.mkdtemp(prefix="tryloop-bench-images-"))
    os.chmod(state, 0o755)  # a build sandbox's init (an unprivileged host id) reaches its mount dir
    try:
        rt = SandboxRuntime(RuntimeConfig(store_dir=work / "store", state_dir=state, memory_dir=None,
                                          cgroup_name=cfg.runtime.cgroup_name), gc=False)
        out: dict = {"packages": packages}
        t0 = time.perf_counter()
        deb = await debian_root(rt, packages, on_step=lambda m: console.print(f"  [dim]{m}[/]"))
        out["debian_cold_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        again = await debian_root(rt, packages)
        out["debian_cached_s"] = round(time.perf_counter() - t0, 2)
        assert again.id == deb.id
        tag_image(rt.store, "bench-base", deb.id)
        ctx = work / "ctx"
        ctx.mkdir()
        (ctx / "data.json").write_text('{"name": "bench"}\n')
        (ctx / "Dockerfile").write_text(DOCKERFILE)
        opts = BuildOptions(network=False)
        t0 = time.perf_counter()
        built = await build_dockerfile(rt, ctx, options=opts)
        out["dockerfile_cold_s"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
        rebuilt = await build_dockerfile(rt, ctx, options=opts)
        out["dockerfile_warm_s"] = round(time.perf_counter() - t0, 3)
        out["same_id"] = rebuilt.id == built.id
        host = rt.host_image()
        out["latency"] = {}
        for _ in range(2):  # interleaved, the second round counts (warm caches for both)
            out["latency"] = {"host": await _latency(rt, host.id, n), "debian": await _latency(rt, deb.id, n)}
        out["disk"] = {r.image.meta.get("kind", "?"): {
            "layers": len(r.image.layers), "mib": round(r.size_bytes / 2**20, 2),
            "unique_mib": round(r.unique_bytes / 2**20, 2)}  # layers no other image of the store shares
            for r in list_images(rt.store) if r.image.id in (host.id, deb.id, built.id)}
        await rt.close_all()
        return out
    finally:
        shutil.rmtree(state, ignore_errors=True)


def run(cfg: TryloopConfig, *, quick: bool = False, packages: list[str] | None = None,
        out: Path | None = None, console: Console | None = None) -> dict:
    console = console or Console()
    with tempfile.TemporaryDirectory(prefix="tryloop-bench-images-") as tmp:
        res = asyncio.run(_run(cfg, Path(tmp), packages or ["jq"], 5 if quick else 40, console))
    t = Table(title="images: build")
    t.add_column("what")
    t.add_column("cold", justify="right")
    t.add_column("again", justify="right")
    t.add_row(f"Debian root (Essential + {' '.join(res['packages'])})", f"{res['debian_cold_s']} s",
              f"{res['debian_cached_s']} s (package digest)")
    t.add_row("Dockerfile on it (WORKDIR, COPY, 2 RUN)", f"{res['dockerfile_cold_s']} s",
              f"{res['dockerfile_warm_s']} s (all cached, same id: {res['same_id']})")
    console.print(t)
    t = Table(title="images: sandboxes (medians)")
    for col in ("root", "create", "exec `true`", "reset", "disk"):
        t.add_column(col, justify="left" if col == "root" else "right")
    for name, kind in (("host-derived", "host"), ("Debian", "debian")):
        lat = res["latency"]["host" if kind == "host" else "debian"]
        disk = res["disk"].get(kind, {})
        t.add_row(name, f"{lat['create_ms']} ms", f"{lat['exec_ms']} ms", f"{lat['reset_ms']} ms",
                  f"{disk.get('mib', '?')} MiB" + (" + host binds" if kind == "host" else ""))
    console.print(t)
    built = res["disk"].get("dockerfile", {})
    console.print(f"the Dockerfile's image: {built.get('layers')} layers, {built.get('unique_mib')} MiB of its own "
                  "on top of the Debian root's")
    if out is not None:
        out.write_text(json.dumps(res, indent=1))
    return res
