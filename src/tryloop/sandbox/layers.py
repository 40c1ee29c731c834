"""Immutable, content-addressed filesystem layers and snapshots built from them.

A sandbox's root is an overlayfs: read-only *lowerdirs* (an image plus layers from this
store) under a writable *upper dir* on a tmpfs.  Snapshotting a live sandbox freezes its
upper dir into a new layer with `LayerStore.add_tree`; a `Snapshot` is an image plus an
ordered stack of layer digests, top-most first.

Store layout (everything under `root`)::

    layers/<digest>/          one layer; <digest> is the full hex sha256 of the tree
    snapshots/<id>.json       one snapshot record (of one whose layers are all here)
    tmp/                      layers under construction (renamed into layers/ atomically)

and the same three under `memory_dir` (a tmpfs, optional) for layers frozen from live
sandboxes and the records of snapshots that use one of them: fast, gone at reboot.

Layers are read-only *by convention*: nothing in this module ever writes to an installed
layer, and callers must not either (mount them only as overlay lowerdirs).  A layer is
built under `tmp/` and `os.rename`d into place, so a layer directory that exists is
complete.  If the same content is added twice the second copy is discarded.  Nothing is
fsynced: a layer can always be rebuilt from its source, and a torn one after a crash is
caught by `LayerStore.verify`.

The digest (`tree_digest`) is a sha256 over a canonical serialization of the tree: every
entry, in sorted order of its relative path (as bytes), with its type, permission bits,
uid, gid, size and content sha256 (regular files), link target (symlinks), and the
whiteout and opaque markers.  Modification times are not part of it; instead every entry
of a layer gets the same fixed mtime/atime (`FIXED_MTIME_NS`), so identical content gives
identical layers down to their stat data, which keeps sandbox state reproducible.

What a layer keeps of a source tree (`add_tree`):

* directories (empty ones too), regular files (content, permission bits, ownership),
  symlinks (as symlinks: never followed, whatever they point at);
* overlayfs whiteouts (character devices 0:0), so that a deletion in a frozen upper dir
  still hides the lower file when the layer is used as a lowerdir;  whiteouts are
  normalized to mode 000, owned by the user building the layer (root), which overlayfs
  never shows;
* opaque directories (xattr ``trusted.overlay.opaque`` = ``b"y"``, or its twin
  ``user.overlay.opaque`` that an overlay mounted in a user namespace writes and reads),
  so that a directory that was removed and re-created still hides the lower directory's
  entries; a layer carries both markers, for sandboxes with and without a user namespace.

A sandbox with a user namespace writes its id N as host id ``id_base + N``, and its
overlay marks opaque directories with ``user.overlay.opaque`` only:
`add_tree(..., id_base=...)` records such a tree in the sandbox's own numbering (an id
outside its range as the overflow id 65534) and reads its ``user.overlay.*`` markers, so
layers never hold a host id range and any sandbox can mount them.  Other trees are read
with the ``trusted.overlay.*`` markers only.

What it drops:

* hard links as the sandbox sees them: the names of a file share one copy in the layer
  (so a copy costs what its source does), but a sandbox that writes to one name copies
  that name up alone, as if each name were a separate file;
* FIFOs, sockets and device nodes other than whiteouts: skipped;
* every extended attribute except the opaque markers: other ``trusted.overlay.*`` and
  ``user.overlay.*`` xattrs (origin, impure, nlink, ...) only mean something inside the
  mount that wrote them, and other ``user.*``, ``security.*`` and ACLs are not carried.

Security rules (an agent controls the content of the upper dir being frozen):

* setuid and setgid bits are stripped from every entry, and ``security.capability`` (like
  every ``security.*`` xattr) is dropped, so an agent cannot smuggle a privileged binary
  into a layer that a later sandbox, or the host, might run;
* no path in the source is ever followed: directories and files are opened relative to
  their parent's descriptor with ``O_NOFOLLOW``, and a file swapped for a symlink or a
  FIFO while it is being frozen is stored as what it has become (or skipped), never read
  through;
* an upper dir that uses overlayfs ``metacopy`` or ``redirect_dir`` cannot be frozen
  faithfully (its files' data or directories' contents live in a lower layer) and is
  refused with `LayerError`: mount sandboxes with those features off (the kernel default);
* trees deeper than `MAX_DEPTH` directories are refused.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tryloop.errors import InputMissing, TryloopError

__all__ = [
    "FIXED_MTIME_NS",
    "MAX_DEPTH",
    "LayerError",
    "LayerNotFound",
    "LayerStore",
    "Snapshot",
    "SnapshotNotFound",
    "tree_digest",
]

#: The mtime and atime of every entry of every layer (2001-09-09T01:46:40Z): fixed so
#: identical content gives identical stat data; not 0, because some tools (zip) reject
#: timestamps before 1980.
FIXED_MTIME_NS = 1_000_000_000 * 1_000_000_000

#: Deepest directory nesting a layer may have (each level holds two descriptors open).
MAX_DEPTH = 256

OPAQUE_XATTR = "trusted.overlay.opaque"
#: What an overlay mounted in a user namespace (option `userxattr`) uses instead.
USER_OPAQUE_XATTR = "user.overlay.opaque"
#: The id a sandbox shows for a host id outside its range (the kernel's overflow id).
OVERFLOW_ID = 65534
_ID_RANGE = 1 << 16

_FORMAT_HEADER = b"tryloop-layer-v1\0"
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20
#: Blocks of this many zero bytes are left as holes in a layer's copy.
_HOLE_MIN = 1 << 16
_STRIP_BITS = stat.S_ISUID | stat.S_ISGID
_NO_XATTR = (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP)

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_SRC = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_O_DST = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class LayerError(TryloopError):
    """A tree cannot be turned into a layer, or the store holds something malformed."""


class LayerNotFound(TryloopError, KeyError):
    """No layer with this digest is in the store (or the digest is malformed)."""

    def __init__(self, digest: str, root: Path | None = None):
        where = f" in layer store {root}" if root is not None else ""
        self.digest = digest
        self.message = f"layer {digest!r} not found{where}"
        super().__init__(digest, root)  # args re-create it when unpickled (other processes)

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message


class SnapshotNotFound(TryloopError, KeyError):
    """No snapshot record with this id is in the store (or the id is malformed)."""

    def __init__(self, snapshot_id: str, root: Path | None = None):
        where = f" in layer store {root}" if root is not None else ""
        self.snapshot_id = snapshot_id
        self.message = f"snapshot {snapshot_id!r} not found{where}"
        super().__init__(snapshot_id, root)  # args re-create it when unpickled (other processes)

    def __str__(self) -> str:
        return self.message


# --------------------------------------------------------------------------- digests


def _record(
    path: bytes,
    kind: bytes,
    mode: int,
    uid: int,
    gid: int,
    size: int = 0,
    content: bytes = b"",
    target: bytes = b"",
    flags: bytes = b"",
) -> tuple[bytes, bytes]:
    """One entry of the canonical serialization: nine NUL-terminated fields.

    No field can contain a NUL (paths and link targets cannot), so the stream is
    unambiguous.  kind: d(ir) f(ile) l(ink) w(hiteout), and in `tree_digest` only, for
    entries a layer never holds: p(fifo) s(ocket) c(har) b(lock) with "major:minor".
    """
    rec = b"%s\0%s\0%o\0%d\0%d\0%d\0%s\0%s\0%s\0" % (
        path,
        kind,
        mode,
        uid,
        gid,
        size,
        content,
        target,
        flags,
    )
    return path, rec


def _finish(records: list[tuple[bytes, bytes]]) -> str:
    records.sort()
    h = hashlib.sha256(_FORMAT_HEADER)
    for _, rec in records:
        h.update(rec)
    return h.hexdigest()


def _fgetxattr(fd: int, name: str) -> bytes | None:
    try:
        return os.getxattr(fd, name)
    except OSError as e:
        if e.errno in _NO_XATTR:
            return None
        raise


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _write_sparse(fd: int, data: bytes) -> None:
    """Write `data` at `fd`'s offset, leaving each whole block of zeros a hole (the caller
    sets the file's length at the end, in case the last block was one)."""
    start = 0  # the first byte neither written nor skipped
    for i in range(0, len(data) - _HOLE_MIN + 1, _HOLE_MIN):
        if data.count(0, i, i + _HOLE_MIN) == _HOLE_MIN:
            if start < i:
                _write_all(fd, memoryview(data)[start:i])
            os.lseek(fd, _HOLE_MIN, os.SEEK_CUR)
            start = i + _HOLE_MIN
    if start < len(data):
        _write_all(fd, memoryview(data)[start:])


def _join(rel: bytes, name: bytes) -> bytes:
    return name if rel == b"." else rel + b"/" + name


class _Walker:
    """Walks a tree by descriptors; records every entry and, if `copy`, copies it.

    Copy mode writes each entry as it will be in the layer (modes stripped, ownership
    possibly replaced, whiteouts normalized) and records exactly that, so
    `tree_digest(layer) == digest` holds for what `add_tree` returns.
    """

    def __init__(self, src: Path, *, copy: bool, uid: int | None = None, gid: int | None = None,
                 id_base: int = 0):
        self.src = src
        self.copy = copy
        self.uid = uid
        self.gid = gid
        self.id_base = id_base
        # Which overlay wrote the tree decides which markers mean something: one mounted in
        # a user namespace uses user.overlay.*, where any other user.* xattr is the agent's
        # own or was copied up from a layer (which carries both opaque markers).
        self.xattr = "user.overlay." if id_base else "trusted.overlay."
        self.records: list[tuple[bytes, bytes]] = []
        self.strip = _STRIP_BITS if copy else 0
        # (st_dev, st_ino) of a file with more than one name -> its first name in the layer
        # and what was recorded of it: the other names become hard links to that copy.
        self.linked: dict[tuple[int, int], tuple[bytes, tuple]] = {}
        self.dst_root: int | None = None

    def _fail(self, rel: bytes, why: str) -> LayerError:
        return LayerError(f"{self.src / os.fsdecode(rel)}: {why}")

    def _unshift(self, host_id: int) -> int:
        if not self.id_base:
            return host_id
        inside = host_id - self.id_base
        return inside if 0 <= inside < _ID_RANGE else OVERFLOW_ID

    def _owner(self, st: os.stat_result) -> tuple[int, int]:
        return (
            self._unshift(st.st_uid) if self.uid is None else self.uid,
            self._unshift(st.st_gid) if self.gid is None else self.gid,
        )

    def _dir_meta(self, fd: int, rel: bytes) -> bool:
        opaque = _fgetxattr(fd, self.xattr + "opaque") == b"y"
        if _fgetxattr(fd, self.xattr + "redirect") is not None:
            raise self._fail(
                rel, "directory has an overlayfs redirect (mount with redirect_dir=off)"
            )
        return opaque

    def _finish_dir(self, dfd: int, st: os.stat_result, opaque: bool) -> None:
        if opaque:
            os.setxattr(dfd, OPAQUE_XATTR, b"y")
            os.setxattr(dfd, USER_OPAQUE_XATTR, b"y")
        os.fchown(dfd, *self._owner(st))
        os.fchmod(dfd, stat.S_IMODE(st.st_mode) & ~_STRIP_BITS)
        os.utime(dfd, ns=(FIXED_MTIME_NS, FIXED_MTIME_NS))

    def run(self, dst_fd: int | None) -> str:
        self.dst_root = dst_fd
        sfd = os.open(self.src, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            st = os.fstat(sfd)
            opaque = self._dir_meta(sfd, b".")
            self.walk(sfd, dst_fd, b".", 0)
            uid, gid = self._owner(st)
            mode = stat.S_IMODE(st.st_mode) & ~self.strip
            self.records.append(_record(b".", b"d", mode, uid, gid, flags=b"o" if opaque else b""))
            if dst_fd is not None:
                self._finish_dir(dst_fd, st, opaque)
        finally:
            os.close(sfd)
        return _finish(self.records)

    def walk(self, sfd: int, dfd: int | None, rel: bytes, depth: int) -> None:
        if depth >= MAX_DEPTH:
            raise self._fail(rel, f"deeper than {MAX_DEPTH} directories")
        with os.scandir(sfd) as it:
            entries = list(it)
        for e in entries:
            name = e.name
            path = _join(rel, os.fsencode(name))
            try:
                if e.is_symlink():
                    self._symlink(sfd, dfd, name, path, e.stat(follow_symlinks=False))
                elif e.is_dir(follow_symlinks=False) or e.is_file(follow_symlinks=False):
                    try:
                        fd = os.open(name, _O_SRC, dir_fd=sfd)
                    except OSError as err:
                        if err.errno != errno.ELOOP:  # ELOOP: became a symlink meanwhile
                            raise
                        self._symlink(sfd, dfd, name, path, os.lstat(name, dir_fd=sfd))
                        continue
                    try:
                        st = os.fstat(fd)
                        if stat.S_ISREG(st.st_mode):
                            self._file(fd, st, dfd, name, path)
                        elif stat.S_ISDIR(st.st_mode):
                            self._dir(fd, st, dfd, name, path, depth)
                        else:  # became a FIFO or socket meanwhile: never read it
                            self._other(st, dfd, name, path)
                    finally:
                        os.close(fd)
                else:
                    self._other(e.stat(follow_symlinks=False), dfd, name, path)
            except FileNotFoundError:
                # The entry vanished while the tree was being walked (a live writer):
                # it is simply not part of the snapshot.
                if dfd is not None:
                    _unlink_partial(dfd, name)
                continue

    def _symlink(
        self, sfd: int, dfd: int | None, name: str, path: bytes, st: os.stat_result
    ) -> None:
        try:
            target = os.readlink(name, dir_fd=sfd)
        except OSError as err:
            if err.errno == errno.EINVAL:  # no longer a symlink: a live writer; drop it
                return
            raise
        uid, gid = self._owner(st)
        self.records.append(_record(path, b"l", 0o777, uid, gid, target=os.fsencode(target)))
        if dfd is not None:
            os.symlink(target, name, dir_fd=dfd)
            os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
            os.utime(name, ns=(FIXED_MTIME_NS, FIXED_MTIME_NS), dir_fd=dfd, follow_symlinks=False)

    def _file(self, fd: int, st: os.stat_result, dfd: int | None, name: str, path: bytes) -> None:
        # A metacopy upper file holds no data of its own (its size, no blocks): one with
        # blocks is a complete file, which saves a getxattr per file of a snapshot.
        if st.st_blocks == 0 and _fgetxattr(fd, self.xattr + "metacopy") is not None:
            raise self._fail(path, "file is an overlayfs metacopy (mount with metacopy=off)")
        # A copy costs what the source costs: another name of a file already copied is a hard
        # link to that copy, and runs of zeros stay holes. Otherwise a tree within its disk
        # quota (one sparse file, many links to it) would copy out as many times its size.
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in self.linked:
            first, fields = self.linked[key]
            if dfd is not None:
                os.link(first, name, src_dir_fd=self.dst_root, dst_dir_fd=dfd, follow_symlinks=False)
            self.records.append(_record(path, b"f", *fields))
            return
        out = os.open(name, _O_DST, 0o600, dir_fd=dfd) if dfd is not None else -1
        try:
            h = hashlib.sha256()
            size = 0
            want = min(st.st_size + 1, _CHUNK)  # small files: a single (short) read
            while chunk := os.read(fd, want):
                h.update(chunk)
                size += len(chunk)
                if out >= 0:
                    _write_sparse(out, chunk)
                if len(chunk) < want:  # a short read of a local regular file is its end
                    break
                want = _CHUNK
            uid, gid = self._owner(st)
            mode = stat.S_IMODE(st.st_mode) & ~self.strip
            if out >= 0:
                os.ftruncate(out, size)  # the length a trailing hole leaves unwritten
                os.fchown(out, uid, gid)  # before chmod: chown clears set-id bits anyway
                os.fchmod(out, mode)
                os.utime(out, ns=(FIXED_MTIME_NS, FIXED_MTIME_NS))
        finally:
            if out >= 0:
                os.close(out)
        fields = (mode, uid, gid, size, h.hexdigest().encode("ascii"))
        if st.st_nlink > 1:
            self.linked[key] = (path, fields)
        self.records.append(_record(path, b"f", *fields))

    def _dir(
        self, fd: int, st: os.stat_result, dfd: int | None, name: str, path: bytes, depth: int
    ) -> None:
        opaque = self._dir_meta(fd, path)
        uid, gid = self._owner(st)
        mode = stat.S_IMODE(st.st_mode) & ~self.strip
        self.records.append(_record(path, b"d", mode, uid, gid, flags=b"o" if opaque else b""))
        if dfd is None:
            self.walk(fd, None, path, depth + 1)
            return
        os.mkdir(name, 0o700, dir_fd=dfd)
        sub = os.open(name, _O_DIR, dir_fd=dfd)
        try:
            self.walk(fd, sub, path, depth + 1)
            self._finish_dir(sub, st, opaque)
        finally:
            os.close(sub)

    def _other(self, st: os.stat_result, dfd: int | None, name: str, path: bytes) -> None:
        m = st.st_mode
        if stat.S_ISCHR(m) and st.st_rdev == 0:
            self.records.append(_record(path, b"w", 0, 0, 0))
            if dfd is not None:
                os.mknod(name, stat.S_IFCHR, os.makedev(0, 0), dir_fd=dfd)
                os.utime(
                    name, ns=(FIXED_MTIME_NS, FIXED_MTIME_NS), dir_fd=dfd, follow_symlinks=False
                )
            return
        if self.copy:  # FIFOs, sockets, real devices: never part of a layer
            return
        kind = (
            b"p"
            if stat.S_ISFIFO(m)
            else b"s"
            if stat.S_ISSOCK(m)
            else b"c"
            if stat.S_ISCHR(m)
            else b"b"
        )
        uid, gid = self._owner(st)
        rdev = b"%d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev))
        self.records.append(_record(path, kind, stat.S_IMODE(m), uid, gid, content=rdev))


def _unlink_partial(dfd: int, name: str) -> None:
    """Remove a half-copied entry whose source vanished mid-copy."""
    try:
        st = os.lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dfd)
    else:
        os.unlink(name, dir_fd=dfd)


def tree_digest(path: Path, *, id_base: int = 0) -> str:
    """The content digest of an existing tree (hex sha256, 64 characters).

    `id_base`: the tree belongs to a sandbox whose ids start at that host id (its
    `Sandbox.id_base`): owners are read in the sandbox's numbering, so the same files in
    two sandboxes give the same digest.

    For a layer it equals the layer's digest (see `LayerStore.verify`); for any tree it
    changes with any byte, permission bit, owner, link target, whiteout or opaque marker,
    but not with mtimes.  Unlike a layer, a tree may hold FIFOs, sockets and devices and
    set-id bits: they are part of its digest, so a reset can be checked to have restored
    exactly the same state.
    """
    return _Walker(Path(path), copy=False, id_base=id_base).run(None)


# --------------------------------------------------------------------------- snapshots


@dataclass(frozen=True)
class Snapshot:
    """An image plus a stack of layers; `layers` is top-most first (overlay lowerdir order)."""

    image: str
    layers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.image, str) or not self.image:
            raise ValueError(f"snapshot image must be a non-empty string, got {self.image!r}")
        layers = tuple(self.layers)
        for layer in layers:
            if not isinstance(layer, str) or not _DIGEST_RE.fullmatch(layer):
                raise ValueError(f"snapshot layer {layer!r} is not a 64-hex-digit sha256 digest")
        object.__setattr__(self, "layers", layers)

    def canonical_json(self) -> bytes:
        return json.dumps(
            {"image": self.image, "layers": list(self.layers)},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode("utf-8")

    @property
    def id(self) -> str:
        """sha256 (hex) of the canonical JSON of image and layers."""
        return hashlib.sha256(self.canonical_json()).hexdigest()

    def child(self, layer: str) -> Snapshot:
        """This snapshot with `layer` stacked on top."""
        return Snapshot(self.image, (layer, *self.layers))


# --------------------------------------------------------------------------- the store


def _rmtree(path: Path) -> None:
    try:
        shutil.rmtree(path)
    except PermissionError:  # not root and a read-only directory: open it up, retry
        for dirpath, _dirs, _files in os.walk(path):
            os.chmod(dirpath, 0o700)
        shutil.rmtree(path)




# Written to a layers directory once every opaque directory in it carries both markers.
_BOTH_MARKERS = ".opaque-markers-v2"


def _add_user_opaque_markers(layers_dir: Path) -> None:
    """Give opaque directories of layers built before both markers were written the second.

    Run once per layers directory; setting an xattr that is already set changes nothing,
    so concurrent runs are harmless.
    """
    done = layers_dir / _BOTH_MARKERS
    if done.exists():
        return
    for dirpath, _dirs, _files in os.walk(layers_dir):
        try:
            if os.getxattr(dirpath, OPAQUE_XATTR, follow_symlinks=False) == b"y":
                os.setxattr(dirpath, USER_OPAQUE_XATTR, b"y", follow_symlinks=False)
        except OSError as e:
            if e.errno not in _NO_XATTR:
                raise
    done.touch()


class LayerStore:
    """Content-addressed layers and snapshot records under `root` (see the module doc)."""

    def __init__(self, root: Path, memory_dir: Path | None = None, *, create: bool = True):
        """The store under `root` (`runtime.store_dir`). With `create` false it must hold layers
        already: commands that read or clean up never make one where a path was mistyped."""
        self.root = Path(root)
        self.layers_dir = self.root / "layers"
        self.snapshots_dir = self.root / "snapshots"
        self.tmp_dir = self.root / "tmp"
        if not create and not self.layers_dir.is_dir():
            what = ("no such directory" if not self.root.exists() else "not a directory" if not self.root.is_dir()
                    else "no layers/")
            raise InputMissing(f"runtime.store_dir: no image store at {self.root} ({what}); `tryloop image build`, "
                               "`import` and `debian` make one")
        try:
            for d in (self.layers_dir, self.snapshots_dir, self.tmp_dir):
                d.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as e:
            raise LayerError(f"runtime.store_dir: {self.root} cannot be a layer store: {e.filename} is not a "
                             "directory") from None
        # Layers frozen from live sandboxes (snapshot / fork) go to a tmpfs first:
        # creating files there costs microseconds where a disk filesystem costs
        # ~0.1 ms each. They vanish at reboot; `persist` copies one to the store.
        # The records of snapshots with a layer there go there too: rewriting a record on
        # a disk filesystem (rename over the old one) costs ~1 ms, and such a record is of
        # no use after a reboot, its layer gone.
        self.memory_dir = Path(memory_dir) if memory_dir is not None else None
        self.memory_snapshots_dir = self.memory_dir / "snapshots" if self.memory_dir is not None else None
        if self.memory_dir is not None:
            for d in (self.memory_dir / "layers", self.memory_dir / "tmp", self.memory_dir / "snapshots"):
                d.mkdir(parents=True, exist_ok=True)
        for d in (self.layers_dir, *([self.memory_dir / "layers"] if self.memory_dir is not None else [])):
            _add_user_opaque_markers(d)

    def __repr__(self) -> str:
        return f"LayerStore({str(self.root)!r})"

    # ---- building layers

    def add_tree(self, src: Path, *, uid: int | None = None, gid: int | None = None,
                 memory: bool = False, id_base: int = 0) -> str:
        """Freeze the directory tree `src` into a layer; returns its digest.

        With `uid`/`gid`, every entry is owned by them (task workspaces, owned by the
        sandbox's unprivileged user); without, ownership is preserved, read in the
        numbering of a sandbox whose ids start at host id `id_base` if given.  See the
        module doc for what is kept, what is dropped and the security rules.
        """
        src = Path(src)
        if not src.is_dir():
            raise LayerError(f"{src}: not a directory, cannot be added as a layer")
        in_memory = memory and self.memory_dir is not None
        tmp = self.memory_dir / "tmp" if in_memory else self.tmp_dir
        build = Path(tempfile.mkdtemp(prefix="build-", dir=tmp))
        try:
            bfd = os.open(build, _O_DIR)
            try:
                digest = _Walker(src, copy=True, uid=uid, gid=gid, id_base=id_base).run(bfd)
            finally:
                os.close(bfd)
        except BaseException:
            _rmtree(build)
            raise
        if in_memory and self.has(digest):
            _rmtree(build)
            return digest
        return self._install(build, digest, self.memory_dir / "layers" if in_memory else None)

    def persist(self, digest: str) -> None:
        """Copy a layer kept in memory into the store on disk (same digest)."""
        p = self.path(digest)
        if p.parent != self.layers_dir and self.add_tree(p) != digest:
            raise LayerError(f"layer {digest} changed while in memory")

    def add_files(
        self,
        files: Mapping[str, bytes | str],
        *,
        uid: int | None = None,
        gid: int | None = None,
        mode: int = 0o644,
    ) -> str:
        """Build a layer from in-memory files; returns its digest.

        Keys are relative paths ("src/main.py"); str values are written as UTF-8.  Parent
        directories (and the layer root) are created with mode 0o755.  Entries are owned
        by `uid`/`gid`, or by the calling user where not given.  Set-id bits in `mode`
        are stripped.
        """
        owner = (os.geteuid() if uid is None else uid, os.getegid() if gid is None else gid)
        fmode = mode & 0o7777 & ~_STRIP_BITS
        plan: dict[tuple[str, ...], bytes | None] = {}  # None: a directory
        for key, value in files.items():
            parts = tuple(key.split("/"))
            if key.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise LayerError(f"add_files: {key!r} is not a clean relative path")
            for i in range(1, len(parts)):
                if plan.setdefault(parts[:i], None) is not None:
                    raise LayerError(
                        f"add_files: {'/'.join(parts[:i])!r} is both a file and a directory"
                    )
            if parts in plan:
                raise LayerError(f"add_files: {key!r} is both a file and a directory")
            plan[parts] = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        build = Path(tempfile.mkdtemp(prefix="build-", dir=self.tmp_dir))
        try:
            for parts in sorted(plan, key=len):  # parents before children
                path = build.joinpath(*parts)
                data = plan[parts]
                if data is None:
                    path.mkdir(0o700)
                    continue
                fd = os.open(path, _O_DST, 0o600)
                try:
                    _write_all(fd, data)
                    os.fchown(fd, *owner)
                    os.fchmod(fd, fmode)
                    os.utime(fd, ns=(FIXED_MTIME_NS, FIXED_MTIME_NS))
                finally:
                    os.close(fd)
            dirs = [p for p, v in plan.items() if v is None]
            for parts in [*sorted(dirs, key=len, reverse=True), ()]:  # children first
                path = build.joinpath(*parts)
                os.chown(path, *owner)
                os.chmod(path, 0o755)
                os.utime(path, ns=(FIXED_MTIME_NS, FIXED_MTIME_NS))
            digest = tree_digest(build)
        except BaseException:
            _rmtree(build)
            raise
        return self._install(build, digest)

    def _install(self, build: Path, digest: str, layers_dir: Path | None = None) -> str:
        target = (layers_dir or self.layers_dir) / digest
        if target.exists():  # same content already stored
            _rmtree(build)
            return digest
        try:
            os.rename(build, target)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not target.is_dir():
                _rmtree(build)
                raise
            _rmtree(build)  # lost a race with an identical add: keep the first
        return digest

    # ---- looking layers up

    def _layer_dir(self, digest: str) -> Path:
        if not isinstance(digest, str) or not _DIGEST_RE.fullmatch(digest):
            raise LayerNotFound(str(digest), self.root)
        p = self.layers_dir / digest
        if self.memory_dir is not None and not p.is_dir():
            mem = self.memory_dir / "layers" / digest
            if mem.is_dir():
                return mem
        return p

    def has(self, digest: str) -> bool:
        try:
            return self._layer_dir(digest).is_dir()
        except LayerNotFound:
            return False

    def path(self, digest: str) -> Path:
        """The layer's directory (mount it only as an overlay lowerdir)."""
        p = self._layer_dir(digest)
        if not p.is_dir():
            raise LayerNotFound(digest, self.root)
        return p

    def list(self) -> list[str]:
        """Digests of all layers, sorted."""
        return sorted(n for n in os.listdir(self.layers_dir) if _DIGEST_RE.fullmatch(n))

    def size_bytes(self, digest: str) -> int:
        """Total size of the layer's regular files (apparent size, not disk blocks)."""
        total = 0
        for dirpath, _dirs, files in os.walk(self.path(digest)):
            for name in files:
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
        return total

    def verify(self, digest: str) -> bool:
        """Whether the layer's content still hashes to its digest."""
        return tree_digest(self.path(digest)) == digest

    def remove(self, digest: str) -> None:
        """Delete a layer.  The caller makes sure no snapshot or mount still uses it.

        The directory is first renamed out of `layers/`, so a half-removed layer is
        never visible under its digest.
        """
        p = self.path(digest)
        graveyard = Path(tempfile.mkdtemp(prefix="remove-", dir=self.tmp_dir))
        os.rename(p, graveyard / "layer")
        _rmtree(graveyard)

    # ---- snapshots

    def _snapshot_dirs(self) -> list[Path]:
        """Where records are, the disk's first (a record there is the newer one)."""
        return [self.snapshots_dir, *([self.memory_snapshots_dir] if self.memory_snapshots_dir else [])]

    def _snapshot_file(self, snapshot_id: str, directory: Path | None = None) -> Path:
        if not isinstance(snapshot_id, str) or not _DIGEST_RE.fullmatch(snapshot_id):
            raise SnapshotNotFound(str(snapshot_id), self.root)
        return (directory or self.snapshots_dir) / f"{snapshot_id}.json"

    def save_snapshot(self, s: Snapshot, meta: dict[str, Any] | None = None) -> str:
        """Record a snapshot (all its layers must be in the store); returns its id.

        Saving the same snapshot again replaces its `meta`. The record of a snapshot with
        a layer kept in memory is kept in memory too (it goes with that layer at reboot).
        """
        in_memory = False
        for layer in s.layers:
            in_memory |= self.path(layer).parent != self.layers_dir  # path() raises LayerNotFound
        sid = s.id
        record = {"id": sid, "image": s.image, "layers": list(s.layers), "meta": meta or {}}
        data = json.dumps(record, sort_keys=True, indent=1).encode("utf-8")
        in_memory = in_memory and self.memory_snapshots_dir is not None
        path = self._snapshot_file(sid, self.memory_snapshots_dir if in_memory else None)
        with contextlib.suppress(OSError):
            if path.read_bytes() == data:  # the same record again (a state forked again): nothing to write
                return sid
        tmp_dir = self.memory_dir / "tmp" if in_memory and self.memory_dir is not None else self.tmp_dir
        fd, tmp = tempfile.mkstemp(prefix="snapshot-", suffix=".json", dir=tmp_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return sid

    def _read_snapshot(self, snapshot_id: str) -> dict[str, Any]:
        for d in self._snapshot_dirs():
            p = self._snapshot_file(snapshot_id, d)
            try:
                return json.loads(p.read_bytes())
            except FileNotFoundError:
                continue
            except ValueError as e:
                raise LayerError(f"{p}: corrupt snapshot record: {e}") from None
        raise SnapshotNotFound(snapshot_id, self.root)

    def load_snapshot(self, snapshot_id: str) -> Snapshot:
        record = self._read_snapshot(snapshot_id)
        try:
            s = Snapshot(record["image"], tuple(record["layers"]))
        except (KeyError, TypeError, ValueError) as e:
            raise LayerError(f"snapshot {snapshot_id}: corrupt record: {e}") from None
        if s.id != snapshot_id:
            raise LayerError(f"snapshot {snapshot_id}: record hashes to {s.id}")
        return s

    def snapshot_meta(self, snapshot_id: str) -> dict[str, Any]:
        """The `meta` saved with the snapshot ({} if none)."""
        return dict(self._read_snapshot(snapshot_id).get("meta") or {})

    def list_snapshots(self) -> list[str]:
        """Ids of all saved snapshots (on disk and in memory), sorted."""
        return sorted({
            n[: -len(".json")]
            for d in self._snapshot_dirs()
            for n in os.listdir(d)
            if n.endswith(".json") and _DIGEST_RE.fullmatch(n[: -len(".json")])
        })
