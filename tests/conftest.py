"""Shared fixtures (one real sandbox runtime per test session, in a private store) and how the
suite is spread over pytest-xdist's workers."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from host import CGROUP_PARENT
from tryloop.config import RuntimeConfig, SandboxConfig, SandboxLimits

# pytest-xdist's workers share the cores. torch's intra-op pool (a thread per core by default) in
# each would oversubscribe them, and OpenMP's barriers wait for descheduled threads: each worker
# gets its share, before anything imports torch (subprocesses inherit it).
if (_workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _workers)))


@pytest.hookimpl(tryfirst=True)   # before pytest-xdist's hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """The default run's two workers (pytest-xdist, `--dist loadgroup`) take whole groups: a
    module, so that its module-scoped fixtures are built once, or one of two groups whose members
    must never run at the same time:
    - `host`: tests that change or check what the whole host shares (mounts, network devices,
      nft tables, cgroup hierarchies): tests/sandbox, the `network` tests (their image builds
      bring up a sandbox network) and those marked `host`;
    - `ray`: the tests marked `ray`, which start local Ray clusters (one at a time on a host).
    Groups are handed out in the order of their first test (`--no-loadscope-reorder`): the
    longest first, the training modules and then `host`, so that no worker is left running one of
    them alone at the end."""
    rank = {}
    for item in items:
        path = item.path.relative_to(config.rootpath).as_posix()
        if path.startswith("tests/sandbox/") or item.get_closest_marker("network") or item.get_closest_marker("host"):
            group = "host"
        elif item.get_closest_marker("ray"):
            group = "ray"
        else:
            group = path
        item.add_marker(pytest.mark.xdist_group(group))
        rank[item] = 0 if path.startswith("tests/train/") else 1 if group == "host" else 2
    items.sort(key=rank.__getitem__)


@pytest.hookimpl(optionalhook=True)   # a pytest-xdist hook
def pytest_xdist_node_collection_finished(node, ids):
    """A worker's tests came without their groups (pytest-xdist's tag on the node ids): the
    groups above would be ignored and every test scheduled alone, so the run stops."""
    if node.config.getvalue("dist") == "loadgroup" and ids and "@" not in ids[0]:
        pytest.exit("pytest-xdist could not group the tests (its --dist loadgroup needs pytest < 9.2): "
                    "install the dev extra's pytest, or run with -n 0", returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.fixture(scope="session")
def runtime_config(tmp_path_factory) -> RuntimeConfig:
    base = tmp_path_factory.mktemp("tryloop")
    return RuntimeConfig(store_dir=base / "store", state_dir=base / "state", cgroup_name=CGROUP_PARENT)


_SESSION_RUNTIME: list = []          # the session's runtime, once a test asked for it
_LEFT_OPEN_BY: dict[str, str] = {}   # sandbox id -> the test after which it was still open


@pytest.fixture(scope="session")
def runtime(runtime_config):
    from tryloop.sandbox import SandboxRuntime

    rt = SandboxRuntime(runtime_config)
    _SESSION_RUNTIME.append(rt)
    yield rt
    # Nothing may outlive the session: every test closes what it opened.
    leftover = rt.live
    for root in set(rt.cgroups.controllers.values()):
        with contextlib.suppress(OSError):
            os.rmdir(root / runtime_config.cgroup_name)
    assert not leftover, "sandboxes left open by tests: " + ", ".join(
        f"{sb!r} (open after {_LEFT_OPEN_BY.get(sb.id, '?')})" for sb in leftover)


@pytest.fixture(autouse=True)
def _name_the_test_that_leaves_a_sandbox_open(request):
    """The session's check above fails at its end; this names the test a leftover sandbox outlived."""
    before = {sb.id for sb in _SESSION_RUNTIME[0].live} if _SESSION_RUNTIME else set()
    yield
    for sb in _SESSION_RUNTIME[0].live if _SESSION_RUNTIME else ():
        if sb.id not in before:
            _LEFT_OPEN_BY.setdefault(sb.id, request.node.nodeid)


@pytest.fixture
def small_config() -> SandboxConfig:
    """Tight limits so that bombs hit them quickly."""
    return SandboxConfig(limits=SandboxLimits(memory_mb=128, pids=64, disk_mb=32, exec_timeout_s=20))


@pytest.fixture
async def sandbox(runtime, small_config):
    sb = await runtime.create(runtime.base_snapshot(small_config), small_config)
    try:
        yield sb
    finally:
        await sb.close()


@pytest.fixture(scope="session")
def project_dir() -> Path:
    """A small real Python project with a passing test, used as a workspace."""
    from tryloop.assets import CALC_PROJECT

    return CALC_PROJECT


@pytest.fixture(scope="session")
def reward_tasks(tmp_path_factory):
    """Real tasks: one hand-written multi-file bug per bundled project (different code, different tests)."""
    from tryloop.tasks.factory import bundled_projects, multifile_bugs, multifile_task

    work = tmp_path_factory.mktemp("reward-tasks")
    projects = {p.name: p for p in bundled_projects()}
    seen, out = set(), []
    for b in multifile_bugs():
        if b["project"] not in seen:
            seen.add(b["project"])
            out.append(multifile_task(projects[b["project"]], b, work))
    return out[:3]


@pytest.fixture(scope="session")
def task(reward_tasks):
    return reward_tasks[0]


# A bug-fix task declaring the code sub-steps: factorial's loop stops one short in mathkit.
FACTORIAL_BUG = {"id": "factorial-range", "project": "mathkit", "report": "factorial(5) returns 24, not 120.",
                 "edits": [{"path": "mathkit/arith.py", "find": "for k in range(2, n + 1):",
                            "replace": "for k in range(2, n):"}]}
REPRO_TEST = b"from mathkit import factorial\n\n\ndef test_factorial_of_five():\n    assert factorial(5) == 120\n"


@pytest.fixture(scope="session")
def repro_task(tmp_path_factory):
    """A bug-fix task from a bundled project with the sub-steps "a test that reproduces the bug"
    (weight 1), then "the fix passes" (weight 3), tracked over turns."""
    from tryloop.tasks.factory import bundled_projects, code_substeps, multifile_task

    project = next(p for p in bundled_projects() if p.name == "mathkit")
    return multifile_task(project, FACTORIAL_BUG, tmp_path_factory.mktemp("repro-task"), substeps=code_substeps())


@pytest.fixture(scope="session")
def repro_test() -> bytes:
    """A test that reproduces `repro_task`'s bug: fails on the broken workspace, passes with the fix."""
    return REPRO_TEST


@pytest.fixture(scope="session")
def smollm2():
    """The bundled SmolLM2, loaded once per session from the user's model cache (the first session
    on a machine converts the GGUF into the cache, ~35 s; later ones read it in a few seconds)."""
    from tryloop.agent.hf import load_model

    return load_model("smollm2-135m", device="cpu")
