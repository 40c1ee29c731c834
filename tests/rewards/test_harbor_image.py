"""A Harbor task whose Dockerfile installs a Debian package its tests need: the import builds
its environment image (FROM a Debian root of the host's release, RUN apt-get install), the
task records the image id, and the agent's and verifier's sandboxes run on it (slow: builds
a Debian root with apt, downloads from the archive). A variant without network, on a minimal
image archive, is in tests/sandbox/test_task_images.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tryloop.rewards.submission import Submission
from tryloop.rewards.verifier import verify
from tryloop.sandbox.dockerfile import BuildError
from tryloop.tasks.harness import task_snapshot
from tryloop.tasks.model import Task
from tryloop.tasks.sources.harbor import build_environment, import_harbor, needs_image

pytestmark = [pytest.mark.slow, pytest.mark.network]

HARBOR = Path(__file__).parents[1] / "tasks" / "data" / "harbor_apt"
FIX = '''"""Counts with tree(1)."""
import json
import subprocess


def count_files(path: str) -> int:
    out = subprocess.run(["tree", "-J", "-a", path], capture_output=True, text=True, check=True).stdout
    report = json.loads(out)[-1]
    return report["files"]
'''


async def test_a_harbor_task_runs_and_is_judged_on_its_own_image(runtime, tmp_path):
    task = import_harbor(HARBOR, tmp_path / "task")
    assert task.meta.image is None and needs_image(task)
    assert any("RUN not executed" in n for n in task.meta.origin["harbor_unsupported"])
    before = task.fingerprint()
    host_snap = task_snapshot(runtime, task)
    t0 = time.monotonic()
    iid = await build_environment(runtime, task)
    cold = time.monotonic() - t0
    task = Task.load(task.root)  # what was recorded on disk
    assert task.meta.image == iid and task.meta.origin["harbor_image"]["from"] == "debian:bookworm"
    assert not any("RUN not executed" in n for n in task.meta.origin["harbor_unsupported"])
    assert task.fingerprint() != before  # the image is part of the task's version
    t0 = time.monotonic()
    assert await build_environment(runtime, task) == iid  # every step cached: the same id
    warm = time.monotonic() - t0

    snap = task_snapshot(runtime, task)
    assert snap.id != host_snap.id and snap.image != host_snap.image
    assert runtime.image(snap.image).meta["base"] == iid
    async with await runtime.create(snap) as sb:  # the agent's view: the workspace on the image
        res = await sb.exec("command -v tree; command -v gcc || echo no-gcc; ls; id -u; stat -c %u report.py cache")
        assert res.text().split() == ["/usr/bin/tree", "no-gcc", "cache", "report.py", "1000", "1000", "1000"], \
            res.text()  # the workspace is the agent's, and so is what RUN made in it

    fixed = await verify(runtime, task, Submission.from_files({"report.py": FIX}))
    assert fixed.state == "pass", fixed.reason
    assert fixed.outcomes == {".harbor-tests/test_report.py::test_tree_comes_from_the_image": "passed",
                              ".harbor-tests/test_report.py::test_count_files": "passed"}
    broken = await verify(runtime, task, Submission())
    assert broken.state == "fail" and broken.outcomes[".harbor-tests/test_report.py::test_count_files"] == "failed"
    assert broken.outcomes[".harbor-tests/test_report.py::test_tree_comes_from_the_image"] == "passed"
    # The verdict names the environment: the same task on the host root has another version.
    host_task = Task.load(task.root)
    host_task.meta = host_task.meta.model_copy(update={"image": None})
    host_task._fingerprint = None
    on_host = await verify(runtime, host_task, Submission.from_files({"report.py": FIX}))
    assert on_host.version != fixed.version
    assert on_host.state != "pass", on_host.reason  # no tree on the host's root
    print(f"\nharbor task image: cold {cold:.1f}s (Debian root with apt included unless cached), cached {warm:.2f}s")

    from tryloop.tasks.gate import GateConfig, validate

    res = await validate(runtime, task, GateConfig(k=2))
    assert res.accepted, res
    assert res.fail_to_pass == [".harbor-tests/test_report.py::test_count_files"]


async def test_a_base_this_host_cannot_make_is_refused_with_the_line(runtime, tmp_path):
    src = tmp_path / "src"
    import shutil

    shutil.copytree(HARBOR, src)
    (src / "environment/Dockerfile").write_text("# a task\nFROM python:3.11-slim\nRUN pip install pytest\n"
                                                "WORKDIR /app\nCOPY report.py /app/report.py\n")
    task = import_harbor(src, tmp_path / "task")  # its Dockerfile: a generated first line, then FROM
    with pytest.raises(BuildError, match=r"environment/Dockerfile:2: FROM python:3.11-slim: not in the image store"):
        await build_environment(runtime, task)
    assert Task.load(task.root).meta.image is None

