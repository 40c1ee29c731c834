"""Real image archives built in the test: layer tars (with whiteouts) written by tarfile,
wrapped as a `docker save` tarball or an OCI image layout, with a JSON config.

The base layer holds the host's dash as /bin/sh with the C library and loader it links
against, so commands run in a sandbox whose root is only the archive's layers.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

Entry = tuple  # (name, kind, payload, mode[, uid, gid]); kind: f d l h c wh opq


def _shared_libs(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        for p in parts:
            if p.startswith("/") and os.path.exists(p):
                libs.append(p)
    return libs


def base_entries(passwd: str = "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234::/home/app:/bin/sh\n",
                 tools: tuple[str, ...] = ()) -> list[Entry]:
    """A minimal root: /bin/sh (dash), the host's `tools` (cat, mkdir, ...), the libraries
    they link against, /etc/passwd and /etc/group."""
    sh = os.path.realpath("/bin/sh") if os.path.basename(os.path.realpath("/bin/sh")) == "dash" else "/usr/bin/dash"
    entries: list[Entry] = [("bin", "d", None, 0o755), ("etc", "d", None, 0o755), ("tmp", "d", None, 0o1777)]
    entries.append(("bin/sh", "f", Path(sh).read_bytes(), 0o755))
    binaries = [sh]
    for tool in tools:
        path = shutil.which(tool)
        assert path, f"host tool {tool} missing"
        entries.append((f"bin/{tool}", "f", Path(os.path.realpath(path)).read_bytes(), 0o755))
        binaries.append(path)
    seen = set()
    for lib in sorted({lib for b in binaries for lib in _shared_libs(b)}):
        rel = lib.lstrip("/")
        if rel in seen:
            continue
        seen.add(rel)
        parts = rel.split("/")
        for i in range(1, len(parts)):
            d = "/".join(parts[:i])
            if d not in seen:
                seen.add(d)
                entries.append((d, "d", None, 0o755))
        entries.append((rel, "f", Path(os.path.realpath(lib)).read_bytes(), 0o755))
    entries.append(("etc/passwd", "f", passwd.encode(), 0o644))
    entries.append(("etc/group", "f", b"root:x:0:\napp:x:1234:\nstaff:x:50:\n", 0o644))
    return entries


def layer_tar(entries: list[Entry], *, gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            name, kind, payload, mode = e[:4]
            uid, gid = (e[4], e[5]) if len(e) > 5 else (0, 0)
            ti = tarfile.TarInfo(name)
            ti.mode, ti.uid, ti.gid, ti.mtime = mode, uid, gid, 1_600_000_000
            data = None
            if kind == "f":
                ti.type, data = tarfile.REGTYPE, payload
                ti.size = len(payload)
            elif kind == "d":
                ti.type = tarfile.DIRTYPE
            elif kind == "l":
                ti.type, ti.linkname = tarfile.SYMTYPE, payload
            elif kind == "h":
                ti.type, ti.linkname = tarfile.LNKTYPE, payload
            elif kind == "c":
                ti.type, ti.devmajor, ti.devminor = tarfile.CHRTYPE, 1, 3
            elif kind == "wh":  # delete `name` (a path): its whiteout marker
                d, _, leaf = name.rpartition("/")
                ti.name = f"{d}/.wh.{leaf}" if d else f".wh.{leaf}"
                ti.type, ti.size, data = tarfile.REGTYPE, 0, b""
            elif kind == "opq":  # `name` is a directory made opaque
                ti.name = f"{name}/.wh..wh..opq"
                ti.type, ti.size, data = tarfile.REGTYPE, 0, b""
            tar.addfile(ti, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue()
    return gzip.compress(raw, mtime=0) if gz else raw


def image_config(layers: list[bytes], *, env=None, workdir="", user="", cmd=None) -> dict:
    diff_ids = ["sha256:" + hashlib.sha256(gzip.decompress(b) if b[:2] == b"\x1f\x8b" else b).hexdigest()
                for b in layers]
    return {"architecture": "amd64", "os": "linux",
            "config": {"Env": env or [], "WorkingDir": workdir, "User": user, "Cmd": cmd},
            "rootfs": {"type": "layers", "diff_ids": diff_ids}}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime = len(data), 1_600_000_000
    tar.addfile(ti, io.BytesIO(data))


def docker_save(path: Path, layers: list[bytes], config: dict, tag: str = "test:latest") -> Path:
    cfg = json.dumps(config).encode()
    cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
    names = []
    with tarfile.open(path, "w") as tar:
        for i, data in enumerate(layers):
            name = f"{i:04d}{hashlib.sha256(data).hexdigest()[:12]}/layer.tar"
            names.append(name)
            _add(tar, name, data)
        _add(tar, cfg_name, cfg)
        _add(tar, "manifest.json", json.dumps([{"Config": cfg_name, "RepoTags": [tag], "Layers": names}]).encode())
    return path


def oci_layout(path: Path, layers: list[bytes], config: dict, ref: str = "latest", *,
               as_tar: bool = False) -> Path:
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> str:
        d = hashlib.sha256(data).hexdigest()
        blobs[d] = data
        return "sha256:" + d

    cfg = json.dumps(config).encode()
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": blob(cfg),
                           "size": len(cfg)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar" +
                            ("+gzip" if b[:2] == b"\x1f\x8b" else ""), "digest": blob(b), "size": len(b)}
                           for b in layers]}
    mdata = json.dumps(manifest).encode()
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": blob(mdata), "size": len(mdata),
        "annotations": {"org.opencontainers.image.ref.name": ref}}]}
    files = {"oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
             "index.json": json.dumps(index).encode()}
    files.update({f"blobs/sha256/{d}": b for d, b in blobs.items()})
    if as_tar:
        with tarfile.open(path, "w") as tar:
            for name, data in files.items():
                _add(tar, name, data)
    else:
        for name, data in files.items():
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_bytes(data)
    return path
