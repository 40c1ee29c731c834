"""Debian roots from the package archive (slow: downloads packages, runs every Essential
package's maintainer scripts in a build sandbox), then a Dockerfile built on one."""

from __future__ import annotations

import time

import pytest

from tryloop.sandbox.catalog import tag_image
from tryloop.sandbox.debian import debian_root
from tryloop.sandbox.dockerfile import BuildError, BuildOptions, build_dockerfile
from tryloop.sandbox.layers import Snapshot

pytestmark = [pytest.mark.slow, pytest.mark.network]


async def test_debian_root_with_jq_then_a_dockerfile_on_it(build_runtime, tmp_path):
    runtime = build_runtime
    t0 = time.monotonic()
    image = await debian_root(runtime, ["jq"])
    cold = time.monotonic() - t0
    assert image.meta["kind"] == "debian" and image.meta["packages"] == ["jq"]
    async with await runtime.create(Snapshot(image.id)) as sb:
        res = await sb.exec("echo '{\"a\": [1, 2]}' | jq -c .a && dpkg --audit && id -u && cat /etc/debian_version")
        assert res.ok, res.text() + res.text("stderr")
        out = res.text().split()
        assert out[0] == "[1,2]" and out[1] == "1000"  # root image: the unprivileged uid
        assert not sb.list_dir("/var/lib/dpkg/updates")  # nothing left half-configured
    t0 = time.monotonic()
    again = await debian_root(runtime, ["jq"])
    warm = time.monotonic() - t0
    assert again.id == image.id and warm < cold
    print(f"\ndebian root with jq: cold {cold:.1f}s, cached {warm:.1f}s")

    tag_image(runtime.store, "debian-jq", image.id)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        "FROM debian-jq\nRUN echo 'dev:x:1500:1500::/work:/bin/sh' >> /etc/passwd && echo 'dev:x:1500:' >> /etc/group\n"
        "USER dev\nWORKDIR /work\nRUN echo '[3,4]' | jq add > sum.txt\n")
    built = await build_dockerfile(runtime, ctx, options=BuildOptions(network=False))
    async with await runtime.create(Snapshot(built.id)) as sb:
        res = await sb.exec("cat sum.txt; id -un; pwd")
        assert res.text().split() == ["7", "dev", "/work"], res.text() + res.text("stderr")


async def test_unknown_package_is_refused(build_runtime):
    runtime = build_runtime
    with pytest.raises(BuildError, match="no-such-package-here"):
        await debian_root(runtime, ["no-such-package-here"])


def test_bench_images_quick(runtime_config, tmp_path):
    from tryloop.bench.images import run
    from tryloop.config import TryloopConfig

    cfg = TryloopConfig(runtime=runtime_config)
    res = run(cfg, quick=True, out=tmp_path / "r.json")
    assert res["same_id"] and set(res["latency"]) == {"host", "debian"}
    assert (tmp_path / "r.json").is_file() and res["disk"]["debian"]["mib"] > 10


async def test_apt_get_install_in_a_run_step(build_runtime, tmp_path):
    """A root with apt in it gets the host's sources and proxy settings, and `apt-get
    install` works in a RUN step: root of the build sandbox holds the capabilities apt and
    dpkg need (its `_apt` download sandbox included); sandboxes on the image run the tool."""
    runtime = build_runtime
    t0 = time.monotonic()
    root = await debian_root(runtime, ["apt"])
    root_s = time.monotonic() - t0
    async with await runtime.create(Snapshot(root.id)) as sb:
        res = await sb.exec("cat /etc/apt/sources.list.d/*; getent passwd _apt; command -v tree || echo none")
        assert "_apt:" in res.text() and res.text().split()[-1] == "none", res.text() + res.text("stderr")
    tag_image(runtime.store, "debian-apt", root.id)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        "FROM debian-apt\n"
        "RUN apt-get update && apt-get install -y --no-install-recommends tree && rm -rf /var/lib/apt/lists/*\n"
        "RUN useradd -m -u 1500 dev && chown -R dev:dev /home/dev\n"
        "USER dev\nWORKDIR /home/dev\n")
    t0 = time.monotonic()
    image = await build_dockerfile(runtime, ctx)
    cold = time.monotonic() - t0
    t0 = time.monotonic()
    again = await build_dockerfile(runtime, ctx)
    warm = time.monotonic() - t0
    assert again.id == image.id
    async with await runtime.create(Snapshot(image.id)) as sb:
        res = await sb.exec("mkdir -p a/b && tree --noreport . && id -un && dpkg -s tree | grep ^Status")
        assert res.ok, res.text() + res.text("stderr")
        assert res.text().split("\n")[:5] == [".", "└── a", "    └── b", "dev", "Status: install ok installed"], \
            res.text()
    print(f"\ndebian root with apt: {root_s:.1f}s; Dockerfile with apt-get install: cold {cold:.1f}s, "
          f"cached {warm:.3f}s")
