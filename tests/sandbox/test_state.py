"""Sandbox state: reset to the snapshot, freeze into a new snapshot, fork, lifetime."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time

import pytest

from tryloop.config import SandboxConfig, SandboxLimits
from tryloop.errors import SandboxClosed
from tryloop.sandbox.layers import tree_digest

FILES = {
    "README.md": "# demo\n",
    "src/app.py": "print('app')\n",
    "src/util.py": "X = 1\n",
    "data/table.csv": "a,b\n1,2\n",
    "run.sh": "#!/bin/sh\necho run\n",
}


def ws_digest(sb) -> str:
    return tree_digest(sb.root_dir() / "workspace", id_base=sb.id_base)


@pytest.fixture
def snap(runtime):
    return runtime.workspace_snapshot(FILES)


@pytest.fixture
async def sb(runtime, snap, small_config):
    s = await runtime.create(snap, small_config)
    try:
        yield s
    finally:
        await s.close()


async def _comms(sb) -> list[str]:
    res = await sb.exec("cat /proc/[0-9]*/comm")
    return res.text().split()


# ---- reset -------------------------------------------------------------------------------


async def test_reset_restores_byte_identical_workspace(sb):
    before = ws_digest(sb)
    res = await sb.exec(
        "set -e\n"
        "echo changed >> README.md\n"          # modify
        "echo new > new.txt; mkdir -p a/b/c; echo deep > a/b/c/d\n"  # create
        "rm src/util.py\n"                      # delete
        "rm -r data\n"                          # delete a directory
        "chmod 600 run.sh; chmod 700 src\n"     # chmod
        "rm src/app.py; ln -s ../README.md src/app.py\n"  # file replaced by a symlink
    )
    assert res.ok, res.text("stderr")
    sb.write_file("api.txt", "via file api")
    changed = ws_digest(sb)
    assert changed != before
    await sb.reset()
    assert ws_digest(sb) == before
    assert sb.read_file("README.md") == FILES["README.md"].encode()
    assert sb.stat("src/app.py").type == "file"
    assert not sb.files.exists("new.txt")
    assert not sb.files.exists("api.txt")
    assert sb.files.exists("data/table.csv")
    assert sb.resets == 1


async def test_reset_digest_matches_a_fresh_sandbox(runtime, snap, small_config, sb):
    await sb.exec("echo x > junk; rm -rf src")
    await sb.reset()
    async with await runtime.create(snap, small_config) as fresh:
        assert ws_digest(fresh) == ws_digest(sb)


async def test_reset_kills_background_processes(sb):
    proc = await sb.start(["sleep", "1000"])
    await sb.exec("setsid sleep 999 > /dev/null 2>&1 < /dev/null &")  # detached, untracked
    await sb.exec("(sleep 998 &) ; true")
    comms = await _comms(sb)
    assert comms.count("sleep") == 3
    await sb.reset()
    res = await proc.wait()
    assert res.signal == signal.SIGKILL
    assert not res.timed_out
    assert "sleep" not in await _comms(sb)


async def test_reset_reports_killed_by_reset(sb):
    proc = await sb.start(["sleep", "1000"])
    await asyncio.sleep(0.05)
    await sb.reset()
    res = await proc.wait()
    assert res.killed_by_reset


async def test_reset_restores_tmp_home_and_shm(sb):
    # Compared with the snapshot's own listing: on a host whose Python lives under /tmp,
    # /tmp holds that installation's (read-only) mount point.
    pristine = (await sb.exec("ls -A /tmp /home/agent /dev/shm")).text()
    res = await sb.exec("echo t > /tmp/t; echo h > ~/.bashrc; mkdir ~/.cache; echo s > /dev/shm/s")
    assert res.ok, res.text("stderr")
    assert (await sb.exec("ls -A /tmp /home/agent /dev/shm")).text() != pristine
    await sb.reset()
    res = await sb.exec("ls -A /tmp /home/agent /dev/shm")
    assert res.text() == pristine


async def _shm_keys(sb) -> set[int]:
    lines = (await sb.exec("cat /proc/sysvipc/shm")).text().splitlines()[1:]
    return {int(line.split()[0]) for line in lines if line.strip()}


async def test_reset_drops_ipc_objects(sb):
    # A System V shared memory segment lives in the IPC namespace: a reset must drop it.
    code = "import ctypes; libc = ctypes.CDLL(None); print(libc.shmget(0x7711, 4096, 0o1666))"
    res = await sb.exec(["python3", "-c", code])
    assert int(res.text()) >= 0
    assert 0x7711 in await _shm_keys(sb)
    await sb.reset()
    assert 0x7711 not in await _shm_keys(sb)


async def test_reset_fifty_times_stays_healthy(sb):
    fds_before = len(os.listdir("/proc/self/fd"))
    for i in range(50):
        sb.write_file(f"iter{i}.txt", str(i))
        await sb.start(["sleep", "1000"])
        await sb.reset()
        assert not sb.files.exists(f"iter{i}.txt")
    assert sb.resets == 50
    assert sb.alive
    assert await sb.ping()
    res = await sb.exec("ls; echo ok")
    assert res.ok
    assert sorted(res.text().split()) == sorted([*{p.split("/")[0] for p in FILES}, "ok"])
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 2


async def test_reset_after_output_limits_and_timeouts(sb):
    res = await sb.exec("sleep 30", timeout=0.2)
    assert res.timed_out
    await sb.reset()
    assert (await sb.exec("echo fine")).text() == "fine\n"


# ---- snapshot_state / fork -----------------------------------------------------------------


async def test_snapshot_state_captures_modifications_and_deletions(runtime, sb, small_config):
    res = await sb.exec(
        "set -e\n"
        "echo v2 > README.md\n"
        "rm src/util.py\n"
        "rm -r data && mkdir data && echo fresh > data/other.csv\n"  # re-created dir: opaque
        "echo brand-new > new.txt\n"
        "chmod 755 run.sh\n"
    )
    assert res.ok, res.text("stderr")
    parent_digest = ws_digest(sb)
    new = await sb.snapshot_state({"note": "test"})
    assert new.id != sb.snapshot.id
    assert new.image == sb.snapshot.image
    assert runtime.store.load_snapshot(new.id) == new
    async with await runtime.create(new, small_config) as child:
        assert ws_digest(child) == parent_digest
        assert child.read_file("README.md") == b"v2\n"
        assert child.read_file("new.txt") == b"brand-new\n"
        # Whiteouts: deleted files of the base snapshot stay deleted in the child.
        assert not child.files.exists("src/util.py")
        assert child.files.exists("src/app.py")
        # Opaque directory: the old contents of a re-created directory stay hidden.
        assert {e.name for e in child.list_dir("data")} == {"other.csv"}
        assert child.stat("run.sh").mode == 0o755
        # A reset of the child returns to the new snapshot, deletions included.
        await child.exec("echo again > src/util.py; rm new.txt")
        await child.reset()
        assert ws_digest(child) == parent_digest
        assert not child.files.exists("src/util.py")


async def test_snapshot_state_leaves_parent_running_and_unchanged(sb):
    proc = await sb.start("echo begin; sleep 1000")
    sb.write_file("state.txt", "1")
    before = ws_digest(sb)
    original = sb.snapshot
    new = await sb.snapshot_state()
    assert ws_digest(sb) == before
    assert not proc.done
    assert sb.snapshot == original  # the parent still resets to its own snapshot
    assert (await sb.exec("cat state.txt")).text() == "1"
    proc.kill()
    res = await proc.wait()
    assert res.signal == signal.SIGKILL
    assert res.stdout == b"begin\n"
    await sb.reset()
    assert not sb.files.exists("state.txt")
    assert new.id != original.id


@pytest.mark.parametrize("program", [
    "echo begin; sleep 1000",
    "while :; do /bin/true; cat state.txt > /dev/null; done",
])
async def test_back_to_back_snapshots_freeze_every_time(sb, program):
    # A task still leaving the refrigerator, or caught mid-fork or mid-exec, can miss the
    # freezer's signal; a v1 group then stays FREEZING until the freeze is retried. A few
    # percent of back-to-back freezes timed out before the retry.
    sb.write_file("state.txt", "1")
    proc = await sb.start(program)
    for _ in range(60):
        snap = await sb.snapshot_state()
    assert not proc.done
    proc.kill()
    await proc.wait()
    async with await sb.runtime.create(snap, sb.config) as child:
        assert child.read_file("state.txt") == b"1"


async def test_snapshot_of_a_child_chains_layers(runtime, sb, small_config):
    sb.write_file("gen1.txt", "1")
    s1 = await sb.snapshot_state()
    async with await runtime.create(s1, small_config) as c1:
        await c1.exec("echo 2 > gen2.txt; rm gen1.txt")
        s2 = await c1.snapshot_state()
        assert len(s2.layers) == len(s1.layers) + 1
        async with await runtime.create(s2, small_config) as c2:
            assert c2.read_file("gen2.txt") == b"2\n"
            assert not c2.files.exists("gen1.txt")
            assert c2.read_file("README.md") == FILES["README.md"].encode()


async def test_unchanged_state_gives_the_same_snapshot_id(sb):
    sb.write_file("x.txt", "x")
    a = await sb.snapshot_state()
    b = await sb.snapshot_state()
    assert a.id == b.id


async def test_fork_gives_independent_children(sb):
    sb.write_file("shared.txt", "parent")
    await sb.exec("rm src/util.py")
    parent_digest = ws_digest(sb)
    children = await sb.fork(3)
    try:
        assert len(children) == 3
        assert len({c.id for c in children} | {sb.id}) == 4
        assert len({c.init_pid for c in children}) == 3
        for c in children:
            assert c.alive
            assert ws_digest(c) == parent_digest
            assert c.read_file("shared.txt") == b"parent"
            assert not c.files.exists("src/util.py")
        for i, c in enumerate(children):
            res = await c.exec(f"echo child{i} > shared.txt; echo {i} > own{i}.txt")
            assert res.ok
        for i, c in enumerate(children):
            assert c.read_file("shared.txt") == f"child{i}\n".encode()
            names = {e.name for e in c.list_dir()}
            assert {n for n in names if n.startswith("own")} == {f"own{i}.txt"}
        assert sb.read_file("shared.txt") == b"parent"
        assert ws_digest(sb) == parent_digest
        # Processes are separate too.
        p = await children[0].start(["sleep", "1000"])
        assert "sleep" not in await _comms(children[1])
        assert "sleep" not in await _comms(sb)
        p.kill()
        await p.wait()
    finally:
        for c in children:
            await c.close()


async def test_fork_of_a_fork(sb):
    sb.write_file("gen.txt", "parent")
    (child,) = await sb.fork(1)
    try:
        await child.exec("echo child > gen.txt; echo c > child-only.txt")
        (grandchild,) = await child.fork()
        try:
            assert grandchild.read_file("gen.txt") == b"child\n"
            assert grandchild.read_file("child-only.txt") == b"c\n"
            await grandchild.exec("echo grandchild > gen.txt")
            assert child.read_file("gen.txt") == b"child\n"
            assert sb.read_file("gen.txt") == b"parent"
            # The grandchild's reset goes to the child's state at fork time.
            await grandchild.reset()
            assert grandchild.read_file("gen.txt") == b"child\n"
        finally:
            await grandchild.close()
    finally:
        await child.close()


def _stored_layers(runtime) -> int:
    store = runtime.store
    return sum(len(os.listdir(d)) for d in (store.layers_dir, store.memory_dir and store.memory_dir / "layers")
               if d and os.path.isdir(d))


async def test_a_quiescent_sandbox_forks_without_copying(runtime, sb):
    res = await sb.exec("set -e; echo v2 > README.md; rm src/util.py; rm -r data; mkdir -p new/deep; "
                        "echo n > new/deep/f")
    assert res.ok, res.text("stderr")
    at_fork = ws_digest(sb)
    stored = _stored_layers(runtime)
    (child,) = await sb.fork(1)
    try:
        # The parent's writable layer was frozen where it is and lent: nothing was copied.
        assert child.snapshot == sb.snapshot and [x.owner for x in child.live_layers] == [sb]
        assert child.live_layers[0].digest is None and _stored_layers(runtime) == stored
        assert ws_digest(child) == at_fork == ws_digest(sb)
        # Each side's writes are its own, on top of what they share.
        assert (await sb.exec("echo p > README.md; echo p > p.txt")).ok
        assert (await child.exec("echo c > README.md; rm -r new; echo c > src/util.py")).ok
        assert child.read_file("README.md") == b"c\n" and not child.files.exists("p.txt")
        assert sb.read_file("README.md") == b"p\n" and sb.files.exists("new/deep/f")
        assert not sb.files.exists("src/util.py") and not sb.files.exists("data")
        # The child resets to the fork point, the parent to its own snapshot.
        await child.reset()
        assert ws_digest(child) == at_fork
        await sb.reset()
        assert sb.read_file("README.md") == FILES["README.md"].encode() and sb.files.exists("src/util.py")
        # The lent layer lives on with the child: past the parent's reset and close.
        await sb.close()
        assert (await child.exec("echo again > README.md; cat new/deep/f")).text() == "n\n"
        await child.reset()
        assert ws_digest(child) == at_fork
        # A snapshot of the child copies the lent layer into the store: it outlives them all.
        snap = await child.snapshot_state()
        assert not any(x.digest is None for x in child.live_layers)
    finally:
        await child.close()
    async with await runtime.create(snap, child.config) as again:
        assert ws_digest(again) == at_fork


async def test_a_busy_sandbox_forks_by_copying_and_keeps_running(sb):
    sb.write_file("state.txt", "1")
    running = await sb.start("sleep 1000")  # a command in flight
    (a,) = await sb.fork(1)
    running.kill()
    await running.wait()
    # A process left behind by a finished command: the host knows of no command, the init does.
    assert (await sb.exec("setsid sleep 1000 > /dev/null 2>&1 < /dev/null &")).ok
    (b,) = await sb.fork(1)
    try:
        for kid in (a, b):
            assert not kid.live_layers and kid.snapshot != sb.snapshot  # a copied layer
            assert kid.read_file("state.txt") == b"1"
        assert "sleep" in await _comms(sb)  # nothing of the parent was stopped
    finally:
        await a.close()
        await b.close()


async def test_forks_stack_frozen_layers_up_to_a_bound_then_copy(sb):
    from tryloop.sandbox.sandbox import MAX_LIVE_LAYERS

    kids = []
    try:
        for i in range(MAX_LIVE_LAYERS + 1):
            sb.write_file("gen.txt", str(i))
            kids += await sb.fork(1)
        assert [len(k.live_layers) for k in kids] == [*range(1, MAX_LIVE_LAYERS + 1), 0]
        for i, k in enumerate(kids):
            assert k.read_file("gen.txt") == str(i).encode()
        await sb.reset()  # frozen layers go with the reset: the next fork lends again
        sb.write_file("gen.txt", "after")
        kids += await sb.fork(2)
        assert [len(k.live_layers) for k in kids[-2:]] == [1, 1]
        assert kids[-1].live_layers == kids[-2].live_layers
        assert kids[-1].read_file("gen.txt") == b"after" and kids[0].read_file("gen.txt") == b"0"
    finally:
        for k in kids:
            await k.close()


async def test_a_kernel_that_cannot_lend_layers_forks_by_copying(runtime, sb, monkeypatch):
    monkeypatch.setattr(type(runtime), "forks_in_place", property(lambda self: False))
    sb.write_file("x.txt", "x")
    (child,) = await sb.fork(1)
    try:
        assert not child.live_layers and child.snapshot != sb.snapshot
        assert child.read_file("x.txt") == b"x"
    finally:
        await child.close()


async def test_an_unchanged_sandbox_forks_on_the_layer_it_froze_last(sb):
    sb.write_file("x.txt", "x")
    (a,) = await sb.fork(1)
    (b,) = await sb.fork(1)
    try:
        assert a.live_layers == b.live_layers and len(b.live_layers) == 1
        assert b.read_file("x.txt") == b"x"
    finally:
        await a.close()
        await b.close()


async def test_a_forked_childs_files_carry_its_own_ids(sb):
    """The frozen layer is lent idmapped: on the host, the child's view of the parent's files
    carries the child's id range, never the parent's."""
    sb.write_file("mine.txt", "x")
    (child,) = await sb.fork(1)
    try:
        st = os.stat(child.root_dir() / "workspace" / "mine.txt")
        assert st.st_uid == child.host_id(1000) and st.st_gid == child.host_id(1000)
        if child.id_base:
            assert child.id_base != sb.id_base
        res = await child.exec("stat -c %u:%g mine.txt && echo y >> mine.txt && cat mine.txt")
        assert res.text() == "1000:1000\nxy\n", res.text("stderr")
    finally:
        await child.close()


async def test_a_fork_whose_caller_stopped_waiting_still_counts(sb):
    """The init freezes the layer even if nobody waits for its answer: the host learns of it
    from the reply whenever it comes, so later snapshots and forks keep what it froze."""
    sb.write_file("one.txt", "1")
    task = asyncio.ensure_future(sb.fork(1))
    for _ in range(3):
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await sb.ping()  # replies come in order: the rotation's is in by now
    sb.write_file("two.txt", "2")
    (child,) = await sb.fork(1)
    try:
        assert child.read_file("one.txt") == b"1" and child.read_file("two.txt") == b"2"
        snap = await sb.snapshot_state()
    finally:
        await child.close()
    async with await sb.runtime.create(snap, sb.config) as again:
        assert again.read_file("one.txt") == b"1" and again.read_file("two.txt") == b"2"


async def test_a_cancel_that_lands_with_the_reply_is_not_lost():
    """The sandbox's waits on its init's replies keep a cancellation that lands in the same turn
    as the reply. asyncio.wait_for (Python 3.11) returns the reply instead: the fork above then
    started its child for a caller that had stopped waiting, and the child was left open."""
    from tryloop.sandbox.sandbox import _within

    reply = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(_within(reply, 5))
    await asyncio.sleep(0)                     # the task waits on the reply
    reply.set_result("rotated")
    waiting.cancel()                           # the caller stops waiting as the reply comes in
    with pytest.raises(asyncio.CancelledError):
        await waiting
    with pytest.raises(TimeoutError):
        await _within(asyncio.get_running_loop().create_future(), 0.01)


async def test_a_fork_cancelled_as_its_children_start_leaves_none_open(sb, monkeypatch):
    """A cancellation can land after a child has started but before the fork returns it:
    the children already started are closed, not left running with nobody holding them."""
    real_create = sb.runtime.create
    fork: asyncio.Future | None = None

    async def create_then_cancel(*args, **kwargs):
        child = await real_create(*args, **kwargs)
        asyncio.get_running_loop().call_soon(fork.cancel)  # from outside, as the child's start ends
        return child

    monkeypatch.setattr(sb.runtime, "create", create_then_cancel)
    before = {s.id for s in sb.runtime.live}
    fork = asyncio.ensure_future(sb.fork(2))
    with pytest.raises(asyncio.CancelledError):
        await fork
    assert {s.id for s in sb.runtime.live} == before


async def test_a_fork_whose_second_child_fails_closes_the_first(sb, monkeypatch):
    from tryloop.errors import SandboxError

    real_create = sb.runtime.create
    calls = 0

    async def second_fails(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise SandboxError("no room for a second child")
        return await real_create(*args, **kwargs)

    monkeypatch.setattr(sb.runtime, "create", second_fails)
    before = {s.id for s in sb.runtime.live}
    with pytest.raises(SandboxError, match="no room"):
        await sb.fork(2)
    assert {s.id for s in sb.runtime.live} == before and calls == 2


async def test_a_layer_number_from_before_a_reset_is_refused(sb, monkeypatch):
    """After a reset the init's layer numbers start again: a number the host held from before
    (a race the host's own check cannot see) names another layer, and the init refuses it."""
    from tryloop.sandbox.sandbox import LayerGone, LiveLayer

    sb.write_file("old.txt", "old")
    (a,) = await sb.fork(1)
    stale = a.live_layers[0]
    await sb.reset()
    sb.write_file("new.txt", "new")
    (b,) = await sb.fork(1)
    try:
        assert b.live_layers[0].index == stale.index and b.live_layers[0].generation != stale.generation
        monkeypatch.setattr(LiveLayer, "lendable", lambda self: True)
        with pytest.raises(LayerGone):
            await sb.lend_layer(stale)
    finally:
        await a.close()
        await b.close()


async def test_a_fork_copies_while_something_still_holds_the_old_root(sb):
    """A file the host holds open in the sandbox's root keeps that overlay mounted: the init
    does not freeze a layer something could still write to, and the fork copies instead."""
    sb.write_file("held.txt", "before")
    path = sb.root_dir() / "workspace" / "held.txt"
    with open(path, "r+b") as held:
        (child,) = await sb.fork(1)
        try:
            assert not child.live_layers  # copied
            held.write(b"after!")
            held.flush()
            assert child.read_file("held.txt") == b"before"
        finally:
            await child.close()
    assert sb.read_file("held.txt") == b"after!"
    assert (await sb.exec("echo fine")).text() == "fine\n"  # put back together, a new zygote


async def test_a_fork_keeps_dev_shm_and_the_root_directorys_mode(sb):
    assert (await sb.exec("echo kept > /dev/shm/x")).ok
    enter = ["nsenter", "-t", str(sb.init_pid), "-U", "-m", f"--root={sb.root_dir()}", "--wd=/"]
    if not sb.id_base:
        enter.remove("-U")
    # Root of the sandbox's namespace changes the mode of its root directory (the agent
    # cannot): the sandbox keeps it across its fork, and a fork after a change of that mode
    # alone freezes a new layer. (A sandbox's root directory takes its attributes from its
    # own writable layer, so a child's is its own, as in any new sandbox.)
    subprocess.run([*enter, "/bin/chmod", "0751", "/"], check=True)
    kids = []
    try:
        kids += await sb.fork(1)
        kids += await sb.fork(1)  # nothing changed: the same layer
        assert (await sb.exec("stat -c %a /")).text().strip() == "751"
        subprocess.run([*enter, "/bin/chmod", "0755", "/"], check=True)  # only the root's mode changed
        kids += await sb.fork(1)
        a, b, c = kids
        assert (await sb.exec("cat /dev/shm/x")).text() == "kept\n"
        assert a.live_layers == b.live_layers and c.live_layers[0] is not a.live_layers[0]
        assert (await sb.exec("stat -c %a /")).text().strip() == "755"
    finally:
        for k in kids:
            await k.close()


async def test_fork_rejects_n_below_one(sb):
    with pytest.raises(ValueError):
        await sb.fork(0)


async def test_same_content_same_snapshot_id(runtime):
    a = runtime.workspace_snapshot({"f.txt": "same", "d/g.txt": b"bytes"})
    b = runtime.workspace_snapshot({"d/g.txt": b"bytes", "f.txt": "same"})
    assert a.id == b.id
    assert a == b
    c = runtime.workspace_snapshot({"f.txt": "different", "d/g.txt": b"bytes"})
    assert c.id != a.id
    d = runtime.workspace_snapshot({"f.txt": "same", "d/h.txt": b"bytes"})
    assert d.id != a.id


async def test_same_directory_same_snapshot_id(runtime, project_dir):
    assert runtime.workspace_snapshot(project_dir).id == runtime.workspace_snapshot(project_dir).id


# ---- lifetime ------------------------------------------------------------------------------


async def test_lifetime_expires(runtime):
    cfg = SandboxConfig(limits=SandboxLimits(lifetime_s=1))
    sb = await runtime.create(None, cfg)
    try:
        proc = await sb.start(["sleep", "1000"])
        deadline = time.monotonic() + 15
        while sb.alive and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not sb.alive
        with pytest.raises(SandboxClosed):
            await sb.exec("true")
        with pytest.raises(SandboxClosed):
            await sb.reset()
        assert not await sb.ping()
        # The command running at expiry was killed and reported.
        res = await proc.wait()
        assert res.signal == signal.SIGKILL
        assert "expired" in repr(sb)
    finally:
        await sb.close()
    assert sb.id not in runtime.cgroups.list_groups()
    assert sb not in runtime.live


async def test_closed_sandbox_refuses_work(runtime, small_config):
    sb = await runtime.create(None, small_config)
    await sb.close()
    assert not sb.alive
    with pytest.raises(SandboxClosed):
        await sb.exec("true")
    with pytest.raises(SandboxClosed):
        sb.read_file("/etc/passwd")
    await sb.close()  # idempotent


async def test_lifetime_expiry_reports_killed_by_reset(runtime):
    cfg = SandboxConfig(limits=SandboxLimits(lifetime_s=1))
    sb = await runtime.create(None, cfg)
    try:
        proc = await sb.start(["sleep", "1000"])
        res = await asyncio.wait_for(proc.wait(), 15)
        assert res.killed_by_reset
    finally:
        await sb.close()


async def test_persisted_snapshot_lives_in_the_store_on_disk(runtime, small_config):
    sb = await runtime.create(runtime.workspace_snapshot({"a.txt": "1"}, config=small_config), small_config)
    try:
        await sb.exec("echo 2 > a.txt")
        fast = await sb.snapshot_state()
        kept = await sb.snapshot_state(persist=True)
        assert fast.layers[0] == kept.layers[0]  # same content, same layer id
        assert runtime.store.path(kept.layers[0]).parent == runtime.store.layers_dir
        child = await runtime.create(kept, small_config)
        try:
            assert (await child.exec("cat a.txt")).text() == "2\n"
        finally:
            await child.close()
    finally:
        await sb.close()
