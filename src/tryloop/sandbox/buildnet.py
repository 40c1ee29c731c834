"""The network of every sandbox with network: a namespace of its own, NAT'd out, kept from the host.

A sandbox created with `SandboxConfig(network=True)` (an agent sandbox of a task with
`network = true`, `tryloop sandbox run --network`, a networked image build step) never
shares the host's network namespace. Its init gets a namespace of its own, as every
sandbox does, and the runtime then plumbs into it, before any command runs:

* a veth pair: `tlb<N>` on the host with `<pool + 4N + 1>/30`, `eth0` in the sandbox with
  `<pool + 4N + 2>/30` and a default route through the host's end; IPv6 is disabled on both
  ends. The index N is claimed by creating the interface (the kernel refuses a name that
  exists), so concurrent runtimes never share an address;
* one nftables table, `inet tryloop_build`, that tryloop creates, owns and removes. It
  matches interfaces by the `tlb*` prefix, so it is the same for every sandbox and has no
  per-sandbox rule:
  - anything a sandbox sends to an address of the host itself (any interface: the veth's
    gateway, eth0's address, a service bound to 0.0.0.0) is dropped on input;
  - forwarded traffic from a sandbox to link-local (169.254.0.0/16: cloud metadata),
    loopback, 0.0.0.0/8, multicast and reserved addresses, or to another sandbox's veth,
    is dropped; IPv6 from a sandbox is dropped;
  - a source address that does not route back through the interface it came in on is
    dropped (no spoofing), and nothing from outside opens a connection into a sandbox;
  - what is left is masqueraded out of the host's uplink: a sandbox reaches what the host
    reaches through its routes (package indexes, its upstream DNS), as the host's address.
* forwarding. Where `net.ipv4.ip_forward` is already 1 nothing changes. Otherwise IPv4
  forwarding is enabled per interface only: on each sandbox's veth and on the interfaces of the
  host's default routes (replies come in there), the uplinks' previous values recorded in
  /run/tryloop-buildnet/state.json and restored when the last sandbox network closes. While a
  sandbox with network runs, packets arriving on an uplink may be forwarded by the host (the
  host-wide side effect; the table drops any that would open a connection into a sandbox).

The veth goes when its sandbox closes, whichever way it was made (pool, fork, reset keeps
it: the namespace is the init's). The last sandbox network to close (no `tlb*` interface left) removes the table and restores
forwarding, under a host-wide lock; a crashed owner's veth goes with its sandbox's namespace
when `SandboxRuntime.gc` kills it, and the next runtime to start removes the rest.

A host that cannot do this (no `ip`, `nft` or `nsenter`, no veth or nf_tables in the
kernel, an address pool that overlaps a host route) fails the sandbox's creation
(SandboxNetworkError) with a message naming what is missing: never a silent fallback to the
host's network.

DNS: the sandbox's /etc/resolv.conf (with an /etc/hosts of its own name and the host's
entries, a layer on top of its root only, never part of a snapshot or image) keeps the
host's nameservers that a sandbox can reach (not loopback, link-local or an address of the
host). A host whose only resolver is local
(systemd-resolved's 127.0.0.53) gets the upstream servers of
/run/systemd/resolve/resolv.conf; if none is found, the sandbox fails to start and says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tryloop.errors import SandboxError

TABLE = "tryloop_build"
PREFIX = "tlb"
#: The addresses sandbox networks take, a /30 each; one pool per host.
POOL = ipaddress.IPv4Network("10.213.0.0/16")
STATE_DIR = Path("/run/tryloop-buildnet")
TOOLS = ("ip", "nft", "nsenter")

_RULES = """\
table inet {table} {{}}
delete table inet {table}
table inet {table} {{
    chain prerouting {{
        type filter hook prerouting priority raw; policy accept;
        iifname "{prefix}*" meta nfproto ipv6 drop
        iifname "{prefix}*" fib saddr . iif oif missing drop
    }}
    chain input {{
        type filter hook input priority filter - 10; policy accept;
        iifname "{prefix}*" drop
    }}
    chain forward {{
        type filter hook forward priority filter - 10; policy accept;
        iifname "{prefix}*" oifname "{prefix}*" drop
        iifname "{prefix}*" ip daddr {{ 0.0.0.0/8, 127.0.0.0/8, 169.254.0.0/16, 224.0.0.0/3 }} drop
        oifname "{prefix}*" ct state established,related accept
        oifname "{prefix}*" drop
    }}
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr {pool} oifname != "{prefix}*" masquerade
    }}
}}
"""


class SandboxNetworkError(SandboxError):
    """The host cannot give a sandbox its filtered network; the message names why."""


@dataclass(frozen=True)
class Attachment:
    dev: str          # the host's end, tlb<N>
    gateway: str      # its address, the sandbox's default route
    address: str      # the sandbox's eth0
    setup_ms: float


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def _run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)


def _fail(what: str, p: subprocess.CompletedProcess | None = None, detail: str = "") -> SandboxNetworkError:
    why = detail or ((p.stderr or p.stdout).strip() if p is not None else "")
    return SandboxNetworkError(f"the filtered sandbox network cannot be set up: {what}: {why} "
                               "(a sandbox with network never falls back to the host's network; "
                               "see `tryloop sandbox doctor`, or run without network)")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(STATE_DIR / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _devices() -> list[str]:
    try:
        return [d for d in os.listdir("/sys/class/net") if d.startswith(PREFIX) and d[len(PREFIX):].isdigit()]
    except OSError:
        return []


def _routes() -> list[tuple[str, ipaddress.IPv4Network]]:
    """(device, destination) of the main IPv4 routing table."""
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/route").read_text().splitlines()[1:]:
            f = line.split()
            if len(f) < 8:
                continue
            dst = socket.inet_ntoa(int(f[1], 16).to_bytes(4, "little"))
            mask = socket.inet_ntoa(int(f[7], 16).to_bytes(4, "little"))
            out.append((f[0], ipaddress.IPv4Network(f"{dst}/{mask}", strict=False)))
    return out


def uplinks() -> list[str]:
    """Interfaces of the host's default IPv4 routes."""
    return sorted({dev for dev, net in _routes() if net.prefixlen == 0 and not dev.startswith(PREFIX)})


def pool_collisions(pool: ipaddress.IPv4Network = POOL) -> list[str]:
    """Host routes (other than the sandbox networks' own) that overlap the pool."""
    return [f"{net} dev {dev}" for dev, net in _routes()
            if net.prefixlen > 0 and not dev.startswith(PREFIX) and net.overlaps(pool)]


def _sysctl(path: str) -> Path:
    return Path("/proc/sys/net") / path


def _read_state() -> dict:
    with contextlib.suppress(OSError, ValueError):
        return json.loads((STATE_DIR / "state.json").read_text())
    return {}


def _write_state(state: dict) -> None:
    tmp = STATE_DIR / f".state.{os.getpid()}"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, STATE_DIR / "state.json")


def _enable_forwarding(dev: str, state: dict) -> None:
    """Per-interface IPv4 forwarding on `dev` and the uplinks, unless the host forwards already."""
    if _sysctl("ipv4/ip_forward").read_text().strip() == "1":
        return
    saved = state.setdefault("forwarding", {})
    for up in uplinks():
        p = _sysctl(f"ipv4/conf/{up}/forwarding")
        if p.read_text().strip() != "1":
            saved.setdefault(up, p.read_text().strip())
            _write_state(state)  # recorded before the change: a crash right after still restores it
            p.write_text("1")
    _sysctl(f"ipv4/conf/{dev}/forwarding").write_text("1")


def _release_host_state() -> list[str]:
    """With the lock held and no sandbox interface left: remove the table, restore forwarding."""
    done = []
    state = _read_state()
    if state.get("table") and shutil.which("nft"):
        p = _run(["nft", "delete", "table", "inet", TABLE])
        if p.returncode == 0:
            done.append(f"removed nft table inet {TABLE}")
    for dev, value in state.get("forwarding", {}).items():
        with contextlib.suppress(OSError):
            _sysctl(f"ipv4/conf/{dev}/forwarding").write_text(value)
            done.append(f"restored net.ipv4.conf.{dev}.forwarding={value}")
    with contextlib.suppress(FileNotFoundError):
        (STATE_DIR / "state.json").unlink()
    return done


def attach(init_pid: int, pool: ipaddress.IPv4Network = POOL) -> Attachment:
    """Give the network namespace of `init_pid` (a sandbox's init, with loopback only) its
    filtered uplink. Raises SandboxNetworkError naming what the host lacks; on failure
    nothing is left behind."""
    t0 = time.perf_counter()
    if os.geteuid() != 0:
        raise _fail("needs root", detail="the runtime does not run as root")
    if missing := missing_tools():
        raise _fail("missing tools", detail=f"{', '.join(missing)} not found on PATH "
                    "(Debian: apt-get install iproute2 nftables util-linux)")
    if collisions := pool_collisions(pool):
        raise _fail(f"the address pool {pool} overlaps host routes", detail="; ".join(collisions))
    slots = pool.num_addresses // 4
    dev = ""
    with _locked():
        state = _read_state()
        p = _run(["nft", "-f", "-"], _RULES.format(table=TABLE, prefix=PREFIX, pool=pool))
        if p.returncode != 0:
            if not _devices():
                _release_host_state()
            raise _fail("nftables (nf_tables in the kernel) refused the rules", p)
        if not state.get("table"):
            state["table"] = TABLE
            _write_state(state)
        try:
            start = random.randrange(slots)
            for k in range(64):
                n = (start + k) % slots
                base = pool.network_address + 4 * n
                gw, addr = base + 1, base + 2
                p = _run(["ip", "link", "add", f"{PREFIX}{n}", "type", "veth", "peer", "name", "eth0",
                          "netns", str(init_pid)])
                if p.returncode == 0:
                    dev = f"{PREFIX}{n}"
                    break
                if "exists" not in p.stderr:
                    raise _fail("creating a veth pair (veth in the kernel)", p)
            else:
                raise _fail("no free address", detail=f"64 tries in {pool}")
            with contextlib.suppress(FileNotFoundError):  # no IPv6 on the host's end
                _sysctl(f"ipv6/conf/{dev}/disable_ipv6").write_text("1")
            _enable_forwarding(dev, state)
            p = _run(["ip", "-batch", "-"], f"addr add {gw}/30 dev {dev}\nlink set {dev} up\n")
            if p.returncode != 0:
                raise _fail(f"configuring {dev}", p)
        except BaseException:
            if dev:
                _run(["ip", "link", "del", dev])
            if not _devices():
                _release_host_state()
            raise
    try:
        inner = ("echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 2>/dev/null; "
                 "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6 2>/dev/null; exec ip -batch -")
        p = _run(["nsenter", f"--net=/proc/{init_pid}/ns/net", "sh", "-c", inner],
                 f"addr add {addr}/30 dev eth0\nlink set eth0 up\nroute add default via {gw}\n")
        if p.returncode != 0:
            raise _fail("configuring the sandbox's end", p)
    except BaseException:
        detach(dev)
        raise
    return Attachment(dev, str(gw), str(addr), (time.perf_counter() - t0) * 1000)


def detach(dev: str) -> None:
    """Remove a sandbox network's veth pair; the last one out removes the table and restores
    forwarding."""
    if dev and shutil.which("ip"):
        _run(["ip", "link", "del", dev])  # both ends; "Cannot find device" once its namespace is gone
    with _locked():
        if not _devices():
            _release_host_state()


def reclaim(devs: list[str] = ()) -> list[str]:
    """After a crash: remove the named leftover interfaces, and the host state if no sandbox
    network is left. Returns what was done."""
    done = []
    for dev in devs:
        if dev in _devices() and shutil.which("ip") and _run(["ip", "link", "del", dev]).returncode == 0:
            done.append(f"removed sandbox veth {dev}")
    if not (STATE_DIR / "state.json").exists():
        return done
    with _locked():
        if not _devices():
            done += _release_host_state()
    return done


RESOLV_SOURCES = ("/etc/resolv.conf", "/run/systemd/resolve/resolv.conf")


def resolv_conf(sources: tuple[str, ...] = RESOLV_SOURCES) -> bytes:
    """/etc/resolv.conf for a sandbox with network: the host's nameservers that it can reach,
    from the first of `sources` that names one (systemd-resolved's upstream list when the
    host's own is its local stub)."""
    host = set()  # the host's own addresses
    p = _run(["ip", "-o", "addr", "show"]) if shutil.which("ip") else None
    if p is not None and p.returncode == 0:
        for line in p.stdout.splitlines():
            f = line.split()
            if len(f) > 3 and f[2] in ("inet", "inet6"):
                host.add(f[3].split("/")[0])

    def reachable(ns: str) -> bool:
        try:
            a = ipaddress.ip_address(ns)
        except ValueError:
            return False
        return a.version == 4 and not (a.is_loopback or a.is_link_local or a.is_unspecified
                                       or str(a) in host or a in POOL)

    for src in sources:
        try:
            lines = Path(src).read_text().splitlines()
        except OSError:
            continue
        servers = [w[1] for w in (x.split() for x in lines) if len(w) > 1 and w[0] == "nameserver"]
        keep = [s for s in servers if reachable(s)]
        if keep:
            rest = [x for x in lines if x.split()[:1] and x.split()[0] in ("search", "domain", "options")]
            return ("\n".join([*rest, *(f"nameserver {s}" for s in keep)]) + "\n").encode()
    raise _fail("no nameserver a sandbox can reach",
                detail="the host's resolvers (/etc/resolv.conf, /run/systemd/resolve/resolv.conf) are all local "
                       "to the host (loopback, link-local or its own address), which a sandbox network cannot "
                       "reach; name an upstream nameserver in /etc/resolv.conf")


def etc_layer(store, hostname: str = "sandbox") -> str:
    """The layer of /etc/resolv.conf (resolv_conf) and /etc/hosts (the sandbox's own name on
    its loopback, then the host's entries) that the runtime mounts on top of a networked
    sandbox's root, so that it resolves names as the host does; never part of a snapshot
    or image."""
    hosts = f"127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n".encode()
    with contextlib.suppress(OSError):
        hosts += Path("/etc/hosts").read_bytes()
    return store.add_files({"etc/resolv.conf": resolv_conf(), "etc/hosts": hosts}, uid=0, gid=0)


def support() -> tuple[bool, str]:
    """Whether this host can give sandboxes their filtered network (for the doctor):
    tools, nf_tables, veth, a free address pool. Creates and removes a scratch table and
    veth pair."""
    if os.geteuid() != 0:
        return False, "needs root"
    if missing := missing_tools():
        return False, f"{', '.join(missing)} not found (Debian: apt-get install iproute2 nftables util-linux)"
    if collisions := pool_collisions():
        return False, f"the address pool {POOL} overlaps host routes: {'; '.join(collisions)}"
    probe = f"tryloop_probe_{os.getpid()}"
    p = _run(["nft", "-f", "-"], f"table inet {probe} {{\n chain c {{\n type nat hook postrouting priority srcnat;\n"
                                 f" masquerade\n }}\n}}\ndelete table inet {probe}\n")
    if p.returncode != 0:
        return False, f"nftables refused a NAT table: {(p.stderr or p.stdout).strip()}"
    name = f"tlxprobe{os.getpid() % 100000}"
    p = _run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"])
    if p.returncode != 0:
        return False, f"no veth pair: {(p.stderr or p.stdout).strip()}"
    _run(["ip", "link", "del", name])
    if not uplinks():
        return False, "the host has no default route to NAT sandboxes out through"
    fwd = _sysctl("ipv4/ip_forward").read_text().strip() == "1"
    return True, (f"veth + nft table inet {TABLE}, pool {POOL}, uplink {', '.join(uplinks())}, "
                  + ("ip_forward already 1" if fwd else "per-interface forwarding while a sandbox with network runs"))
