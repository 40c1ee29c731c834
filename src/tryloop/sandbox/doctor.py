"""What isolation this host offers, and what a sandbox would lack.

`checks()` probes each kernel feature a sandbox relies on. `require_host()` raises
`HostUnsupported` naming everything required that is missing: tryloop never
starts a silently weaker sandbox.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from tryloop.errors import HostUnsupported


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    required: bool = True
    fix: str = ""


def _filesystems() -> set[str]:
    try:
        return {line.split()[-1] for line in Path("/proc/filesystems").read_text().splitlines() if line}
    except OSError:
        return set()


def _kernel() -> tuple[int, int]:
    parts = platform.release().split(".")
    try:
        return int(parts[0]), int(parts[1].split("-")[0])
    except (IndexError, ValueError):
        return (0, 0)


def _has_syscall_openat2() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    # openat2 with a zero-size struct: EINVAL means the syscall exists, ENOSYS means not.
    libc.syscall(437, -100, b"/", None, 0)
    return ctypes.get_errno() != 38


def _has_syscall_mount_setattr() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    # mount_setattr with a NULL attr: EINVAL/EFAULT mean the syscall exists, ENOSYS means not.
    libc.syscall(442, -100, b"/", 0, None, 0)
    return ctypes.get_errno() != 38


def checks() -> list[Check]:
    from tryloop.sandbox.cgroups import CgroupHost
    from tryloop.sandbox.native import compiler

    out: list[Check] = []
    is_root = os.geteuid() == 0
    out.append(Check("root", is_root, "running as root" if is_root else f"running as uid {os.geteuid()}",
                     fix="run as root: mounts, cgroups and uid switches need CAP_SYS_ADMIN"))
    major, minor = _kernel()
    out.append(Check("kernel >= 5.12", (major, minor) >= (5, 12), f"Linux {platform.release()}",
                     fix="close_range, pidfd_open, openat2 and mount_setattr need Linux 5.12 or newer"))
    ns_dir = Path("/proc/self/ns")
    for ns in ("mnt", "pid", "ipc", "uts", "net", "cgroup"):
        present = (ns_dir / ns).exists()
        out.append(Check(f"namespace:{ns}", present, "available" if present else "missing",
                         fix=f"kernel built without CONFIG_{ns.upper()}_NS"))
    fss = _filesystems()
    for fs in ("overlay", "tmpfs", "proc"):
        out.append(Check(f"filesystem:{fs}", fs in fss, "available" if fs in fss else "missing",
                         fix=f"modprobe {fs}" if fs == "overlay" else ""))
    seccomp_ok = Path("/proc/sys/kernel/seccomp/actions_avail").exists()
    out.append(Check("seccomp filter", seccomp_ok, "available" if seccomp_ok else "missing",
                     fix="kernel built without CONFIG_SECCOMP_FILTER"))
    arch = platform.machine()
    arch_ok = arch in ("x86_64", "amd64", "aarch64", "arm64")
    out.append(Check("seccomp tables for arch", arch_ok, arch, fix="add this architecture's syscall table"))
    out.append(Check("openat2", _has_syscall_openat2(), "confined path resolution for the file API"))
    out.append(Check("mount_setattr", _has_syscall_mount_setattr(),
                     "read-only binds that stay read-only in every submount"))
    out.append(Check("pidfd_open", hasattr(os, "pidfd_open"), "process handles immune to pid reuse"))
    try:
        cg = CgroupHost.detect()
        for ctrl, where in cg.describe():
            out.append(Check(f"cgroup:{ctrl}", where != "missing", where,
                             fix="mount the controller (cgroup v1) or enable it in cgroup.subtree_control (v2)"))
        out.append(Check("cgroup layout", cg.version != "none", cg.version, required=False))
    except Exception as e:  # detection itself failing is a finding, not a crash
        out.append(Check("cgroups", False, str(e)))
    cc = compiler()
    out.append(Check("C compiler", cc is not None, cc or "none",
                     fix="apt-get install gcc libc6-dev (builds the sandbox init once)"))
    bw = shutil.which("bwrap")
    out.append(Check("bubblewrap (benchmark baseline only)", bw is not None, bw or "not installed",
                     required=False, fix="apt-get install bubblewrap"))
    return out


def require_host() -> None:
    missing = [c for c in checks() if c.required and not c.ok]
    if missing:
        lines = "; ".join(f"{c.name} ({c.detail}{': ' + c.fix if c.fix else ''})" for c in missing)
        raise HostUnsupported(
            f"this host cannot run isolated sandboxes; missing: {lines}. "
            "Run `tryloop sandbox doctor` for the full report.",
            missing=[c.name for c in missing],
        )
