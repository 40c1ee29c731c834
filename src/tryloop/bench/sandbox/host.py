"""Probes of the host (memory, slabs, fds, mounts, processes) and the baselines' runners."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tryloop.bench.sandbox.common import BWRAP_ARGS, WS_BYTES, BenchError


def meminfo() -> dict[str, int]:
    """/proc/meminfo in KiB."""
    out: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0])
    return out


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, RssAnon) of a process in KiB; VmRSS counts shared file pages in every process."""
    rss = anon = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1])
    except OSError:
        pass
    return rss, anon


def _cpu_times() -> tuple[int, int]:
    """(total, idle + iowait) jiffies of all CPUs."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v), v[3] + v[4]


async def settle(max_wait: float = 3.0, quiet: float = 0.25) -> float:
    """Wait (at most `max_wait` s) for a 100 ms window in which the host's CPUs are at most
    `quiet` busy, so a row does not start in the kernel cleanup of the last one; returns
    the busy fraction of the last window (others' load shows up here too)."""
    deadline = time.monotonic() + max_wait
    while True:
        a = _cpu_times()
        await asyncio.sleep(0.1)
        b = _cpu_times()
        busy = 1 - (b[1] - a[1]) / max(1, b[0] - a[0])
        if busy <= quiet or time.monotonic() > deadline:
            return busy


def scratch_dir() -> Path:
    """A temp dir on tmpfs when there is room (copies there are the fastest a copy-based
    system could do, so the copy baselines are the toughest), else in the default temp dir."""
    shm = Path("/dev/shm")
    with contextlib.suppress(OSError):
        st = os.statvfs(shm)
        with open("/proc/self/mounts") as f:
            on_tmpfs = any(line.split()[1] == str(shm) and line.split()[2] == "tmpfs" for line in f)
        if on_tmpfs and st.f_bavail * st.f_frsize > 8 * WS_BYTES:
            return Path(tempfile.mkdtemp(prefix="tryloop-bench-", dir=shm))
    return Path(tempfile.mkdtemp(prefix="tryloop-bench-"))


def slab_bytes() -> dict[str, int]:
    """Bytes held by each slab cache (/proc/slabinfo, root only); {} when unreadable."""
    out: dict[str, int] = {}
    try:
        with open("/proc/slabinfo") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 3 and parts[1].isdigit():
                    out[parts[0]] = int(parts[2]) * int(parts[3])  # num_objs * objsize
    except OSError:
        pass
    return out


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def mount_count() -> int:
    with open("/proc/self/mounts") as f:
        return sum(1 for _ in f)


def processes_running(path: Path) -> set[int]:
    """Pids whose executable (or argv[0], where exe cannot be read) is `path`."""
    want = str(path)
    found: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            exe = os.readlink(f"/proc/{name}/exe")
        except OSError:
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    exe = f.read().split(b"\0", 1)[0].decode(errors="replace")
            except OSError:
                continue
        if exe == want or exe.removesuffix(" (deleted)") == want:
            found.add(int(name))
    return found


def code_version() -> dict[str, Any]:
    """The git commit of this checkout and whether the sandbox code differs from it
    (the numbers belong to the code that ran); {} outside a git checkout."""
    root = Path(__file__).resolve().parents[4]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "src/tryloop/sandbox"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {"git_head": head, "sandbox_code_modified": bool(dirty)}


def zombie_children(comm: str | None = None) -> list[int]:
    """Exited children of this process nobody has reaped (optionally only those named
    `comm`). Sandbox inits are children of this process (CLONE_PARENT), so one that
    close() failed to reap shows up here."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        state, ppid = data[data.rindex(b")") + 2:].split()[:2]
        if state == b"Z" and int(ppid) == me and (
                comm is None or data[data.index(b"(") + 1:data.rindex(b")")].decode(errors="replace") == comm):
            found.append(int(name))
    return found


def spawn_wait(path: str, argv: list[str], env: dict[str, str]) -> float:
    """posix_spawn + waitpid; seconds. Raises BenchError on a non-zero exit."""
    t0 = time.perf_counter()
    pid = os.posix_spawn(path, argv, env)
    _, status = os.waitpid(pid, 0)
    dt = time.perf_counter() - t0
    if status != 0:
        raise BenchError(f"{' '.join(argv[:3])}...: exit status {os.waitstatus_to_exitcode(status)}")
    return dt


def timed_run(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - t0


def bwrap_check() -> tuple[str | None, str]:
    """(path of bwrap or None, version or why it is unusable)."""
    path = shutil.which("bwrap")
    if path is None:
        return None, "bwrap not installed (apt-get install -y bubblewrap)"
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout.strip()
        subprocess.run([path, *BWRAP_ARGS], capture_output=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"bwrap does not run here: {e}"
    return path, version


def ensure_headroom(n: int) -> list[str]:
    """Raise RLIMIT_NOFILE for `n` live sandboxes (3 fds each) and check pids; notes on what was done."""
    notes: list[str] = []
    need = 3 * n + fd_count() + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(hard, need)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        notes.append(f"RLIMIT_NOFILE raised {soft} -> {new}")
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft < need:
        raise BenchError(f"density {n} needs ~{need} open files; RLIMIT_NOFILE hard limit is {hard} "
                         "(raise it with ulimit -n, or lower --density)")
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    running = sum(1 for p in os.listdir("/proc") if p.isdigit())
    if running + n + 256 > pid_max:
        raise BenchError(f"density {n}: {running} processes running and pid_max is {pid_max} "
                         "(raise kernel.pid_max, or lower --density)")
    return notes
