"""What every part of the sandbox benchmark shares: row keys, sizes, workspace shape."""

from __future__ import annotations

from dataclasses import dataclass

from tryloop.errors import TryloopError

#: Keys of the latency rows, in the order they run and print.
LATENCY_ROWS = ("cold_create", "warm_acquire", "exec_true", "exec_python", "reset", "fork", "teardown")
#: Counts the leak check reports; every one must be 0.
LEAK_CHECKS = ("live_sandboxes", "cgroups", "init_processes", "zombie_children", "fds", "mounts", "records")

BWRAP_ARGS = [
    "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
    "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/lib", "/lib", "--symlink", "usr/bin", "/bin",
    "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "/bin/true",
]

WS_FILES = 2000
WS_BYTES = 50 << 20
WS_DIRS = 40
POOL_SIZE = 8
DENSITY_CONCURRENCY = 8


class BenchError(TryloopError):
    """A benchmark step did not do what it claims to measure (a failed command, a wrong state)."""


@dataclass(frozen=True)
class Sizes:
    """Samples per row. The copy baselines (0.1–1 s each) take `copies` samples, spread over the row."""

    cold: int
    warm: int
    exec_true: int
    exec_python: int
    reset: int
    fork: int
    copies: int
    density: int
    cycles: int


FULL = Sizes(cold=500, warm=500, exec_true=1500, exec_python=100, reset=500, fork=100, copies=20,
             density=1000, cycles=10_000)
QUICK = Sizes(cold=40, warm=40, exec_true=200, exec_python=8, reset=40, fork=8, copies=3,
              density=100, cycles=500)
