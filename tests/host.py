"""What tests share about the host: the cgroup parent of their runtimes, and a skip, naming why,
for tests that need a host able to run sandboxes on one that cannot."""

from __future__ import annotations

import os

import pytest

# The cgroup parent of every runtime a test process makes: its own, because a runtime's gc removes
# groups under its parent that its state directory has no record of, which could be another test
# process's sandboxes (the suite runs on several workers).
CGROUP_PARENT = f"tryloop-test-{os.getpid()}"


def require_sandbox_host() -> None:
    from tryloop.errors import HostUnsupported
    from tryloop.sandbox.doctor import require_host

    try:
        require_host()
    except HostUnsupported as e:
        pytest.skip(f"host cannot run sandboxes: {e}")
