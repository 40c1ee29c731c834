"""Build sandboxes (Dockerfile RUN steps, Debian configure steps) keep the guarantees of
every sandbox, as root of their own user namespace: the build capabilities of that
namespace and nothing more, no_new_privs, seccomp, no host-global knobs, nothing of the
host visible, and no write outside the step's own layer.

Root there holds CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_KILL, CAP_SETGID
and CAP_SETUID (what apt and dpkg need), all of them the user namespace's: each attack
below uses them against the host and must fail, checked from the host where it can be.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from oci_archives import base_entries, docker_save, image_config, layer_tar

from tryloop.config import SandboxConfig
from tryloop.errors import SandboxError
from tryloop.sandbox.dockerfile import BuildError, BuildOptions, build_dockerfile, run_build_step
from tryloop.sandbox.images import Image, image_id
from tryloop.sandbox.layers import Snapshot
from tryloop.sandbox.oci import import_archive
from tryloop.sandbox.runtime import BUILD_CAPABILITIES

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the kernel sandbox needs root")

BUILD_CAPS = sum(1 << n for n in BUILD_CAPABILITIES.values())

PROBE = r"""
while read k v rest; do case $k in CapInh:|CapPrm:|CapEff:|CapBnd:|CapAmb:|NoNewPrivs:|Seccomp:|Uid:) echo "$k$v";; esac
done < /proc/self/status
read a b c < /proc/self/uid_map; echo "map:$a:$b:$c"
for f in /proc/sys/kernel/core_pattern /proc/sys/vm/drop_caches /proc/sys/kernel/panic /proc/sysrq-trigger \
         /proc/sys/kernel/hostname /sys/kernel/uevent_helper /sys/power/state; do
  if (exec 3>>"$f") 2>/dev/null; then echo "WRITABLE $f"; fi
done
for p in /proc/[0-9]*; do echo "pid:${p#/proc/}"; done
ls / | while read e; do echo "root:$e"; done
echo pwned > /bin/cat; rm /etc/passwd; echo changed > /etc/group; touch /made-by-root
chown 1234:50 /made-by-root
"""

# Each attack is a system call that root of the host could make; root of a build sandbox
# must be refused every one (seccomp, and the kernel: its capabilities are its user
# namespace's). Prints name=0 when the call succeeded, name=errno otherwise.
ATTACKS_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <linux/netlink.h>
#include <linux/if_packet.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#define TRY(name, call) do { errno = 0; long r_ = (long)(call); printf("%s=%d\n", name, r_ < 0 ? errno : 0); } while (0)
/* connect ADDR PORT: a TCP connection within 2 s, and the first bytes the peer sends.
 * ADDR "gw" is the default gateway of /proc/net/route. Prints "connect ADDR:PORT=errno". */
static int probe_connect(const char *addr, int port) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    char line[256], ip[32];
    snprintf(ip, sizeof ip, "%s", addr);
    if (!strcmp(addr, "gw")) {
        FILE *f = fopen("/proc/net/route", "r");
        unsigned dst, gw;
        char dev[64];
        strcpy(ip, "none");
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "%63s %x %x", dev, &dst, &gw) == 3 && dst == 0 && gw) {
                struct in_addr a = {gw};
                snprintf(ip, sizeof ip, "%s", inet_ntoa(a));
            }
        if (f) fclose(f);
    }
    int err = inet_pton(AF_INET, ip, &sa.sin_addr) == 1 ? 0 : EINVAL;
    int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (!err && connect(s, (struct sockaddr *)&sa, sizeof sa) < 0) {
        err = errno;
        if (err == EINPROGRESS) {
            struct pollfd p = {s, POLLOUT, 0};
            socklen_t len = sizeof err;
            if (poll(&p, 1, 2000) != 1) err = ETIMEDOUT;
            else getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
        }
    }
    char got[64] = "";
    if (!err) {
        struct pollfd p = {s, POLLIN, 0};
        if (poll(&p, 1, 2000) == 1) {
            ssize_t n = read(s, got, sizeof got - 1);
            got[n > 0 ? n : 0] = 0;
        }
    }
    printf("connect %s:%d=%d %s\n", ip, port, err, strtok(got, "\r\n") ? got : "");
    return 0;
}
int main(int argc, char **argv) {
    if (argc > 3 && !strcmp(argv[1], "connect")) {
        for (int i = 2; i + 1 < argc; i += 2) probe_connect(argv[i], atoi(argv[i + 1]));
        return 0;
    }
    if (argc > 2 && !strcmp(argv[1], "as")) { /* as UID CMD...: drop to UID as apt drops to _apt */
        unsigned id = (unsigned)atoi(argv[2]);
        if (setgroups(0, NULL) < 0 || setresgid(id, id, id) < 0 || setresuid(id, id, id) < 0) return 101;
        execv(argv[3], argv + 3);
        return 102;
    }
    TRY("mount_tmpfs", mount("none", "/tmp", "tmpfs", 0, NULL));
    TRY("remount_root_rw", mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND, NULL));
    TRY("umount_proc", umount2("/proc", MNT_DETACH));
    TRY("sethostname", sethostname("pwned", 5));
    TRY("init_module", syscall(SYS_init_module, "", 0, ""));
    int fd = open("/bin/sh", O_RDONLY);
    TRY("finit_module", syscall(SYS_finit_module, fd, "", 0));
    TRY("delete_module", syscall(SYS_delete_module, "loop", 0));
    TRY("chroot", chroot("/tmp"));
    TRY("unshare_user", unshare(CLONE_NEWUSER));
    TRY("unshare_mnt", unshare(CLONE_NEWNS));
    int ns = open("/proc/1/ns/mnt", O_RDONLY);
    TRY("setns", setns(ns, 0));
    TRY("mknod_block", mknod("/tmp/sda", S_IFBLK | 0600, makedev(8, 0)));
    TRY("mknod_mem", mknod("/tmp/mem", S_IFCHR | 0600, makedev(1, 1)));
    struct { unsigned int bytes; int type; unsigned char h[128]; } fh = {128, 0, {0}};
    int mnt_id;
    TRY("name_to_handle_at", syscall(SYS_name_to_handle_at, AT_FDCWD, "/", &fh, &mnt_id, 0));
    TRY("open_by_handle_at", syscall(SYS_open_by_handle_at, AT_FDCWD, &fh, O_RDONLY));
    TRY("ptrace_init", ptrace(PTRACE_ATTACH, 1, 0, 0));
    struct timeval tv = {1, 0};
    TRY("settimeofday", settimeofday(&tv, NULL));
    TRY("iopl", syscall(SYS_iopl, 3));
    TRY("chown_unmapped", chown("/tmp", 70000, 70000));
    TRY("setuid_unmapped", setuid(70000));
    TRY("core_pattern", open("/proc/sys/kernel/core_pattern", O_WRONLY));
    TRY("sysrq", open("/proc/sysrq-trigger", O_WRONLY));
    TRY("kmsg", open("/dev/kmsg", O_RDONLY));
    TRY("netlink_audit", socket(AF_NETLINK, SOCK_RAW, 9 /* NETLINK_AUDIT */));
    TRY("netlink_route", socket(AF_NETLINK, SOCK_RAW, 0));
    TRY("packet", socket(AF_PACKET, SOCK_RAW, 0));
    return 0;
}
"""


@pytest.fixture(scope="module")
def base(build_runtime, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sec")
    attacks = tmp / "attacks"
    (tmp / "attacks.c").write_text(ATTACKS_C)
    subprocess.run(["cc", "-O1", "-static", "-o", str(attacks), str(tmp / "attacks.c")], check=True)
    entries = base_entries(tools=("cat", "ls", "rm", "touch", "chown", "chmod", "stat", "mkdir", "id", "grep"))
    entries += [("bin/attacks", "f", attacks.read_bytes(), 0o755), ("opt", "d", None, 0o755),
                ("opt/host", "d", None, 0o755)]
    layers = [layer_tar(entries)]
    path = docker_save(tmp / "base.tar", layers, image_config(layers, env=["PATH=/bin"]))
    return import_archive(build_runtime.store, path)


async def _step(runtime, base: Image, script: str, network: bool = False, **kw) -> tuple[str, list[str]]:
    out: list[bytes] = []
    layer = await run_build_step(runtime, list(base.layers), dict(base.env), ["/bin/sh", "-c", script],
                                 options=BuildOptions(network=network), on_output=lambda _n, c: out.append(c), **kw)
    return layer, b"".join(out).decode().splitlines()


async def test_build_step_is_confined_as_root_of_its_namespace(build_runtime, base):
    store = build_runtime.store
    before = {d: store.verify(d) for d in base.layers}
    layer, lines = await _step(build_runtime, base, PROBE)
    fields = dict(x.split(":", 1) for x in lines if x.split(":", 1)[0] in
                  ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Uid", "map"))
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[cap], 16) == BUILD_CAPS, (cap, fields)  # the build capabilities, nothing else
    assert fields["NoNewPrivs"] == "1" and fields["Seccomp"] == "2"
    assert fields["Uid"] == "0"  # root of the namespace ...
    # ... of a namespace nested in the sandbox's with the same ids (it locks the mounts: see
    # test_security_userns), so its map reads as identity from inside; the sandbox's own maps
    # them to an unused host id range, which test_security_userns checks from the host.
    inside, outside, count = fields["map"].split(":")
    assert (inside, outside, count) == ("0", "0", "65536")
    assert not [x for x in lines if x.startswith("WRITABLE")]
    assert len([x for x in lines if x.startswith("pid:")]) <= 4  # init, shell, a subshell: no host process
    roots = {x[5:] for x in lines if x.startswith("root:")}
    assert "home" not in roots and "usr" not in roots and "bin" in roots  # the image, not the host
    # The step's writes went to its own layer, with the image's ids: the layers below
    # and the host are untouched.
    assert all(store.verify(d) for d in base.layers) and all(before.values())
    top = store.path(layer)
    assert (top / "bin/cat").read_text() == "pwned\n"
    st = os.stat(top / "made-by-root")
    assert (st.st_uid, st.st_gid) == (1234, 50)  # chowned with CAP_CHOWN, in the image's numbering
    wh = os.lstat(top / "etc/passwd")
    assert wh.st_rdev == 0 and (wh.st_mode & 0o170000) == 0o020000  # a whiteout
    assert b"pwned" not in (store.path(base.layers[0]) / "bin/cat").read_bytes()[:64]


async def test_root_of_a_build_sandbox_cannot_reach_the_host(build_runtime, base):
    """Mounting, module loading, the host's hostname and clock, file handles, devices,
    other namespaces, ids outside the namespace, host-global /proc knobs: all refused."""
    hostname = socket.gethostname()
    modules = Path("/proc/modules").read_text() if Path("/proc/modules").exists() else ""
    _layer, lines = await _step(build_runtime, base, "/bin/attacks")
    results = dict(x.split("=", 1) for x in lines if "=" in x)
    assert len(results) == ATTACKS_C.count("TRY(\"") and results["chown_unmapped"] == "22", lines
    # No socket family beyond unix/inet/inet6; EAFNOSUPPORT, as a kernel without them says
    assert results["netlink_audit"] == results["netlink_route"] == results["packet"] == "97", results
    succeeded = [name for name, err in results.items() if err == "0"]
    assert not succeeded, f"root of a build sandbox could: {succeeded} ({results})"
    assert socket.gethostname() == hostname
    if modules:
        assert Path("/proc/modules").read_text() == modules


class _Listener:
    """A TCP server of the host on (addr, any port) that answers `banner` and counts who came."""

    def __init__(self, addr: str, banner: bytes):
        import threading

        self.sock = socket.create_server((addr, 0))
        self.port = self.sock.getsockname()[1]
        self.peers: list[str] = []
        self.banner = banner
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, peer = self.sock.accept()
                self.peers.append(peer[0])
                with conn:
                    conn.sendall(self.banner)

    def close(self) -> None:
        self.sock.close()


def _host_addresses() -> list[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


async def test_build_network_reaches_no_host_or_link_local_address(build_runtime, base):
    """A networked RUN step (a network namespace of its own, NAT'd out) cannot reach a
    service of the host: not on 127.0.0.1 (its loopback is its own), not on the host's
    address (a server bound to 0.0.0.0, an HTTP server), not on its gateway (the host's end
    of its veth), and not the link-local metadata address 169.254.169.254."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    host = _host_addresses()
    assert host, "the host has no global IPv4 address"
    anyaddr, loop = _Listener("0.0.0.0", b"host-any\n"), _Listener("127.0.0.1", b"host-lo\n")
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            hits.append(self.client_address[0])
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"host-http\n")

        def log_message(self, *a):
            pass

    http = HTTPServer(("0.0.0.0", 0), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    hp = http.server_address[1]
    targets = [("127.0.0.1", loop.port), ("127.0.0.1", anyaddr.port), ("127.0.0.1", hp),
               *((a, anyaddr.port) for a in host), *((a, hp) for a in host),
               ("gw", anyaddr.port), ("gw", hp), ("169.254.169.254", 80), ("169.254.169.254", hp)]
    try:
        _layer, lines = await _step(build_runtime, base, "/bin/attacks connect " +
                                    " ".join(f"{a} {p}" for a, p in targets), network=True)
    finally:
        http.shutdown()
        http.server_close()
        anyaddr.close()
        loop.close()
    results = [x for x in lines if x.startswith("connect ")]
    assert len(results) == len(targets), lines
    reached = [x for x in results if "=0 " in x or x.endswith("=0")]
    assert not reached, f"a build step reached the host: {reached}"
    assert not anyaddr.peers and not loop.peers and not hits, (anyaddr.peers, loop.peers, hits)
    gw = next(x for x in results if x.startswith("connect ") and f":{anyaddr.port}=" in x
              and not x.startswith(("connect 127.", *(f"connect {a}:" for a in host))))
    assert "none" not in gw, f"the build step had no default route: {results}"  # it did have a network


async def test_capabilities_do_not_apply_to_host_files_on_a_bind(build_runtime, base, tmp_path):
    """A sandbox with the build capabilities on an image that binds a host directory (a
    build never does; this is the worst case): the host's files are unmapped in its user
    namespace, so CAP_CHOWN, CAP_FOWNER and CAP_DAC_OVERRIDE do not apply to them."""
    host_dir = tmp_path / "shared"
    host_dir.mkdir()
    for p in (tmp_path, host_dir):
        os.chmod(p, 0o755)
    victim = host_dir / "victim"
    victim.write_text("original\n")
    os.chmod(victim, 0o600)
    binds = ((str(host_dir), "/opt/host"),)
    img = Image(image_id(base.layers, binds, base.env, uuid.uuid4().hex), base.layers, binds, base.env, 0, 0)
    build_runtime.register_image(img)
    cfg = SandboxConfig().model_copy(update={"uid": 0, "gid": 0, "workdir": "/"})
    attack = ("cat /opt/host/victim; echo pwned > /opt/host/victim; touch /opt/host/planted; "
              "chmod 4777 /opt/host/victim; chown 0:0 /opt/host/victim; stat -c owner=%u /opt/host/victim")
    async with await build_runtime.create(Snapshot(img.id), cfg, root_capabilities=True) as sb:
        res = await sb.exec(["/bin/sh", "-c", attack])
    assert "owner=65534" in res.text(), res.text() + res.text("stderr")  # host root is unmapped inside
    assert "original" not in res.text()  # CAP_DAC_OVERRIDE does not read a host file of mode 600
    assert victim.read_text() == "original\n" and not (host_dir / "planted").exists()
    st = victim.stat()
    assert (st.st_mode & 0o7777, st.st_uid) == (0o600, 0)


async def test_switching_to_another_user_drops_every_capability(build_runtime, base):
    """apt drops to its `_apt` user for downloads: the switch (CAP_SETUID of the namespace)
    works and leaves the process with no capability; a USER step gets none at all."""
    _layer, lines = await _step(build_runtime, base,
                                "/bin/attacks as 1234 /bin/sh -c "
                                "'id -u; while read k v; do case $k in CapEff:|CapPrm:|CapAmb:) echo $k$v;; esac; "
                                "done < /proc/self/status; touch /tmp/mine; stat -c %u /tmp/mine'")
    assert lines[0] == "1234" and lines[-1] == "1234", lines
    assert all(int(x.split(":")[1], 16) == 0 for x in lines if x.startswith("Cap")), lines
    _layer, lines = await _step(build_runtime, base, "grep ^CapEff /proc/self/status; chown 0 /tmp || echo refused",
                                user="app")
    assert int(lines[0].split()[1], 16) == 0 and lines[-1] == "refused", lines


async def test_dockerfile_run_chowns_as_root(build_runtime, base, tmp_path):
    """A RUN step that needs root's capabilities (chown to another user, files of other
    owners), as package installs do; no network."""
    from tryloop.sandbox.catalog import tag_image

    tag_image(build_runtime.store, "build-sec-base", base.id)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        "FROM build-sec-base\n"
        "RUN mkdir -p /home/app /srv/private && chown 1234:1234 /home/app && chown app:staff /srv/private "
        "&& chmod 700 /srv/private && touch /srv/private/x && chown app /srv/private/x\n"
        "RUN ls /srv/private > /srv/listing\n"  # root reads a directory of app's, mode 700
        "USER app\nRUN touch /home/app/made-by-app\n")
    img = await build_dockerfile(build_runtime, ctx, options=BuildOptions(network=False))
    async with await build_runtime.create(Snapshot(img.id), SandboxConfig()) as sb:
        res = await sb.exec("stat -c '%n %u:%g' /home/app /srv/private /srv/private/x /home/app/made-by-app; "
                            "cat /srv/listing; id -u")
    assert res.text().split("\n")[:6] == ["/home/app 1234:1234", "/srv/private 1234:50", "/srv/private/x 1234:0",
                                          "/home/app/made-by-app 1234:1234", "x", "1234"], res.text()
    # (sandboxes on the image run as its user, app: not root, no capabilities)


async def test_no_capabilities_without_a_user_namespace(runtime_config, tmp_path):
    """Without a user namespace they would be the host's: the runtime refuses to give them,
    and a build step as root is refused with the reason."""
    from tryloop.config import RuntimeConfig
    from tryloop.sandbox import SandboxRuntime

    cfg = RuntimeConfig(store_dir=runtime_config.store_dir, state_dir=tmp_path / "state",
                        cgroup_name=f"tryloop-nouserns-{os.getpid()}", user_namespaces="off")
    rt = SandboxRuntime(cfg, gc=False)
    with pytest.raises(SandboxError, match="capabilities for root are given only inside a user namespace"):
        await rt.create(rt.base_snapshot(), SandboxConfig(), root_capabilities=True)
    base = rt.host_image()
    with pytest.raises(BuildError, match="user namespace"):
        await run_build_step(rt, [base.layers[-1]], {}, ["true"], options=BuildOptions(network=False))
    assert not rt.live


# The escape tests every sandbox passes, run against a sandbox whose commands run as root with
# the build capabilities (as a RUN step's do) on the host-derived root: host binds and all, the
# worst case a build could meet. Network aside: a networked step's is filtered (buildnet.py), tested
# by test_build_network_reaches_no_host_or_link_local_address and test_buildnet.py.
# Five tests of the suite assume an unprivileged agent and so do not apply as they are (root may
# write its own /etc/passwd, list its own /root and write into the image's empty /sys directory,
# all in its writable layer; setuid binaries cannot make it more than root; kill -1 also reaches
# its own zygote, which the init replaces at the next command, failing one being started at that
# moment): `test_root_reaches_no_host_file_secret_or_process` below checks what they
# check of the host.
SUITE = ("test_ps_and_proc_show_only_sandbox_processes", "test_cannot_signal_the_host_test_process",
         "test_mounts_are_read_only_nosuid_nodev",
         "test_ptrace_is_denied", "test_mount_unshare_chroot_are_denied",
         "test_proc_sys_is_read_only_and_host_global_sysctls_closed",
         "test_dev_cannot_be_rewritten_to_plant_a_privileged_stdin", "test_only_safe_device_nodes",
         "test_host_describing_proc_files_are_masked_and_knobs_read_only", "test_file_api_symlink_tricks",
         "test_only_loopback_and_no_routes", "test_syscalls_outside_the_allow_list_are_refused")


@pytest.fixture
async def root_sandbox(build_runtime, small_config):
    cfg = small_config.model_copy(update={"uid": 0, "gid": 0})
    sb = await build_runtime.create(build_runtime.base_snapshot(small_config), cfg, root_capabilities=True)
    try:
        yield sb
    finally:
        await sb.close()


@pytest.mark.parametrize("name", SUITE)
async def test_escape_suite_against_root_with_build_capabilities(root_sandbox, name):
    import test_security

    probe = await root_sandbox.exec("grep -E '^(Uid|CapEff)' /proc/self/status")
    assert probe.text().split()[1] == "0" and int(probe.text().split()[-1], 16) == BUILD_CAPS, probe.text()
    await getattr(test_security, name)(root_sandbox)


async def test_root_reaches_no_host_file_secret_or_process(root_sandbox, tmp_path):
    """What the five suite tests left out check of the host, against root with the build
    capabilities: host secrets unread, host binds (/usr, the Python prefixes) unwritable,
    host knobs unchanged, a host process of the agent's uid unseen and unsignalled."""
    tag = uuid.uuid4().hex[:12]
    secret = f"TOPSECRET-{tag}".encode()
    paths = [Path("/root") / f"tryloop-secret-{tag}", Path("/tmp") / f"tryloop-secret-{tag}"]
    for p in paths:
        p.write_bytes(secret)
        os.chmod(p, 0o600)
    hostname = Path("/proc/sys/kernel/hostname").read_text()
    passwd = Path("/etc/passwd").read_bytes()
    victim = subprocess.Popen(["sleep", "60"], user=1000, group=1000)
    prefix = os.path.realpath(sys.prefix)
    targets = [f"/usr/bin/tryloop-evil-{tag}", f"/usr/lib/tryloop-evil-{tag}", f"{prefix}/tryloop-evil-{tag}",
               f"{prefix}/bin/tryloop-evil-{tag}"]
    try:
        res = await root_sandbox.exec(
            f"cat /root/tryloop-secret-{tag} /tmp/tryloop-secret-{tag} /proc/1/root/tmp/tryloop-secret-{tag}; "
            "find / -name 'tryloop-secret-*' 2>/dev/null; "
            + "".join(f"echo x > {t} && echo WROTE {t}; chown 0 {t} && echo CHOWNED {t}; " for t in targets)
            + f"chmod 777 /usr/bin && echo CHMODDED; chown 0 {prefix}/bin && echo CHOWNED-PREFIX; "
            "echo pwned > /proc/sys/kernel/hostname && echo HOSTNAME; hostname pwned && echo HOSTNAME; "
            "echo 'evil::0:0::/:/bin/sh' >> /etc/passwd; "
            f"ls /proc | grep -qx {victim.pid} && echo SEEN; kill -9 {victim.pid} && echo KILLED; "
            "stat -c 'usr=%u' /usr/bin", timeout=30)
        out = res.text() + res.text("stderr")
        assert secret.decode() not in out and f"tryloop-secret-{tag}\n" not in res.text(), out
        for word in ("WROTE", "CHOWNED", "CHMODDED", "HOSTNAME", "SEEN", "KILLED"):
            assert word not in res.text(), out
        assert "usr=65534" in out, out  # host root's files are unmapped: no capability applies to them
        assert all(not Path(t).exists() for t in targets)
        assert Path("/proc/sys/kernel/hostname").read_text() == hostname
        assert Path("/etc/passwd").read_bytes() == passwd  # the sandbox's own /etc/passwd changed, not this
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait(5)
        for p in paths:
            p.unlink(missing_ok=True)
        for t in targets:
            with contextlib.suppress(OSError):
                os.unlink(t)
