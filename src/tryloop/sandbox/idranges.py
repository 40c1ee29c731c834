"""Host-wide registry of the id ranges that sandboxes' user namespaces map to.

Each sandbox with a user namespace sees ids 0..65535 that are, on the host, one range
of 65536 ids from `first` up (2**31 by default: far above any host user, below the
invalid id 2**32 - 1). Two sandboxes must never share a range, not even two of
different runtimes or processes: one file per range in use, named by its first host
id and created with O_EXCL, lets the kernel arbitrate (ranges start at multiples of
65536, so runtimes configured with different `first` still never overlap). The file names its owner (the runtime's pid and start time) and,
once started, the sandbox's init, so a range whose owner and init are both dead (a
crashed runtime) is reclaimed by the next runtime's gc. The directory is on /run (a
tmpfs): after a reboot nothing is in use, and nothing is.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from pathlib import Path

from tryloop.errors import SandboxError

#: Ids per sandbox: 0..65535 inside, the classic container range (nobody is 65534).
RANGE = 1 << 16
_LAST_ID = (1 << 32) - 2  # (uid_t)-1 is "no id" to the kernel


def start_time(pid: int) -> int | None:
    """Kernel start time of a process (clock ticks since boot), to tell pids apart after reuse."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2:].split()[19])


def _alive(pid: int | None, started: int | None) -> bool:
    """Whether the process that had this pid and start time still runs (a zombie does not:
    an init that exited has no process left in its namespaces, even before it is reaped)."""
    if not pid or started is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    fields = data[data.rindex(b")") + 2:].split()
    return fields[0] not in (b"Z", b"X") and int(fields[19]) == started


class IdRanges:
    """Claims, releases and reclaims id ranges in the registry `directory`."""

    def __init__(self, directory: Path, first: int, owner: tuple[int, int | None]):
        if first < RANGE or first + RANGE - 1 > _LAST_ID or first % RANGE:
            raise ValueError(f"id range start {first}: not a multiple of {RANGE} in [{RANGE}, {_LAST_ID - RANGE + 1}]")
        self.dir = Path(directory)
        self.first = first
        self.count = (_LAST_ID + 1 - first) // RANGE
        self.owner = owner
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Whoever can write the registry can make two sandboxes share ids: only its owner.
        st = self.dir.stat()
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise SandboxError(f"id range registry {self.dir} must belong to uid {os.geteuid()} and be "
                               f"writable by it alone (owner {st.st_uid}, mode {st.st_mode & 0o777:o})")
        # Start the search at a random range: concurrent runtimes rarely probe the same files.
        self._next = secrets.randbelow(self.count)

    def _path(self, base: int) -> Path:
        return self.dir / str(base)

    def claim(self, sandbox: str) -> int:
        """Reserve a free range for `sandbox`; returns its first host id (the host's number
        of the sandbox's root)."""
        # One snapshot of the start: threads of this runtime move `_next` while we probe,
        # and re-reading it could skip the one range still free.
        start = self._next
        for i in range(self.count):
            index = (start + i) % self.count
            base = self.first + index * RANGE
            try:
                fd = os.open(self._path(base), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                continue
            try:
                doc = {"owner_pid": self.owner[0], "owner_start": self.owner[1], "sandbox": sandbox}
                os.write(fd, json.dumps(doc).encode() + b"\n")
            finally:
                os.close(fd)
            self._next = (index + 1) % self.count
            return base
        raise SandboxError(f"all {self.count} id ranges in {self.dir} are in use")

    def started(self, base: int, sandbox: str, init_pid: int) -> None:
        """Record the sandbox's init: the range stays taken while it lives, whatever its owner.

        Appended as a second line, never rewritten: a file truncated and written again
        makes ext4 (where /run may live) allocate its blocks at once, and unlinking it
        then costs milliseconds.
        """
        fd = os.open(self._path(base), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            doc = {"init_pid": init_pid, "init_start": start_time(init_pid)}
            os.write(fd, json.dumps(doc).encode() + b"\n")
        finally:
            os.close(fd)

    def release(self, base: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(base))

    def in_use(self) -> dict[int, dict]:
        """Every claimed range (by first host id) and what its file says (unreadable: {})."""
        out: dict[int, dict] = {}
        for entry in os.scandir(self.dir):
            if entry.name.isdigit():
                doc: dict = {}
                try:
                    for line in Path(entry.path).read_bytes().splitlines():
                        doc.update(json.loads(line))
                except (OSError, ValueError):
                    doc = {}
                out[int(entry.name)] = doc
        return out

    def reclaim_dead(self) -> list[int]:
        """Release the ranges whose owner and init are both gone; returns their first ids.

        A file that cannot be read is a claim caught between create and write: left alone
        for a minute, then taken for the leftover of a runtime that crashed right there.
        """
        freed = []
        for base, doc in self.in_use().items():
            if not doc:
                with contextlib.suppress(FileNotFoundError):
                    if time.time() - self._path(base).stat().st_mtime > 60:
                        self.release(base)
                        freed.append(base)
                continue
            if _alive(doc.get("owner_pid"), doc.get("owner_start")):
                continue
            if _alive(doc.get("init_pid"), doc.get("init_start")):
                continue
            self.release(base)
            freed.append(base)
        return freed
