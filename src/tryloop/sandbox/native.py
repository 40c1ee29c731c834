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
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".tlinit-")
    os.close(fd)
    base = [cc, "-O2", "-Wall", "-o", tmp, str(SOURCE)]
    # Static first: no dynamic loader at start and fewer private pages per sandbox.
    for extra in (["-static"], []):
        proc = subprocess.run(base + extra, capture_output=True, text=True)
        if proc.returncode == 0:
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
            return target
    os.unlink(tmp)
    raise HostUnsupported(f"building the sandbox init failed:\n{proc.stderr}", missing=["cc"])
