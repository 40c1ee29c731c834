"""Escape attempts against the user namespace of a sandbox: ids shared with the host.

Without a user namespace the agent's uid 1000 is the host's uid 1000 (a real user on
many hosts), every sandbox shares it, and whatever gains root inside is host root. Each
test here attacks that from a live sandbox and checks the outcome from the host. They
run with `USER_NAMESPACES = "on"`: a host that cannot give user namespaces fails them
(the runtime refuses to start) rather than skipping. Set it to "off" to see every
attack succeed.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tryloop.config import RuntimeConfig, SandboxConfig
from tryloop.errors import SandboxError
from tryloop.sandbox.images import Image, image_id
from tryloop.sandbox.layers import Snapshot

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the kernel sandbox needs root")

USER_NAMESPACES = "on"
AGENT = 1000


@pytest.fixture(scope="module")
def runtime(runtime_config, tmp_path_factory):
    """A runtime of this module's own (cgroup parent, state) that requires user namespaces."""
    from tryloop.sandbox import SandboxRuntime

    cfg = RuntimeConfig(store_dir=runtime_config.store_dir, state_dir=tmp_path_factory.mktemp("userns-state"),
                        cgroup_name=f"tryloop-userns-{os.getpid()}", user_namespaces=USER_NAMESPACES)
    rt = SandboxRuntime(cfg)
    yield rt
    leftover = rt.live
    for root in set(rt.cgroups.controllers.values()):
        with contextlib.suppress(OSError):
            os.rmdir(root / cfg.cgroup_name)
    assert not leftover, f"sandboxes left open by tests: {leftover}"


@contextlib.asynccontextmanager
async def _open(runtime, config: SandboxConfig | None = None, snapshot=None) -> AsyncIterator:
    cfg = config or SandboxConfig()
    sb = await runtime.create(snapshot or runtime.base_snapshot(cfg), cfg)
    try:
        yield sb
    finally:
        await sb.close()


def _host_ids(pid: int) -> tuple[set[int], set[int]]:
    """The real, effective, saved and filesystem uids and gids of a process, as the host sees them."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {int(x) for x in fields["Uid"].split()}, {int(x) for x in fields["Gid"].split()}


def _host_users() -> tuple[set[int], set[int]]:
    return {u.pw_uid for u in pwd.getpwall()}, {g.gr_gid for g in grp.getgrall()}


def _uid_range(pid: int) -> tuple[int, int]:
    """(first host id, count) of a process's user namespace, from the host."""
    lines = Path(f"/proc/{pid}/uid_map").read_text().split("\n")
    _inside, outside, count = (int(x) for x in lines[0].split())
    return outside, count


def _host_pid_of(sb, proc) -> int:
    """The host pid of a command (inside it has another number): the process in the
    sandbox's pid namespace whose innermost pid is the command's."""
    ns = os.readlink(f"/proc/{sb.init_pid}/ns/pid")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{entry.name}/ns/pid") != ns:
                continue
            status = Path(f"/proc/{entry.name}/status").read_text()
            nspid = next(line for line in status.splitlines() if line.startswith("NSpid:")).split()
            if int(nspid[-1]) == proc.pid:
                return int(entry.name)
    raise AssertionError(f"command {proc.pid} of {sb.id} not found on the host")


async def test_agent_uid_is_no_host_users_uid(runtime):
    """The agent's uid inside is 1000; on the host it must not be uid 1000 (or any id a
    host user or group has), or a kernel bug that escapes the namespaces lands as that user."""
    users, groups = _host_users()
    async with _open(runtime) as sb:
        proc = await sb.start(["sleep", "30"])
        try:
            inside = (await sb.exec("id -u; id -g")).text().split()
            assert inside == [str(AGENT), str(AGENT)], inside
            uids, gids = _host_ids(_host_pid_of(sb, proc))
            assert not uids & users, f"the agent runs as host user(s) {uids & users}"
            assert not gids & groups, f"the agent runs as host group(s) {gids & groups}"
            assert min(uids | gids) >= runtime.config.id_ranges_first, (uids, gids)
            # Its init, root inside, is no host root either.
            init_uids, _ = _host_ids(sb.init_pid)
            assert 0 not in init_uids and not init_uids & users, init_uids
        finally:
            proc.kill()
            await proc.wait()


async def test_two_sandboxes_never_share_ids(runtime):
    """A uid shared between sandboxes shares the kernel's per-user limits and lets one
    sandbox's process signal or ptrace the other's after a namespace escape."""
    async with _open(runtime) as a, _open(runtime) as b:
        pa, pb = await a.start(["sleep", "30"]), await b.start(["sleep", "30"])
        try:
            ua, _ = _host_ids(_host_pid_of(a, pa))
            ub, _ = _host_ids(_host_pid_of(b, pb))
            assert not ua & ub, f"two sandboxes' agents share host uid(s) {ua & ub}"
            (fa, na), (fb, nb) = _uid_range(a.init_pid), _uid_range(b.init_pid)
            assert na == nb == 1 << 16
            assert fa + na <= fb or fb + nb <= fa, f"overlapping id ranges {fa}+{na} and {fb}+{nb}"
        finally:
            for p in (pa, pb):
                p.kill()
                await p.wait()


async def test_workspace_files_are_no_host_users_files(runtime):
    """What the agent writes is owned, on the host, by no host user (a host user would
    own, and could change, files a later verifier or snapshot reads); the host still reads
    it, the file API and snapshots still number it as the agent's."""
    users, _ = _host_users()
    async with _open(runtime) as sb:
        res = await sb.exec("echo secret > /workspace/mine && mkdir -p /workspace/d && echo x > /workspace/d/f "
                            "&& chmod 600 /workspace/mine && stat -c %u /workspace/mine")
        assert res.ok and res.text() == f"{AGENT}\n", res.text("stderr")
        for rel in ("mine", "d", "d/f"):
            st = os.lstat(sb.upper_dir() / "workspace" / rel)
            assert st.st_uid not in users and st.st_gid >= runtime.config.id_ranges_first, (rel, st)
        assert sb.read_file("/workspace/mine") == b"secret\n"  # mode 600: the host reads it anyway
        assert sb.stat("/workspace/mine").uid == AGENT
        snap = await sb.snapshot_state()
    layer = runtime.store.path(snap.layers[0])
    assert os.lstat(layer / "workspace" / "mine").st_uid == AGENT  # layers hold the sandbox's numbering
    async with _open(runtime, snapshot=snap) as again:
        assert (await again.exec("cat /workspace/mine; stat -c %u:%g /workspace/d/f")).text() == \
            f"secret\n{AGENT}:{AGENT}\n"


async def test_root_inside_cannot_write_host_files_on_a_shared_bind(runtime, tmp_path):
    """A kernel bug or a capability leak that gives a process every capability inside
    the sandbox (here: a process the host puts into the sandbox's namespaces as their
    root) makes the read-only host binds writable again. It must still own nothing of
    the host: host root's files are unmapped inside, so it can neither write them,
    create files next to them, nor plant a setuid binary for the host to run."""
    host_dir = tmp_path / "shared"
    host_dir.mkdir()
    for p in (tmp_path, host_dir):
        os.chmod(p, 0o755)
    victim = host_dir / "victim"
    victim.write_text("original\n")
    os.chmod(victim, 0o755)
    base = runtime.host_image()
    binds = (*base.binds, (str(host_dir), "/opt/tryloop"))
    img = Image(image_id(base.layers, binds, base.env, uuid.uuid4().hex), base.layers, binds, base.env,
                base.uid, base.gid)
    runtime.register_image(img)
    attack = ("mount -o remount,bind,rw /opt/tryloop; "
              "echo pwned > /opt/tryloop/victim; "
              "echo planted > /opt/tryloop/planted; "
              "chmod 4755 /opt/tryloop/victim; "
              "chown 0:0 /opt/tryloop/victim; "
              "stat -c owner=%u /opt/tryloop/victim")
    async with _open(runtime, snapshot=Snapshot(img.id)) as sb:
        enter = ["nsenter", "-t", str(sb.init_pid), "-m", f"--root={sb.root_dir()}", "--wd=/"]
        if sb.id_base:
            enter.insert(3, "-U")  # its user namespace too: uid 0 there, with every capability of it
        res = subprocess.run([*enter, "/bin/sh", "-c", attack], capture_output=True, text=True, timeout=30)
        assert "owner=" in res.stdout, f"the attack did not run: {res.stdout!r} {res.stderr!r}"
        if sb.id_base:
            assert "owner=65534" in res.stdout, "the host's root is mapped into the sandbox"
    st = victim.stat()
    assert victim.read_text() == "original\n", "root inside wrote a host file"
    assert not (host_dir / "planted").exists(), "root inside created a file in a host directory"
    assert st.st_mode & 0o7777 == 0o755, f"root inside changed a host file's mode to {st.st_mode:o}"


async def test_agent_ids_outside_the_namespace_are_refused(runtime):
    """An agent uid the namespace does not map would run every command as the overflow id."""
    with pytest.raises(SandboxError, match="0..65535"):
        sb = await runtime.create(config=SandboxConfig(uid=70000, gid=70000))
        await sb.close()  # not refused: close it before the test fails
    assert not runtime.live


REMOUNT_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <unistd.h>
struct attr { uint64_t set, clr, prop, userns; };
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *m = argv[i];
        char path[512];
        int r = mount(NULL, m, NULL, MS_REMOUNT | MS_BIND, NULL);
        printf("%s remount-rw %d\n", m, r == 0);
        struct attr a = {0, 1 /* MOUNT_ATTR_RDONLY */, 0, 0};
        r = syscall(442 /* mount_setattr */, AT_FDCWD, m, 0x8000 /* AT_RECURSIVE */, &a, sizeof a);
        printf("%s setattr-rw %d\n", m, r == 0);
        int t = syscall(428 /* open_tree */, AT_FDCWD, m, 1 /* OPEN_TREE_CLONE */);
        r = t >= 0 ? syscall(442, t, "", 0x1000 /* AT_EMPTY_PATH */, &a, sizeof a) : -1;
        printf("%s clone-rw %d\n", m, r == 0);
        snprintf(path, sizeof path, "%s/planted", m);
        int fd = open(path, O_CREAT | O_WRONLY, 0644);
        printf("%s write %d\n", m, fd >= 0);
        if (t >= 0) {
            snprintf(path, sizeof path, "/proc/self/fd/%d/planted", t);
            fd = open(path, O_CREAT | O_WRONLY, 0644);
            printf("%s write-clone %d\n", m, fd >= 0);
        }
    }
    return 0;
}
"""


async def test_root_inside_cannot_make_a_layer_writable(runtime, tmp_path):
    """Root of a sandbox's user namespace (a kernel bug away: no command holds its
    capabilities) tries to remount every layer its init mounted writable, and to write into
    it: a layer of the shared store, which every sandbox of that snapshot reads, and a layer a
    fork lent from its parent. The mounts were made in the sandbox's own namespace, which
    could change their flags; the init locks them before anything runs."""
    attack = tmp_path / "remount"
    (tmp_path / "remount.c").write_text(REMOUNT_C)
    subprocess.run(["cc", "-O1", "-static", "-o", str(attack), str(tmp_path / "remount.c")], check=True)
    snap = runtime.workspace_snapshot({"f.txt": "original\n"})
    async with _open(runtime, snapshot=snap) as parent:
        assert (await parent.exec("echo parent > /workspace/g.txt")).ok
        (child,) = await parent.fork(1)
        try:
            assert child.live_layers, "the fork copied: no layer was lent"
            child.write_file("/tmp/remount", attack.read_bytes(), 0o755)
            layers = sorted(os.listdir(f"/proc/{child.init_pid}/root/layers"), key=int)
            enter = ["nsenter", "-t", str(child.init_pid), "-U", "-m", f"--root=/proc/{child.init_pid}/root",
                     "--wd=/"]
            res = subprocess.run([*enter, "/root/tmp/remount", *(f"/layers/{n}" for n in layers)],
                                 capture_output=True, text=True, timeout=30)
            lines = res.stdout.splitlines()
            assert len(lines) == 5 * len(layers) and len(layers) >= 2, (res.stdout, res.stderr)
            assert not [x for x in lines if x.endswith(" 1")], f"root inside made a layer writable: {lines}"
            # What the attack saw from inside, the host sees too: nothing planted anywhere.
            assert (await child.exec("cat /workspace/g.txt /workspace/f.txt")).text() == "parent\noriginal\n"
            assert not (runtime.store.path(snap.layers[0]) / "planted").exists()
            assert not Path(f"/proc/{parent.init_pid}/root/rw/snap-0/planted").exists()
        finally:
            await child.close()
