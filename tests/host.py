"""Tests that need a host able to run sandboxes skip, naming why, on one that cannot."""

from __future__ import annotations

import pytest


def require_sandbox_host() -> None:
    from tryloop.errors import HostUnsupported
    from tryloop.sandbox.doctor import require_host

    try:
        require_host()
    except HostUnsupported as e:
        pytest.skip(f"host cannot run sandboxes: {e}")
