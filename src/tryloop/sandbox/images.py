"""Images: the read-only root filesystem under a sandbox.

An image is a stack of content-addressed layers plus read-only bind mounts of
host directories. The default image is derived from the host: its /usr (with
its Python) and the Python installation that runs tryloop, bound read-only, on
top of a small generated skeleton (/etc with an unprivileged user and nothing
secret, mount points, /workspace owned by the agent). Nothing else of the host
is visible: not /root, not /etc/shadow, not /home, not the host's processes.

The host part cannot be hashed file by file (it is gigabytes), so the image id
covers the skeleton's digest, the bind list, the inode and mtime of each bind
source and the Python distributions installed: a change to any of them makes a
new image id, and with it new snapshot ids.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import site
import stat
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from tryloop.errors import TryloopError
from tryloop.sandbox.layers import LayerStore

AGENT_HOME = "/home/agent"
_TOP_LEVEL = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Small, non-secret host files the tools in /usr expect to find.
_ETC_COPY = (
    "nsswitch.conf", "ld.so.cache", "ld.so.conf", "localtime", "os-release", "resolv.conf",
    "ssl/certs/ca-certificates.crt", "mime.types", "protocols", "services",
)
_ETC_TREES = ("ld.so.conf.d", "alternatives")


class ImageError(TryloopError):
    """An image archive, Dockerfile or image reference is invalid; the message names it."""

    exit_code = 65  # sysexits.h EX_DATAERR


@dataclass(frozen=True)
class Image:
    """A root filesystem: `layers` top-most first, then host `binds` mounted read-only."""

    id: str
    layers: tuple[str, ...]
    binds: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    uid: int = 1000
    gid: int = 1000
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    #: Default working directory of commands (an OCI config's WorkingDir), None: the config's.
    workdir: str | None = None
    #: The user the image names (an OCI config's User, a Dockerfile's USER); "" for none.
    user: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Image:
        d = json.loads(text)
        return cls(
            id=d["id"], layers=tuple(d["layers"]), binds=tuple(tuple(b) for b in d["binds"]),
            env=tuple(tuple(e) for e in d["env"]), uid=d["uid"], gid=d["gid"], meta=d.get("meta", {}),
            workdir=d.get("workdir"), user=d.get("user", ""),
        )

    def sandbox_config(self, config):
        """`config` with this image's working directory and user where it leaves them unset
        (or at their defaults).

        An image whose user is root (uid 0) keeps the config's unprivileged uid: sandbox
        commands never run as uid 0 outside a user namespace.
        """
        update: dict = {}
        fields = type(config).model_fields

        def unset(name: str) -> bool:  # not given, or given as the default (a whole YAML dump)
            return name not in config.model_fields_set or getattr(config, name) == fields[name].default

        if self.workdir and unset("workdir"):
            update["workdir"] = self.workdir
        if self.user and self.uid > 0 and unset("uid") and unset("gid"):
            update.update(uid=self.uid, gid=self.gid)
        return config.model_copy(update=update) if update else config


def image_id(layers: Iterable[str], binds: Iterable[tuple[str, str]], env: Iterable[tuple[str, str]],
             fingerprint: str = "") -> str:
    doc = json.dumps({"layers": list(layers), "binds": [list(b) for b in binds],
                      "env": [list(e) for e in env], "host": fingerprint}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()


def make_image(store: LayerStore, layers: Iterable[str], env: Iterable[tuple[str, str]], *,
               workdir: str = "/", user: str = "", meta: dict | None = None, save: bool = True) -> Image:
    """Save an image of store layers (top-most first) with an OCI-style config.

    Its id is the digest of the layers and the config (env, workdir, user and the ids
    the user resolves to in the image's /etc/passwd), so equal content gives an equal id.
    """
    layers = tuple(layers)
    env = tuple((str(k), str(v)) for k, v in env)
    uid, gid = resolve_user(store, layers, user)
    config = json.dumps({"workdir": workdir, "user": user, "uid": uid, "gid": gid}, sort_keys=True)
    iid = image_id(layers, (), env, config)
    image = Image(id=iid, layers=layers, env=env, uid=uid, gid=gid, meta=dict(meta or {}),
                  workdir=workdir, user=user)
    if save:
        save_image(store, image)
    return image


def find_in_layers(store: LayerStore, layers: Iterable[str], rel: str) -> Path | None:
    """The path of `rel` as the overlay of `layers` (top-most first) shows it, or None.

    Whiteouts and opaque directories are honoured; a symlink on the way is not followed
    (the entry counts as absent).
    """
    parts = [p for p in rel.strip("/").split("/") if p]
    for digest in layers:
        cur = store.path(digest)
        for i, comp in enumerate(parts):
            nxt = cur / comp
            try:
                st = os.lstat(nxt)
            except FileNotFoundError:
                if i > 0 and _opaque(cur):
                    return None
                break
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                return None  # a whiteout: deleted in this layer
            if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
                return None
            cur = nxt
        else:
            return cur
    return None


def _opaque(d: Path) -> bool:
    try:
        return os.getxattr(d, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


def _db(store: LayerStore, layers: tuple[str, ...], rel: str) -> list[list[str]]:
    p = find_in_layers(store, layers, rel)
    if p is None or p.is_symlink() or not p.is_file():
        return []
    return [line.split(":") for line in p.read_text(errors="replace").splitlines() if line and line[0] != "#"]


def resolve_user(store: LayerStore, layers: tuple[str, ...], user: str) -> tuple[int, int]:
    """uid and gid of a USER value (name or number, optionally :group) in the image's
    /etc/passwd and /etc/group; ("", root) is (0, 0)."""
    name, _, group = (user or "root").partition(":")
    uid = gid = None
    if name.isdigit():
        uid = int(name)
        for row in _db(store, layers, "etc/passwd"):
            if len(row) > 3 and row[2] == name and row[3].isdigit():
                gid = int(row[3])
                break
    else:
        for row in _db(store, layers, "etc/passwd"):
            if len(row) > 3 and row[0] == name and row[2].isdigit() and row[3].isdigit():
                uid, gid = int(row[2]), int(row[3])
                break
        if uid is None:
            if name == "root":
                uid, gid = 0, 0
            else:
                raise ImageError(f"user {name!r} is not in the image's /etc/passwd")
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            gid = next((int(r[2]) for r in _db(store, layers, "etc/group")
                        if len(r) > 2 and r[0] == group and r[2].isdigit()), None)
            if gid is None:
                raise ImageError(f"group {group!r} is not in the image's /etc/group")
    if gid is None:
        gid = uid
    if not (0 <= uid < 65536 and 0 <= gid < 65536):
        raise ImageError(f"user {user!r}: ids above 65535 are not supported")
    return uid, gid


def save_image(store: LayerStore, image: Image) -> None:
    d = store.root / "images"
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{image.id}.tmp{os.getpid()}"
    tmp.write_text(image.to_json())
    os.replace(tmp, d / f"{image.id}.json")


def load_image(store: LayerStore, image_id_: str) -> Image:
    p = store.root / "images" / f"{image_id_}.json"
    try:
        return Image.from_json(p.read_text())
    except FileNotFoundError:
        raise KeyError(f"image {image_id_} is not in the store at {store.root}") from None


def python_prefixes() -> list[str]:
    """Installations the default image must expose: the base Python and, if any, the venv."""
    out: list[str] = []
    for p in (sys.base_prefix, sys.prefix):
        real = os.path.realpath(p)
        if real not in out and not real.startswith("/usr/"):
            out.append(real)
    return out


def _host_fingerprint(binds: list[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    h.update(sys.version.encode())
    for src, _ in binds:
        st = os.stat(src)
        h.update(f"{src}:{st.st_ino}:{st.st_mtime_ns}\n".encode())
    # The packages of the installation itself, not of whatever sys.path holds at the moment: an
    # imported library may add folders of its own (Ray adds its thirdparty_files), which would
    # give one host two ids, and two reward versions, depending on what was imported first.
    sites = [d for d in site.getsitepackages() if os.path.isdir(d)]
    dists = sorted({f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions(path=sites)})
    h.update("\n".join(dists).encode())
    return h.hexdigest()


def _mkdir(root: Path, rel: str, mode: int, uid: int = 0, gid: int = 0) -> None:
    p = root / rel.lstrip("/")
    p.mkdir(parents=True, exist_ok=True)
    os.chmod(p, mode)
    os.chown(p, uid, gid)


def _write(root: Path, rel: str, text: str, mode: int = 0o644) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    os.chmod(p, mode)


def _build_skeleton(root: Path, uid: int, gid: int, binds: list[tuple[str, str]]) -> None:
    for name in ("proc", "dev", "sys", "etc", "opt", "run", "var", "mnt", "srv", "home"):
        _mkdir(root, name, 0o755)
    for name in ("tmp", "var/tmp"):
        _mkdir(root, name, 0o1777)
    _mkdir(root, "root", 0o711)  # traversable to reach a Python under /root, not listable
    _mkdir(root, AGENT_HOME, 0o755, uid, gid)
    _mkdir(root, "workspace", 0o755, uid, gid)
    _mkdir(root, "opt/tryloop", 0o755, uid, gid)  # image build steps install here
    for name in _TOP_LEVEL:
        host = Path("/") / name
        if host.is_symlink():
            os.symlink(os.readlink(host), root / name)
    for _, dst in binds:
        parts = Path(dst).parts[1:]
        for i in range(1, len(parts)):
            d = root.joinpath(*parts[:i])
            if not d.exists():
                _mkdir(root, str(Path(*parts[:i])), 0o711)
        (root / dst.lstrip("/")).mkdir(parents=True, exist_ok=True)
    etc = Path("/etc")
    for rel in _ETC_COPY:
        src = etc / rel
        if src.exists():
            dst = root / "etc" / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o644)
    for rel in _ETC_TREES:
        src = etc / rel
        if src.is_dir():
            shutil.copytree(src, root / "etc" / rel, symlinks=True)
    _write(root, "etc/passwd",
           "root:x:0:0:root:/root:/bin/sh\n"
           f"agent:x:{uid}:{gid}:agent:{AGENT_HOME}:/bin/bash\n"
           "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    _write(root, "etc/group", f"root:x:0:\nagent:x:{gid}:\nnogroup:x:65534:\n")
    _write(root, "etc/hostname", "sandbox\n")
    _write(root, "etc/hosts", "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost\n")


def host_image(store: LayerStore, uid: int = 1000, gid: int = 1000) -> Image:
    """The default image: this host's /usr and Python, read-only, on a generated skeleton."""
    binds: list[tuple[str, str]] = []
    for name in _TOP_LEVEL:
        host = Path("/") / name
        if host.is_dir() and not host.is_symlink():
            binds.append((str(host), f"/{name}"))
    prefixes = python_prefixes()
    binds += [(p, p) for p in prefixes]
    with tempfile.TemporaryDirectory(dir=store.root / "tmp" if (store.root / "tmp").is_dir() else None) as tmp:
        skel = Path(tmp) / "skel"
        skel.mkdir()
        _build_skeleton(skel, uid, gid, binds)
        skeleton = store.add_tree(skel)
    path = [f"{p}/bin" for p in reversed(prefixes)]
    path += ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
    env = (("PATH", ":".join(path)), ("HOME", AGENT_HOME), ("USER", "agent"), ("LANG", "C.UTF-8"),
           ("TMPDIR", "/tmp"))
    fp = _host_fingerprint(binds)
    iid = image_id([skeleton], binds, env, fp)
    image = Image(id=iid, layers=(skeleton,), binds=tuple(binds), env=env, uid=uid, gid=gid,
                  meta={"kind": "host", "python": sys.version.split()[0]})
    save_image(store, image)
    return image


def harness_prefixes(base: Image) -> list[str]:
    """The host's Python installations `with_host_python` binds into `base` for the harness:
    those its own binds do not already hold."""
    return [p for p in python_prefixes() if (p, p) not in base.binds]


def with_host_python(store: LayerStore, base: Image) -> Image:
    """`base` (an image made only of layers) with this host's Python installations bound
    read-only at their own paths, first on PATH, as the default image has them: what the
    verifier's harness runs its supervisor and pytest with, in a task's own environment.

    The bound interpreter uses the image's C library and shared libraries (a Debian root of
    the host's release has what it needs). Cached: the same base on the same host gives the
    same id. HOME defaults to /tmp when the base names none. A base that has binds of its
    own (an image built on the host-derived root, whose binds already hold the host's
    Python) keeps them; the host's Python is bound once."""
    prefixes = python_prefixes()
    binds = (*base.binds, *((p, p) for p in harness_prefixes(base)))
    with tempfile.TemporaryDirectory(dir=store.root / "tmp" if (store.root / "tmp").is_dir() else None) as tmp:
        skel = Path(tmp) / "skel"
        skel.mkdir()
        for _, dst in binds[len(base.binds):]:
            parts = Path(dst).parts[1:]
            for i in range(1, len(parts)):
                if not skel.joinpath(*parts[:i]).exists():
                    _mkdir(skel, str(Path(*parts[:i])), 0o711)  # traversable, not listable
            _mkdir(skel, dst, 0o755)
        mounts = store.add_tree(skel)
    env = dict(base.env)
    path = [f"{p}/bin" for p in reversed(prefixes)]
    env["PATH"] = ":".join([*path, *(d for d in env.get("PATH", "/usr/bin:/bin").split(":") if d not in path)])
    env.setdefault("HOME", "/tmp")
    env_items = tuple(sorted(env.items()))
    layers = (mounts, *base.layers)
    iid = image_id(layers, binds, env_items, f"{_host_fingerprint(list(binds))}:{base.workdir}:{base.user}")
    image = Image(id=iid, layers=layers, binds=binds, env=env_items, uid=base.uid, gid=base.gid,
                  meta={"kind": "task", "base": base.id, "python": sys.version.split()[0]},
                  workdir=base.workdir, user=base.user)
    save_image(store, image)
    return image
