"""Images from Dockerfiles, built without a container engine.

The common subset is supported: `FROM` (`scratch`, an image of the store by name or id),
`RUN`, `COPY` and `ADD` from the build context, `ENV`, `WORKDIR`, `USER`, `ARG`, and the
metadata instructions `CMD`, `ENTRYPOINT`, `LABEL`, `EXPOSE` and `STOPSIGNAL` (kept in
the image's metadata). Anything else (a second `FROM`, `COPY --from`, `ADD` of a URL,
`RUN --mount`, `SHELL`, `VOLUME`, `HEALTHCHECK`, `ONBUILD`, heredocs) is refused with
an error naming the file and line, before anything is built.

Every step that changes files is one layer of the store:

* `COPY`/`ADD`/`WORKDIR` layers are staged on the host and added with
  `LayerStore.add_tree`; their digest is their content, so an unchanged context gives
  the same layer without any cache;
* a `RUN` step executes in a build sandbox whose root is the image built so far (no host
  root), inside a user namespace of its own, as the image's user (root there is an
  unprivileged id on the host, holding only the build capabilities of that namespace:
  `runtime.BUILD_CAPABILITIES`, so that apt, dpkg and chown work); with the network
  open (the default), a network namespace of its own NAT'd out through the host, which
  reaches what the host reaches but no address of the host and no link-local address
  (buildnet.py). Its
  writable layer, translated back from the namespace's ids, becomes the step's layer.
  The layer is cached under a key of the image it ran on, the command and the build
  arguments it sees (`build-cache/` in the store), so a rebuild with nothing changed
  runs nothing and gives the same image id.

A failing `RUN` raises `BuildError` naming the file, line and step; the layers of the
steps before it stay cached.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from tryloop.config import SandboxConfig, SandboxLimits
from tryloop.sandbox.build import network_env
from tryloop.sandbox.buildnet import SandboxNetworkError
from tryloop.sandbox.images import Image, ImageError, find_in_layers, make_image, resolve_user
from tryloop.sandbox.layers import Snapshot
from tryloop.sandbox.oci import mountpoints_layer, unpack_layer

SUPPORTED = ("FROM", "RUN", "COPY", "ADD", "ENV", "WORKDIR", "USER", "ARG",
             "CMD", "ENTRYPOINT", "LABEL", "EXPOSE", "STOPSIGNAL", "MAINTAINER")
_KNOWN_UNSUPPORTED = ("SHELL", "VOLUME", "HEALTHCHECK", "ONBUILD")
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class BuildError(ImageError):
    """A Dockerfile that does not parse, or a step that failed; the message names the
    file, the line and the step."""


@dataclass(frozen=True)
class Instruction:
    cmd: str
    args: str
    line: int
    flags: tuple[tuple[str, str], ...] = ()

    def exec_form(self) -> list[str] | None:
        if self.args.startswith("["):
            try:
                v = json.loads(self.args)
            except ValueError:
                return None
            if isinstance(v, list) and all(isinstance(x, str) for x in v):
                return v
        return None

    def text(self) -> str:
        flags = "".join(f"--{k}={v} " for k, v in self.flags)
        return f"{self.cmd} {flags}{self.args}".strip()


@dataclass
class Dockerfile:
    path: Path
    instructions: list[Instruction]

    def where(self, ins: Instruction) -> str:
        return f"{self.path}:{ins.line}"


# --------------------------------------------------------------------------- parsing

_FLAG_RE = re.compile(r"--([a-z-]+)=(\S*)\s*")
_ALLOWED_FLAGS = {"COPY": {"chown", "chmod"}, "ADD": {"chown", "chmod"}, "FROM": {"platform"}}


def parse(path: str | Path, text: str | None = None) -> Dockerfile:
    """Parse a Dockerfile; any unsupported or malformed instruction is a BuildError
    naming the file and line."""
    path = Path(path)
    if text is None:
        try:
            text = path.read_text()
        except OSError as e:
            raise BuildError(f"{path}: cannot read the Dockerfile ({e.strerror})") from None
    out: list[Instruction] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start = i + 1
        raw = lines[i].strip()
        i += 1
        if not raw or raw.startswith("#"):
            directive = raw.lower().replace(" ", "")
            if directive.startswith("#escape=") and raw.split("=", 1)[1].strip() != "\\":
                raise BuildError(f"{path}:{start}: only the default escape character (\\) is supported")
            continue
        parts = [raw]
        while parts[-1].endswith("\\"):
            parts[-1] = parts[-1][:-1]
            while i < len(lines) and (not lines[i].strip() or lines[i].strip().startswith("#")):
                i += 1  # comment and empty lines inside a continuation are dropped
            if i >= len(lines):
                break
            parts.append(lines[i].strip())
            i += 1
        logical = " ".join(p.strip() for p in parts).strip()
        word, _, rest = logical.partition(" ")
        cmd = word.upper()
        rest = rest.strip()
        where = f"{path}:{start}"
        if cmd not in SUPPORTED:
            if cmd in _KNOWN_UNSUPPORTED:
                raise BuildError(f"{where}: {cmd} is not supported by this builder")
            raise BuildError(f"{where}: unknown instruction {word!r}")
        if re.search(r"<<-?\s*['\"]?[A-Za-z_]", rest) and cmd in ("RUN", "COPY", "ADD"):
            raise BuildError(f"{where}: heredocs are not supported")
        flags: list[tuple[str, str]] = []
        while rest.startswith("--"):
            m = _FLAG_RE.match(rest)
            if not m:
                raise BuildError(f"{where}: malformed flag in {cmd}: {rest.split()[0]!r}")
            name = m.group(1)
            if name not in _ALLOWED_FLAGS.get(cmd, set()):
                raise BuildError(f"{where}: {cmd} --{name} is not supported by this builder")
            flags.append((name, m.group(2)))
            rest = rest[m.end():]
        if not rest and cmd not in ("CMD", "ENTRYPOINT"):
            raise BuildError(f"{where}: {cmd} needs arguments")
        out.append(Instruction(cmd, rest, start, tuple(flags)))
    froms = [ins for ins in out if ins.cmd == "FROM"]
    before = [ins for ins in out[: out.index(froms[0])]] if froms else out
    if not froms:
        raise BuildError(f"{path}: no FROM instruction")
    if any(ins.cmd != "ARG" for ins in before):
        bad = next(ins for ins in before if ins.cmd != "ARG")
        raise BuildError(f"{path}:{bad.line}: only ARG may come before FROM")
    if len(froms) > 1:
        raise BuildError(f"{path}:{froms[1].line}: multi-stage builds (a second FROM) are not supported")
    return Dockerfile(path, out)


_VAR_RE = re.compile(r"\\\$|\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def expand(s: str, env: dict[str, str]) -> str:
    """Docker's variable substitution: $V, ${V}, ${V:-default}, ${V:+alternate}; \\$ is a $."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "\\$":
            return "$"
        name = m.group(1) or m.group(4)
        op, word = m.group(2), m.group(3)
        val = env.get(name)
        if op in (":-", "-"):
            return val if (val if op == ":-" else val is not None) else expand(word or "", env)
        if op in (":+", "+"):
            return expand(word or "", env) if (val if op == ":+" else val is not None) else ""
        return val or ""

    return _VAR_RE.sub(sub, s)


def _words(ins: Instruction, where: str) -> list[str]:
    try:
        return shlex.split(ins.args)
    except ValueError as e:
        raise BuildError(f"{where}: cannot split {ins.cmd} arguments ({e})") from None


def _pairs(ins: Instruction, where: str, env: dict[str, str]) -> list[tuple[str, str]]:
    """NAME=VALUE pairs of ENV / LABEL (or the legacy `ENV NAME VALUE`)."""
    first = ins.args.split(None, 1)
    if ins.cmd == "ENV" and "=" not in first[0]:
        if len(first) < 2:
            raise BuildError(f"{where}: ENV {first[0]} needs a value")
        return [(first[0], expand(first[1], env))]
    out = []
    for w in _words(ins, where):
        k, sep, v = w.partition("=")
        if not sep or not k:
            raise BuildError(f"{where}: {ins.cmd} expects NAME=VALUE, got {w!r}")
        out.append((k, expand(v, env)))
    return out


# --------------------------------------------------------------------------- building


@dataclass
class BuildOptions:
    build_args: dict[str, str] = field(default_factory=dict)
    network: bool = True
    timeout_s: float = 1800.0
    memory_mb: int = 4096
    disk_mb: int = 8192
    pids: int = 1024


@dataclass
class _State:
    layers: list[str]
    env: dict[str, str]
    workdir: str = "/"
    user: str = ""
    args: dict[str, str] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    chain: str = ""

    def vars(self) -> dict[str, str]:
        return {**self.args, **self.env}


Progress = Callable[[int, int, str, str], None]  # step, steps, text, status (built / cached / meta)


def _resolve_base(runtime, ref: str, where: str) -> Image:
    from tryloop.sandbox.catalog import resolve

    try:
        return runtime.image(resolve(runtime.store, ref))
    except KeyError as e:
        raise BuildError(f"{where}: FROM {ref}: {e.args[0] if e.args else e}") from None


async def build_dockerfile(runtime, context: str | Path, dockerfile: str | Path | None = None, *,
                           options: BuildOptions | None = None, tag: str | None = None,
                           on_step: Progress | None = None,
                           on_output: Callable[[str, bytes], None] | None = None) -> Image:
    """Build the Dockerfile (default: CONTEXT/Dockerfile) with `context` as its build
    context; returns the saved image (tagged `tag` if given)."""
    from tryloop.sandbox.catalog import tag_image

    opts = options or BuildOptions()
    context = Path(context).resolve()
    if not context.is_dir():
        raise BuildError(f"{context}: the build context is not a directory")
    df = parse(Path(dockerfile) if dockerfile is not None else context / "Dockerfile")
    store = runtime.store
    steps = [ins for ins in df.instructions]
    n = len(steps)
    st = _State(layers=[], env={})
    meta_args: dict[str, str] = {}
    for i, ins in enumerate(steps, 1):
        where = df.where(ins)
        if ins.cmd == "ARG" and not st.chain:  # an ARG before FROM: usable in FROM only
            for name, val in _arg_defs(ins, where, meta_args):
                meta_args[name] = opts.build_args.get(name, val) if val is not None or name in opts.build_args \
                    else ""
            _report(on_step, i, n, ins, "meta")
            continue
        status = "meta"
        if ins.cmd == "FROM":
            status = _from(runtime, st, ins, where, meta_args)
        elif ins.cmd == "ARG":
            for name, val in _arg_defs(ins, where, st.vars()):
                st.args[name] = opts.build_args.get(name, val if val is not None else meta_args.get(name, ""))
        elif ins.cmd == "ENV":
            for k, v in _pairs(ins, where, st.vars()):
                st.env[k] = v
        elif ins.cmd == "LABEL":
            st.meta.setdefault("labels", {}).update(_pairs(ins, where, st.vars()))
        elif ins.cmd == "MAINTAINER":
            st.meta.setdefault("labels", {})["maintainer"] = ins.args
        elif ins.cmd in ("CMD", "ENTRYPOINT"):
            st.meta[ins.cmd.lower()] = ins.exec_form() or (["/bin/sh", "-c", ins.args] if ins.args else None)
        elif ins.cmd in ("EXPOSE", "STOPSIGNAL"):
            st.meta[ins.cmd.lower()] = expand(ins.args, st.vars())
        elif ins.cmd == "USER":
            user = expand(ins.args, st.vars()).strip()
            try:
                resolve_user(store, tuple(st.layers), user)
            except ImageError as e:
                raise BuildError(f"{where}: USER {user}: {e}") from None
            st.user = user
        elif ins.cmd == "WORKDIR":
            path = expand(ins.args, st.vars()).strip()
            st.workdir = os.path.normpath(os.path.join(st.workdir, path))
            status = _cached(store, st, ["workdir", st.chain, st.layers, st.workdir, st.user],
                             partial(_workdir, store, st, where))
        elif ins.cmd in ("COPY", "ADD"):
            key = ["copy", st.chain, st.layers, st.workdir, st.env, st.args, ins.text(),
                   _sources_digest(ins, where, context, st.vars())]
            status = _cached(store, st, key, partial(_copy, store, st, ins, where, context))
        elif ins.cmd == "RUN":
            status = await _run(runtime, st, ins, where, i, n, opts, on_output)
        st.chain = _digest([st.chain, ins.text(), st.layers, st.env, st.workdir, st.user,
                            sorted(st.args.items())])
        _report(on_step, i, n, ins, status)
    env = dict(st.env)
    meta = {"kind": "dockerfile", "dockerfile": str(df.path), "context": str(context), **st.meta}
    image = make_image(store, st.layers, env.items(), workdir=st.workdir, user=st.user, meta=meta)
    runtime.register_image(image)
    if tag:
        tag_image(store, tag, image.id)
    return image


def _report(on_step: Progress | None, i: int, n: int, ins: Instruction, status: str) -> None:
    if on_step is not None:
        on_step(i, n, ins.text(), status)


def _digest(doc: object) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _arg_defs(ins: Instruction, where: str, env: dict[str, str]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for w in _words(ins, where):
        name, sep, val = w.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise BuildError(f"{where}: ARG name {name!r} is not valid")
        out.append((name, expand(val, env) if sep else None))
    return out


def _from(runtime, st: _State, ins: Instruction, where: str, meta_args: dict[str, str]) -> str:
    words = expand(ins.args, meta_args).split()
    if len(words) == 3 and words[1].upper() == "AS":
        words = words[:1]
    if len(words) != 1:
        raise BuildError(f"{where}: FROM expects an image (optionally `AS name`), got {ins.args!r}")
    ref = words[0]
    store = runtime.store
    if ref == "scratch":
        st.layers = [mountpoints_layer(store)]
        st.env = {"PATH": _DEFAULT_PATH}
        st.chain = "scratch"
        return "meta"
    base = _resolve_base(runtime, ref, where)
    if base.binds:
        raise BuildError(f"{where}: FROM {ref}: the image binds host directories; a build needs an image "
                         "made only of layers (an imported archive, scratch or a built image)")
    st.layers = list(base.layers)
    st.env = dict(base.env)
    st.workdir = base.workdir or "/"
    st.user = base.user
    st.chain = base.id
    st.meta = {k: v for k, v in base.meta.items() if k in ("cmd", "entrypoint", "labels")}
    st.meta["base"] = base.id
    return "meta"


def _ensure_parents(store, st: _State, stage: Path, rel_dir: str) -> None:
    """Create rel_dir's directories in the stage with the metadata the image gives them
    (a directory in a layer above replaces its mode and owner in the merged root)."""
    parts = [p for p in rel_dir.strip("/").split("/") if p]
    for k in range(1, len(parts) + 1):
        rel = "/".join(parts[:k])
        d = stage / rel
        if d.is_dir() and not d.is_symlink():
            continue
        if d.exists() or d.is_symlink():
            d.unlink()
        d.mkdir()
        existing = find_in_layers(store, st.layers, rel)
        if existing is not None and existing.is_dir() and not existing.is_symlink():
            s = os.lstat(existing)
            os.chown(d, s.st_uid, s.st_gid)
            os.chmod(d, stat.S_IMODE(s.st_mode))
        else:
            os.chmod(d, 0o755)
            os.chown(d, 0, 0)


def _check_path(store, st: _State, rel: str, where: str) -> None:
    """Refuse a destination that passes through a symlink of the image: the staged layer
    would put a directory in its place and replace the link."""
    parts = [p for p in rel.strip("/").split("/") if p]
    for k in range(1, len(parts)):
        p = find_in_layers(store, st.layers, "/".join(parts[:k]))
        if p is not None and p.is_symlink():
            target = os.readlink(p)
            raise BuildError(f"{where}: destination /{rel} passes through the symlink "
                             f"/{'/'.join(parts[:k])} -> {target}; name the real path")


def _add_stage(store, stage: Path) -> str:
    os.chmod(stage, 0o755)
    os.chown(stage, 0, 0)
    return store.add_tree(stage)


def _cached(store, st: _State, key_doc: list, build: Callable[[], str]) -> str:
    """Run a step that makes a layer (or none: ""), cached under the digest of its inputs
    in the store's build cache; stacks the layer and says "cached" or "built"."""
    layer = _cache_get(store, key_doc)
    status = "cached"
    if layer is None:
        layer = build()
        _cache_put(store, key_doc, layer)
        status = "built"
    if layer:
        st.layers.insert(0, layer)
    return status


def _cache_get(store, key_doc: list) -> str | None:
    cached = store.root / "build-cache" / _digest(key_doc)
    try:
        layer = cached.read_text().strip()
    except FileNotFoundError:
        return None
    return None if layer and not store.has(layer) else layer  # pruned since: build it again


def _cache_put(store, key_doc: list, layer: str) -> None:
    cache_dir = store.root / "build-cache"
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = _digest(key_doc)
    tmp = cache_dir / f".{key}.{os.getpid()}"
    tmp.write_text(layer)
    os.replace(tmp, cache_dir / key)


def _sources_digest(ins: Instruction, where: str, context: Path, env: dict[str, str]) -> str:
    """The content of what a COPY/ADD takes from the context: names, types, modes, link
    targets and bytes (not mtimes or owners, which COPY does not keep)."""
    words = ins.exec_form() or _words(ins, where)
    words = [expand(w, env) for w in words]
    h = hashlib.sha256()
    ignore = _ignored(context)
    for pattern in words[:-1]:
        if re.match(r"^[a-z]+://", pattern):
            continue  # refused when the step runs
        for src in _sources(context, pattern, where):
            todo = [src]
            while todo:
                p = todo.pop()
                rel = str(p.relative_to(context))
                if p != src and _is_ignored(rel, ignore):
                    continue
                st = os.lstat(p)
                h.update(f"{rel}\0{st.st_mode:o}\0".encode())
                if stat.S_ISLNK(st.st_mode):
                    h.update(os.readlink(p).encode() + b"\0")
                elif stat.S_ISDIR(st.st_mode):
                    todo.extend(sorted(p.iterdir(), reverse=True))
                elif stat.S_ISREG(st.st_mode):
                    with open(p, "rb") as f:
                        while chunk := f.read(1 << 20):
                            h.update(chunk)
                    h.update(b"\0")
    return h.hexdigest()


def _is_ignored(rel: str, patterns: list[str]) -> bool:
    """.dockerignore: the last pattern that matches decides; `!pattern` takes a path back."""
    ignored = False
    for pat in patterns:
        negate = pat.startswith("!")
        pat = pat[1:].lstrip("/") if negate else pat
        if fnmatch.fnmatch(rel, pat) or rel.startswith(pat.rstrip("/") + "/"):
            ignored = not negate
    return ignored


def _workdir(store, st: _State, where: str) -> str:
    existing = find_in_layers(store, st.layers, st.workdir)
    if existing is not None and existing.is_dir():
        return ""
    _check_path(store, st, st.workdir, where)
    uid, gid = resolve_user(store, tuple(st.layers), st.user)
    with tempfile.TemporaryDirectory(dir=store.tmp_dir) as tmp:
        stage = Path(tmp) / "root"
        stage.mkdir()
        rel = st.workdir.strip("/")
        _ensure_parents(store, st, stage, rel)
        os.chown(stage / rel, uid, gid)
        return _add_stage(store, stage)


def _ids(store, st: _State, spec: str, where: str) -> tuple[int, int]:
    name, _, group = spec.partition(":")
    try:
        uid, gid = resolve_user(store, tuple(st.layers), name)
        if group:
            _, gid = resolve_user(store, tuple(st.layers), f"{name}:{group}")
    except ImageError as e:
        raise BuildError(f"{where}: --chown={spec}: {e}") from None
    return uid, gid


def _sources(context: Path, pattern: str, where: str) -> list[Path]:
    rel = os.path.normpath(pattern.lstrip("/"))
    if rel == ".." or rel.startswith("../"):
        raise BuildError(f"{where}: source {pattern!r} is outside the build context")
    matches = sorted(glob.glob(glob.escape(str(context)) + "/" + rel)) if any(c in rel for c in "*?[") \
        else [str(context / rel)]
    out = []
    real_ctx = os.path.realpath(context)
    for m in matches:
        p = Path(m)
        if not (p.exists() or p.is_symlink()):
            raise BuildError(f"{where}: source {pattern!r} does not exist in the build context {context}")
        real = os.path.realpath(p.parent) if p.is_symlink() else os.path.realpath(p)
        if real != real_ctx and not real.startswith(real_ctx + "/"):
            raise BuildError(f"{where}: source {pattern!r} resolves outside the build context")
        out.append(p)
    if not out:
        raise BuildError(f"{where}: source {pattern!r} matches nothing in the build context {context}")
    return out


def _ignored(context: Path) -> list[str]:
    f = context / ".dockerignore"
    if not f.is_file():
        return []
    return [ln.strip().lstrip("/") for ln in f.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def _copy(store, st: _State, ins: Instruction, where: str, context: Path) -> str:
    words = ins.exec_form() or _words(ins, where)
    words = [expand(w, st.vars()) for w in words]
    if len(words) < 2:
        raise BuildError(f"{where}: {ins.cmd} needs a source and a destination")
    *srcs, dest = words
    if any(re.match(r"^[a-z]+://", s) for s in srcs):
        raise BuildError(f"{where}: {ins.cmd} from a URL is not supported (the build context only)")
    flags = dict(ins.flags)
    uid, gid = _ids(store, st, flags["chown"], where) if "chown" in flags else (0, 0)
    chmod = None
    if "chmod" in flags:
        if not re.fullmatch(r"[0-7]{3,4}", flags["chmod"]):
            raise BuildError(f"{where}: --chmod={flags['chmod']}: octal modes only")
        chmod = int(flags["chmod"], 8)
    dest_abs = os.path.normpath(os.path.join(st.workdir, dest))
    sources = [p for s in srcs for p in _sources(context, s, where)]
    existing = find_in_layers(store, st.layers, dest_abs)
    into_dir = (dest.endswith(("/", "/.")) or dest == "." or len(sources) > 1
                or (existing is not None and existing.is_dir() and not existing.is_symlink())
                or any(p.is_dir() and not p.is_symlink() for p in sources))
    ignore = _ignored(context)
    with tempfile.TemporaryDirectory(dir=store.tmp_dir) as tmp:
        stage = Path(tmp) / "root"
        stage.mkdir()
        for src in sources:
            if src.is_dir() and not src.is_symlink():
                target_rel = dest_abs.strip("/")
            elif into_dir:
                target_rel = os.path.join(dest_abs.strip("/"), src.name)
            else:
                target_rel = dest_abs.strip("/")
            if not target_rel:
                target_rel = ""
            _check_path(store, st, target_rel + "/x", where)
            if ins.cmd == "ADD" and src.is_file() and not src.is_symlink() and _is_archive(src):
                # A local archive is unpacked into the destination directory (safely:
                # see oci.unpack_layer), owned as the archive says.
                _ensure_parents(store, st, stage, dest_abs)
                with open(src, "rb") as f:
                    unpack_layer(f, stage / dest_abs.strip("/") if dest_abs.strip("/") else stage,
                                 f"{where}: ADD {src.name}")
                continue
            parent = os.path.dirname(target_rel) if not (src.is_dir() and not src.is_symlink()) else target_rel
            _ensure_parents(store, st, stage, parent)
            if src.is_dir() and not src.is_symlink():
                _merge(src, stage / target_rel if target_rel else stage, uid, gid, chmod,
                       ignore, context)
            else:
                _put(src, stage / target_rel, uid, gid, chmod)
        dest_rel = dest_abs.strip("/")
        if into_dir and "chown" in flags and dest_rel and find_in_layers(store, st.layers, dest_rel) is None:
            os.chown(stage / dest_rel, uid, gid)  # a destination directory COPY creates is the owner's
        return _add_stage(store, stage)


def _is_archive(p: Path) -> bool:
    import tarfile

    try:
        return tarfile.is_tarfile(p)
    except OSError:
        return False


def _put(src: Path, dst: Path, uid: int | None, gid: int | None, chmod: int | None) -> None:
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    elif dst.exists() or dst.is_symlink():
        dst.unlink()
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    else:
        shutil.copyfile(src, dst)
        os.chmod(dst, chmod if chmod is not None else stat.S_IMODE(os.lstat(src).st_mode))
    if uid is not None:
        os.chown(dst, uid, gid, follow_symlinks=False)


def _merge(src: Path, dst: Path, uid: int | None, gid: int | None, chmod: int | None,
           ignore: list[str], context: Path | None = None) -> None:
    """Copy the contents of directory src into dst (which exists), as COPY does."""
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        p = Path(entry.path)
        if context is not None and ignore and _is_ignored(str(p.relative_to(context)), ignore):
            continue
        target = dst / entry.name
        if entry.is_dir(follow_symlinks=False):
            if not target.is_dir() or target.is_symlink():
                if target.exists() or target.is_symlink():
                    target.unlink()
                target.mkdir()
            _merge(p, target, uid, gid, chmod, ignore, context)
            os.chmod(target, stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode))
            if uid is not None:
                os.chown(target, uid, gid)
        elif entry.is_file(follow_symlinks=False) or entry.is_symlink():
            _put(p, target, uid, gid, chmod)
        # FIFOs, sockets, devices in the context are not copied


async def run_build_step(runtime, layers: list[str], env: dict[str, str], cmd: list[str], *,
                         workdir: str = "/", user: str = "", options: BuildOptions | None = None,
                         what: str = "build step", on_output=None) -> str:
    """Run `cmd` in a build sandbox on `layers` (top-most first) as `user` (root: the
    root of the sandbox's own user namespace) and return the layer of what it changed
    ("" for nothing). A failure raises BuildError starting with `what`."""
    opts = options or BuildOptions()
    store = runtime.store
    uid, gid = resolve_user(store, tuple(layers), user)
    env = dict(env)
    env.setdefault("PATH", _DEFAULT_PATH)
    env.setdefault("HOME", "/root" if uid == 0 else "/")
    if opts.network:
        env.update(network_env())
        if find_in_layers(store, layers, "etc/ssl/certs/ca-certificates.crt") is None:
            for k in ("PIP_CERT", "SSL_CERT_FILE"):  # the image has no CA bundle there
                env.pop(k, None)
    image = make_image(store, layers, sorted(env.items()), workdir=workdir, user=user,
                       meta={"kind": "build-step"}, save=False)
    runtime.register_image(image)
    snap = Snapshot(image.id, ())
    cfg = SandboxConfig(network=opts.network, limits=SandboxLimits(
        memory_mb=opts.memory_mb, disk_mb=opts.disk_mb, pids=opts.pids, exec_timeout_s=opts.timeout_s,
        file_size_mb=max(512, opts.disk_mb))).model_copy(update={"uid": uid, "gid": gid, "workdir": workdir})
    if uid == 0 and not runtime.user_namespaces:
        raise BuildError(f"{what}: runs as root, which a build sandbox may only be in a user namespace of its "
                         f"own, and this runtime gives none ({runtime.user_namespaces_detail}); name an "
                         "unprivileged USER or enable runtime.user_namespaces")
    # Root holds the build capabilities of its own user namespace (see runtime.BUILD_CAPABILITIES).
    try:
        sb = await runtime.create(snap, cfg, root_capabilities=runtime.user_namespaces)
    except SandboxNetworkError as e:
        raise BuildError(f"{what}: {e}") from None
    async with sb:
        res = await sb.exec(cmd, cwd=workdir, on_output=on_output, merge_stderr=True)
        if not res.ok:
            why = (f"timed out after {opts.timeout_s:g}s" if res.timed_out else
                   "ran out of memory" if res.oom_killed else
                   f"exit {res.exit_code}" if res.exit_code is not None else f"signal {res.signal}")
            tail = (res.text() + res.text("stderr"))[-3000:]  # stderr: why a command did not start
            raise BuildError(f"{what} failed ({why}); the steps before it stay cached\n{tail}")
        sb.cgroup.freeze()
        try:
            upper = sb.upper_dir()
            empty = not any(os.scandir(upper))
            return "" if empty else store.add_tree(upper, id_base=sb.id_base)
        finally:
            sb.cgroup.thaw()


async def _run(runtime, st: _State, ins: Instruction, where: str, i: int, n: int, opts: BuildOptions,
               on_output) -> str:
    store = runtime.store
    argv = ins.exec_form()
    args_env = {k: v for k, v in st.args.items() if k not in st.env}
    key_doc = ["run", st.chain, st.layers, st.env, st.workdir, st.user, argv or ins.args,
               sorted(args_env.items()), opts.network]
    layer = _cache_get(store, key_doc)
    if layer is not None:
        if layer:
            st.layers.insert(0, layer)
        return "cached"
    env = {**st.env, **args_env}
    cmd = argv if argv else ["/bin/sh", "-c", ins.args]
    layer = await run_build_step(runtime, st.layers, env, cmd, workdir=st.workdir, user=st.user,
                                 options=opts, what=f"{where}: step {i}/{n} `{ins.text()}`",
                                 on_output=on_output)
    _cache_put(store, key_doc, layer)
    if layer:
        st.layers.insert(0, layer)
    return "built"
