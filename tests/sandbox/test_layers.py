"""Tests of tryloop.sandbox.layers on the real filesystem (no mocks)."""

from __future__ import annotations

import os
import pickle
import socket
import stat
import struct
import subprocess
import time
from pathlib import Path

import pytest

from tryloop.errors import TryloopError
from tryloop.sandbox.layers import (
    FIXED_MTIME_NS,
    OPAQUE_XATTR,
    USER_OPAQUE_XATTR,
    LayerError,
    LayerNotFound,
    LayerStore,
    Snapshot,
    SnapshotNotFound,
    tree_digest,
)

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (chown, mknod, trusted xattrs)")


def _has_overlay() -> bool:
    try:
        return "overlay" in Path("/proc/filesystems").read_text()
    except OSError:
        return False


needs_overlay = pytest.mark.skipif(
    not (IS_ROOT and _has_overlay()), reason="needs root and overlayfs to mount"
)


@pytest.fixture
def store(tmp_path: Path) -> LayerStore:
    return LayerStore(tmp_path / "store")


def make_tree(root: Path, mtime: float) -> Path:
    """A small tree with files, an empty dir, a nested dir and symlinks."""
    root.mkdir()
    (root / "README").write_text("hello\n")
    (root / "bin").mkdir()
    (root / "bin" / "run.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    os.chmod(root / "bin" / "run.sh", 0o755)
    (root / "empty").mkdir()
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "src" / "pkg" / "data.bin").write_bytes(bytes(range(256)) * 64)
    os.symlink("src/pkg/mod.py", root / "link")
    os.symlink("/nonexistent/dangling", root / "dangling")
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files + [""]:
            os.utime(os.path.join(dirpath, name), (mtime, mtime), follow_symlinks=False)
    return root


def mount_overlay(lowers: list[Path], work: Path) -> Path:
    """Mount an overlay of `lowers` (top-most first) with a fresh upper; returns the mountpoint."""
    upper, wdir, mnt = work / "upper", work / "work", work / "mnt"
    for d in (upper, wdir, mnt):
        d.mkdir(parents=True)
    opts = f"lowerdir={':'.join(map(str, lowers))},upperdir={upper},workdir={wdir}"
    subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", opts, str(mnt)],
        check=True,
        capture_output=True,
    )
    return mnt


def umount(mnt: Path) -> None:
    subprocess.run(["umount", str(mnt)], check=False, capture_output=True)


# --------------------------------------------------------------------------- digests


def test_same_content_same_digest_regardless_of_location_and_mtime(
    store: LayerStore, tmp_path: Path
) -> None:
    a = make_tree(tmp_path / "a", mtime=1_500_000_000)
    b = make_tree(tmp_path / "b", mtime=1_700_000_000.5)
    assert tree_digest(a) == tree_digest(b)

    da = store.add_tree(a)
    db = store.add_tree(b)
    assert da == db
    assert len(da) == 64 and all(c in "0123456789abcdef" for c in da)
    assert store.list() == [da]
    assert os.listdir(store.tmp_dir) == []  # the duplicate build was discarded
    assert store.verify(da)
    assert tree_digest(store.path(da)) == da == tree_digest(a)  # nothing to strip in a

    layer = store.path(da)
    assert (layer / "src/pkg/data.bin").read_bytes() == (a / "src/pkg/data.bin").read_bytes()
    assert (layer / "empty").is_dir() and os.listdir(layer / "empty") == []
    assert stat.S_IMODE(os.stat(layer / "bin/run.sh").st_mode) == 0o755
    for dirpath, dirs, files in os.walk(layer):
        for name in dirs + files + [""]:
            st = os.lstat(os.path.join(dirpath, name))
            assert st.st_mtime_ns == FIXED_MTIME_NS, os.path.join(dirpath, name)


def test_any_change_changes_digest(tmp_path: Path) -> None:
    base = make_tree(tmp_path / "base", mtime=1_600_000_000)
    seen = {tree_digest(base)}

    def variant(name: str, change) -> None:
        t = make_tree(tmp_path / name, mtime=1_600_000_000)
        change(t)
        d = tree_digest(t)
        assert d not in seen, name
        seen.add(d)

    def flip_byte(t: Path) -> None:
        p = t / "src/pkg/data.bin"
        data = bytearray(p.read_bytes())
        data[1000] ^= 1
        p.write_bytes(bytes(data))

    def retarget(t: Path) -> None:
        os.unlink(t / "link")
        os.symlink("src/pkg/mod.pyc", t / "link")

    def rename(t: Path) -> None:
        os.rename(t / "README", t / "README.md")

    variant("byte", flip_byte)
    variant("mode", lambda t: os.chmod(t / "README", 0o600))
    variant("dirmode", lambda t: os.chmod(t / "empty", 0o700))
    variant("symlink", retarget)
    variant("rename", rename)
    variant("newdir", lambda t: (t / "empty" / "sub").mkdir())
    variant("emptyfile", lambda t: (t / "empty" / "f").touch())
    if IS_ROOT:
        variant("owner", lambda t: os.chown(t / "README", 1000, 1000))


# --------------------------------------------------------------------------- ownership, security


@needs_root
def test_uid_gid_chown_every_entry(store: LayerStore, tmp_path: Path) -> None:
    src = make_tree(tmp_path / "ws", mtime=1_600_000_000)
    plain = store.add_tree(src)
    owned = store.add_tree(src, uid=1234, gid=5678)
    assert owned != plain
    layer = store.path(owned)
    count = 0
    for dirpath, dirs, files in os.walk(layer):
        for name in dirs + files + [""]:
            st = os.lstat(os.path.join(dirpath, name))
            assert (st.st_uid, st.st_gid) == (1234, 5678), os.path.join(dirpath, name)
            count += 1
    assert count >= 9
    assert tree_digest(layer) == owned
    # Without uid/gid, ownership is preserved.
    os.chown(src / "README", 42, 43)
    kept = store.path(store.add_tree(src))
    assert (os.stat(kept / "README").st_uid, os.stat(kept / "README").st_gid) == (42, 43)


@needs_root
def test_setid_bits_and_xattrs_are_stripped(store: LayerStore, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "suid").write_bytes(b"\x7fELF")
    os.chmod(src / "suid", 0o4755)
    (src / "sgid").write_bytes(b"x")
    os.chmod(src / "sgid", 0o2711)
    (src / "shared").mkdir()
    os.chmod(src / "shared", 0o2775)
    (src / "sticky").mkdir()
    os.chmod(src / "sticky", 0o1777)
    # A file capability (VFS_CAP_REVISION_2, effective, CAP_SYS_ADMIN permitted) and more.
    cap = struct.pack("<IIIII", 0x02000001, 1 << 21, 0, 0, 0)
    os.setxattr(src / "suid", "security.capability", cap)
    os.setxattr(src / "suid", "user.note", b"smuggled")
    os.setxattr(src / "shared", "trusted.overlay.origin", b"\x00\xfb")
    os.setxattr(src / "shared", "trusted.overlay.impure", b"y")

    digest = store.add_tree(src)
    layer = store.path(digest)
    assert stat.S_IMODE(os.stat(layer / "suid").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(layer / "sgid").st_mode) == 0o711
    assert stat.S_IMODE(os.stat(layer / "shared").st_mode) == 0o775
    assert stat.S_IMODE(os.stat(layer / "sticky").st_mode) == 0o1777  # sticky is harmless
    for name in ("suid", "sgid", "shared", "sticky", ""):
        assert os.listxattr(layer / name) == [], name
    assert tree_digest(layer) == digest != tree_digest(src)


def test_symlinks_are_copied_never_followed(store: LayerStore, tmp_path: Path) -> None:
    secret_dir = tmp_path / "outside"
    secret_dir.mkdir()
    (secret_dir / "secret").write_text("top secret")
    src = tmp_path / "src"
    src.mkdir()
    os.symlink("/etc/shadow", src / "shadow")
    os.symlink(secret_dir, src / "outside")
    os.symlink(secret_dir / "secret", src / "secret")

    layer = store.path(store.add_tree(src))
    for name, target in [
        ("shadow", "/etc/shadow"),
        ("outside", str(secret_dir)),
        ("secret", str(secret_dir / "secret")),
    ]:
        assert stat.S_ISLNK(os.lstat(layer / name).st_mode), name
        assert os.readlink(layer / name) == target
    # Nothing of the targets was copied into the layer.
    assert sorted(os.listdir(layer)) == ["outside", "secret", "shadow"]
    assert store.size_bytes(tree_digest(layer)) == 0


def test_hard_links_share_one_copy_and_special_files_skipped(
    store: LayerStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The names of one file share one copy in the layer (a copy costs what its source does);
    FIFOs, sockets and device nodes are not carried."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "one").write_text("same inode")
    os.link(src / "one", src / "two")
    (src / "sub").mkdir()
    os.link(src / "one", src / "sub" / "three")
    os.mkfifo(src / "fifo")
    monkeypatch.chdir(src)  # AF_UNIX paths are short: bind relative to the cwd
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("sock")
        if IS_ROOT:
            os.mknod(src / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        digest = store.add_tree(src)
    layer = store.path(digest)
    assert sorted(os.listdir(layer)) == ["one", "sub", "two"]
    assert os.stat(layer / "one").st_ino == os.stat(layer / "two").st_ino == os.stat(layer / "sub" / "three").st_ino
    assert (layer / "sub" / "three").read_text() == "same inode"
    assert os.stat(layer / "one").st_nlink == 3
    assert store.size_bytes(digest) == 3 * len("same inode")   # apparent size: every name
    assert tree_digest(layer) == digest
    assert tree_digest(src) != digest  # the source's FIFO, socket, device count there


def test_zeros_stay_holes_in_the_copy(store: LayerStore, tmp_path: Path) -> None:
    """A sparse file copies as a sparse file: a tree within its disk quota cannot copy out as
    many times its size. Its content, and so the digest, is unchanged."""
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "sparse", "wb") as f:
        f.write(b"head")
        f.seek(64 << 20)
        f.write(b"tail")
    (src / "zeros").write_bytes(bytes(3 << 20))          # written zeros, not a hole
    (src / "small").write_bytes(bytes(100))
    digest = store.add_tree(src)
    layer = store.path(digest)
    assert tree_digest(layer) == digest == tree_digest(src)
    with open(layer / "sparse", "rb") as f:
        assert f.read(4) == b"head" and f.seek(64 << 20) == 64 << 20 and f.read() == b"tail"
    assert os.stat(layer / "sparse").st_size == (64 << 20) + 4
    assert os.stat(layer / "zeros").st_size == 3 << 20 and (layer / "small").read_bytes() == bytes(100)
    allocated = sum(os.stat(layer / n).st_blocks * 512 for n in ("sparse", "zeros"))
    assert allocated < 1 << 20, allocated


@needs_root
def test_metacopy_upper_is_refused(store: LayerStore, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("")
    os.setxattr(src / "f", "trusted.overlay.metacopy", b"")
    with pytest.raises(LayerError, match="metacopy"):
        store.add_tree(src)
    assert os.listdir(store.tmp_dir) == [] and store.list() == []


# --------------------------------------------------------------------------- user namespaces


@needs_root
def test_an_upper_dir_of_a_user_namespace_is_read_in_its_numbering(store: LayerStore, tmp_path: Path) -> None:
    """Its ids are the host's id_base + N and its opaque marker is user.overlay.opaque; the
    layer holds N (an id outside the range: the overflow id) and both markers."""
    base = 1 << 31
    upper = tmp_path / "upper"
    upper.mkdir()
    (upper / "d").mkdir()
    os.setxattr(upper / "d", USER_OPAQUE_XATTR, b"y")
    (upper / "d" / "mine").write_text("x")
    os.chown(upper / "d" / "mine", base + 1000, base + 1000)
    (upper / "stray").write_text("y")
    os.chown(upper / "stray", 1000, 1000)  # no id of this sandbox
    os.chown(upper, base, base)
    os.chown(upper / "d", base, base)
    layer = store.path(store.add_tree(upper, id_base=base))
    assert (os.stat(layer / "d" / "mine").st_uid, os.stat(layer / "d" / "mine").st_gid) == (1000, 1000)
    assert os.stat(layer / "stray").st_uid == 65534 and os.stat(layer).st_uid == 0
    assert os.getxattr(layer / "d", OPAQUE_XATTR) == os.getxattr(layer / "d", USER_OPAQUE_XATTR) == b"y"
    # The same tree from an overlay outside a user namespace: user.* xattrs are no markers there.
    assert tree_digest(upper, id_base=base) != tree_digest(upper)


@needs_root
def test_layers_built_with_one_opaque_marker_get_the_other(tmp_path: Path) -> None:
    old = LayerStore(tmp_path / "store")
    layer = old.path(old.add_files({"d/x": "X"}))
    os.setxattr(layer / "d", OPAQUE_XATTR, b"y")  # as a layer of an older tryloop
    (old.layers_dir / ".opaque-markers-v2").unlink()
    LayerStore(tmp_path / "store")
    assert os.getxattr(layer / "d", USER_OPAQUE_XATTR) == b"y"
    with pytest.raises(OSError):
        os.getxattr(layer, USER_OPAQUE_XATTR)


# --------------------------------------------------------------------------- overlay semantics


def _make_upper_by_hand(upper: Path) -> None:
    upper.mkdir()
    os.mknod(upper / "a", stat.S_IFCHR, os.makedev(0, 0))  # whiteout: a was deleted
    (upper / "d").mkdir()
    os.setxattr(upper / "d", OPAQUE_XATTR, b"y")  # d was removed and re-created
    (upper / "d" / "y").write_text("Y")


@needs_root
def test_whiteouts_and_opaque_dirs_survive_a_round_trip(store: LayerStore, tmp_path: Path) -> None:
    _make_upper_by_hand(tmp_path / "upper")
    digest = store.add_tree(tmp_path / "upper")
    layer = store.path(digest)
    st = os.lstat(layer / "a")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
    assert os.getxattr(layer / "d", OPAQUE_XATTR) == b"y"
    assert tree_digest(layer) == digest == tree_digest(tmp_path / "upper")
    # Without the markers the digest differs.
    os.removexattr(tmp_path / "upper" / "d", OPAQUE_XATTR)
    assert tree_digest(tmp_path / "upper") != digest
    os.unlink(tmp_path / "upper" / "a")
    (tmp_path / "upper" / "a").touch()
    assert tree_digest(tmp_path / "upper") != digest


@needs_overlay
def test_frozen_whiteouts_and_opaque_dirs_work_as_lowerdir(
    store: LayerStore, tmp_path: Path
) -> None:
    lower = store.add_files({"a": "A", "b": "B", "d/x": "X"})
    _make_upper_by_hand(tmp_path / "upper")
    frozen = store.add_tree(tmp_path / "upper")

    mnt = mount_overlay([store.path(frozen), store.path(lower)], tmp_path / "ovl")
    try:
        assert sorted(os.listdir(mnt)) == ["b", "d"]
        assert not (mnt / "a").exists()
        assert (mnt / "b").read_text() == "B"
        assert os.listdir(mnt / "d") == ["y"]
        assert (mnt / "d" / "y").read_text() == "Y"
    finally:
        umount(mnt)


@needs_overlay
def test_freezing_a_real_upper_dir_reproduces_the_merged_view(
    store: LayerStore, tmp_path: Path
) -> None:
    """Change a live overlay, freeze its upper dir, remount with it as a layer: same view."""
    lower = store.add_files({"a": "A", "b": "B", "d/x": "X", "e/keep": "K"})
    work = tmp_path / "live"
    mnt = mount_overlay([store.path(lower)], work)
    try:
        os.unlink(mnt / "a")
        (mnt / "d" / "x").unlink()
        (mnt / "d").rmdir()
        (mnt / "d").mkdir()  # re-created: opaque in the upper dir
        (mnt / "d" / "y").write_text("Y")
        (mnt / "b").write_text("B2")
        (mnt / "e" / "new").write_text("N")
        view = tree_digest(mnt)
    finally:
        umount(mnt)

    frozen = store.add_tree(work / "upper")
    snap = Snapshot("img", (lower,)).child(frozen)
    mnt2 = mount_overlay([store.path(x) for x in snap.layers], tmp_path / "again")
    try:
        assert sorted(os.listdir(mnt2)) == ["b", "d", "e"]
        assert os.listdir(mnt2 / "d") == ["y"]
        assert (mnt2 / "b").read_text() == "B2"
        assert sorted(os.listdir(mnt2 / "e")) == ["keep", "new"]
        assert tree_digest(mnt2) == view
    finally:
        umount(mnt2)


# --------------------------------------------------------------------------- add_files


def test_add_files_layout_and_equivalence_with_add_tree(store: LayerStore, tmp_path: Path) -> None:
    files = {"task.md": "do it\n", "src/a/b.py": b"print(1)\n", "src/c.txt": "c"}
    digest = store.add_files(files, mode=0o4640)
    layer = store.path(digest)
    assert (layer / "src/a/b.py").read_bytes() == b"print(1)\n"
    assert stat.S_IMODE(os.stat(layer / "task.md").st_mode) == 0o640
    for d in ("", "src", "src/a"):
        assert stat.S_IMODE(os.stat(layer / d).st_mode) == 0o755
    assert tree_digest(layer) == digest

    # The same tree built on disk gives the same layer.
    src = tmp_path / "src"
    for rel, content in files.items():
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content.encode() if isinstance(content, str) else content)
        os.chmod(p, 0o640)
    for d in (src, src / "src", src / "src/a"):
        os.chmod(d, 0o755)
    assert store.add_tree(src) == digest
    assert store.add_files(dict(reversed(files.items())), mode=0o640) == digest

    for bad in ("/abs", "../up", "a/../b", "a//b", "", "./a"):
        with pytest.raises(LayerError):
            store.add_files({bad: "x"})
    with pytest.raises(LayerError, match="both a file and a directory"):
        store.add_files({"a": "x", "a/b": "y"})


@needs_root
def test_add_files_owner(store: LayerStore) -> None:
    layer = store.path(store.add_files({"w/f": "x"}, uid=1000, gid=1001))
    for rel in ("", "w", "w/f"):
        st = os.lstat(layer / rel)
        assert (st.st_uid, st.st_gid) == (1000, 1001)


# --------------------------------------------------------------------------- store API


def test_layer_not_found_and_removal(store: LayerStore) -> None:
    missing = "ab" * 32
    with pytest.raises(LayerNotFound) as info:
        store.path(missing)
    assert isinstance(info.value, KeyError) and isinstance(info.value, TryloopError)
    assert missing in str(info.value) and str(store.root) in str(info.value)
    assert info.value.digest == missing
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is LayerNotFound and str(again) == str(info.value)
    with pytest.raises(LayerNotFound, match=r"\.\./\.\./etc"):
        store.path("../../etc")
    with pytest.raises(KeyError):
        store.size_bytes(missing)
    assert not store.has(missing) and not store.has("../x")

    digest = store.add_files({"f": b"12345"})
    assert store.has(digest) and store.size_bytes(digest) == 5
    store.remove(digest)
    assert not store.has(digest) and store.list() == []
    assert os.listdir(store.tmp_dir) == []
    with pytest.raises(LayerNotFound):
        store.remove(digest)


def test_snapshots(store: LayerStore) -> None:
    l1 = store.add_files({"one": "1"})
    l2 = store.add_files({"two": "2"})
    base = Snapshot("python:3.12")
    s1 = base.child(l1)
    s2 = s1.child(l2)
    assert s2.layers == (l2, l1)  # top-most first
    assert s2 == Snapshot("python:3.12", [l2, l1])
    assert s2.id == Snapshot("python:3.12", (l2, l1)).id
    assert len({base.id, s1.id, s2.id, Snapshot("python:3.12", (l1, l2)).id}) == 4
    assert Snapshot("other", (l2, l1)).id != s2.id
    # Pinned: the id is the sha256 of this exact canonical JSON.
    assert Snapshot("img").canonical_json() == b'{"image":"img","layers":[]}'
    assert Snapshot("img").id == "99afcccb01567d21c62d0c7cb18c3d9f075cab75b4c9ec166fb5e4be66f1f71b"

    assert store.save_snapshot(s2, {"step": 7}) == s2.id
    store.save_snapshot(s1)
    assert store.load_snapshot(s2.id) == s2
    assert store.snapshot_meta(s2.id) == {"step": 7}
    assert store.snapshot_meta(s1.id) == {}
    assert store.list_snapshots() == sorted([s1.id, s2.id])

    with pytest.raises(SnapshotNotFound, match=base.id):
        store.load_snapshot(base.id)
    with pytest.raises(LayerNotFound, match="cd" * 32):
        store.save_snapshot(s2.child("cd" * 32))
    with pytest.raises(ValueError):
        Snapshot("img", ("not-a-digest",))
    with pytest.raises(ValueError):
        Snapshot("")


def test_snapshot_records_of_memory_layers_stay_in_memory(tmp_path: Path) -> None:
    """A snapshot with a layer on the memory tmpfs keeps its record there too (no disk write per
    fork); one whose layers are all on disk is recorded on disk. Both are found alike."""
    store = LayerStore(tmp_path / "store", tmp_path / "mem")
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("state\n")
    on_disk = store.add_files({"one": "1"})
    in_memory = store.add_tree(src, memory=True)
    assert store.path(in_memory).parent == tmp_path / "mem" / "layers"
    disk_snap = Snapshot("img", (on_disk,))
    mem_snap = disk_snap.child(in_memory)
    store.save_snapshot(disk_snap, {"a": 1})
    store.save_snapshot(mem_snap, {"b": 2})
    assert os.listdir(store.snapshots_dir) == [f"{disk_snap.id}.json"]
    assert os.listdir(tmp_path / "mem" / "snapshots") == [f"{mem_snap.id}.json"]
    assert store.load_snapshot(mem_snap.id) == mem_snap and store.snapshot_meta(mem_snap.id) == {"b": 2}
    assert store.list_snapshots() == sorted([disk_snap.id, mem_snap.id])
    store.save_snapshot(mem_snap, {"b": 3})  # saving again replaces the meta
    store.save_snapshot(mem_snap, {"b": 3})  # the same record again: nothing changes
    assert store.snapshot_meta(mem_snap.id) == {"b": 3}
    assert sorted(os.listdir(tmp_path / "mem" / "tmp")) == []
    # Another store on the same directories (another process) sees both.
    again = LayerStore(tmp_path / "store", tmp_path / "mem")
    assert again.list_snapshots() == store.list_snapshots() and again.load_snapshot(mem_snap.id) == mem_snap


# --------------------------------------------------------------------------- speed


def test_freeze_speed_100_small_files(store: LayerStore, tmp_path: Path) -> None:
    """Prints the time to freeze an upper dir with 100 changed files (target: <= 10 ms)."""
    upper = tmp_path / "upper"
    for i in range(100):
        p = upper / f"pkg{i % 10}" / f"file{i}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"value = {i}\n" * (i + 1))
    store.add_files({"warm": "up"})  # first-call costs (imports, dirs) out of the timing
    times = []
    for round_ in range(11):
        (upper / "round").write_text(str(round_))  # a new layer each round
        t0 = time.perf_counter()
        digest = store.add_tree(upper)
        times.append(time.perf_counter() - t0)
        assert store.has(digest)
        assert tree_digest(store.path(digest)) == digest
    t0 = time.perf_counter()
    tree_digest(upper)
    hash_only = time.perf_counter() - t0
    times.sort()
    print(
        f"\nfreeze of 100 small files: best {times[0] * 1e3:.2f} ms, "
        f"median {times[5] * 1e3:.2f} ms (tree_digest alone {hash_only * 1e3:.2f} ms)"
    )


def test_memory_layers_are_addressable_and_persist_to_disk(tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f.txt").write_text("hello")
    store = LayerStore(tmp_path / "store", memory_dir=tmp_path / "mem")
    digest = store.add_tree(src, memory=True)
    assert store.path(digest).parent == tmp_path / "mem" / "layers"
    assert store.has(digest) and tree_digest(store.path(digest)) == digest
    store.persist(digest)
    assert store.path(digest).parent == store.layers_dir
    assert tree_digest(store.path(digest)) == digest
