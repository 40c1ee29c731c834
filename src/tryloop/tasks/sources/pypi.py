"""Projects from PyPI source distributions.

    project = project_from_sdist("more-itertools==10.2.0", work_dir)

`pip download --no-deps --no-binary=:all:` fetches the sdist (pip is the
registry's ordinary client; note that pip prepares the sdist's metadata, which
runs its build backend on this host, as any `pip download` of an sdist does).
The archive is extracted with tarfile's `data` filter (no absolute paths, no
`..`, no links out of the tree, no devices), its project root found, and its
tests detected like a local directory's (`tests/`, `test/`, `test_*.py`...).

The project is not installed in the sandbox: the test command is
`python3 -m pytest -q <test paths>`, which imports a flat-layout package from
the working directory, plus `-o pythonpath=src` for a src layout (see
`default_test_command`). Packages whose tests need compiled extensions, a
build step or dependencies missing from the sandbox image fail the quality
gate instead of passing here.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from tryloop.tasks.project import Project
from tryloop.tasks.sources.local import SourceError, project_from_dir, validate_name

_SPEC_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9.+!_-]+)\s*$")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip")


def normalize_name(name: str) -> str:
    """PEP 503 normalized name (lowercase, runs of '-', '_', '.' become '-')."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_spec(spec: str) -> tuple[str, str]:
    """`name==version` → (name, version). Only pinned specs: a task must not change under us."""
    m = _SPEC_RE.match(spec)
    if not m:
        raise SourceError(f"sdist spec {spec!r} must pin one version: 'name==version'")
    return m.group(1), m.group(2)


def download_sdist(spec: str, dest: Path, *, timeout: float = 300) -> Path:
    """Download the sdist for `spec` into `dest` with pip; return the archive's path."""
    parse_spec(spec)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".pip-", dir=dest))
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--retries", "1", "--timeout", "20",
               "-q", "-d", str(tmp), spec]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SourceError(f"pip download {spec} took more than {timeout:.0f}s") from None
        if res.returncode != 0:
            raise SourceError(f"pip download {spec} failed: {(res.stderr or res.stdout).strip()[-2000:]}")
        got = [p for p in tmp.iterdir() if p.name.endswith(ARCHIVE_SUFFIXES)]
        if len(got) != 1:
            raise SourceError(f"pip download {spec}: expected one sdist, got {sorted(p.name for p in got)}")
        return Path(shutil.move(got[0], dest / got[0].name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def extract_archive(archive: Path, dest: Path) -> Path:
    """Extract a .tar.* or .zip safely into `dest` (created); return the project root (the single
    top-level directory, or `dest` itself)."""
    archive, dest = Path(archive), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                root = dest.resolve()
                for info in zf.infolist():
                    target = (dest / info.filename).resolve()
                    if not target.is_relative_to(root) or Path(info.filename).is_absolute():
                        raise SourceError(f"{archive.name}: member {info.filename!r} leaves the archive")
                zf.extractall(dest)
        else:
            with tarfile.open(archive) as tf:
                tf.extractall(dest, filter="data")
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as e:
        shutil.rmtree(dest, ignore_errors=True)
        raise SourceError(f"{archive.name}: cannot extract safely: {e}") from None
    entries = [p for p in dest.iterdir() if p.name not in ("pax_global_header",)]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest


def project_from_archive(archive: str | Path, work_dir: str | Path, *, spec: str | None = None,
                         name: str | None = None, test_command: str | None = None,
                         test_paths: list[str] | None = None) -> Project:
    """A project from an sdist archive already on disk (extracted under `work_dir/src`)."""
    archive = Path(archive)
    stem = archive.name
    for suffix in ARCHIVE_SUFFIXES:
        stem = stem.removesuffix(suffix)
    if name is None:
        name = normalize_name(parse_spec(spec)[0] if spec else stem.rsplit("-", 1)[0])
    validate_name(name)
    dest = Path(work_dir) / "src" / stem
    if dest.exists():
        shutil.rmtree(dest)
    root = extract_archive(archive, dest)
    origin = {"sdist": archive.name, "sha256": sha256_file(archive)}
    if spec:
        origin["spec"] = spec
    return project_from_dir(root, name=name, test_command=test_command, test_paths=test_paths,
                            source="pypi", origin=origin)


def project_from_sdist(spec: str, work_dir: str | Path, *, test_command: str | None = None,
                       test_paths: list[str] | None = None) -> Project:
    """Download `name==version`'s sdist from PyPI into `work_dir` and make a Project of it.

    origin = {'sdist': file name, 'sha256': of the archive, 'spec': spec}.
    """
    work_dir = Path(work_dir)
    archive = download_sdist(spec, work_dir / "sdist")
    return project_from_archive(archive, work_dir, spec=spec, test_command=test_command,
                                test_paths=test_paths)
