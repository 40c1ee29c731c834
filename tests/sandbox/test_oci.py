"""OCI image roots: real archives built here, imported into the layer store, and real
commands run in sandboxes whose root is nothing but the archive's layers."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from oci_archives import base_entries, docker_save, image_config, layer_tar, oci_layout

from tryloop.config import SandboxConfig
from tryloop.sandbox.layers import Snapshot
from tryloop.sandbox.oci import ImageError, import_archive, unpack_layer

# Layer 2 deletes /data/a (whiteout), empties /opt/old (opaque) but adds /opt/old/new,
# replaces /data/keep and adds /app owned by the image's user.
TOP = [
    ("data", "d", None, 0o755), ("data/a", "wh", None, 0o644),
    ("opt/old", "d", None, 0o755), ("opt/old", "opq", None, 0o644),
    ("opt/old/new", "f", b"new\n", 0o644),
    ("data/keep", "f", b"v2\n", 0o644),
    ("app", "d", None, 0o755, 1234, 1234), ("app/hello", "f", b"hello\n", 0o644, 1234, 1234),
    ("app/link", "l", "/data/keep", 0o777), ("app/hard", "h", "app/hello", 0o644),
    ("dev/null", "c", None, 0o666),
]
MID = [("data", "d", None, 0o755), ("data/a", "f", b"a\n", 0o644), ("data/b", "f", b"b\n", 0o644),
       ("data/keep", "f", b"v1\n", 0o644), ("opt", "d", None, 0o755), ("opt/old", "d", None, 0o755),
       ("opt/old/f1", "f", b"1\n", 0o644), ("opt/old/sub", "d", None, 0o755)]

PROBE = ("echo \"$GREETING $(pwd)\"; for p in /data/a /data/b /opt/old/f1 /opt/old/sub /opt/old/new; do "
         "[ -e $p ] && echo \"has $p\"; done; read v < /data/keep; echo keep=$v; read v < /app/link; echo link=$v; "
         "read v < /app/hard; echo hard=$v; while read k u rest; do [ $k = Uid: ] && echo uid=$u; done < /proc/self/status; true")


@pytest.fixture(scope="module")
def layers() -> list[bytes]:
    return [layer_tar(base_entries(), gz=True), layer_tar(MID), layer_tar(TOP, gz=True)]


def _config(layers):
    return image_config(layers, env=["PATH=/bin", "GREETING=hi"], workdir="/app", user="app")


async def _probe(runtime, image, config: SandboxConfig | None = None) -> str:
    async with await runtime.create(Snapshot(image.id), config or SandboxConfig()) as sb:
        res = await sb.exec(PROBE)
        assert res.ok, res.text("stderr")
        return res.text()


EXPECTED = "hi /app\nhas /data/b\nhas /opt/old/new\nkeep=v2\nlink=v2\nhard=hello\nuid=1234\n"


async def test_docker_save_archive_runs_with_whiteouts_opaque_and_config(runtime, tmp_path, layers):
    path = docker_save(tmp_path / "img.tar", layers, _config(layers))
    image = import_archive(runtime.store, path)
    assert image.workdir == "/app" and image.user == "app" and (image.uid, image.gid) == (1234, 1234)
    assert ("GREETING", "hi") in image.env
    assert image.meta["tags"] == ["test:latest"]
    assert image.meta["skipped"] == ["layer 3: dev/null"]  # device nodes are never unpacked
    assert await _probe(runtime, image) == EXPECTED
    # Ownership as the archive says; set-id bits and devices never reach a layer.
    top = runtime.store.path(image.layers[0])
    assert os.stat(top / "app/hello").st_uid == 1234 and not (top / "dev/null").exists()
    # Same archive, same image id; a config set explicitly wins over the image's.
    assert import_archive(runtime.store, path).id == image.id
    out = await _probe(runtime, image, SandboxConfig(uid=2000, gid=2000, workdir="/"))
    assert out.startswith("hi /\n") and out.endswith("uid=2000\n")


async def test_oci_layout_dir_and_tar_give_the_docker_save_image(runtime, tmp_path, layers):
    cfg = _config(layers)
    d = tmp_path / "layout"
    d.mkdir()
    a = import_archive(runtime.store, oci_layout(d, layers, cfg))
    b = import_archive(runtime.store, oci_layout(tmp_path / "layout.tar", layers, cfg, as_tar=True))
    c = import_archive(runtime.store, docker_save(tmp_path / "img.tar", layers, cfg))
    assert a.id == b.id == c.id
    assert await _probe(runtime, a) == EXPECTED


async def test_root_user_image_runs_as_the_unprivileged_uid_in_its_workdir(runtime, tmp_path, layers):
    cfg = image_config(layers[:1], env=["PATH=/bin"], workdir="/not/in/the/layers")
    image = import_archive(runtime.store, docker_save(tmp_path / "r.tar", layers[:1], cfg))
    assert (image.uid, image.workdir) == (0, "/not/in/the/layers")
    async with await runtime.create(Snapshot(image.id)) as sb:  # the missing WorkingDir is made
        res = await sb.exec("while read k u r; do [ $k = Uid: ] && echo $u; done < /proc/self/status; pwd")
        assert res.text() == "1000\n/not/in/the/layers\n"


def _unpack(tmp_path: Path, entries, name="evil") -> Path:
    dest = tmp_path / name
    dest.mkdir()
    unpack_layer(io.BytesIO(layer_tar(entries)), dest, name)
    return dest


def _raw_tar(members: list[tarfile.TarInfo]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for ti in members:
            tar.addfile(ti, io.BytesIO(b"x" * ti.size) if ti.isreg() else None)
    return buf.getvalue()


@pytest.mark.parametrize("name", ["../escape", "a/../../escape", "/abs/escape"])
def test_unpack_refuses_paths_that_leave_the_layer(tmp_path, name):
    ti = tarfile.TarInfo(name)
    ti.size = 1
    dest = tmp_path / "d" / "root"
    dest.mkdir(parents=True)
    with pytest.raises(ImageError, match="escape"):
        unpack_layer(io.BytesIO(_raw_tar([ti])), dest, "layer.tar")
    assert not (tmp_path / "escape").exists() and not (tmp_path / "d" / "escape").exists()


def test_unpack_never_writes_through_a_symlink(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    with pytest.raises(ImageError, match="not a directory"):
        _unpack(tmp_path, [("link", "l", str(outside), 0o777), ("link/planted", "f", b"x", 0o644)])
    with pytest.raises(ImageError, match="not a directory"):
        _unpack(tmp_path, [("rel", "l", "../outside", 0o777), ("rel/planted", "f", b"x", 0o644)], "e2")
    # A whiteout through a symlink deletes nothing outside either.
    (outside / "victim").write_text("keep")
    with pytest.raises(ImageError):
        _unpack(tmp_path, [("link", "l", str(outside), 0o777), ("link/victim", "wh", None, 0o644)], "e3")
    assert list(outside.iterdir()) == [outside / "victim"]
    # A hard link must name a file of the same layer.
    with pytest.raises(ImageError, match="hard link"):
        _unpack(tmp_path, [("h", "h", "/etc/passwd", 0o644)], "e4")
    with pytest.raises(ImageError, match="hard link"):
        _unpack(tmp_path, [("h", "h", "../../etc/passwd", 0o644)], "e5")


def test_unpack_markers_and_bad_archives(tmp_path):
    dest = _unpack(tmp_path, [("d", "d", None, 0o700), ("d", "opq", None, 0), ("gone", "wh", None, 0),
                              ("d/f", "f", b"1", 0o4755)], "ok")
    assert os.getxattr(dest / "d", "trusted.overlay.opaque") == b"y"
    st = os.lstat(dest / "gone")
    assert st.st_rdev == 0 and (st.st_mode & 0o170000) == 0o020000
    assert oct(os.stat(dest / "d").st_mode & 0o7777) == "0o700"
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(ImageError, match="bad.tar: not a tar archive"):
        unpack_layer(io.BytesIO(b"garbage" * 100), bad, "bad.tar")
    with pytest.raises(ImageError, match="neither an OCI image layout"):
        import_archive_none(tmp_path)


def import_archive_none(tmp_path):
    from tryloop.sandbox.layers import LayerStore

    p = tmp_path / "empty.tar"
    with tarfile.open(p, "w"):
        pass
    return import_archive(LayerStore(tmp_path / "store"), p)


def test_corrupt_oci_blob_is_refused(tmp_path, layers):
    from tryloop.sandbox.layers import LayerStore

    d = tmp_path / "layout"
    d.mkdir()
    oci_layout(d, layers, _config(layers))
    blob = max((d / "blobs/sha256").iterdir(), key=lambda p: p.stat().st_size)
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(ImageError, match="does not match its digest"):
        import_archive(LayerStore(tmp_path / "store"), d)


async def test_workspace_snapshot_on_an_image_goes_to_its_workdir_as_its_user(runtime, tmp_path, layers):
    image = import_archive(runtime.store, docker_save(tmp_path / "img.tar", layers, _config(layers)))
    snap = runtime.workspace_snapshot({"task.txt": "todo\n"}, image=image)
    async with await runtime.create(snap) as sb:
        res = await sb.exec("read v < task.txt; echo $v > done.txt && echo $v")
        assert res.ok and res.text() == "todo\n", res.text("stderr")
    assert os.stat(runtime.store.path(snap.layers[0]) / "app/task.txt").st_uid == 1234
