"""Without root or a kernel feature, sandboxes refuse to start and say what is missing."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from tryloop.config import RuntimeConfig
from tryloop.errors import HostUnsupported
from tryloop.sandbox.doctor import checks, require_host


def test_this_host_offers_everything_required():
    missing = [c.name for c in checks() if c.required and not c.ok]
    assert missing == []
    require_host()


def _as_nobody(code: str, tmp_path: Path, imports: str) -> subprocess.CompletedProcess:
    # Imports first: this host's Python lives under /root, which nobody may read.
    prelude = imports + "\nimport os; os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)


def test_runtime_refuses_without_root_and_names_what_is_missing(tmp_path):
    tmp_path.chmod(0o777)
    res = _as_nobody(
        "try:\n"
        "    SandboxRuntime(RuntimeConfig(store_dir=Path('s'), state_dir=Path('t')))\n"
        "except HostUnsupported as e:\n"
        "    print('REFUSED', e.missing, e)\n", tmp_path,
        "from pathlib import Path\nfrom tryloop.config import RuntimeConfig\nfrom tryloop.errors import HostUnsupported\n"
        "from tryloop.sandbox import SandboxRuntime\nimport tryloop.sandbox.doctor, tryloop.sandbox.cgroups, "
        "tryloop.sandbox.native, ctypes, platform, shutil")
    assert "REFUSED" in res.stdout, res.stdout + res.stderr
    assert "['root']" in res.stdout and "running as uid 65534" in res.stdout


def test_doctor_cli_reports_missing_features_and_fails_without_root(tmp_path):
    tmp_path.chmod(0o777)
    res = _as_nobody("app(['sandbox', 'doctor', '--no-live'], prog_name='tryloop')", tmp_path,
                     "import os\nos.environ['COLUMNS'] = '200'\nfrom tryloop.cli.main import app\n"
                     "import tryloop.cli.sandbox, tryloop.sandbox.doctor, tryloop.sandbox.cgroups, "
                     "tryloop.sandbox.native, tryloop.sandbox.seccomp, ctypes, platform, shutil")
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "MISSING" in out and "root" in out and "weaker isolation" in out


def _userns_check(cfg: RuntimeConfig):
    return next(c for c in checks(cfg) if c.name == "user namespace per sandbox")


def test_user_namespaces_on_refuses_a_host_that_cannot_give_them():
    # Layers in /proc: a filesystem without idmapped mounts, as a host's store might be.
    cfg = RuntimeConfig(user_namespaces="on", memory_dir=Path("/proc/tryloop-nowhere"))
    with pytest.raises(HostUnsupported, match="user namespace per sandbox") as e:
        require_host(cfg)
    assert "idmapped" in str(e.value)
    auto = _userns_check(cfg.model_copy(update={"user_namespaces": "auto"}))
    assert not auto.ok and not auto.required and "/proc/tryloop-nowhere" in auto.detail


def test_user_namespaces_off_is_reported_and_logged(runtime_config, tmp_path, caplog):
    from tryloop.sandbox import SandboxRuntime

    cfg = RuntimeConfig(store_dir=runtime_config.store_dir, state_dir=tmp_path / "state",
                        cgroup_name=runtime_config.cgroup_name, user_namespaces="off")
    check = _userns_check(cfg)
    assert not check.ok and not check.required and "off" in check.detail
    with caplog.at_level(logging.WARNING, logger="tryloop.sandbox.runtime"):
        rt = SandboxRuntime(cfg, gc=False)
    assert not rt.user_namespaces
    assert "without a user namespace (runtime.user_namespaces: off)" in caplog.text


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="probes with root")
def test_doctor_checks_the_sandbox_network(monkeypatch):
    """Not required (only sandboxes with network need it), probed for real by the CLI, and
    naming what is missing."""
    import os
    import shutil

    from tryloop.sandbox import buildnet
    from tryloop.sandbox.doctor import network_check

    check = network_check(probe=True)
    assert check.ok and not check.required, check
    assert not [d for d in os.listdir("/sys/class/net") if d.startswith(("tlb", "tlx"))]
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert "tryloop_probe" not in tables
    which = shutil.which
    monkeypatch.setattr(buildnet.shutil, "which", lambda t, *a, **k: None if t == "nft" else which(t, *a, **k))
    for probe in (True, False):
        check = network_check(probe=probe)
        assert not check.ok and "nft not found" in check.detail and "nftables" in check.fix, check
    assert "sandbox network (filtered netns)" in {c.name for c in checks()}
