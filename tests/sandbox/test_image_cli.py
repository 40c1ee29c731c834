"""`tryloop image ...` run as a real subprocess against a private store: import an OCI
archive, build a Dockerfile on it (twice: the second all cached), ls, inspect, rm, prune."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from oci_archives import base_entries, docker_save, image_config, layer_tar, oci_layout

TRYLOOP = Path(sys.executable).parent / "tryloop"


def tryloop(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run([str(TRYLOOP), *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture
def config_file(runtime, runtime_config, tmp_path):
    """A private store (so ls/prune see only this test's images), the session's cgroup parent."""
    store = tmp_path / "store"
    state = Path(tempfile.mkdtemp(prefix="tryloop-image-cli-"))  # reachable by a build's user namespace
    os.chmod(state, 0o755)
    store.mkdir()
    (store / "native").symlink_to(runtime_config.store_dir / "native")  # the session's compiled init
    path = tmp_path / "tryloop.yaml"
    path.write_text(yaml.safe_dump({
        "runtime": {"store_dir": str(store), "state_dir": str(state), "cgroup_name": runtime_config.cgroup_name},
        "images": {"build_network": False, "prune_grace_s": 0},
    }))
    yield path
    shutil.rmtree(state, ignore_errors=True)


def test_import_build_ls_inspect_rm_prune(config_file, tmp_path):
    layers = [layer_tar(base_entries(tools=("cat",)), gz=True)]
    layout = tmp_path / "layout"
    layout.mkdir()
    oci_layout(layout, layers, image_config(layers, env=["PATH=/bin"]), ref="base")
    res = tryloop("image", "import", str(layout), "--tag", "base:1", "-c", str(config_file))
    assert res.returncode == 0, res.stdout + res.stderr
    base_id = res.stdout.strip().splitlines()[-1]
    assert len(base_id) == 64

    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "msg.txt").write_text("from the context\n")
    (ctx / "Dockerfile").write_text("FROM base:1\nARG WHO=nobody\nWORKDIR /srv\nCOPY msg.txt .\n"
                                    "RUN echo \"built for $WHO\" >> msg.txt && cat msg.txt\n")
    res = tryloop("image", "build", str(ctx), "-t", "app", "--build-arg", "WHO=tests", "-c", str(config_file))
    assert res.returncode == 0, res.stdout + res.stderr
    app_id = res.stdout.strip().splitlines()[-1]
    assert "built for tests" in res.stderr  # the RUN output streams
    assert "3 step(s) built, 0 cached" in res.stderr
    res = tryloop("image", "build", str(ctx), "-t", "app", "--build-arg", "WHO=tests", "-c", str(config_file))
    assert res.stdout.strip().splitlines()[-1] == app_id
    assert "0 step(s) built, 3 cached" in res.stderr

    res = tryloop("image", "ls", "-c", str(config_file))
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "app:latest" in out and "base:1" in out and "on disk" in out
    rows = json.loads(tryloop("image", "ls", "--json", "-c", str(config_file)).stdout)
    assert {r["id"] for r in rows} == {base_id, app_id}
    doc = json.loads(tryloop("image", "inspect", "app", "-c", str(config_file)).stdout)
    assert doc["id"] == app_id and doc["workdir"] == "/srv" and doc["names"] == ["app:latest"]
    assert doc["meta"]["base"] == base_id

    res = tryloop("sandbox", "run", "--image", "app", "-c", str(config_file), "--", "cat", "msg.txt")
    assert res.returncode == 0 and res.stdout == "from the context\nbuilt for tests\n", res.stdout + res.stderr
    res = tryloop("sandbox", "run", "--image", "nothing", "-c", str(config_file), "--", "true")
    assert res.returncode == 78 and "images.run_image: no image named 'nothing'" in res.stdout + res.stderr
    res = tryloop("image", "rm", "app", "-c", str(config_file))
    assert res.returncode == 0, res.stdout + res.stderr
    res = tryloop("image", "prune", "-c", str(config_file))
    assert res.returncode == 0 and "removed" in res.stdout + res.stderr, res.stdout + res.stderr
    rows = json.loads(tryloop("image", "ls", "--json", "-c", str(config_file)).stdout)
    assert [r["id"] for r in rows] == [base_id]
    res = tryloop("image", "inspect", "app", "-c", str(config_file))
    assert res.returncode == 66 and "no image named 'app'" in res.stdout + res.stderr

    archive = tmp_path / "saved.tar"
    docker_save(archive, layers, image_config(layers, env=["PATH=/bin"]), tag="piped:7")
    res = subprocess.run([str(TRYLOOP), "image", "import", "-", "-c", str(config_file)], input=archive.read_bytes(),
                         capture_output=True, timeout=120, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "400"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(tryloop("image", "inspect", "piped:7", "-c", str(config_file)).stdout)["id"] == \
        res.stdout.decode().split()[-1]

    (ctx / "Dockerfile").write_text("FROM base:1\nHEALTHCHECK CMD true\n")
    res = tryloop("image", "build", str(ctx), "-c", str(config_file))
    assert res.returncode == 65
    assert f"{ctx / 'Dockerfile'}:2: HEALTHCHECK is not supported" in res.stdout + res.stderr
