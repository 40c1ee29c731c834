"""Builds the sandbox init (`tlinit`) from its C source once, cached by content hash.

The init is C because one is held per idle sandbox: a static binary costs tens
of kilobytes of private memory where a Python process would cost megabytes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tryloop.errors import HostUnsupported

SOURCE = Path(__file__).with_name("native") / "tlinit.c"


def source_digest() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]


def compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


def compile_cached(target: Path, attempts: list[list[str]], timeout_s: float | None = None) -> str | None:
    """Compile into `target` with the first of `attempts` (compiler command lines without their
    `-o OUTPUT`) that succeeds; None then, else the last attempt's error output.

    Each attempt writes a temporary file beside `target`, renamed over it when done (atomic:
    processes building at once all find a whole file), mode 755 (usable by other users of a
    shared cache); nothing temporary is left behind, whatever happens."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}-")
    os.close(fd)
    error = "no attempt"
    try:
        for args in attempts:
            try:
                proc = subprocess.run([*args, "-o", tmp], capture_output=True, text=True, timeout=timeout_s)
            except (OSError, subprocess.TimeoutExpired) as e:
                error = str(e)
                continue
            if proc.returncode == 0:
                os.chmod(tmp, 0o755)
                os.replace(tmp, target)
                return None
            error = proc.stderr
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return error


def build_init(out_dir: Path) -> Path:
    """Return the path of a built init for the current source, compiling it if needed."""
    target = out_dir / f"tlinit-{source_digest()}"
    if target.exists():
        return target
    cc = compiler()
    if cc is None:
        raise HostUnsupported(
            "no C compiler found to build the sandbox init (install gcc and libc6-dev)",
            missing=["cc"],
        )
    base = [cc, "-O2", "-Wall", str(SOURCE)]
    # Static first: no dynamic loader at start and fewer private pages per sandbox.
    error = compile_cached(target, [base + ["-static"], base])
    if error is not None:
        raise HostUnsupported(f"building the sandbox init failed:\n{error}", missing=["cc"])
    return target
