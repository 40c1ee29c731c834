"""File access to a sandbox from the host, confined by the kernel.

Every path is resolved with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
relative to the sandbox's root: `..`, absolute paths and symlinks the agent
planted are all resolved as if the process were chrooted there, so no path can
reach the host. Writes additionally refuse to cross a mount (RESOLVE_NO_XDEV):
only the sandbox's own writable layer can be written, never its /proc, /dev or
the read-only host binds. Reads refuse special files (devices, FIFOs, sockets)
and pseudo filesystems (proc, sysfs).

In a sandbox with a user namespace, the writable layer belongs to that namespace: the
kernel refuses to create a file there whose owner it cannot map (the host's root), so
files and directories are created with the agent's ids as this thread's filesystem ids
(see `_creating_as`).

The host's own access (the verifier writing hidden tests, the harness reading its records)
has the host's permissions inside the sandbox. The agent's access (`SandboxFiles(sb,
agent=True)`, `sb.agent_files`: the file tools a policy calls) has the agent's: this
thread takes the agent's ids as its filesystem ids and no supplementary groups, and the
kernel drops the capabilities that override file permissions while it does
(`_acting_as`). So a tool cannot read or write what the agent's own processes could not,
such as a root-only file of the image, or /etc/ld.so.preload.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import stat as _stat
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tryloop.config import SandboxConfig
from tryloop.errors import PathOutsideSandbox, SandboxError

_SYS_OPENAT2 = 437  # the same number on every architecture (new syscall table)
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
_PROC_SUPER_MAGIC = 0x9FA0
_SYSFS_MAGIC = 0x62656572

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _Statfs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_long * 15)]


_libc.fstatfs.argtypes = [ctypes.c_int, ctypes.POINTER(_Statfs)]
for _f in (_libc.setfsuid, _libc.setfsgid):  # ids of sandboxes lie above 2**31
    _f.argtypes, _f.restype = [ctypes.c_uint], ctypes.c_uint
_PR_GET_SECUREBITS, _PR_SET_SECUREBITS = 27, 28
_SECBIT_NO_SETUID_FIXUP = 1 << 2
_NO_ID = 0xFFFFFFFF  # an invalid id: setfsuid(-1) only reports the current one


@contextlib.contextmanager
def _fs_ids(uid: int, gid: int):
    """This thread's filesystem ids are `uid`/`gid` while inside (they are per thread)."""
    old_gid = _libc.setfsgid(gid)
    old_uid = _libc.setfsuid(uid)
    try:
        if _libc.setfsuid(_NO_ID) != uid or _libc.setfsgid(_NO_ID) != gid:
            raise SandboxError(f"cannot switch to filesystem ids {uid}:{gid}")
        yield
    finally:
        _libc.setfsuid(old_uid)
        _libc.setfsgid(old_gid)


@contextlib.contextmanager
def _creating_as(uid: int, gid: int):
    """Create files as host ids `uid`/`gid` on this thread only, keeping the host's
    capabilities: with SECBIT_NO_SETUID_FIXUP the switch away from fsuid 0 does not drop
    them, so permission checks are the same as before."""
    bits = _libc.prctl(_PR_GET_SECUREBITS, 0, 0, 0, 0)
    if bits < 0 or _libc.prctl(_PR_SET_SECUREBITS, bits | _SECBIT_NO_SETUID_FIXUP, 0, 0, 0) != 0:
        raise SandboxError(f"cannot keep capabilities across an fsuid switch: {os.strerror(ctypes.get_errno())}")
    try:
        with _fs_ids(uid, gid):
            yield
    finally:
        _libc.prctl(_PR_SET_SECUREBITS, bits, 0, 0, 0)


# setgroups as a raw syscall: it changes this thread's groups only, where glibc's wrapper
# changes every thread's. None where the number is not known: agent access then refuses.
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}.get(platform.machine())


@contextlib.contextmanager
def _acting_as(uid: int, gid: int):
    """File access as host ids `uid`/`gid` with no supplementary groups, on this thread only.
    Leaving filesystem uid 0 makes the kernel drop the capabilities that override file
    permissions (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, ...) from this thread's
    effective set, and coming back restores them, so permissions are checked as for the
    agent's own processes."""
    nr = _SYS_SETGROUPS
    if nr is None:
        raise SandboxError(f"acting as the agent: no setgroups number known for {platform.machine()}")
    if _libc.prctl(_PR_GET_SECUREBITS, 0, 0, 0, 0) & _SECBIT_NO_SETUID_FIXUP:
        raise SandboxError("acting as the agent: this thread keeps its capabilities across an fsuid switch")
    groups = os.getgroups()
    if _libc.syscall(nr, 0, None) != 0:
        raise SandboxError(f"cannot drop supplementary groups: {os.strerror(ctypes.get_errno())}")
    try:
        with _fs_ids(uid, gid):
            yield
    finally:
        saved = (ctypes.c_uint * max(len(groups), 1))(*groups)
        _libc.syscall(nr, len(groups), saved)


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = 0) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    fd = _libc.syscall(_SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def _fs_type(fd: int) -> int:
    buf = _Statfs()
    if _libc.fstatfs(fd, ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return buf.f_type & 0xFFFFFFFF


@dataclass(frozen=True)
class FileInfo:
    path: str
    name: str
    type: str  # file, dir, symlink, other
    size: int
    mode: int
    uid: int
    mtime: float

    @classmethod
    def from_stat(cls, path: str, name: str, st: os.stat_result, uid: int | None = None) -> FileInfo:
        """`uid`: the owner as the sandbox numbers it (default: st_uid, the host's number)."""
        if _stat.S_ISREG(st.st_mode):
            kind = "file"
        elif _stat.S_ISDIR(st.st_mode):
            kind = "dir"
        elif _stat.S_ISLNK(st.st_mode):
            kind = "symlink"
        else:
            kind = "other"
        return cls(path, name, kind, st.st_size, _stat.S_IMODE(st.st_mode),
                   st.st_uid if uid is None else uid, st.st_mtime)


_READ = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
_WRITE = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV


class FileRoot(Protocol):
    """What the file API needs of a sandbox (a `Sandbox`); declared here so that this
    module does not import the one that uses it."""

    id: str
    config: SandboxConfig
    id_base: int

    def root_dir(self) -> Path: ...
    def host_id(self, sandbox_id: int) -> int: ...
    def sandbox_id(self, host_id: int) -> int: ...


class SandboxFiles:
    """read / write / list / stat inside one sandbox (see the module docstring)."""

    def __init__(self, sandbox: FileRoot, *, agent: bool = False):
        self._sb = sandbox
        self._agent_access = agent

    def _agent(self) -> tuple[int, int]:
        """The agent's uid and gid as the host numbers them (shifted by a user namespace)."""
        return self._sb.host_id(self._sb.config.uid), self._sb.host_id(self._sb.config.gid)

    def _as_agent(self) -> contextlib.AbstractContextManager:
        """Creating files: with the agent's permissions in agent mode, else the host's."""
        if self._agent_access:
            return self._access()
        if not self._sb.id_base:
            return contextlib.nullcontext()
        return _creating_as(*self._agent())

    def _access(self) -> contextlib.AbstractContextManager:
        """Opening existing paths: as the agent in agent mode, else as the host."""
        return _acting_as(*self._agent()) if self._agent_access else contextlib.nullcontext()

    def _root(self) -> int:
        # Opened per call: a reset mounts a new root, so a cached fd would go stale.
        try:
            return os.open(str(self._sb.root_dir()), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise SandboxError(f"sandbox {self._sb.id}: root not reachable: {e}") from None

    def _norm(self, path: str) -> str:
        if "\0" in path:
            raise PathOutsideSandbox(f"path contains a NUL byte: {path!r}")
        if not path.startswith("/"):
            path = f"{self._sb.config.workdir.rstrip('/')}/{path}"
        return path

    def _open(self, path: str, flags: int, resolve: int, mode: int = 0) -> int:
        root = self._root()
        try:
            with self._access():
                return openat2(root, self._norm(path), flags, mode, resolve)
        except OSError as e:
            if e.errno == 18:  # EXDEV: the path crossed into another mount
                raise PathOutsideSandbox(f"{path}: not on the sandbox's writable filesystem") from None
            if e.errno == 40 and resolve & RESOLVE_NO_MAGICLINKS:  # ELOOP
                raise PathOutsideSandbox(f"{path}: goes through a link that leaves the sandbox") from None
            raise
        finally:
            os.close(root)

    def read(self, path: str, max_bytes: int | None = None) -> bytes:
        fd = self._open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK, _READ)
        try:
            st = os.fstat(fd)
            if not _stat.S_ISREG(st.st_mode):
                raise PathOutsideSandbox(f"{path}: not a regular file")
            if _fs_type(fd) in (_PROC_SUPER_MAGIC, _SYSFS_MAGIC):
                raise PathOutsideSandbox(f"{path}: pseudo filesystem, not readable through the file API")
            chunks = []
            remaining = st.st_size if max_bytes is None else min(st.st_size, max_bytes)
            while remaining > 0:
                chunk = os.read(fd, min(remaining, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def write(self, path: str, data: bytes | str, mode: int = 0o644, make_parents: bool = True) -> None:
        if isinstance(data, str):
            data = data.encode()
        full = self._norm(path)
        parent, _, name = full.rstrip("/").rpartition("/")
        if not name or name in (".", ".."):
            raise PathOutsideSandbox(f"{path}: not a file name")
        pfd = self._dir(parent or "/", make_parents)
        try:
            with self._as_agent():
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
                             | os.O_NONBLOCK, mode, dir_fd=pfd)
        except OSError as e:
            os.close(pfd)
            if e.errno == 40:
                raise PathOutsideSandbox(f"{path}: is a symlink; refusing to write through it") from None
            raise
        try:
            st = os.fstat(fd)
            if not _stat.S_ISREG(st.st_mode):
                raise PathOutsideSandbox(f"{path}: not a regular file")
            if not self._agent_access:  # the agent's access creates it as the agent already
                os.fchown(fd, *self._agent())
            if not self._agent_access or st.st_uid == self._agent()[0]:  # the agent chmods its own only
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
            os.close(pfd)

    def _dir(self, path: str, make: bool) -> int:
        """An O_PATH fd of a directory, creating missing components as the agent's."""
        try:
            return self._open(path, os.O_PATH | os.O_DIRECTORY, _WRITE)
        except FileNotFoundError:
            if not make:
                raise
        parent, _, name = path.rstrip("/").rpartition("/")
        pfd = self._dir(parent or "/", make)
        try:
            try:
                with self._as_agent():
                    os.mkdir(name, 0o755, dir_fd=pfd)
                if not self._agent_access:
                    os.chown(name, *self._agent(), dir_fd=pfd, follow_symlinks=False)
            except FileExistsError:
                pass
            with self._access():
                return openat2(pfd, name, os.O_PATH | os.O_DIRECTORY, 0, _WRITE | RESOLVE_NO_SYMLINKS)
        finally:
            os.close(pfd)

    def stat(self, path: str) -> FileInfo:
        fd = self._open(path, os.O_PATH | os.O_NOFOLLOW, _READ)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        full = self._norm(path)
        return FileInfo.from_stat(full, full.rstrip("/").rpartition("/")[2] or "/", st, self._sb.sandbox_id(st.st_uid))

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except FileNotFoundError:
            return False

    def list(self, path: str = ".") -> list[FileInfo]:
        fd = self._open(path, os.O_RDONLY | os.O_DIRECTORY, _READ)
        full = self._norm(path).rstrip("/")
        try:
            out = []
            with self._access():
                names = sorted(os.listdir(fd))
            for name in names:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                out.append(FileInfo.from_stat(f"{full}/{name}", name, st, self._sb.sandbox_id(st.st_uid)))
            return out
        finally:
            os.close(fd)
