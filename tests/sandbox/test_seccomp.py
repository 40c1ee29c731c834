"""Tests of the seccomp-BPF filter builder.

Two layers: a small classic-BPF interpreter runs the programs of both arches on synthetic
`seccomp_data` (so the aarch64 program is checked on any host), and child processes load the
host's program into the real kernel and try what an agent would do.
"""

from __future__ import annotations

import json
import platform
import re
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tryloop.errors import HostUnsupported
from tryloop.sandbox import seccomp
from tryloop.sandbox.seccomp import (
    ALLOWED,
    NOTABLY_DENIED,
    SYSCALLS,
    build_filter,
    describe,
    filter_length,
)

AUDIT = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
ALLOW = 0x7FFF0000
KILL_PROCESS = 0x80000000
EPERM = 0x00050000 | 1
ENOSYS = 0x00050000 | 38
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
# What glibc's pthread_create passes: VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|PARENT_SETTID|
# CHILD_CLEARTID; and fork: CHILD_SETTID|CHILD_CLEARTID|SIGCHLD.
THREAD_FLAGS = 0x003D0F00
FORK_FLAGS = 0x01200011


def run_bpf(prog: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """Evaluate a classic-BPF seccomp program the way the kernel does (for the opcodes we use)."""
    padded = (*args, *(0,) * (6 - len(args)))
    data = struct.pack("<IIQ6Q", nr & 0xFFFFFFFF, arch, 0, *padded)
    insns = list(struct.iter_unpack("<HBBI", prog))
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x54:  # and #k
            acc &= k
        elif code == 0x06:  # ret #k
            return k
        elif code == 0x05:  # ja k
            pc += k
        elif code in (0x15, 0x35, 0x45):  # jeq / jge / jset
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        else:
            raise AssertionError(f"unexpected opcode {code:#x} at {pc}")
        pc += 1


# --- building -------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_program_shape(arch: str) -> None:
    prog = build_filter(arch=arch)
    n = filter_length(prog)
    assert len(prog) == 8 * n
    assert 20 < n < 4096
    insns = list(struct.iter_unpack("<HBBI", prog))
    assert insns[0] == (0x20, 0, 0, 4)  # ld seccomp_data.arch
    assert insns[1][0] == 0x15 and insns[1][3] == AUDIT[arch]
    assert insns[2] == (0x06, 0, 0, KILL_PROCESS)
    assert insns[-1] == (0x06, 0, 0, ENOSYS)  # the last range: numbers above the table's


def test_aliases_default_and_cache() -> None:
    assert build_filter(arch="arm64") == build_filter(arch="aarch64")
    assert build_filter(arch="amd64") == build_filter(arch="x86_64")
    if platform.machine() in seccomp.SUPPORTED_ARCHES:
        assert build_filter() == build_filter(arch=platform.machine())
    # Cached: the same object comes back whatever order or duplicates extra_deny has.
    assert build_filter(["getcwd", "getpid"], "x86_64") is build_filter(
        ("getpid", "getcwd", "getpid"), "x86_64"
    )


def test_unknown_name_is_named() -> None:
    with pytest.raises(ValueError, match="no_such_call"):
        build_filter(["getcwd", "no_such_call"], arch="x86_64")
    with pytest.raises(ValueError, match="no_such_call"):
        describe(["no_such_call"], arch="aarch64")
    with pytest.raises(TypeError):
        build_filter("getcwd", arch="x86_64")  # type: ignore[arg-type]


def test_unsupported_arch() -> None:
    with pytest.raises(HostUnsupported) as info:
        build_filter(arch="riscv64")
    assert "riscv64" in str(info.value)
    assert info.value.missing


def test_filter_length_rejects_ragged_bytes() -> None:
    with pytest.raises(ValueError):
        filter_length(b"\0" * 12)


def test_every_syscall_denied_still_fits() -> None:
    for arch, table in SYSCALLS.items():
        prog = build_filter(table, arch=arch)
        assert filter_length(prog) < 4096
        assert run_bpf(prog, table["read"], AUDIT[arch]) == EPERM
        # EPERM on clone3 would break glibc's fallback to clone, so it stays ENOSYS.
        assert run_bpf(prog, table["clone3"], AUDIT[arch]) == ENOSYS


def test_describe() -> None:
    lines = describe(["getcwd"], arch="x86_64")
    assert "mount: EPERM" in lines and "getcwd: EPERM" in lines
    assert any(line.startswith("clone:") and "CLONE_NEWUSER" in line for line in lines)
    assert any(line.startswith("clone3: ENOSYS") for line in lines)
    assert any(line.startswith("io_setup, ") and "ENOSYS" in line for line in lines)
    assert any(line.startswith("socket:") and "AF_INET6" in line for line in lines)
    assert any("does not know" in line and "ENOSYS" in line for line in lines)
    arm = describe(arch="aarch64")
    assert "iopl: EPERM" not in arm and "mbind: EPERM" in arm


def test_allow_list_is_one_source_for_both_arches() -> None:
    """Each arch's program follows ALLOWED: what the arch has of it is allowed, the rest of
    its table denied, so adding a name to the list opens it on every arch at once."""
    for arch in seccomp.SUPPORTED_ARCHES:
        v = seccomp.verdicts(arch=arch)
        assert set(v) == set(SYSCALLS[arch])
        allowed = {n for n, x in v.items() if x in ("allow", "rule")}
        assert allowed == (set(ALLOWED) | set(seccomp.ARG_RULES)) & set(SYSCALLS[arch]), arch
        assert not allowed & set(NOTABLY_DENIED), arch
    # The names both arches have get the same verdict on both.
    x86, arm = seccomp.verdicts(arch="x86_64"), seccomp.verdicts(arch="aarch64")
    assert {n: x86[n] for n in arm} == arm


# --- syscall tables ---------------------------------------------------------------------------


def test_spot_numbers() -> None:
    x86, arm = SYSCALLS["x86_64"], SYSCALLS["aarch64"]
    expect_x86 = {"mount": 165, "umount2": 166, "ptrace": 101, "unshare": 272, "setns": 308,
                  "bpf": 321, "clone": 56, "clone3": 435, "ioctl": 16, "socket": 41,
                  "getcwd": 79, "open_tree_attr": 467}  # fmt: skip
    expect_arm = {"mount": 40, "umount2": 39, "ptrace": 117, "unshare": 97, "setns": 268,
                  "bpf": 280, "clone": 220, "clone3": 435, "ioctl": 29, "socket": 198,
                  "getcwd": 17, "open_tree_attr": 467}  # fmt: skip
    assert {n: x86[n] for n in expect_x86} == expect_x86
    assert {n: arm[n] for n in expect_arm} == expect_arm
    for name in ("iopl", "ioperm", "uselib", "_sysctl", "create_module", "open", "fork"):
        assert name not in arm
    for name in (*NOTABLY_DENIED, *ALLOWED):
        assert name in x86 or name in arm, name


def _header_defines(path: Path) -> dict[str, int]:
    text = path.read_text()
    return {m[1]: int(m[2]) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)\b", text)}


@pytest.mark.parametrize(
    ("arch", "header"),
    [
        ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
        ("aarch64", "/usr/include/asm-generic/unistd.h"),
    ],
)
def test_table_matches_installed_header(arch: str, header: str) -> None:
    path = Path(header)
    if not path.exists():
        pytest.skip(f"{header} not installed")
    defines = _header_defines(path)
    defines.pop("syscalls", None)  # __NR_syscalls is a count
    defines.pop("arch_specific_syscall", None)  # a base number, not a syscall
    table = SYSCALLS[arch]
    wrong = {n: (table[n], v) for n, v in defines.items() if n in table and table[n] != v}
    assert not wrong
    if arch == "x86_64":
        assert set(defines) <= set(table)  # nothing the header has is missing


# --- program semantics, both arches -----------------------------------------------------------


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_semantics(arch: str) -> None:
    prog = build_filter(arch=arch)
    t, audit = SYSCALLS[arch], AUDIT[arch]

    def verdict(name: str, *args: int) -> int:
        return run_bpf(prog, t[name], audit, args)

    other = AUDIT["aarch64" if arch == "x86_64" else "x86_64"]
    assert run_bpf(prog, t["read"], other) == KILL_PROCESS
    assert run_bpf(prog, t["read"], 0x40000003) == KILL_PROCESS  # i386
    for name in NOTABLY_DENIED:
        if name in t:
            assert verdict(name) == EPERM, name
    for name in set(ALLOWED) & set(t):
        assert verdict(name) == ALLOW, name
    # Every number of the table that is neither allowed nor ruled is EPERM ...
    known = set(t.values())
    for name, nr in t.items():
        if name not in ALLOWED and name not in seccomp.ARG_RULES and name != "clone3" and name not in seccomp.AIO:
            assert run_bpf(prog, nr, audit) == EPERM, name
    # ... and every number it does not know is ENOSYS: holes, the future, x32, garbage.
    unknown = [n for n in range(0, 1100) if n not in known]
    assert unknown and all(run_bpf(prog, n, audit) == ENOSYS for n in unknown)
    for nr in (max(known) + 1, 0x40000000 | t["getpid"], 0x7FFFFFFF, 0xFFFFFFFF):
        assert run_bpf(prog, nr, audit) == ENOSYS, hex(nr)

    assert verdict("clone", FORK_FLAGS) == ALLOW
    assert verdict("clone", THREAD_FLAGS) == ALLOW
    assert verdict("clone", FORK_FLAGS | CLONE_NEWUSER) == EPERM
    assert verdict("clone", CLONE_NEWNET) == EPERM
    assert verdict("clone", CLONE_NEWNS | (1 << 40)) == EPERM
    assert verdict("clone3") == ENOSYS
    # Linux AIO: one host-wide pool of contexts; ENOSYS, as on a kernel without it.
    for name in seccomp.AIO:
        assert name not in ALLOWED and verdict(name) == ENOSYS, name

    assert verdict("ioctl", 1, 0x5412) == EPERM  # TIOCSTI
    assert verdict("ioctl", 1, 0x541C) == EPERM  # TIOCLINUX
    assert verdict("ioctl", 1, (1 << 32) | 0x5412) == EPERM  # the kernel ignores the high half
    assert verdict("ioctl", 1, 0x5401) == ALLOW  # TCGETS

    assert verdict("socket", 1, 1) == ALLOW  # AF_UNIX, SOCK_STREAM
    assert verdict("socket", 1, 5 | 0x80000) == ALLOW  # AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC
    assert verdict("socket", 2, 1) == ALLOW  # AF_INET, SOCK_STREAM
    assert verdict("socket", 2, 2 | 0x800) == ALLOW  # AF_INET, SOCK_DGRAM | SOCK_NONBLOCK
    assert verdict("socket", 10, 1) == ALLOW  # AF_INET6
    assert verdict("socket", 2, 10 | 0x80000) == EPERM  # AF_INET, SOCK_PACKET | SOCK_CLOEXEC
    for family in (16, 17, 38, 40, 0, 3, 4, 5, 9, 15, 29, 30, 42, 44, 45, 1 << 16):
        # netlink, packet, alg, vsock, unspec, ax25, ipx, appletalk, x25, key, can, tipc,
        # qipcrtr, xdp, mctp, and garbage in the high half of the low word
        assert verdict("socket", family, 2) == EPERM, family
    assert verdict("socket", (1 << 32) | 16, 3) == EPERM  # the kernel reads an int
    assert verdict("socketpair", 1, 1) == ALLOW
    assert verdict("socketpair", 2, 1) == EPERM
    assert verdict("socketpair", 16, 3) == EPERM

    assert verdict("personality", 0xFFFFFFFF) == ALLOW
    assert verdict("personality", 0) == ALLOW
    assert verdict("personality", 0x0040000) == EPERM  # ADDR_NO_RANDOMIZE


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_build_variant_differs_only_in_socket_families(arch: str) -> None:
    """Build sandboxes: a family outside unix/inet/inet6 fails with EAFNOSUPPORT (useradd
    carries on as on a kernel without audit), still never opens; everything else as for
    every sandbox."""
    t, audit = SYSCALLS[arch], AUDIT[arch]
    plain, build = build_filter(arch=arch), build_filter(arch=arch, build=True)
    eafnosupport = 0x00050000 | 97
    for family, typ, proto in ((16, 3, 9), (16, 3, 0), (17, 3, 0), (40, 1, 0), (38, 5, 0)):
        assert run_bpf(build, t["socket"], audit, (family, typ, proto)) == eafnosupport, family
        assert run_bpf(plain, t["socket"], audit, (family, typ, proto)) == EPERM, family
    assert run_bpf(build, t["socket"], audit, (2, 10)) == EPERM  # AF_INET, SOCK_PACKET
    for family in (1, 2, 10):
        assert run_bpf(build, t["socket"], audit, (family, 1)) == ALLOW
    for name, nr in t.items():
        if name != "socket":
            assert run_bpf(build, nr, audit, (FORK_FLAGS,)) == run_bpf(plain, nr, audit, (FORK_FLAGS,)), name


def test_extra_deny_semantics() -> None:
    prog = build_filter(["getcwd", "clone", "open"], arch="aarch64")  # aarch64 has no open
    t, audit = SYSCALLS["aarch64"], AUDIT["aarch64"]
    assert run_bpf(prog, t["getcwd"], audit) == EPERM
    assert run_bpf(prog, t["clone"], audit, (FORK_FLAGS,)) == EPERM  # plain deny wins
    assert run_bpf(prog, t["getpid"], audit) == ALLOW


# --- the real kernel --------------------------------------------------------------------------

HOST = platform.machine()
needs_kernel = pytest.mark.skipif(
    sys.platform != "linux"
    or HOST not in SYSCALLS
    or "Seccomp:" not in Path("/proc/self/status").read_text(),
    reason="needs Linux with seccomp on a supported arch",
)

# Runs in a child: load the filter (unless "none"), try things, print {check: "ok" | errno}.
CHILD = r"""
import ctypes, errno, fcntl, json, os, socket, subprocess, sys, termios, threading
path, nr, workdir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ul, sl = ctypes.c_ulong, ctypes.c_long

class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

if path != "none":
    data = open(path, "rb").read()
    buf = ctypes.create_string_buffer(data, len(data))
    fprog = SockFprog(len(data) // 8, ctypes.addressof(buf))
    if libc.prctl(38, ul(1), ul(0), ul(0), ul(0)):  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if libc.prctl(22, ul(2), ctypes.byref(fprog), ul(0), ul(0)):  # PR_SET_SECCOMP, FILTER
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")

def err(e):
    return errno.errorcode.get(e, str(e))

def raw(*args):
    r = libc.syscall(*[sl(a) for a in args])
    return "ok" if r != -1 else err(ctypes.get_errno())

def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return err(e.errno)

def clone_newuser():
    # Raw clone: if the filter let it through, the child must leave at once.
    r = libc.syscall(sl(nr["clone"]), sl(0x10000000 | 17), sl(0), sl(0), sl(0), sl(0))
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)
        return "ok"
    return err(ctypes.get_errno())

def mount():
    # The target does not exist: unfiltered this is ENOENT for anyone, filtered EPERM.
    r = libc.mount(b"none", b"/nonexistent-tryloop/x", b"tmpfs", ul(0), None)
    if r:
        raise OSError(ctypes.get_errno(), "mount")

def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7

def thread():
    box = []
    t = threading.Thread(target=box.append, args=(1,))
    t.start()
    t.join()
    assert box == [1]

def write_file():
    p = os.path.join(workdir, "f.txt")
    with open(p, "w") as f:
        f.write("hi")
    assert open(p).read() == "hi"

def sock(*args):
    return lambda: socket.socket(*args).close()

master, slave = os.openpty()

def tiocsti_high():
    c = ctypes.c_char(b"x")
    r = libc.syscall(sl(nr["ioctl"]), sl(slave), sl((1 << 32) | 0x5412), ctypes.byref(c))
    if r == -1:
        raise OSError(ctypes.get_errno(), "ioctl")

def personality(p):
    def call():
        if libc.personality(ul(p)) == -1:
            raise OSError(ctypes.get_errno(), "personality")
    return call

out = {
    "unshare_newns": raw(nr["unshare"], 0x00020000),
    "mount": attempt(mount),
    "clone_newuser": clone_newuser(),
    "clone3": raw(nr["clone3"], 0, 0),
    "x32_getpid": raw(0x40000000 | nr["getpid"]),
    "fork": attempt(fork),
    "thread": attempt(thread),
    "subprocess": attempt(lambda: subprocess.run(["true"], check=True)),
    "write_file": attempt(write_file),
    "getcwd": attempt(os.getcwd),
    "socket_inet": attempt(sock(socket.AF_INET, socket.SOCK_STREAM)),
    "socket_inet6": attempt(sock(socket.AF_INET6, socket.SOCK_DGRAM)),
    "socket_unix": attempt(sock(socket.AF_UNIX, socket.SOCK_STREAM)),
    "socketpair_unix": attempt(lambda: [s.close() for s in socket.socketpair()]),
    "socket_netlink": attempt(sock(socket.AF_NETLINK, socket.SOCK_RAW, 0)),
    "socket_vsock": attempt(sock(40, socket.SOCK_STREAM)),
    "socket_alg": attempt(sock(38, socket.SOCK_SEQPACKET)),
    "get_mempolicy": raw(nr["get_mempolicy"], 0, 0, 0, 0, 0),
    "unknown_syscall": raw(nr["unknown"]),
    "getaddrinfo": attempt(lambda: socket.getaddrinfo("localhost", 80, flags=socket.AI_ADDRCONFIG)),
    "socket_packet": attempt(sock(socket.AF_PACKET, socket.SOCK_RAW)),
    "socket_inet_sock_packet": attempt(sock(socket.AF_INET, 10)),
    "tiocsti": attempt(lambda: fcntl.ioctl(slave, termios.TIOCSTI, b"x")),
    "tiocsti_high": attempt(tiocsti_high),
    "tiocgwinsz": attempt(lambda: fcntl.ioctl(slave, termios.TIOCGWINSZ, b"\0" * 8)),
    "personality_query": attempt(personality(0xFFFFFFFF)),
    "personality_norandom": attempt(personality(0x0040000)),
}
print(json.dumps(out))
"""


def _run_child(tmp_path: Path, prog: bytes | None) -> subprocess.CompletedProcess[str]:
    path = "none"
    if prog is not None:
        (tmp_path / "filter.bpf").write_bytes(prog)
        path = str(tmp_path / "filter.bpf")
    numbers = {n: SYSCALLS[HOST][n] for n in ("unshare", "clone", "clone3", "ioctl", "getpid",
                                             "get_mempolicy")}
    numbers["unknown"] = max(SYSCALLS[HOST].values()) + 17  # a syscall of some future kernel
    return subprocess.run(
        [sys.executable, "-c", CHILD, path, json.dumps(numbers), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )


def _results(tmp_path: Path, prog: bytes | None) -> dict[str, str]:
    proc = _run_child(tmp_path, prog)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@needs_kernel
def test_kernel_enforces_default_filter(tmp_path: Path) -> None:
    r = _results(tmp_path, build_filter())
    denied = ["unshare_newns", "mount", "clone_newuser", "socket_packet",
              "socket_inet_sock_packet", "tiocsti", "tiocsti_high", "personality_norandom",
              "socket_netlink", "socket_vsock", "socket_alg", "get_mempolicy"]  # fmt: skip
    allowed = ["fork", "thread", "subprocess", "write_file", "getcwd", "socket_inet",
               "socket_inet6", "socket_unix", "socketpair_unix", "tiocgwinsz",
               "personality_query", "getaddrinfo"]  # fmt: skip
    assert {k: r[k] for k in denied} == dict.fromkeys(denied, "EPERM")
    assert {k: r[k] for k in allowed} == dict.fromkeys(allowed, "ok")
    assert r["clone3"] == r["unknown_syscall"] == r["x32_getpid"] == "ENOSYS"


@needs_kernel
def test_kernel_without_filter_differs(tmp_path: Path) -> None:
    """Control: the same probes unfiltered, so the EPERMs above are the filter's doing."""
    r = _results(tmp_path, None)
    assert r["mount"] == "ENOENT"
    assert r["clone3"] == "EINVAL"  # size 0 is rejected; the filter answers ENOSYS first
    assert r["getcwd"] == "ok"
    assert r["personality_query"] == "ok"
    assert r["socket_netlink"] == "ok"
    assert r["get_mempolicy"] != "EPERM"


@needs_kernel
def test_kernel_extra_deny(tmp_path: Path) -> None:
    r = _results(tmp_path, build_filter(["getcwd"]))
    assert r["getcwd"] == "EPERM"
    assert r["fork"] == r["thread"] == r["write_file"] == "ok"


@needs_kernel
def test_kernel_kills_foreign_arch(tmp_path: Path) -> None:
    foreign = "aarch64" if HOST == "x86_64" else "x86_64"
    proc = _run_child(tmp_path, build_filter(arch=foreign))
    assert proc.returncode == -signal.SIGSYS
