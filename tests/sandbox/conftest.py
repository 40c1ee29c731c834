"""Fixtures of the image tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tryloop.config import RuntimeConfig


@pytest.fixture(scope="session")
def build_runtime(runtime, runtime_config):
    """A runtime for image builds: the session's store and cgroup parent, its state (and
    mount directory) outside pytest's 0700 temporary root. A build sandbox's init runs
    as an unprivileged host id (root of its own user namespace) and must reach it."""
    from tryloop.sandbox import SandboxRuntime

    state = Path(tempfile.mkdtemp(prefix="tryloop-build-state-"))
    os.chmod(state, 0o755)
    rt = SandboxRuntime(RuntimeConfig(store_dir=runtime_config.store_dir, state_dir=state,
                                      memory_dir=runtime_config.memory_dir, cgroup_name=runtime_config.cgroup_name),
                        gc=False)
    yield rt
    assert not rt.live, f"sandboxes left open by tests: {rt.live}"
    shutil.rmtree(state, ignore_errors=True)
