"""The sandbox runtime: builds sandboxes on this host's kernel and cleans up after them.

One `SandboxRuntime` per process is enough; it owns the layer store, the cgroup
parent, the compiled init and the seccomp filters, and records every sandbox it
creates in a state directory so that a crashed owner's leftovers are reclaimed
by the next runtime to start (or by `tryloop sandbox gc`).

Where the host allows (`runtime.user_namespaces`), each sandbox also gets a user
namespace whose ids 0..65535 are a host id range of its own, claimed in a host-wide
registry (idranges.py) and released when it closes.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import resource
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tryloop.config import RuntimeConfig, SandboxConfig
from tryloop.errors import HostUnsupported, SandboxError
from tryloop.sandbox import protocol as P
from tryloop.sandbox import seccomp
from tryloop.sandbox.cgroups import CgroupHost, CgroupLimits, kernel_at_least
from tryloop.sandbox.doctor import IDMAPPED_TMPFS_KERNEL
from tryloop.sandbox.idranges import RANGE, IdRanges, start_time
from tryloop.sandbox.images import Image, host_image, load_image, with_host_python
from tryloop.sandbox.layers import LayerStore, Snapshot
from tryloop.sandbox.native import build_init
from tryloop.sandbox.sandbox import LiveLayer, Sandbox

log = logging.getLogger(__name__)

#: What a command running as uid 0 in a build sandbox holds (`create(root_capabilities=True)`),
#: with their numbers from linux/capability.h. What apt, dpkg and maintainer scripts need:
#: chown, write and chmod files of other owners, set-id bits, switch to another uid (apt's
#: `_apt`), signal their own processes. The kernel confines each to the sandbox's own user
#: namespace: they act on files whose owner and group the namespace maps (the image's layers
#: and the writable layer; a host file is unmapped there) and on the sandbox's processes.
BUILD_CAPABILITIES: dict[str, int] = {
    "CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_FSETID": 4, "CAP_KILL": 5,
    "CAP_SETGID": 6, "CAP_SETUID": 7,
}


@dataclass
class GcReport:
    records: int = 0
    cgroups: int = 0
    processes: int = 0
    tmp_dirs: int = 0
    id_ranges: int = 0
    networks: int = 0
    kept: int = 0
    details: list[str] = field(default_factory=list)

    @property
    def reclaimed(self) -> int:
        return self.records + self.cgroups + self.tmp_dirs + self.id_ranges + self.networks


def _raise_nofile() -> None:
    # Each live sandbox holds three descriptors (control socket, its zygote's socket, pidfd).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class SandboxRuntime:
    """Creates sandboxes from snapshots. See `create`."""

    def __init__(self, config: RuntimeConfig | None = None, *, gc: bool = True):
        self.config = config or RuntimeConfig()
        from tryloop.sandbox.doctor import require_host

        require_host(self.config)  # with user_namespaces: on, also that the host gives them
        mem = self.config.memory_dir
        self.store = LayerStore(self.config.store_dir, mem if mem is not None and mem.parent.is_dir() else None)
        self.cgroups = CgroupHost.detect(self.config.cgroup_name)
        if self.cgroups.missing:
            raise HostUnsupported(
                f"cgroup controllers missing: {', '.join(self.cgroups.missing)}; "
                "resource limits cannot be enforced (see `tryloop sandbox doctor`)",
                missing=[f"cgroup:{c}" for c in self.cgroups.missing],
            )
        self.init_path = build_init(self.config.store_dir / "native")
        self.records_dir = self.config.state_dir / "sandboxes"
        self.mnt_dir = self.config.state_dir / "mnt"
        self.records_dir.mkdir(parents=True, exist_ok=True)
        self.mnt_dir.mkdir(parents=True, exist_ok=True)
        self._seccomp_files: dict[tuple[str, ...], Path] = {}  # extra deny (+ "+build") -> file
        self._images: dict[str, Image] = {}
        self._host_images: dict[tuple[int, int], Image] = {}
        self._live: dict[str, Sandbox] = {}
        self._me = (os.getpid(), start_time(os.getpid()))
        self.id_ranges = self._id_ranges()
        _raise_nofile()
        if gc:
            self.gc()

    def _id_ranges(self) -> IdRanges | None:
        """The id-range registry if sandboxes get user namespaces here, else None (logged)."""
        from tryloop.sandbox.doctor import user_namespace_support

        mode = self.config.user_namespaces
        if mode == "off":
            self.user_namespaces_detail = "off (runtime.user_namespaces: off)"
            log.warning("sandboxes run without a user namespace (runtime.user_namespaces: off): "
                        "the agent's uid is the host's uid of the same number")
            return None
        ok, self.user_namespaces_detail = user_namespace_support(self.config)
        if not ok:  # "on" was refused by require_host: this is "auto"
            log.warning("sandboxes run without a user namespace, which this host cannot give them "
                        "(runtime.user_namespaces: auto): %s", self.user_namespaces_detail)
            return None
        return IdRanges(self.config.id_ranges_dir, self.config.id_ranges_first, self._me)

    @property
    def user_namespaces(self) -> bool:
        """Whether each sandbox of this runtime gets a user namespace and an id range of its own."""
        return self.id_ranges is not None

    @property
    def forks_in_place(self) -> bool:
        """Whether `Sandbox.fork` can lend a frozen writable layer instead of copying it: with
        user namespaces the child's launcher idmaps the parent's tmpfs, which Linux allows
        from 6.3 on (`tryloop sandbox doctor` says so); older kernels fork by copying."""
        return self.id_ranges is None or kernel_at_least(*IDMAPPED_TMPFS_KERNEL)

    # ---- images and snapshots -------------------------------------------

    def host_image(self, uid: int = 1000, gid: int = 1000) -> Image:
        key = (uid, gid)
        if key not in self._host_images:
            img = host_image(self.store, uid, gid)
            self._host_images[key] = img
            self._images[img.id] = img
        return self._host_images[key]

    def image(self, image_id: str) -> Image:
        if image_id not in self._images:
            self._images[image_id] = load_image(self.store, image_id)
        return self._images[image_id]

    def register_image(self, image: Image) -> None:
        self._images[image.id] = image

    def with_host_python(self, image_id: str) -> Image:
        """The image `image_id` with this host's Python bound in (images.with_host_python): the
        root of a task's sandboxes when the task has an environment image of its own."""
        key = f"python:{image_id}"
        if key not in self._images:
            img = with_host_python(self.store, self.image(image_id))
            self._images[img.id] = img
            self._images[key] = img
        return self._images[key]

    def base_snapshot(self, config: SandboxConfig | None = None) -> Snapshot:
        """The default image with nothing on top: an empty /workspace."""
        cfg = config or SandboxConfig()
        return Snapshot(self.host_image(cfg.uid, cfg.gid).id)

    def workspace_snapshot(self, src: str | Path | dict[str, bytes | str], *,
                           image: Image | None = None, config: SandboxConfig | None = None) -> Snapshot:
        """A snapshot whose /workspace holds `src` (a directory or {relative path: content}).

        The files become a content-addressed layer owned by the agent's uid, so the
        same content always gives the same snapshot id.
        """
        cfg = config or SandboxConfig()
        img = image or self.host_image(cfg.uid, cfg.gid)
        cfg = img.sandbox_config(cfg)  # an image's workdir and user, as sandboxes on it get them
        ws = cfg.workdir.strip("/")
        if isinstance(src, dict):
            layer = self.store.add_files({f"{ws}/{k.lstrip('/')}": v for k, v in src.items()},
                                         uid=cfg.uid, gid=cfg.gid)
        else:
            src = Path(src)
            if not src.is_dir():
                raise SandboxError(f"workspace source {src} is not a directory")
            with tempfile.TemporaryDirectory(dir=self.store.tmp_dir) as tmp:
                dst = Path(tmp) / ws
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(src, dst, symlinks=True)
                layer = self.store.add_tree(Path(tmp), uid=cfg.uid, gid=cfg.gid)
        snap = Snapshot(img.id, (layer,))
        self.store.save_snapshot(snap, {"source": str(src) if not isinstance(src, dict) else "files"})
        return snap

    def _seccomp_file(self, extra: Iterable[str], build: bool = False) -> Path:
        names = tuple(sorted(set(extra)))
        key = (*names, "+build") if build else names
        path = self._seccomp_files.get(key)
        if path is None:
            prog = seccomp.build_filter(names, build=build)
            d = self.config.store_dir / "seccomp"
            d.mkdir(parents=True, exist_ok=True)
            path = d / f"{hashlib.sha256(prog).hexdigest()[:16]}.bpf"
            if not path.exists():
                tmp = d / f".{path.name}.{os.getpid()}"
                tmp.write_bytes(prog)
                os.replace(tmp, path)
            self._seccomp_files[key] = path
        return path

    # ---- sandboxes ---------------------------------------------------------

    async def create(self, snapshot: Snapshot | None = None, config: SandboxConfig | None = None,
                     *, timeout: float = 10.0, root_capabilities: bool = False,
                     live: Sequence[LiveLayer] = ()) -> Sandbox:
        """Start a sandbox whose files are exactly `snapshot` (default: the bare host image).

        `root_capabilities` (build sandboxes only): commands run as uid 0 hold
        BUILD_CAPABILITIES of the sandbox's own user namespace, and the sandbox loads the
        build variant of the seccomp filter (seccomp.build_filter(build=True)); refused
        without a user namespace.

        Every sandbox has a network namespace of its own, never the host's. With
        `config.network` it gets the filtered uplink of buildnet.py before any command runs,
        and the host's reachable nameservers and /etc/hosts on top of its root (a layer
        mounted there only, never part of a snapshot); a host that cannot give it fails
        the start (buildnet.SandboxNetworkError), never falls back to the host's network.
        The veth goes when the sandbox closes.

        `live` (forks, `Sandbox.fork`): frozen writable layers of other sandboxes stacked on
        top of `snapshot`, top-most first, each lent by its owner as a mount.
        """
        cfg = config or SandboxConfig()
        net_layer = ""
        if cfg.network:
            from tryloop.sandbox import buildnet

            net_layer = buildnet.etc_layer(self.store, cfg.hostname)
        sb = await self._create(snapshot, cfg, timeout, root_capabilities, net_layer, tuple(live))
        if cfg.network:
            try:
                sb.netdev = buildnet.attach(sb.init_pid).dev
                self._note_netdev(sb.id, sb.netdev)
            except BaseException:
                await sb.close()
                raise
        return sb

    async def _create(self, snapshot: Snapshot | None, cfg: SandboxConfig, timeout: float,
                      root_capabilities: bool, net_layer: str = "", live: tuple[LiveLayer, ...] = ()) -> Sandbox:
        if root_capabilities and self.id_ranges is None:
            raise SandboxError("capabilities for root are given only inside a user namespace of the sandbox's "
                               f"own, which this runtime does not give ({self.user_namespaces_detail})")
        if self.id_ranges is not None and max(cfg.uid, cfg.gid) >= RANGE:
            raise SandboxError(f"agent uid {cfg.uid} / gid {cfg.gid}: a sandbox's user namespace maps ids "
                               f"0..{RANGE - 1} only")
        if min(cfg.uid, cfg.gid) == 0 and self.id_ranges is None:  # image builds ask for the namespace's root
            raise SandboxError("commands run as uid 0 only in a sandbox with a user namespace, which this "
                               f"runtime does not give ({self.user_namespaces_detail})")
        snap = snapshot or self.base_snapshot(cfg)
        image = self.image(snap.image)
        cfg = image.sandbox_config(cfg)  # the image's workdir and user, unless the config names them
        top = [("lower", str(self.store.path(net_layer)))] if net_layer else []
        below = [("lower", str(self.store.path(d))) for d in (*snap.layers, *image.layers)]
        lent: list[int] = []  # closed below once the launcher has its copies
        try:
            for layer in live:
                lent.append(await layer.owner.lend_layer(layer))
            # Lower layers top-most first: the network's, the lent ones, the snapshot's, the image's.
            lowers = [*top, *(("lowerfd", str(i)) for i in range(len(lent))), *below]
            return await self._launch(snap, image, cfg, timeout, root_capabilities, lowers, lent, live, len(top))
        finally:
            for fd in lent:
                os.close(fd)

    async def _launch(self, snap: Snapshot, image: Image, cfg: SandboxConfig, timeout: float,
                      root_capabilities: bool, lowers: list[tuple[str, str]], lent: list[int],
                      live: tuple[LiveLayer, ...], live_at: int) -> Sandbox:
        sid = secrets.token_hex(6)
        lim = cfg.limits
        id_base = self.id_ranges.claim(sid) if self.id_ranges is not None else 0
        try:
            self._write_record(sid, id_base)
        except BaseException:
            self._release_range(id_base)
            raise
        cg = None
        parent_sock = child_sock = None
        launcher = 0
        try:
            cg = self.cgroups.create(sid, CgroupLimits(
                memory_bytes=lim.memory_mb << 20, pids=lim.pids,
                cpu_quota_us=int(lim.cpus * 100_000), cpu_weight=lim.cpu_weight))
            items = [("mnt", str(self.mnt_dir)), ("hostname", cfg.hostname),
                     ("seccomp", str(self._seccomp_file(cfg.seccomp_extra_deny, build=root_capabilities))),
                     ("quota", str(lim.disk_mb << 20)),
                     ("shm", str(lim.dev_shm_mb << 20)),
                     ("lifetime_ms", str(int(lim.lifetime_s * 1000)) if lim.lifetime_s else "0")]
            if id_base:
                items.append(("idbase", str(id_base)))
                if root_capabilities:
                    items.append(("rootcaps", str(sum(1 << n for n in BUILD_CAPABILITIES.values()))))
            items += lowers
            for src, dst in image.binds:
                items += [("bsrc", src), ("bdst", dst)]
            items += [("cg", str(p)) for p in cg.procs_files()]
            parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            os.set_inheritable(child_sock.fileno(), True)
            launcher = os.posix_spawn(str(self.init_path), [str(self.init_path), str(child_sock.fileno())],
                                      {})
            child_sock.close()
            child_sock = None
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", lent))] if lent else []
            parent_sock.sendmsg([P.encode_config(items)], anc)
            parent_sock.setblocking(False)
            env = dict(image.env)
            env.update(cfg.env)
            sb = Sandbox(self, sid, snap, cfg, env, cg, parent_sock, id_base=id_base, live=live,
                         live_at=live_at)
            parent_sock = None
            try:
                await sb._handshake(timeout)
            except BaseException as e:
                reason = sb._dead_reason or f"no answer from init within {timeout}s"
                sb._detach(reason)
                sb._release_init()  # kill, reap, close the pidfd
                if isinstance(e, asyncio.CancelledError):
                    raise
                raise SandboxError(f"sandbox {sid} failed to start: {reason}") from None
            finally:
                _reap(launcher)
                launcher = 0
            if id_base and self.id_ranges is not None:
                # From here the range is held while the init lives, even past our own death.
                self.id_ranges.started(id_base, sid, sb.init_pid)
            self._live[sid] = sb
            return sb
        except BaseException:
            for s in (parent_sock, child_sock):
                if s is not None:
                    s.close()
            if launcher:
                _reap(launcher)
            if cg is not None:
                with contextlib.suppress(Exception):
                    cg.remove()
            self._remove_record(sid)
            self._release_range(id_base)
            raise

    def _release_range(self, id_base: int) -> None:
        if id_base and self.id_ranges is not None:
            self.id_ranges.release(id_base)

    def _forget(self, sb: Sandbox) -> None:
        # The init has been reaped: every process of the sandbox is gone with it (pid 1 of
        # its pid namespace), so nothing runs with the range's ids any more.
        self._live.pop(sb.id, None)
        try:
            if sb.netdev:
                from tryloop.sandbox import buildnet

                try:
                    buildnet.detach(sb.netdev)
                except Exception as e:  # the next runtime's gc retries
                    log.warning("sandbox %s: removing its network %s: %s", sb.id, sb.netdev, e)
            sb.cgroup.remove()
        finally:
            self._remove_record(sb.id)
            self._release_range(sb.id_base)

    @property
    def live(self) -> list[Sandbox]:
        return list(self._live.values())

    async def close_all(self) -> None:
        await asyncio.gather(*(sb.close() for sb in list(self._live.values())), return_exceptions=True)

    # ---- crash records and garbage collection ------------------------------

    def _write_record(self, sid: str, id_base: int = 0) -> None:
        data = json.dumps({"id": sid, "owner_pid": self._me[0], "owner_start": self._me[1],
                           "cgroup": sid, "id_base": id_base, "created": time.time()})
        fd = os.open(self.records_dir / f"{sid}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data.encode())
        finally:
            os.close(fd)

    def _note_netdev(self, sid: str, dev: str) -> None:
        """Add a sandbox's veth to its record, for gc after a crash."""
        path = self.records_dir / f"{sid}.json"
        rec = json.loads(path.read_text())
        rec["netdev"] = dev
        tmp = path.with_name(f".{sid}.tmp")
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, path)

    def _remove_record(self, sid: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.records_dir / f"{sid}.json")

    def gc(self) -> GcReport:
        """Reclaim what sandboxes of dead owners left behind: processes, cgroups, records.

        Mounts need no reclaiming: they live in each sandbox's private mount
        namespace and vanish with its last process.
        """
        report = GcReport()
        recorded: set[str] = set()
        netdevs: list[str] = []
        for rec_path in sorted(self.records_dir.glob("*.json")):
            try:
                rec = json.loads(rec_path.read_text())
            except (OSError, ValueError):
                rec_path.unlink(missing_ok=True)
                report.records += 1
                continue
            sid = rec["id"]
            owner = (rec["owner_pid"], rec["owner_start"])
            # Only a dead owner's sandboxes are reclaimed: a live process may hold
            # several runtimes, each with its own sandboxes.
            if start_time(owner[0]) == owner[1]:
                recorded.add(rec["cgroup"])
                report.kept += 1
                continue
            if rec.get("netdev"):
                netdevs.append(rec["netdev"])
            try:
                group = self.cgroups.group(rec["cgroup"])
                report.processes += len(group.pids())
                self.cgroups.remove(rec["cgroup"])
                report.cgroups += 1
            except Exception as e:  # keep going: gc must reclaim what it can
                report.details.append(f"{sid}: {e}")
            rec_path.unlink(missing_ok=True)
            report.records += 1
            report.details.append(f"reclaimed sandbox {sid} of dead owner pid {owner[0]}")
        for name in self.cgroups.list_groups():
            if name in recorded or name in self._live:
                continue
            # A group without a record here is either a leftover whose rmdir failed,
            # or a live sandbox of another runtime sharing the cgroup parent with a
            # different state_dir, or one being created right now. Only empty groups
            # older than a minute are leftovers for sure.
            with contextlib.suppress(Exception):
                group = self.cgroups.group(name)
                if group.pids() or time.time() - min(p.stat().st_mtime for p in group.paths.values()) < 60:
                    continue
                self.cgroups.remove(name)
                report.cgroups += 1
                report.details.append(f"removed empty orphan cgroup {name}")
        from tryloop.sandbox import buildnet

        # After the cgroups: the dead owners' veths (gone with their namespaces, or removed
        # here), then the nft table and forwarding if no sandbox network is left.
        for line in buildnet.reclaim(netdevs):
            report.networks += 1
            report.details.append(line)
        if self.id_ranges is not None:
            # After the cgroups: a dead owner's sandboxes are gone, and their ranges with them.
            freed = self.id_ranges.reclaim_dead()
            report.id_ranges += len(freed)
            if freed:
                report.details.append(f"released {len(freed)} id ranges of dead owners")
        cutoff = time.time() - 3600
        for entry in self.store.tmp_dir.iterdir():
            with contextlib.suppress(OSError):
                if entry.stat().st_mtime < cutoff:
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
                    report.tmp_dirs += 1
        return report


def _reap(pid: int) -> None:
    """Wait for the launcher, which exits right after forking the init."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
