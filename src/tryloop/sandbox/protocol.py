"""Wire format between the host and a sandbox's init (see native/tlinit.c)."""

from __future__ import annotations

import struct
from typing import NamedTuple

PROTO_VERSION = 1

REQ = struct.Struct("=8I4Q")  # op id flags timeout_ms nargs nenv uid gid | nofile fsize cpu sig
RSP = struct.Struct("=2I2i2I6Q")  # op id status err stage flags | pid wall utime stime maxrss extra

OP_EXEC, OP_KILL, OP_RESET, OP_PING, OP_ROTATE, OP_EXPORT = 1, 2, 3, 4, 5, 6
(R_PID, R_READY, R_STARTED, R_FAILED, R_EXIT, R_RESET, R_PONG, R_FATAL, R_EXPIRED, R_ZYGOTE,
 R_ROTATED, R_EXPORT) = range(1, 13)
# R_ZYGOTE carries (SCM_RIGHTS) the host's end of a new zygote's socket: exec requests go
# there directly, one hop shorter than through the init; the init still reaps and reports.
# OP_ROTATE (a fork without a copy) makes the writable layer a lower layer; R_ROTATED's pid
# field is its number and its flags the init's generation (resets so far; R_RESET's pid
# field), err EBUSY if the sandbox was not quiescent. OP_EXPORT (number in `sig`, generation
# in `flags`) answers R_EXPORT carrying a read-only detached mount of that layer, or ESTALE.

F_STDIN, F_STDOUT, F_STDERR, F_MERGE, F_QUIET = 1, 2, 4, 8, 16  # F_QUIET: no start report
X_TIMEDOUT, X_RESET, X_EXPIRED = 1, 2, 4

STAGES = [
    "none", "config", "cgroup", "unshare", "fork", "mount", "pivot_root", "network",
    "seccomp-load", "chroot", "rlimit", "capabilities", "setuid", "cwd", "no_new_privs",
    "seccomp", "exec", "fds", "too-many-processes", "reset", "user-namespace",
]
S_CWD = STAGES.index("cwd")
S_EXEC = STAGES.index("exec")


def stage_name(stage: int) -> str:
    return STAGES[stage] if 0 <= stage < len(STAGES) else f"stage-{stage}"


class Reply(NamedTuple):  # a tuple: built once per reply, on the exec path
    op: int
    id: int
    status: int
    err: int
    stage: int
    flags: int
    pid: int
    wall_ns: int
    utime_us: int
    stime_us: int
    maxrss_kb: int
    extra: int

    @classmethod
    def decode(cls, data: bytes) -> Reply:
        return cls(*RSP.unpack_from(data))


def encode_config(items: list[tuple[str, str]]) -> bytes:
    out = bytearray()
    for key, value in items:
        if "\0" in key or "\0" in value:
            raise ValueError(f"config value for {key!r} contains a NUL byte")
        out += key.encode() + b"\0" + value.encode() + b"\0"
    return bytes(out)


def _strings(strings: list[str]) -> bytes:
    for s in strings:
        if "\0" in s:
            raise ValueError(f"argument, environment or cwd contains a NUL byte: {s!r}")
    return b"".join(s.encode("utf-8", "surrogateescape") + b"\0" for s in strings)


def encode_env(env: dict[str, str]) -> tuple[int, bytes]:
    """An environment as exec requests carry it; a sandbox encodes its own once."""
    return len(env), _strings([f"{k}={v}" for k, v in env.items()])


def encode_exec(
    exec_id: int, *, argv: list[str], env: dict[str, str] | tuple[int, bytes], cwd: str, flags: int,
    timeout_ms: int, uid: int, gid: int, nofile: int, fsize: int, cpu: int,
) -> bytes:
    nenv, env_bytes = env if isinstance(env, tuple) else encode_env(env)
    head = REQ.pack(OP_EXEC, exec_id, flags, timeout_ms, len(argv), nenv, uid, gid,
                    nofile, fsize, cpu, 0)
    return head + _strings([cwd, *argv]) + env_bytes


def encode_simple(op: int, req_id: int = 0, sig: int = 0, flags: int = 0) -> bytes:
    return REQ.pack(op, req_id, flags, 0, 0, 0, 0, 0, 0, 0, 0, sig)
