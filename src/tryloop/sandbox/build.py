"""Images built from a small spec: a base, then pip / files / run steps, each a cached layer.

    base: host                 # the default host-derived image, or an image id
    env: {PIP_NO_INPUT: "1"}
    steps:
      - pip: ["six==1.16.0"]   # installed into /opt/tryloop/site (on PYTHONPATH)
      - files: {/opt/data/words.txt: ./words.txt}
      - run: "echo ready > /opt/tryloop/marker"
      - run: "cd /tmp && cp -R /opt/src b && ... > /workspace/out"
        inputs: {/opt/src: ./project}   # seen by this step only, not part of the image

A step's cache key is the image it starts from plus the step itself, so
editing one step rebuilds it and everything after it, and nothing before.
`pip` and `run` steps execute in a sandbox of the image built so far (as the
image's unprivileged uid, which owns /opt/tryloop; `pip` with the filtered network
of buildnet.py: what the host reaches, not the host itself)
and their writable layer becomes the step's layer.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from pydantic import Field, model_validator

from tryloop.config import SandboxConfig, SandboxLimits, _Model, load_yaml
from tryloop.errors import ConfigError, SandboxError
from tryloop.sandbox.images import Image, image_id, save_image
from tryloop.sandbox.layers import Snapshot

SITE = "/opt/tryloop/site"


class Step(_Model):
    pip: list[str] | None = None
    files: dict[str, str] | None = None
    run: str | None = None
    inputs: dict[str, str] | None = Field(None, description="`run` only: files or directories laid over the "
                                                             "image for this step alone (owned by the step's "
                                                             "uid); the image keeps what the step writes, not "
                                                             "them")
    network: bool = False
    timeout_s: float = Field(900.0, gt=0)

    @model_validator(mode="after")
    def _one_kind(self) -> Step:
        kinds = [k for k in ("pip", "files", "run") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"a step has exactly one of pip / files / run, got {kinds or 'none'}")
        if self.inputs is not None and self.run is None:
            raise ValueError("only a run step takes inputs")
        # Sources are copied under a temporary directory of the host at their destination: a `..`
        # would write outside it.
        for field_, dsts in (("files", self.files), ("inputs", self.inputs)):
            for dst in dsts or ():
                if ".." in dst.split("/"):
                    raise ValueError(f"{field_}: destination {dst!r} has a '..' in it")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("pip", "files", "run") if getattr(self, k) is not None)


class ImageSpec(_Model):
    base: str = "host"
    uid: int = 1000
    gid: int = 1000
    env: dict[str, str] = Field(default_factory=dict)
    steps: list[Step] = Field(default_factory=list)
    source_dir: Path | None = Field(None, description="where relative `files` sources are resolved")


def load_spec(path: str | Path) -> ImageSpec:
    spec = load_yaml(path, ImageSpec)
    if spec.source_dir is None:
        spec = spec.model_copy(update={"source_dir": Path(path).resolve().parent})
    return spec


def _step_key(parent: str, step: Step, spec: ImageSpec) -> str:
    doc = step.model_dump()
    for field, sources in (("files", step.files), ("inputs", step.inputs)):
        if not sources:
            continue
        # Content of the sources, not just their names, decides the cache key.
        h = hashlib.sha256()
        for dst, src in sorted(sources.items()):
            p = _source(spec, src)
            for f in sorted([p] if p.is_file() else [x for x in p.rglob("*") if x.is_file()]):
                h.update(f"{dst}:{f.relative_to(p) if p.is_dir() else ''}\n".encode())
                h.update(f.read_bytes())
        doc[f"{field}_digest"] = h.hexdigest()
    if step.inputs:  # where the inputs come from on this host is not part of the step, their content is
        doc["inputs"] = sorted(step.inputs)
    return hashlib.sha256(json.dumps([parent, doc], sort_keys=True).encode()).hexdigest()


def _source(spec: ImageSpec, src: str) -> Path:
    p = Path(src)
    if not p.is_absolute() and spec.source_dir is not None:
        p = spec.source_dir / p
    if not p.exists():
        raise ConfigError(f"image spec: files source {src} does not exist (looked at {p})")
    return p


async def build_image(runtime, spec: ImageSpec,
                      on_step: Callable[[int, int, str, bool], None] | None = None) -> Image:
    base = runtime.host_image(spec.uid, spec.gid) if spec.base == "host" else runtime.image(spec.base)
    layers = list(base.layers)
    env = dict(base.env)
    env.update(spec.env)
    if any(s.pip for s in spec.steps):
        env["PYTHONPATH"] = ":".join(x for x in (SITE, env.get("PYTHONPATH", "")) if x)
    cache_dir = runtime.store.root / "build-cache"
    cache_dir.mkdir(parents=True, exist_ok=True)

    def current() -> Image:
        iid = image_id(layers, base.binds, sorted(env.items()))
        img = Image(iid, tuple(layers), base.binds, tuple(sorted(env.items())), spec.uid, spec.gid,
                    meta={"kind": "spec", "base": base.id})
        save_image(runtime.store, img)
        runtime.register_image(img)
        return img

    img = current()
    for i, step in enumerate(spec.steps, 1):
        key = _step_key(img.id, step, spec)
        cached = cache_dir / key
        layer = cached.read_text().strip() if cached.exists() else None
        hit = layer is not None and runtime.store.has(layer)
        if not hit:
            layer = await _run_step(runtime, img, step, spec)
            cached.write_text(layer)
        layers.insert(0, layer)
        img = current()
        if on_step:
            on_step(i, len(spec.steps), _describe(step), hit)
    return img


def network_env() -> dict[str, str]:
    """What a networked build step needs from the host to reach a package index the way
    the host does: proxies, an http(s) index, and the system CA bundle (the image has it)."""
    import os

    keep = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
    env = {k: v for k, v in os.environ.items() if k in keep}
    for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST"):
        if os.environ.get(k, "").startswith(("http://", "https://")):
            env[k] = os.environ[k]
    env["PIP_CERT"] = env["SSL_CERT_FILE"] = "/etc/ssl/certs/ca-certificates.crt"
    return env


def _describe(step: Step) -> str:
    if step.pip:
        return "pip " + " ".join(step.pip)
    if step.files:
        return "files " + ", ".join(step.files)
    return "run " + (step.run or "")


def _files_layer(runtime, spec: ImageSpec, files: dict[str, str], **owner) -> str:
    with tempfile.TemporaryDirectory(dir=runtime.store.tmp_dir) as tmp:
        root = Path(tmp)
        for dst, src in files.items():
            p = _source(spec, src)
            target = root / dst.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if p.is_dir():
                shutil.copytree(p, target, symlinks=True)
            else:
                shutil.copy2(p, target)
        return runtime.store.add_tree(root, **owner)


async def _run_step(runtime, img: Image, step: Step, spec: ImageSpec) -> str:
    if step.files is not None:
        return _files_layer(runtime, spec, step.files)
    if step.pip is not None:
        import shlex

        cmd = (f"python3 -m pip install --no-cache-dir --disable-pip-version-check --no-warn-script-location "
               f"--target {SITE} {' '.join(shlex.quote(p) for p in step.pip)}")
        network = True
    else:
        cmd, network = step.run or "", step.network
    cfg = SandboxConfig(network=network, uid=spec.uid, gid=spec.gid,
                        limits=SandboxLimits(memory_mb=4096, disk_mb=8192, pids=1024, exec_timeout_s=step.timeout_s))
    env = {"HOME": "/tmp", **(network_env() if network else {})}
    # A run step's inputs are a layer of the step's sandbox only: its writable layer (the step's
    # layer) holds what the step wrote, never them.
    snap = Snapshot(img.id, (_files_layer(runtime, spec, step.inputs, uid=spec.uid, gid=spec.gid),)
                    if step.inputs else ())
    async with await runtime.create(snap, cfg) as sb:
        res = await sb.exec(cmd, cwd="/", env=env)
        if not res.ok:
            raise SandboxError(f"image step `{_describe(step)}` failed (exit {res.exit_code}):\n"
                               f"{res.text('stderr')[-2000:]}{res.text()[-1000:]}")
        sb.cgroup.freeze()
        try:
            return runtime.store.add_tree(sb.upper_dir(), id_base=sb.id_base)
        finally:
            sb.cgroup.thaw()
