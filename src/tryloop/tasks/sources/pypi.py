"""Projects from PyPI source distributions.

    project = project_from_sdist("more-itertools==10.2.0", work_dir)

Nothing from the sdist runs on this host. `pip download` of an sdist would run
its build backend (setup.py, PEP 517 hooks) here to prepare its metadata, as
this host's root, so the importer does not use pip: it reads the project's page
on a PEP 503 / PEP 691 simple index with urllib, picks the sdist whose file name
is `name-version` with an archive suffix, downloads it and checks its sha256
against the index's hash (the `#sha256=` fragment, or the JSON `hashes`). The
index is the one given (`index_url=`, `tryloop tasks synth --index-url`,
`tasks.pypi_index_url`), else the one this host's pip is configured with
(`PIP_INDEX_URL`, then pip's `download.index-url` / `global.index-url`), else
https://pypi.org/simple. A `file://` index is a local directory: `<name>/index.html`
as pip expects, or else the archives found in `<name>/`.

The archive is extracted with tarfile's `data` filter (no absolute paths, no
`..`, no links out of the tree, no devices), its project root found, and its
tests detected like a local directory's (`tests/`, `test/`, `test_*.py`...).

The project is not built or installed: the test command is
`python3 -m pytest -q <test paths>`, which imports a flat-layout package from
the working directory, plus `-o pythonpath=src` for a src layout (see
`default_test_command`); the sdist's own code first runs there, in the task's
sandbox (quality gate, verifier). Its compiled extensions are built, when asked
(`build_environment`, `tasks synth --build-extensions`), in a build sandbox into
an environment image holding only the extension modules, which the tasks run
on; never on this host. Dependencies missing from the sandbox image go into an
image (`tryloop image build`) whose steps run in build sandboxes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from html.parser import HTMLParser
from pathlib import Path

from tryloop.tasks.project import Project
from tryloop.tasks.sources.local import SourceError, is_src_layout, project_from_dir, validate_name

_SPEC_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9.+!_-]+)\s*$")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip")
DEFAULT_INDEX_URL = "https://pypi.org/simple"
MAX_SDIST_BYTES = 1 << 30
_JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def normalize_name(name: str) -> str:
    """PEP 503 normalized name (lowercase, runs of '-', '_', '.' become '-')."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_spec(spec: str) -> tuple[str, str]:
    """`name==version` → (name, version). Only pinned specs: a task must not change under us."""
    m = _SPEC_RE.match(spec)
    if not m:
        raise SourceError(f"sdist spec {spec!r} must pin one version: 'name==version'")
    return m.group(1), m.group(2)


def pip_index_url() -> str:
    """The index this host's pip uses: PIP_INDEX_URL, else pip's configured `index-url` (download.,
    then global.), else PyPI. Reading pip's configuration runs pip, not any package."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"].split()[0]
    try:
        # -P and cwd="/": the working directory is not on sys.path, so a `pip/` there is not imported.
        res = subprocess.run([sys.executable, "-P", "-m", "pip", "config", "list"], capture_output=True,
                             text=True, timeout=60, cwd="/",
                             env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        found = dict(re.findall(r"^([\w:.-]+)='(.*)'$", res.stdout, re.M)) if res.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired):
        found = {}
    for key in ("download.index-url", "global.index-url"):
        if found.get(key):
            return found[key].split()[0]
    return DEFAULT_INDEX_URL


def _same_version(a: str, b: str) -> bool:
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover - packaging ships with pip and pytest
        return a.lower() == b.lower()
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a.lower() == b.lower()


def _sdist_of(filename: str, name: str, version: str) -> bool:
    """Is `filename` the sdist of name==version (`name-version.tar.gz`, name compared normalized)?"""
    suffix = next((s for s in ARCHIVE_SUFFIXES if filename.endswith(s)), None)
    if suffix is None or "/" in filename or "\\" in filename:
        return False
    stem = filename[: -len(suffix)]
    if "-" not in stem:
        return False
    got_name, got_version = stem.rsplit("-", 1)
    return normalize_name(got_name) == normalize_name(name) and _same_version(got_version, version)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[dict[str, str | None]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            a = dict(attrs)
            if a.get("href"):
                self.links.append(a)


def _open(url: str, timeout: float, accept: str | None = None):
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    return urllib.request.urlopen(req, timeout=timeout)  # noqa: S310 - schemes checked by the callers


def _index_files(index_url: str, name: str, timeout: float) -> list[dict]:
    """The files the index lists for `name`: [{filename, url, sha256 | None, yanked}]."""
    scheme = urllib.parse.urlsplit(index_url).scheme
    page = index_url.rstrip("/") + "/" + normalize_name(name) + "/"
    files: list[dict] = []
    if scheme == "file":
        root = Path(urllib.request.url2pathname(urllib.parse.urlsplit(page).path))
        if (root / "index.html").is_file():
            body, ctype, page = (root / "index.html").read_text(errors="replace"), "text/html", \
                (root / "index.html").as_uri()
        elif root.is_dir():
            return [{"filename": p.name, "url": p.as_uri(), "sha256": None, "yanked": False}
                    for p in sorted(root.iterdir()) if p.is_file()]
        else:
            raise SourceError(f"{name} is not in the index {index_url} (no {root})")
    elif scheme in ("http", "https"):
        try:
            with _open(page, timeout, f"{_JSON_TYPE}, text/html;q=0.1") as r:
                ctype = r.headers.get("Content-Type", "")
                page = r.geturl()
                body = r.read(64 << 20).decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise SourceError(f"{name} is not in the index {index_url}") from None
            raise SourceError(f"index {page}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            raise SourceError(f"index {page}: {getattr(e, 'reason', e)}") from None
    else:
        raise SourceError(f"index URL {index_url!r}: only http(s):// and file:// indexes are supported")
    if ctype.startswith(_JSON_TYPE):
        try:
            for f in json.loads(body).get("files", []):
                files.append({"filename": f["filename"], "url": urllib.parse.urljoin(page, f["url"]),
                              "sha256": (f.get("hashes") or {}).get("sha256"), "yanked": bool(f.get("yanked"))})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise SourceError(f"index {page}: malformed PEP 691 page ({e})") from None
        return files
    parser = _Links()
    parser.feed(body)
    for a in parser.links:
        url = urllib.parse.urljoin(page, a["href"])
        parts = urllib.parse.urlsplit(url)
        m = re.search(r"(?:^|&)sha256=([0-9a-fA-F]{64})(?:&|$)", parts.fragment)
        files.append({"filename": urllib.parse.unquote(parts.path.rsplit("/", 1)[-1]),
                      "url": parts._replace(fragment="").geturl(), "sha256": m.group(1).lower() if m else None,
                      "yanked": "data-yanked" in a})
    return files


def find_sdist(spec: str, *, index_url: str | None = None, timeout: float = 60) -> dict:
    """The sdist the index lists for `name==version`: {filename, url, sha256 | None, yanked}. A
    non-yanked file is preferred (a pin may select a yanked one, PEP 592), then `.tar.gz`."""
    name, version = parse_spec(spec)
    index_url = index_url or pip_index_url()
    found = [f for f in _index_files(index_url, name, timeout) if _sdist_of(f["filename"], name, version)]
    if not found:
        raise SourceError(f"{index_url} lists no sdist for {spec} (only wheels, or no such version)")
    index_scheme = urllib.parse.urlsplit(index_url).scheme
    allowed = ("file",) if index_scheme == "file" else ("http", "https")
    found = [f for f in found if urllib.parse.urlsplit(f["url"]).scheme in allowed]
    if not found:
        raise SourceError(f"{index_url}: the sdist of {spec} is linked with a scheme other than {allowed}")
    found.sort(key=lambda f: (f["yanked"], next(i for i, s in enumerate(ARCHIVE_SUFFIXES)
                                                  if f["filename"].endswith(s))))
    return found[0]


def download_sdist(spec: str, dest: Path, *, index_url: str | None = None, timeout: float = 300) -> Path:
    """Download the sdist for `spec` from the index into `dest`; return the archive's path. Nothing
    of it runs: the file is fetched with urllib and its sha256 checked against the index's."""
    f = find_sdist(spec, index_url=index_url, timeout=min(timeout, 60))
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".sdist-", dir=dest)
    tmp = Path(tmp_name)
    h, size = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out, _open(f["url"], timeout) as r:
            for block in iter(lambda: r.read(1 << 20), b""):
                size += len(block)
                if size > MAX_SDIST_BYTES:
                    raise SourceError(f"{f['filename']}: larger than {MAX_SDIST_BYTES >> 20} MiB")
                h.update(block)
                out.write(block)
        if f["sha256"] and h.hexdigest() != f["sha256"]:
            raise SourceError(f"{f['filename']}: sha256 {h.hexdigest()} is not the index's {f['sha256']}")
        return Path(shutil.move(tmp, dest / f["filename"]))
    except (urllib.error.URLError, OSError) as e:
        raise SourceError(f"download of {f['url']} failed: {getattr(e, 'reason', e)}") from None
    finally:
        tmp.unlink(missing_ok=True)


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
                       test_paths: list[str] | None = None, index_url: str | None = None) -> Project:
    """Download `name==version`'s sdist from the index (see `pip_index_url`) into `work_dir` and make a
    Project of it. Nothing of the sdist runs on this host.

    origin = {'sdist': file name, 'sha256': of the archive, 'spec': spec}.
    """
    parse_spec(spec)
    work_dir = Path(work_dir)
    archive = download_sdist(spec, work_dir / "sdist", index_url=index_url)
    return project_from_archive(archive, work_dir, spec=spec, test_command=test_command,
                                test_paths=test_paths)


# ---- environment images: the sdist's compiled parts, built in a build sandbox ----------------

#: Sources a build backend compiles (C, C++, Cython, Fortran, Rust).
COMPILED_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".pyx", ".f", ".f90", ".rs")
#: Where the sdist's tree lies in the build step's sandbox (an input of that step only).
SDIST_INPUT = "/opt/tryloop/sdist"
#: Where this host's CA bundle lies in that step, on a base other than the host-derived root.
HOST_CA = "/opt/tryloop/host-ca.crt"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

# Run with the task's interpreter in the build sandbox: copy the extension modules of the wheel
# pip built into the working directory, at the place of their package in the project's tree
# (`pkg/` or `src/pkg/`; a top-level module in `src/` only in a src layout: argv[4] is "1" where
# `local.is_src_layout`, which decides whether the test command imports from `src/`, said so on
# the host), and print each path.
_PLACE_EXTENSIONS = r"""
import glob, os, sys, zipfile
wheels, src, ws = glob.glob(sys.argv[1] + "/*.whl"), sys.argv[2], sys.argv[3]
src_layout = sys.argv[4] == "1"
if len(wheels) != 1:
    sys.exit(f"expected one wheel, found {wheels}")
placed = []
with zipfile.ZipFile(wheels[0]) as z:
    for name in z.namelist():
        if not name.endswith((".so", ".pyd")) or name.split("/")[0].endswith((".data", ".dist-info")):
            continue
        d = os.path.dirname(name)
        prefix = "src/" if (os.path.isdir(os.path.join(src, "src", d)) and not os.path.isdir(os.path.join(src, d))
                            if d else src_layout) else ""
        dest = os.path.join(ws, prefix + name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with z.open(name) as f, open(dest, "wb") as out:
            out.write(f.read())
        os.chmod(dest, 0o755)
        placed.append(prefix + name)
if not placed:
    sys.exit(f"{os.path.basename(wheels[0])} has no compiled extension module (.so): nothing to build")
print("\n".join(placed))
"""


def compiled_sources(root: str | Path) -> list[str]:
    """The project's sources a build compiles (`*.c`, `*.pyx`, ...), relative paths, sorted."""
    from tryloop.tasks.project import ignored

    root = Path(root)
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and p.suffix.lower() in COMPILED_SUFFIXES
                  and not ignored(p.relative_to(root).as_posix()))


def runtime_requirements(project: Project) -> tuple[list[str], list[str]]:
    """(requirements, the files they came from): what the sdist declares it needs to run and to
    test. Read, never run: PKG-INFO's `Requires-Dist` (without markers naming other extras than
    test ones), `*.egg-info/requires.txt` (its top and its test sections: an old setup.py's
    `install_requires`), then what SWE-bench environments read (requirement files, pyproject.toml,
    setup.cfg, with their test extras). Local paths and bare URLs are left out (as there)."""
    import email.parser

    from tryloop.tasks.sources.swebench import TEST_EXTRAS, declared_requirements, installable

    root = project.root
    reqs: list[str] = []
    found: list[str] = []
    if (root / "PKG-INFO").is_file():
        meta = email.parser.Parser().parsestr((root / "PKG-INFO").read_text(encoding="utf-8", errors="replace"))
        for line in meta.get_all("Requires-Dist") or []:
            req, _, marker = line.partition(";")
            extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
            if extra is None or extra.group(1) in TEST_EXTRAS:
                reqs.append(req.strip() + (f"; {marker.strip()}" if marker.strip() and extra is None else ""))
        if reqs:
            found.append("PKG-INFO")
    for info in sorted(root.glob("*.egg-info/requires.txt")) + sorted(root.glob("src/*.egg-info/requires.txt")):
        section, before = "", len(reqs)
        for line in info.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]").split(":")[0]
            elif line and not line.startswith("#") and (section == "" or section in TEST_EXTRAS):
                reqs.append(line)
        if len(reqs) > before:
            found.append(info.relative_to(root).as_posix())
    declared, files = declared_requirements(root, None)
    return installable(reqs + declared)[0], found + files


def _version(project: Project) -> str:
    spec = project.origin.get("spec")
    if spec:
        return parse_spec(spec)[1]
    sdist = project.origin.get("sdist", project.root.name)
    for suffix in ARCHIVE_SUFFIXES:
        sdist = sdist.removesuffix(suffix)
    return sdist.rsplit("-", 1)[-1] if "-" in sdist else "latest"


def environment_tag(project: Project) -> str:
    """`pypi/<name>:<version>`, the name an environment image of the project gets."""
    return f"pypi/{project.name}:{re.sub(r'[^A-Za-z0-9._-]', '_', _version(project))}"


def environment_spec(project: Project, *, base: str = "host", workdir: str = "/workspace",
                     empty_dir: str | Path | None = None, ca_bundle: str | Path | None = None,
                     requirements: list[str] | None = None, extensions: bool = True):
    """The image spec of a project's environment: `base` (the host-derived root, or an image id)
    and one `run` step, in a build sandbox with the filtered network, that builds a wheel of the
    sdist with the host's Python (`pip wheel --no-deps`: the build backend, setup.py, the
    compiler and what `build-system.requires` names from the index, all in the sandbox) and keeps
    only its extension modules, in `workdir` at the place of their package. The sdist's tree is
    the step's input, not part of the image: the image holds the built `.so` files alone, and a
    task's workspace (the sources, mutated or not) is laid over them. `empty_dir` (an empty
    directory of this host) is laid at `workdir` as another input, owned by the step's uid, for a
    base whose working directory is missing or not the build user's (a Debian root); `ca_bundle`
    (this host's CA certificates) is another, which pip trusts, as the host's pip does, on a base
    whose own bundle lacks the authorities of the host's network (a TLS proxy's)."""
    import shlex

    from tryloop.sandbox.build import ImageSpec, Step

    build, wheel = "/tmp/tryloop-build", "/tmp/tryloop-wheel"
    script = " && ".join([
        *([f"export PIP_CERT={HOST_CA} SSL_CERT_FILE={HOST_CA}"] if ca_bundle is not None else []),
        f"rm -rf {build} {wheel}", f"cp -R {SDIST_INPUT} {build}", f"cd {build}",
        f"python3 -m pip wheel --no-deps --no-cache-dir --disable-pip-version-check -w {wheel} .",
        f"python3 -c {shlex.quote(_PLACE_EXTENSIONS)} {wheel} {build} {shlex.quote(workdir)} "
        f"{int(is_src_layout(project.root))}",
        f"cd / && rm -rf {build} {wheel}"])
    inputs = {SDIST_INPUT: str(project.root)}
    if empty_dir is not None:
        inputs[workdir] = str(empty_dir)
    if ca_bundle is not None:
        inputs[HOST_CA] = str(ca_bundle)
    steps = []
    env = {}
    if requirements:
        # The dependencies, from the index, into the image's site folder (on PYTHONPATH), in a
        # build sandbox like the wheel; the site folder is the build user's on any base.
        from tryloop.sandbox.build import SITE

        deps = " && ".join([
            *([f"export PIP_CERT={HOST_CA} SSL_CERT_FILE={HOST_CA}"] if ca_bundle is not None else []),
            "python3 -m pip install --no-cache-dir --disable-pip-version-check --no-warn-script-location "
            f"--target {SITE} " + " ".join(shlex.quote(r) for r in requirements)])
        dep_inputs = {k: v for k, v in inputs.items() if k == HOST_CA}
        if empty_dir is not None:
            dep_inputs[SITE] = str(empty_dir)
        steps.append(Step(run=deps, inputs=dep_inputs or None, network=True, timeout_s=1800))
        env["PYTHONPATH"] = SITE
    if extensions:
        steps.append(Step(run=script, inputs=inputs, network=True, timeout_s=1800))
    return ImageSpec(base=base, steps=steps, env=env)


async def build_environment(runtime, project: Project, *, base: str | None = None, on_step=None,
                            extensions: bool = True, dependencies: bool = False) -> str:
    """Build the environment image of an sdist's project (`environment_spec`) on `base` (an image
    name or id; None: the host-derived root): with `dependencies`, what it declares it needs
    (`runtime_requirements`) installed from the index; with `extensions`, its extension modules
    compiled. Name it `pypi/<name>:<version>`, record it in `project.origin['environment']`
    (image id, tag, base, the requirements installed, the extension modules built) and return
    its id. Every step runs in a build sandbox, never on the host; a failure raises BuildError
    naming the project and the step."""
    from tryloop.errors import SandboxError
    from tryloop.sandbox.build import build_image
    from tryloop.sandbox.catalog import resolve, tag_image
    from tryloop.sandbox.dockerfile import BuildError

    requirements, sources = runtime_requirements(project) if dependencies else ([], [])
    if not extensions and not requirements:
        raise BuildError(f"{project.name}: nothing to build: it declares no dependencies"
                         + (f" (read: {', '.join(sources)})" if sources else "")
                         + ", and building its extension modules was not asked for")
    base_id, workdir = "host", "/workspace"
    if base is not None:
        try:
            base_id = resolve(runtime.store, base)
        except KeyError:
            raise BuildError(f"{project.name}: the environment's base image {base!r} is not in the image store "
                             f"{runtime.store.root} (tryloop image ls)") from None
        # The wheel is built with the host's Python (the interpreter the tests run with).
        # (The image built on it has the config's working directory, /workspace, as tasks expect.)
        base_id = runtime.with_host_python(base_id).id
    try:
        with tempfile.TemporaryDirectory(dir=runtime.store.tmp_dir) as empty:
            spec = environment_spec(project, base=base_id, workdir=workdir,
                                    empty_dir=None if base is None else empty,
                                    ca_bundle=HOST_CA_BUNDLE if base is not None and HOST_CA_BUNDLE.is_file()
                                    else None, requirements=requirements, extensions=extensions)
            what = ([f"install {', '.join(requirements)}"] if requirements else []) + \
                (["build the sdist's wheel, keep its extension modules"] if extensions else [])
            image = await build_image(runtime, spec, on_step=on_step and (
                lambda i, n, _what, hit: on_step(f"{i}/{n} {what[i - 1]} ({'cached' if hit else 'built'})")))
    except SandboxError as e:
        raise BuildError(f"{project.name}: the environment {environment_tag(project)} did not build: {e}") from None
    built: list[str] = []
    if extensions:
        top = runtime.store.path(image.layers[0]) / workdir.strip("/")
        built = sorted(p.relative_to(top).as_posix() for p in top.rglob("*") if p.is_file()) if top.is_dir() else []
    tag_image(runtime.store, environment_tag(project), image.id)
    project.origin["environment"] = {"image": image.id, "tag": environment_tag(project),
                                     "base": base or "host", "built": built, "requirements": requirements,
                                     "requirements_from": sources}
    return image.id
