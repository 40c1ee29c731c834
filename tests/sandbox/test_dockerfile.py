"""The Dockerfile builder: real builds (RUN steps in build sandboxes on the image's own
root), cached rebuilds, and refusals that name the file and line."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from oci_archives import base_entries, docker_save, image_config, layer_tar

from tryloop.sandbox.catalog import list_images, prune, remove_image, resolve, tag_image
from tryloop.sandbox.dockerfile import BuildError, BuildOptions, build_dockerfile, expand, parse
from tryloop.sandbox.layers import Snapshot
from tryloop.sandbox.oci import import_archive

TOOLS = ("cat", "mkdir", "rm", "ls", "id", "touch", "ln")

DOCKERFILE = """\
# a comment
ARG BASE=base:1
FROM ${BASE}
ARG GREETING=hello
ENV APP_HOME=/srv/app \\
    MODE="two words"
WORKDIR $APP_HOME
COPY src/ ./
COPY --chown=app:app data.txt /srv/data/
RUN echo "$GREETING $MODE from $(pwd) as $(id -u)" > built.txt \\
 && mkdir -p /var/made && echo x > /var/made/f && rm /etc/group && rm -rf /opt/tree && mkdir /opt/tree \\
 && touch /opt/tree/fresh
USER app
RUN ["/bin/sh", "-c", "echo by-app > /srv/data/by-app.txt"]
CMD ["cat", "built.txt"]
"""


@pytest.fixture(scope="module")
def base(build_runtime, tmp_path_factory):
    runtime = build_runtime
    entries = base_entries(tools=TOOLS) + [("opt", "d", None, 0o755), ("opt/tree", "d", None, 0o755),
                                           ("opt/tree/old", "f", b"old\n", 0o644)]
    layers = [layer_tar(entries, gz=True)]
    path = docker_save(tmp_path_factory.mktemp("base") / "base.tar", layers,
                       image_config(layers, env=["PATH=/bin"]))
    image = import_archive(runtime.store, path)
    tag_image(runtime.store, "base:1", image.id)
    return image


def _context(tmp_path: Path, dockerfile: str = DOCKERFILE) -> Path:
    ctx = tmp_path / "ctx"
    (ctx / "src" / "pkg").mkdir(parents=True, exist_ok=True)
    (ctx / "src" / "main.sh").write_text("echo main\n")
    (ctx / "src" / "pkg" / "mod.txt").write_text("mod\n")
    (ctx / "data.txt").write_text("data\n")
    (ctx / "Dockerfile").write_text(dockerfile)
    return ctx


async def _sh(runtime, image, cmd: str) -> str:
    async with await runtime.create(Snapshot(image.id)) as sb:
        res = await sb.exec(cmd)
        assert res.ok, res.text() + res.text("stderr")
        return res.text()


async def test_build_runs_steps_in_the_image_and_a_rebuild_is_all_cached(build_runtime, base, tmp_path):
    runtime = build_runtime
    ctx = _context(tmp_path)
    seen: list[tuple[int, str]] = []
    t0 = time.monotonic()
    image = await build_dockerfile(runtime, ctx, tag="app:1", options=BuildOptions(network=False),
                                   on_step=lambda i, n, text, status: seen.append((i, status)))
    cold = time.monotonic() - t0
    assert resolve(runtime.store, "app:1") == image.id
    assert [s for _, s in seen].count("built") == 5  # WORKDIR, 2 COPY, 2 RUN
    assert image.workdir == "/srv/app" and image.user == "app" and (image.uid, image.gid) == (1234, 1234)
    assert image.meta["cmd"] == ["cat", "built.txt"]
    assert ("MODE", "two words") in image.env and not any(k == "GREETING" for k, _ in image.env)
    out = await _sh(runtime, image,
                    "cat built.txt; ls /srv/app /srv/app/pkg; cat /srv/data/by-app.txt; id -u; "
                    "ls -n /srv/data | while read m l u g rest; do echo $u:$g $rest; done; "
                    "ls /opt/tree; [ -e /etc/group ] || echo no-group; cat /var/made/f")
    lines = out.splitlines()
    # RUN ran as the namespace's root (0), in WORKDIR, with the ARG and ENV values.
    assert lines[0] == "hello two words from /srv/app as 0"
    assert "main.sh" in lines and "mod.txt" in lines and "by-app" in lines
    assert "1234" in lines  # the image's USER, honoured by sandboxes on it
    assert any(x.startswith("1234:1234") and x.endswith("by-app.txt") for x in lines)  # RUN as app
    assert any(x.startswith("1234:1234") and x.endswith("data.txt") for x in lines)  # --chown
    # rm of a lower file (whiteout) and of a lower directory re-created (opaque).
    assert "no-group" in lines and "fresh" in lines and "old" not in lines
    assert lines[-1] == "x"
    # The RUN layer holds ids as the image sees them, not the namespace's host ids.
    made = runtime.store.path(image.layers[1]) / "var/made/f"
    assert os.stat(made).st_uid == 0

    seen.clear()
    t0 = time.monotonic()
    again = await build_dockerfile(runtime, ctx, options=BuildOptions(network=False),
                                   on_step=lambda i, n, text, status: seen.append((i, status)))
    warm = time.monotonic() - t0
    assert again.id == image.id
    assert "built" not in {s for _, s in seen}
    assert [s for _, s in seen].count("cached") == 5
    print(f"\nbuild cold {cold:.2f}s warm {warm:.2f}s")

    # A changed context file rebuilds its COPY and the steps after it, not those before.
    (ctx / "data.txt").write_text("data v2\n")
    seen.clear()
    changed = await build_dockerfile(runtime, ctx, options=BuildOptions(network=False),
                                     on_step=lambda i, n, text, status: seen.append((i, status)))
    assert changed.id != image.id
    statuses = dict(seen)
    assert [statuses[i] for i in (5, 6, 7, 8, 10)] == ["cached", "cached", "built", "built", "built"]


async def test_failing_run_names_the_step_and_keeps_the_cache(build_runtime, base, tmp_path):
    runtime = build_runtime
    df = DOCKERFILE.replace("USER app\n", "USER app\nRUN echo failing-output; exit 3\n")
    ctx = _context(tmp_path, df)
    with pytest.raises(BuildError) as e:
        await build_dockerfile(runtime, ctx, options=BuildOptions(network=False))
    msg = str(e.value)
    assert f"{ctx / 'Dockerfile'}:14: step 10/12 `RUN echo failing-output; exit 3` failed (exit 3)" in msg
    assert "failing-output" in msg
    fixed = _context(tmp_path, df.replace("exit 3", "true"))
    seen: list[tuple[int, str]] = []
    await build_dockerfile(runtime, fixed, options=BuildOptions(network=False),
                           on_step=lambda i, n, text, status: seen.append((i, status)))
    assert dict(seen)[8] == "cached" and dict(seen)[10] == "built"  # the steps before the failure were kept


async def test_build_sandbox_sees_only_the_image(build_runtime, base, tmp_path):
    runtime = build_runtime
    ctx = _context(tmp_path, "FROM base:1\nRUN ls / > /listing; [ ! -e /work ] && [ ! -e /usr ] && [ ! -e /home ]\n")
    image = await build_dockerfile(runtime, ctx, options=BuildOptions(network=False))
    listing = (await _sh(runtime, image, "cat /listing")).split()
    assert "usr" not in listing and "bin" in listing


@pytest.mark.parametrize(("text", "line", "match"), [
    ("FROM base:1\nVOLUME /data\n", 2, "VOLUME is not supported"),
    ("FROM base:1\nFROBNICATE x\n", 2, "unknown instruction 'FROBNICATE'"),
    ("FROM base:1 AS a\nRUN true\nFROM base:1\n", 3, "multi-stage"),
    ("FROM base:1\nCOPY --from=a /x /y\n", 2, "COPY --from is not supported"),
    ("FROM base:1\nRUN --mount=type=cache,target=/x true\n", 2, "RUN --mount is not supported"),
    ("RUN true\nFROM base:1\n", 1, "only ARG may come before FROM"),
    ("FROM base:1\nRUN <<EOF\necho\nEOF\n", 2, "heredocs"),
    ("FROM base:1\nENV\n", 2, "ENV needs arguments"),
])
def test_parse_refusals_name_file_and_line(tmp_path, text, line, match):
    p = tmp_path / "Dockerfile"
    p.write_text(text)
    with pytest.raises(BuildError, match=match) as e:
        parse(p)
    assert str(e.value).startswith(f"{p}:{line}: ")


async def test_build_refusals_name_file_and_line(build_runtime, base, tmp_path):
    runtime = build_runtime
    cases = [("FROM nosuch:9\n", 1, "no image named 'nosuch:9'"),
             ("FROM base:1\nCOPY ../outside /x\n", 2, "outside the build context"),
             ("FROM base:1\nCOPY missing.txt /x\n", 2, "does not exist"),
             ("FROM base:1\nUSER ghost\n", 2, "'ghost' is not in the image's /etc/passwd"),
             ("FROM base:1\nADD https://example.com/x /x\n", 2, "from a URL is not supported")]
    for i, (text, line, match) in enumerate(cases):
        ctx = _context(tmp_path / str(i), text)
        with pytest.raises(BuildError, match=match) as e:
            await build_dockerfile(runtime, ctx, options=BuildOptions(network=False))
        assert str(e.value).startswith(f"{ctx / 'Dockerfile'}:{line}: ")


def test_expand():
    env = {"A": "x", "E": ""}
    assert expand("$A ${A} ${B:-d} ${A:+alt} ${E:-e} ${E-f} \\$A", env) == "x x d alt e  $A"


async def test_scratch_copy_ls_rm_prune(build_runtime, base, tmp_path):
    runtime = build_runtime
    ctx = _context(tmp_path, "FROM scratch\nCOPY data.txt /\n")
    image = await build_dockerfile(runtime, ctx, tag="scratchy", options=BuildOptions(network=False))
    rows = {r.image.id: r for r in list_images(runtime.store)}
    assert rows[image.id].tags == ["scratchy:latest"] and rows[image.id].size_bytes > 0
    copy_layer = image.layers[0]
    with pytest.raises(KeyError):
        resolve(runtime.store, "nothing-here")
    assert remove_image(runtime.store, "scratchy") == (image.id, ["scratchy:latest"])
    report = prune(runtime.store, grace_s=0)
    assert copy_layer in report.removed and report.bytes_freed > 0
    assert not runtime.store.has(copy_layer)
    assert runtime.store.has(base.layers[0])  # still referenced by the base image


async def test_add_archive_dockerignore_chmod_and_symlinked_destination(build_runtime, base, tmp_path):
    import io
    import tarfile

    runtime = build_runtime
    ctx = _context(tmp_path, "FROM base:1\nADD bundle.tar /opt/bundle/\nCOPY --chmod=0700 src /srv/src\n"
                             "COPY . /ctx/\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        ti = tarfile.TarInfo("inner/file.txt")
        ti.size = 3
        tar.addfile(ti, io.BytesIO(b"in\n"))
    (ctx / "bundle.tar").write_bytes(buf.getvalue())
    (ctx / "secret.key").write_text("no\n")
    (ctx / "keep.key").write_text("yes\n")
    (ctx / ".dockerignore").write_text("*.key\nsrc/pkg\n!keep.key\n")
    image = await build_dockerfile(runtime, ctx, options=BuildOptions(network=False))
    out = await _sh(runtime, image, "cat /opt/bundle/inner/file.txt; ls /ctx; ls -l /srv/src/main.sh")
    lines = out.splitlines()
    assert lines[0] == "in"
    assert "secret.key" not in lines and "keep.key" in lines and "data.txt" in lines and "bundle.tar" in lines
    assert lines[-1].startswith("-rwx------")
    # A destination through a symlink of the image is refused, naming the link.
    bad = _context(tmp_path / "b", "FROM base:1\nRUN ln -s /tmp /lnk\nCOPY data.txt /lnk/x/\n")
    with pytest.raises(BuildError, match="passes through the symlink /lnk -> /tmp"):
        await build_dockerfile(runtime, bad, options=BuildOptions(network=False))
