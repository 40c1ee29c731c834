"""Image roots from OCI archives: `docker save` tarballs and OCI image layouts.

Each layer of the archive becomes one layer of the content-addressed store, in the
archive's order (the first layer at the bottom of the overlay stack). Layer tars are
unpacked by `unpack_layer`, which converts the OCI deletion markers into what overlayfs
reads from a lower directory: a whiteout `.wh.NAME` becomes a character device 0:0 named
NAME, and `.wh..wh..opq` marks its directory opaque. The overlay mount then applies them:
a file deleted in a layer is gone from the sandbox's root, and an opaque directory hides
every entry the layers below had in it.

Unpacking never trusts the archive:

* a member name that is absolute, contains `..`, or passes through a symlink (planted by
  an earlier member) is refused: every path is opened component by component relative to
  the layer's root with O_NOFOLLOW, so nothing is ever written outside it;
* symlinks are stored as symlinks, whatever they point at (they are resolved inside the
  sandbox's root, never on the host); hard links become copies of their target in the
  same layer, and a hard link to a name outside the layer is refused;
* device nodes, FIFOs and sockets are skipped (sandboxes get their own /dev) and
  counted in the import report;
* ownership is kept as the archive says (the unpacker runs as root); set-id bits are
  stripped when the tree becomes a layer, like in every layer.

The image config's `Env`, `WorkingDir` and `User` become the image's environment,
default working directory and user (see `Image.apply`); `Cmd`, `Entrypoint` and
`Labels` are kept in its metadata. The image id is a digest of the layer digests and
that config, so the same archive always imports as the same image.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tryloop.sandbox.images import ImageError, find_in_layers, make_image
from tryloop.sandbox.layers import OPAQUE_XATTR, USER_OPAQUE_XATTR, LayerStore

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class UnpackReport:
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    hardlinks: int = 0
    whiteouts: int = 0
    opaque: int = 0
    skipped: list[str] = field(default_factory=list)  # device nodes, FIFOs


# --------------------------------------------------------------------------- unpacking


def _clean_parts(name: str, where: str) -> list[str]:
    if name.startswith("/"):
        raise ImageError(f"{where}: member {name!r} has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ImageError(f"{where}: member {name!r} leaves the layer through '..'")
    return parts


class _Tree:
    """A directory being filled, reached only through descriptors (no path is followed)."""

    def __init__(self, root: Path, where: str):
        self.root = root
        self.where = where
        self.fd = os.open(root, _O_DIR)

    def close(self) -> None:
        os.close(self.fd)

    def parent(self, parts: list[str], name: str) -> int:
        """A descriptor of the directory holding parts[-1], creating missing directories."""
        fd = os.dup(self.fd)
        try:
            for comp in parts[:-1]:
                try:
                    nfd = os.open(comp, _O_DIR, dir_fd=fd)
                except FileNotFoundError:
                    os.mkdir(comp, 0o755, dir_fd=fd)
                    nfd = os.open(comp, _O_DIR, dir_fd=fd)
                except OSError as e:  # ELOOP / ENOTDIR: a symlink or a file on the way
                    raise ImageError(f"{self.where}: member {name!r} passes through "
                                     f"{comp!r}, which is not a directory ({e.strerror})") from None
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    def remove(self, dfd: int, leaf: str) -> None:
        try:
            st = os.lstat(leaf, dir_fd=dfd)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(leaf, _O_DIR, dir_fd=dfd)
            try:
                for entry in os.listdir(sub):
                    self.remove(sub, entry)
            finally:
                os.close(sub)
            os.rmdir(leaf, dir_fd=dfd)
        else:
            os.unlink(leaf, dir_fd=dfd)


def _owner(m: tarfile.TarInfo) -> tuple[int, int]:
    if os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    return m.uid, m.gid


def unpack_layer(fileobj: IO[bytes], dest: Path, where: str) -> UnpackReport:
    """Unpack one layer tar (plain or gzip, read as a stream) into the empty directory `dest`.

    `where` names the layer in error messages (archive and member path).
    """
    rep = UnpackReport()
    tree = _Tree(dest, where)
    dirs: list[tuple[list[str], tarfile.TarInfo]] = []
    try:
        try:
            tar = tarfile.open(fileobj=fileobj, mode="r|*")  # noqa: SIM115 - closed by `with` below
        except tarfile.TarError as e:
            raise ImageError(f"{where}: not a tar archive ({e})") from None
        with tar:
            for m in tar:
                _unpack_member(tar, m, tree, rep, dirs)
        # Directory metadata last: a read-only directory must be filled first.
        for parts, m in sorted(dirs, key=lambda d: -len(d[0])):
            dfd = tree.parent(parts, m.name) if parts else os.dup(tree.fd)
            try:
                fd = os.open(parts[-1], _O_DIR, dir_fd=dfd) if parts else os.dup(tree.fd)
                try:
                    os.fchown(fd, *_owner(m))
                    os.fchmod(fd, m.mode & 0o7777)
                finally:
                    os.close(fd)
            finally:
                os.close(dfd)
    except (OSError, EOFError, zlib.error, tarfile.TarError) as e:
        raise ImageError(f"{where}: cannot unpack: {e}") from None
    finally:
        tree.close()
    return rep


def _unpack_member(tar: tarfile.TarFile, m: tarfile.TarInfo, tree: _Tree, rep: UnpackReport,
                   dirs: list) -> None:
    parts = _clean_parts(m.name, tree.where)
    if not parts:  # the layer's root itself
        if m.isdir():
            dirs.append(([], m))
        return
    leaf = parts[-1]
    if leaf == OPAQUE_MARKER:
        dfd = tree.parent(parts, m.name)  # the directory holding the marker
        try:
            for x in (OPAQUE_XATTR, USER_OPAQUE_XATTR):
                try:
                    os.setxattr(dfd, x, b"y")
                except OSError:
                    if x == OPAQUE_XATTR:
                        raise
        finally:
            os.close(dfd)
        rep.opaque += 1
        return
    dfd = tree.parent(parts, m.name)
    try:
        if leaf.startswith(WHITEOUT_PREFIX):
            target = leaf[len(WHITEOUT_PREFIX):]
            if not target or target in (".", ".."):
                raise ImageError(f"{tree.where}: member {m.name!r} is a malformed whiteout")
            tree.remove(dfd, target)
            os.mknod(target, stat.S_IFCHR, os.makedev(0, 0), dir_fd=dfd)
            rep.whiteouts += 1
            return
        if m.isdir():
            try:
                st = os.lstat(leaf, dir_fd=dfd)
                if not stat.S_ISDIR(st.st_mode):
                    tree.remove(dfd, leaf)
                    os.mkdir(leaf, 0o755, dir_fd=dfd)
            except FileNotFoundError:
                os.mkdir(leaf, 0o755, dir_fd=dfd)
            dirs.append((parts, m))
            rep.dirs += 1
            return
        tree.remove(dfd, leaf)  # a later member replaces an earlier one of the same name
        if m.issym():
            os.symlink(m.linkname, leaf, dir_fd=dfd)
            os.chown(leaf, *_owner(m), dir_fd=dfd, follow_symlinks=False)
            rep.symlinks += 1
        elif m.islnk():
            try:
                src_parts = _clean_parts(m.linkname, tree.where)
            except ImageError:
                raise ImageError(f"{tree.where}: hard link {m.name!r} -> {m.linkname!r} "
                                 "leaves the layer") from None
            if not src_parts:
                raise ImageError(f"{tree.where}: hard link {m.name!r} points at the layer root")
            sfd = tree.parent(src_parts, m.linkname)
            try:
                try:
                    src = os.open(src_parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=sfd)
                except OSError as e:
                    raise ImageError(f"{tree.where}: hard link {m.name!r} -> {m.linkname!r}: "
                                     f"the target is not a file earlier in this layer ({e.strerror})") from None
            finally:
                os.close(sfd)
            try:
                st = os.fstat(src)
                if not stat.S_ISREG(st.st_mode):
                    raise ImageError(f"{tree.where}: hard link {m.name!r} -> {m.linkname!r} is not a file")
                out = os.open(leaf, _O_NEW, 0o600, dir_fd=dfd)
                try:
                    with os.fdopen(src, "rb", closefd=False) as fsrc, os.fdopen(out, "wb", closefd=False) as fdst:
                        shutil.copyfileobj(fsrc, fdst, 1 << 20)
                    os.fchown(out, st.st_uid, st.st_gid)
                    os.fchmod(out, stat.S_IMODE(st.st_mode))
                finally:
                    os.close(out)
            finally:
                os.close(src)
            rep.hardlinks += 1
        elif m.isreg():
            data = tar.extractfile(m)
            out = os.open(leaf, _O_NEW, 0o600, dir_fd=dfd)
            try:
                with os.fdopen(out, "wb", closefd=False) as f:
                    if data is not None:
                        shutil.copyfileobj(data, f, 1 << 20)
                os.fchown(out, *_owner(m))
                os.fchmod(out, m.mode & 0o7777)
            finally:
                os.close(out)
            rep.files += 1
        else:  # devices, FIFOs: a sandbox has its own /dev and makes its own FIFOs
            rep.skipped.append(m.name)
    finally:
        os.close(dfd)


# --------------------------------------------------------------------------- archives


@dataclass
class _Manifest:
    config: dict
    layers: list[tuple[str, str]]  # (name for messages, blob path inside the archive)
    tags: list[str]
    digests: dict[str, str]  # blob path -> expected sha256 (OCI layouts)


class _Archive:
    """A `docker save` tarball or an OCI layout, as a directory or a tar file."""

    def __init__(self, path: Path):
        self.path = path
        self._tar: tarfile.TarFile | None = None
        if path.is_dir():
            return
        if not path.is_file():
            raise ImageError(f"{path}: no such archive or directory")
        try:
            self._tar = tarfile.open(path, mode="r:*")  # noqa: SIM115 - closed by close()
        except tarfile.TarError as e:
            raise ImageError(f"{path}: not a tar archive ({e})") from None
        self._members = {m.name[2:] if m.name.startswith("./") else m.name: m
                         for m in self._tar.getmembers()}

    def close(self) -> None:
        if self._tar is not None:
            self._tar.close()

    def has(self, name: str) -> bool:
        if self._tar is None:
            return (self.path / name).is_file()
        return name in self._members

    @contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        _clean_parts(name, str(self.path))
        if self._tar is None:
            p = self.path / name
            if p.is_symlink() or not p.is_file():
                raise ImageError(f"{self.path}: {name} is missing or not a regular file")
            with open(p, "rb") as f:
                yield f
            return
        m = self._members.get(name)
        if m is None or not m.isreg():
            raise ImageError(f"{self.path}: {name} is missing or not a regular file")
        f = self._tar.extractfile(m)
        assert f is not None
        yield f

    def json(self, name: str) -> object:
        with self.open(name) as f:
            try:
                return json.loads(f.read())
            except ValueError as e:
                raise ImageError(f"{self.path}: {name} is not valid JSON ({e})") from None


def _blob(digest: str, where: str) -> str:
    algo, _, hexd = str(digest).partition(":")
    if algo != "sha256" or len(hexd) != 64 or any(c not in "0123456789abcdef" for c in hexd):
        raise ImageError(f"{where}: unsupported digest {digest!r} (sha256 only)")
    return f"blobs/sha256/{hexd}"


_LAYER_TYPES = ("application/vnd.oci.image.layer.v1.tar", "application/vnd.oci.image.layer.v1.tar+gzip",
                "application/vnd.docker.image.rootfs.diff.tar.gzip", "application/vnd.docker.image.rootfs.diff.tar")


def _read_manifest(ar: _Archive, ref: str | None) -> _Manifest:
    where = str(ar.path)
    if ar.has("index.json") and ar.has("oci-layout"):
        index = ar.json("index.json")
        manifests = index.get("manifests", []) if isinstance(index, dict) else []
        if ref is not None:
            manifests = [m for m in manifests
                         if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == ref
                         or m.get("annotations", {}).get("io.containerd.image.name") == ref]
        if not manifests:
            raise ImageError(f"{where}: index.json lists no image manifest" + (f" named {ref!r}" if ref else ""))
        if len(manifests) > 1:
            names = [m.get("annotations", {}).get("org.opencontainers.image.ref.name", m.get("digest"))
                     for m in manifests]
            raise ImageError(f"{where}: index.json lists {len(manifests)} images ({', '.join(map(str, names))}); "
                             "name one with --ref")
        desc = manifests[0]
        digests: dict[str, str] = {}
        for _ in range(4):  # an index may point at a nested index
            path = _blob(desc.get("digest", ""), f"{where}: index.json")
            digests[path] = path.rsplit("/", 1)[1]
            doc = ar.json(path)
            if not isinstance(doc, dict):
                raise ImageError(f"{where}: {path} is not a manifest")
            if "manifests" in doc:
                sub = [m for m in doc["manifests"]
                       if m.get("platform", {}).get("architecture") in (None, _arch())]
                if not sub:
                    raise ImageError(f"{where}: {path}: no manifest for this host's architecture ({_arch()})")
                desc = sub[0]
                continue
            break
        else:
            raise ImageError(f"{where}: image indexes nested too deeply")
        cpath = _blob(doc.get("config", {}).get("digest", ""), f"{where}: {path}")
        digests[cpath] = cpath.rsplit("/", 1)[1]
        layers = []
        for i, ld in enumerate(doc.get("layers", [])):
            mt = ld.get("mediaType", "")
            if mt and mt not in _LAYER_TYPES:
                raise ImageError(f"{where}: layer {i} of {path} has media type {mt!r}; "
                                 "only tar and tar+gzip layers are supported")
            lp = _blob(ld.get("digest", ""), f"{where}: {path} layer {i}")
            digests[lp] = lp.rsplit("/", 1)[1]
            layers.append((lp, lp))
        _verify(ar, path, digests.pop(path))
        config = ar.json(cpath)
        _verify(ar, cpath, digests.pop(cpath))
        tags = [ref] if ref else [m.get("annotations", {}).get("org.opencontainers.image.ref.name")
                                  for m in manifests if m.get("annotations", {}).get("org.opencontainers.image.ref.name")]
        if not isinstance(config, dict):
            raise ImageError(f"{where}: {cpath} is not an image config")
        return _Manifest(config, layers, tags, digests)
    if ar.has("manifest.json"):
        man = ar.json("manifest.json")
        if not isinstance(man, list) or not man:
            raise ImageError(f"{where}: manifest.json lists no image")
        if ref is not None:
            man = [m for m in man if ref in (m.get("RepoTags") or [])]
            if not man:
                raise ImageError(f"{where}: manifest.json has no image tagged {ref!r}")
        if len(man) > 1:
            tags = [t for m in man for t in (m.get("RepoTags") or ["<untagged>"])]
            raise ImageError(f"{where}: manifest.json lists {len(man)} images ({', '.join(tags)}); name one with --ref")
        m = man[0]
        if not isinstance(m.get("Config"), str) or not isinstance(m.get("Layers"), list):
            raise ImageError(f"{where}: manifest.json: an entry needs Config and Layers")
        config = ar.json(m["Config"])
        if not isinstance(config, dict):
            raise ImageError(f"{where}: {m['Config']} is not an image config")
        return _Manifest(config, [(str(x), str(x)) for x in m["Layers"]], list(m.get("RepoTags") or []), {})
    raise ImageError(f"{where}: neither an OCI image layout (oci-layout, index.json) "
                     "nor a docker save archive (manifest.json)")


def _arch() -> str:
    m = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(m, m)


def _verify(ar: _Archive, path: str, hexd: str) -> None:
    h = hashlib.sha256()
    with ar.open(path) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    if h.hexdigest() != hexd:
        raise ImageError(f"{ar.path}: blob {path} does not match its digest (corrupt archive)")


class _HashingReader(io.RawIOBase):
    def __init__(self, f: IO[bytes]):
        self.f = f
        self.h = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        data = self.f.read(len(b))
        self.h.update(data)
        b[: len(data)] = data
        return len(data)


# --------------------------------------------------------------------------- import


def mountpoints_layer(store: LayerStore) -> str:
    """The bottom layer of every imported or built image: the directories a sandbox
    mounts on (/proc, /dev, ...) and a sticky /tmp, in case the image has none."""
    with tempfile.TemporaryDirectory(dir=store.tmp_dir) as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        for name in ("proc", "dev", "sys", "etc", "tmp", "run"):
            (root / name).mkdir()
            os.chmod(root / name, 0o1777 if name == "tmp" else 0o755)
        os.chmod(root, 0o755)
        return store.add_tree(root, uid=0, gid=0)


def oci_env(config: dict, where: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for item in config.get("Env") or []:
        k, sep, v = str(item).partition("=")
        if not sep or not k:
            raise ImageError(f"{where}: config Env entry {item!r} is not NAME=VALUE")
        out = [(a, b) for a, b in out if a != k] + [(k, v)]
    return out


def import_archive(store: LayerStore, path: str | Path, *, ref: str | None = None,
                   on_layer=None):
    """Import an OCI layout or `docker save` archive; returns the saved Image.

    `on_layer(i, n, digest)` is called after each layer is in the store.
    """
    path = Path(path)
    ar = _Archive(path)
    try:
        man = _read_manifest(ar, ref)
        cfg = man.config.get("config") or man.config.get("container_config") or {}
        if not isinstance(cfg, dict):
            raise ImageError(f"{path}: image config's `config` is not an object")
        layers: list[str] = []
        skipped: list[str] = []
        for i, (name, blob) in enumerate(man.layers):
            where = f"{path}: layer {i + 1}/{len(man.layers)} ({name})"
            with ar.open(blob) as raw, tempfile.TemporaryDirectory(dir=store.tmp_dir) as tmp:
                hashing = _HashingReader(raw)
                dest = Path(tmp) / "root"
                dest.mkdir(mode=0o755)
                rep = unpack_layer(hashing, dest, where)  # type: ignore[arg-type]
                if blob in man.digests:
                    while hashing.read(1 << 20):  # the rest of a compressed stream
                        pass
                    if hashing.h.hexdigest() != man.digests[blob]:
                        raise ImageError(f"{where}: blob does not match its digest (corrupt archive)")
                skipped += [f"layer {i + 1}: {s}" for s in rep.skipped]
                digest = store.add_tree(dest)
            layers.append(digest)
            if on_layer:
                on_layer(i + 1, len(man.layers), digest)
        bottom = mountpoints_layer(store)
        stack = tuple(reversed(layers)) + (bottom,)
        env = oci_env(cfg, f"{path}: config")
        workdir = os.path.normpath("/" + str(cfg.get("WorkingDir") or "").lstrip("/"))
        if find_in_layers(store, stack, workdir) is None:
            # A container engine creates a missing WorkingDir when the container starts;
            # here it is a small layer of its own, so every sandbox can start in it.
            with tempfile.TemporaryDirectory(dir=store.tmp_dir) as tmp:
                root = Path(tmp) / "root"
                (root / workdir.lstrip("/")).mkdir(parents=True, mode=0o755)
                for d in [root, *(root / workdir.lstrip("/")).parents, root / workdir.lstrip("/")]:
                    if d == root or root in d.parents:
                        os.chmod(d, 0o755)
                stack = (store.add_tree(root, uid=0, gid=0), *stack)
        meta = {"kind": "oci", "source": str(path), "tags": man.tags,
                "cmd": cfg.get("Cmd"), "entrypoint": cfg.get("Entrypoint"),
                "labels": cfg.get("Labels") or {}, "skipped": skipped[:100]}
        return make_image(store, stack, env, workdir=workdir,
                          user=str(cfg.get("User") or ""), meta=meta)
    finally:
        ar.close()
