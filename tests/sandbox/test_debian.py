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
