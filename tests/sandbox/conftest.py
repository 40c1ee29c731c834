"""Fixtures of the image tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def build_runtime(runtime):
    """The runtime image builds run on: the session's. Its sandboxes need a user namespace
    (a build step runs as root of its own); a host without them fails these tests."""
    assert runtime.user_namespaces, f"image builds need user namespaces: {runtime.user_namespaces_detail}"
    return runtime
