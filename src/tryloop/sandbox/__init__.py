"""Kernel sandboxes: isolation, layered filesystems, snapshot / reset / fork, warm pools.

    runtime = SandboxRuntime()
    snap = runtime.workspace_snapshot("path/to/project")
    async with await runtime.create(snap) as sb:
        result = await sb.exec("python -m pytest -q")
"""

from tryloop.sandbox.images import Image
from tryloop.sandbox.layers import LayerStore, Snapshot
from tryloop.sandbox.pool import WarmPool
from tryloop.sandbox.process import ExecResult, Process
from tryloop.sandbox.runtime import SandboxRuntime
from tryloop.sandbox.sandbox import Sandbox

__all__ = [
    "ExecResult", "Image", "LayerStore", "Process", "Sandbox", "SandboxRuntime", "Snapshot", "WarmPool",
]
