"""Debian base roots from packages, in the manner of mmdebstrap, without a chroot on the host.

`debian_root(runtime, ["jq", ...])` makes an image of the host's Debian release (the
archives and lists apt is configured with) holding the Essential packages, the packages
asked for and everything they depend on:

1. apt resolves the set against an empty status database (`apt-get install
   --print-uris`): no network, nothing installed. The sorted list of the resolved
   files and their archive hashes is the root's *package digest*; a root already built
   for that digest is reused as it is.
2. apt downloads the files (signatures checked as for any apt download) into the
   store's `debian-cache/`, shared between roots.
3. Each package's data is unpacked on the host (`dpkg-deb --fsys-tarfile`; no package
   code runs) into a merged-/usr tree, with the dpkg database written as dpkg itself
   leaves it after unpacking: every package "install ok unpacked", its file list and
   maintainer scripts under /var/lib/dpkg/info. That tree is one layer.
4. The maintainer scripts run in a build sandbox on that layer, as root of its own
   user namespace (with the build capabilities of that namespace) and without network (`preinst install` of each package, then
   `dpkg --configure -a`); what they change is a second layer.

A root with apt in it also gets the host's apt sources, the keyrings they name and its
proxy settings (`host_apt_config`), a layer of their own, so that `apt-get install` in a
RUN step on it reaches the archives the way the host does.

Conffiles are not recorded as such in the status database (upgrading one later treats
it as an ordinary file). The image's environment is Debian's default PATH, its user
root (sandboxes on it run as the config's unprivileged uid), its working directory /.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from tryloop.sandbox.dockerfile import BuildError, BuildOptions, run_build_step
from tryloop.sandbox.images import Image, load_image, make_image
from tryloop.sandbox.oci import mountpoints_layer

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_URI = re.compile(r"^'([^']+)' (\S+) (\d+) ?(\S*)$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]*(:[a-z0-9]+)?(=[A-Za-z0-9.+~:-]+)?$")
_MERGED = (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"))


def _apt_opts(status: Path, archives: Path) -> list[str]:
    return ["-o", f"Dir::State::status={status}", "-o", f"Dir::Cache::archives={archives}",
            "-o", "Debug::NoLocking=1", "-o", "APT::Install-Recommends=false", "-o", "APT::Get::Assume-Yes=true"]


def _run(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=kw.pop("text", True), **kw)
    if res.returncode != 0:
        err = res.stderr if isinstance(res.stderr, str) else res.stderr.decode(errors="replace")
        raise BuildError(f"{what} failed (exit {res.returncode}): {err.strip()[-2000:]}")
    return res


def _lists_stamp() -> str:
    """Changes whenever apt's package lists do (apt-get update)."""
    h = hashlib.sha256()
    lists = Path("/var/lib/apt/lists")
    for p in sorted(lists.glob("*_Packages*")) if lists.is_dir() else []:
        st = p.stat()
        h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def essential_packages(cache_dir: Path | None = None) -> list[str]:
    """The packages of the configured archives marked Essential: yes (kept in `cache_dir`
    until apt's package lists change)."""
    cached = cache_dir / f"essential-{_lists_stamp()[:16]}.json" if cache_dir is not None else None
    if cached is not None and cached.is_file():
        with contextlib.suppress(ValueError):
            return list(json.loads(cached.read_text()))
    out = _run(["apt-cache", "dumpavail"], "apt-cache dumpavail").stdout
    names, pkg = set(), None
    for line in out.splitlines():
        if line.startswith("Package: "):
            pkg = line[9:].strip()
        elif line.strip() == "Essential: yes" and pkg:
            names.add(pkg)
    if not names:
        raise BuildError("apt knows no Essential packages: run `apt-get update` on the host first")
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}")
        tmp.write_text(json.dumps(sorted(names)))
        os.replace(tmp, cached)
    return sorted(names)


_APT_CONF_KEEP = re.compile(r"^Acquire::(([A-Za-z0-9]+::)?Proxy(::\S+)?|Check-Valid-Until|Check-Date|"
                            r"(https?::)?Timeout|Retries) ")
_SIGNED_BY = re.compile(r"(?:^Signed-By:\s*|\[[^]]*signed-by=)(/[^\s\]]+)", re.M | re.I)


def host_apt_config() -> dict[str, bytes]:
    """What apt in a root needs to reach the archives the way the host's apt does, as
    files of the root: the host's sources (`/etc/apt/sources.list` and the enabled
    `.list`/`.sources` files of `sources.list.d`), the keyrings they name with
    `Signed-By`, and the host's proxy and archive-validity settings
    (`etc/apt/apt.conf.d/00host`, from `apt-config dump`)."""
    files: dict[str, bytes] = {}
    etc = Path("/etc/apt")
    sources = [etc / "sources.list"] if (etc / "sources.list").is_file() else []
    d = etc / "sources.list.d"
    if d.is_dir():
        sources += sorted(p for p in d.iterdir() if p.suffix in (".list", ".sources") and p.is_file())
    for p in sources:
        data = p.read_bytes()
        files[str(p).lstrip("/")] = data
        for key in _SIGNED_BY.findall(data.decode(errors="replace")):
            k = Path(key)
            if k.is_file() and str(k).startswith(("/usr/share/keyrings/", "/etc/apt/")):
                files[str(k).lstrip("/")] = k.read_bytes()
    dump = subprocess.run(["apt-config", "dump"], capture_output=True, text=True)
    keep = [ln for ln in dump.stdout.splitlines() if _APT_CONF_KEEP.match(ln)] if dump.returncode == 0 else []
    if keep:
        files["etc/apt/apt.conf.d/00host"] = ("// the host's apt settings for reaching its archives\n"
                                              + "\n".join(keep) + "\n").encode()
    return files


def resolve(packages: list[str], work: Path) -> list[tuple[str, str, str]]:
    """(uri, file name, hash) of every package the set needs, from an empty system."""
    for p in packages:
        if not _NAME.fullmatch(p):
            raise BuildError(f"debian root: {p!r} is not a Debian package name (name[:arch][=version])")
    status = work / "status"
    status.touch()
    archives = work / "archives"
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["apt-get", "install", "--print-uris", "-qq", *_apt_opts(status, archives), *packages],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise BuildError(f"debian root: apt cannot resolve {' '.join(packages)}: {res.stdout.strip()} "
                         f"{res.stderr.strip()}"[-2000:])
    out = []
    for line in res.stdout.splitlines():
        m = _URI.match(line.strip())
        if m:
            out.append((m.group(1), m.group(2), m.group(4)))
    return sorted(out, key=lambda x: x[1])


async def debian_root(runtime, packages: list[str], *, on_step: Callable[[str], None] | None = None,
                      options: BuildOptions | None = None,
                      on_output: Callable[[str, bytes], None] | None = None) -> Image:
    """A Debian root with the Essential packages plus `packages` (see the module doc)."""
    say = on_step or (lambda _msg: None)
    store = runtime.store
    wanted = sorted(set(packages))
    with tempfile.TemporaryDirectory(dir=store.tmp_dir) as tmp:
        work = Path(tmp)
        essential = essential_packages(store.root / "debian-cache")
        files = resolve(sorted(set(essential) | set(wanted)), work)
        arch = _run(["dpkg", "--print-architecture"], "dpkg --print-architecture").stdout.strip()
        names_resolved = {f.split("_", 1)[0] for _, f, _ in files}
        # A root with apt gets the host's sources and proxy settings (a layer of its own),
        # so `apt-get install` in a RUN step on it reaches the archives as the host does.
        apt_conf = host_apt_config() if "apt" in names_resolved else {}
        digest = hashlib.sha256(json.dumps([arch, [[f, h] for _, f, h in files],
                                            sorted((k, hashlib.sha256(v).hexdigest())
                                                   for k, v in apt_conf.items())]).encode()).hexdigest()
        record = store.root / "debian-roots" / digest
        if record.is_file():
            try:
                image = load_image(store, record.read_text().strip())
                if all(store.has(layer) for layer in image.layers):
                    say(f"cached root for package digest {digest[:12]}")
                    return image
            except KeyError:
                pass
        cache = store.root / "debian-cache"
        (cache / "partial").mkdir(parents=True, exist_ok=True)
        say(f"{len(files)} packages (digest {digest[:12]}); downloading what the cache lacks")
        _run(["apt-get", "install", "--download-only", "-qq", *_apt_opts(work / "status", cache),
              *sorted(set(essential) | set(wanted))], "apt-get download")
        debs = [cache / f for _, f, _ in files]
        missing = [d.name for d in debs if not d.is_file()]
        if missing:
            raise BuildError(f"debian root: apt did not download {', '.join(missing[:5])}")
        root = work / "root"
        root.mkdir(mode=0o755)
        say(f"unpacking {len(debs)} packages")
        names = _unpack_all(root, debs, work)
        unpacked = store.add_tree(root)
    bottom = mountpoints_layer(store)
    layers = [unpacked, bottom]
    if apt_conf:
        layers.insert(0, store.add_files(apt_conf, uid=0, gid=0))
    # base-passwd's preinst makes /etc/passwd and /etc/group: it runs first.
    script = ("set -e; /sbin/ldconfig; export DEBIAN_FRONTEND=noninteractive DPKG_MAINTSCRIPT_NAME=preinst; "
              "cd /var/lib/dpkg/info; for p in base-passwd " + " ".join(n for n in names if n != "base-passwd") +
              "; do f=$p.preinst; [ -e $f ] || f=$p:" + arch + ".preinst; "
              "if [ -x $f ]; then DPKG_MAINTSCRIPT_PACKAGE=${p%%:*} ./$f install; fi; done; "
              "unset DPKG_MAINTSCRIPT_NAME; dpkg --configure -a --force-confdef --force-confold")
    say("running the maintainer scripts in a build sandbox")
    opts = options or BuildOptions(network=False)
    configured = await run_build_step(runtime, layers, {"PATH": _PATH, "LANG": "C.UTF-8"},
                                      ["/bin/sh", "-c", script], options=opts,
                                      what=f"debian root ({len(names)} packages): configuring",
                                      on_output=on_output)
    if configured:
        layers.insert(0, configured)
    image = make_image(store, layers, [("PATH", _PATH), ("LANG", "C.UTF-8")], workdir="/", user="root",
                       meta={"kind": "debian", "packages": wanted, "arch": arch, "package_digest": digest,
                             "installed": len(names)})
    runtime.register_image(image)
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp_rec = record.with_name(f".{digest}.{os.getpid()}")
    tmp_rec.write_text(image.id)
    os.replace(tmp_rec, record)
    return image


_INFO_SKIP = {"control"}
#: What base-files' postinst chowns, prepared with the ownership it sets (Debian's fixed
#: gids: mail 8, utmp 43), so that the unpacked layer already has it (the scripts' own
#: chown, with the build sandbox's CAP_CHOWN, then changes nothing). (path, gid, mode, is_dir)
_PRESET = (("var/mail", 8, 0o2775, True), ("var/log/wtmp", 43, 0o664, False),
           ("var/log/btmp", 43, 0o660, False), ("var/log/lastlog", 43, 0o664, False))


def _unpack_all(root: Path, debs: list[Path], work: Path) -> list[str]:
    """Unpack every package into a merged-/usr `root` and write its dpkg database;
    returns the package names (with :arch for Multi-Arch: same ones)."""
    for d in ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "var/lib/dpkg/info", "var/lib/dpkg/updates",
              "var/lib/dpkg/triggers", "var/lib/dpkg/alternatives"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link, target in _MERGED:
        os.symlink(target, root / link)
    stanzas, names = [], []
    for deb in debs:
        ctl = work / "ctl"
        if ctl.exists():
            shutil.rmtree(ctl)
        _run(["dpkg-deb", "--control", str(deb), str(ctl)], f"dpkg-deb --control {deb.name}")
        control = (ctl / "control").read_text()
        fields = dict(re.findall(r"^([A-Za-z-]+): ?(.*)$", control, re.M))
        pkg, arch = fields["Package"], fields.get("Architecture", "all")
        key = f"{pkg}:{arch}" if fields.get("Multi-Arch") == "same" else pkg
        data = work / "data.tar"
        with open(data, "wb") as out:
            subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=out, check=True)
        listing = _run(["tar", "-tf", str(data)], f"tar -t {deb.name}").stdout.splitlines()
        _run(["tar", "-xf", str(data), "-C", str(root), "--keep-directory-symlink", "--numeric-owner",
              "--same-permissions", "--same-owner"], f"unpacking {deb.name}")
        paths = []
        for entry in listing:
            p = "/" + entry.lstrip("./").rstrip("/") if entry not in ("./", ".") else "/."
            paths.append(p)
        info = root / "var/lib/dpkg/info"
        (info / f"{key}.list").write_text("\n".join(paths) + "\n")
        for member in sorted(ctl.iterdir()):
            if member.name not in _INFO_SKIP:
                shutil.copy2(member, info / f"{key}.{member.name}")
        lines = control.rstrip("\n").split("\n")
        lines.insert(1, "Status: install ok unpacked")
        stanzas.append("\n".join(lines))
        names.append(key)
    for rel, gid, mode, is_dir in _PRESET:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if is_dir:
            p.mkdir(exist_ok=True)
        else:
            p.touch()
        os.chown(p, 0, gid)
        os.chmod(p, mode)
    (root / "var/lib/dpkg/status").write_text("\n\n".join(stanzas) + "\n")
    (root / "var/lib/dpkg/available").write_text("")
    (root / "var/lib/dpkg/arch").write_text(subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True).stdout)
    (work / "data.tar").unlink(missing_ok=True)
    return names


def host_release() -> tuple[str, str]:
    """(VERSION_ID, VERSION_CODENAME) of the host's Debian release, from /etc/os-release."""
    fields = {}
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            k, sep, v = line.partition("=")
            if sep:
                fields[k] = v.strip().strip('"')
    if fields.get("ID") != "debian" and "debian" not in fields.get("ID_LIKE", "").split():
        return "", ""
    return fields.get("VERSION_ID", ""), fields.get("VERSION_CODENAME", "")


def debian_base_ref(ref: str) -> bool:
    """Whether the image reference `ref` (a Dockerfile's FROM) names the host's Debian
    release: `debian:bookworm`, `debian:12`, `debian:bookworm-slim`, `debian:12.5`. A bare
    `debian` or `debian:latest` does not (latest may be another release)."""
    name, _, tag = ref.removeprefix("docker.io/").removeprefix("library/").partition(":")
    version, codename = host_release()
    if name != "debian" or not (version or codename):
        return False
    tag = tag.removesuffix("-slim")
    return bool(tag) and (tag in (codename, version) or tag.split(".")[0] == version)


async def provide_base(runtime, ref: str, *, on_step: Callable[[str], None] | None = None) -> Image | None:
    """The image a Dockerfile's `FROM ref` names, made on this host when the store has none:
    a Debian root of the host's release with apt (`debian_root(runtime, ["apt"])`), tagged
    `ref`, for the names of that release (see debian_base_ref). None for any other name."""
    from tryloop.sandbox.catalog import tag_image

    if not debian_base_ref(ref):
        return None
    image = await debian_root(runtime, ["apt"], on_step=on_step)
    tag_image(runtime.store, ref, image.id)
    return image
