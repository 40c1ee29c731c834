"""SWE-bench-style instances on an environment image: the repository's dependencies installed
with pip in a build sandbox, one image per repository version, shared by its instances.

The default run installs a wheel made here from a local directory (pip --no-index
--find-links: no network); the PyPI variant is marked `network`."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from git_repos import commit_all, sh, take_patch

from tryloop.rewards.submission import Submission
from tryloop.rewards.verifier import verify
from tryloop.sandbox.catalog import resolve
from tryloop.tasks.gate import GateConfig, validate
from tryloop.tasks.harness import task_snapshot
from tryloop.tasks.model import Task
from tryloop.tasks.sources.swebench import (
    build_environment,
    environment_requirements,
    environment_spec,
    needs_image,
    task_from_instance,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the kernel sandbox needs root")
pytestmark = pytest.mark.host   # the environment builds bring up sandbox networks


DEP = "tinydep_tryloop"  # not in tryloop's own environment: only the image has it


def wheel(dest: Path, name: str = DEP, version: str = "1.0") -> Path:
    """A pure-Python wheel written by hand (a zip with its dist-info): no build backend."""
    files = {f"{name}/__init__.py": b'def shout(s):\n    return s.upper() + "!"\n',
             f"{name}-{version}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n".encode(),
             f"{name}-{version}.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: tryloop-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
              for p, d in files.items()]
    files[f"{name}-{version}.dist-info/RECORD"] = ("\n".join([*record, f"{name}-{version}.dist-info/RECORD,,"])
                                                  + "\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in files.items():
            z.writestr(p, d)
    return path


def make_repo(root: Path, imports: str, call: str, requirement: str) -> tuple[Path, list[dict]]:
    """A repository whose code imports its declared dependency, with a bug (greet() drops the
    last character), and two instances of one version at different base commits."""
    r = root / "repo"
    r.mkdir()
    sh(r, "init", "-q", "--initial-branch=main")
    core = f"{imports}\n\n\ndef greet(name):\n    return ({call})[:-1]\n"
    tests = "from app.core import greet\n\n\ndef test_prefix():\n    assert greet('ada').startswith('HELLO, ADA')\n"
    (r / "app").mkdir()
    (r / "app/__init__.py").write_text("")
    (r / "app/core.py").write_text(core)
    (r / "tests").mkdir()
    (r / "tests/test_core.py").write_text(tests)
    (r / "requirements.txt").write_text(f"# runtime\n{requirement}\n-e .\n")
    first = commit_all(r, "base")
    (r / "README.md").write_text("a later commit, the bug still there\n")
    second = commit_all(r, "later")
    (r / "app/core.py").write_text(core.replace("[:-1]", ""))
    patch = take_patch(r)
    (r / "tests/test_core.py").write_text(tests + "\n\ndef test_bang():\n    assert greet('ada') == 'HELLO, ADA!'\n")
    test_patch = take_patch(r)
    common = {"repo": "acme/greeter", "version": "1.0", "problem_statement": "greet() drops the '!'\n",
              "patch": patch, "test_patch": test_patch, "FAIL_TO_PASS": ["tests/test_core.py::test_bang"],
              "PASS_TO_PASS": ["tests/test_core.py::test_prefix"]}
    return r, [{**common, "instance_id": "acme__greeter-1", "base_commit": first},
               {**common, "instance_id": "acme__greeter-2", "base_commit": second}]


def test_which_dependencies_an_instance_declares(tmp_path):
    r = tmp_path / "r"
    r.mkdir()
    sh(r, "init", "-q", "--initial-branch=main")
    (r / "requirements.txt").write_text("six==1.16.0  # pinned\n-r other.txt\n./vendored\n\n")
    (r / "requirements-test.txt").write_text("toolz\nsix==1.16.0\n")
    (r / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["attrs>=21"]\n'
                                      '[project.optional-dependencies]\ntest = ["iniconfig"]\ndocs = ["sphinx"]\n')
    (r / "setup.cfg").write_text("[options]\ninstall_requires =\n    idna\n[options.extras_require]\n"
                                 "testing =\n    pluggy\n")
    setup = commit_all(r, "setup")
    (r / "requirements.txt").write_text("something-else\n")
    sh(r, "commit", "-qam", "later")
    base = sh(r, "rev-parse", "HEAD").strip()
    inst = {"repo": "acme/x", "version": "2.3"}
    env = environment_requirements(inst, r, base)
    assert env["requirements"] == ["something-else", "toolz", "six==1.16.0", "attrs>=21", "iniconfig", "idna",
                                   "pluggy"]
    assert env["from"] == ["requirements.txt", "requirements-test.txt", "pyproject.toml", "setup.cfg"]
    assert (env["repo"], env["version"], env["commit"]) == ("acme/x", "2.3", base)
    # the commit SWE-bench sets a version's environment up from wins over the base commit
    env = environment_requirements({**inst, "environment_setup_commit": setup}, r, base)
    assert env["requirements"][:2] == ["six==1.16.0", "toolz"] and env["skipped"] == ["-r other.txt", "./vendored"]
    # requirements the instance gives win over the repository; no version: the base commit keys it
    env = environment_requirements({"repo": "acme/x", "requirements": "a==1\n# c\nb\n"}, r, base)
    assert (env["requirements"], env["from"], env["version"]) == (["a==1", "b"], ["instance"], base[:12])
    assert environment_requirements({"repo": "acme/x", "pip_packages": ["c"]}, r, base)["requirements"] == ["c"]


def test_an_instance_without_dependencies_keeps_the_host_root(tmp_path):
    r, (inst, _) = make_repo(tmp_path, "import os", "'hello, ' + name.upper() + '!' + os.sep[:0]", "x")
    (r / "requirements.txt").unlink()
    sh(r, "commit", "-qam", "no requirements")
    task = task_from_instance({**inst, "base_commit": sh(r, "rev-parse", "HEAD").strip()}, r, tmp_path / "t")
    assert not needs_image(task) and task.meta.image is None
    assert asyncio.run(build_environment(None, task)) is None


@needs_root
async def test_instances_of_one_version_share_one_image_and_are_judged_on_it(runtime, tmp_path):
    wheels = tmp_path / "wheels"
    wheel(wheels)
    repo, instances = make_repo(tmp_path, f"from {DEP} import shout", "shout('hello, ' + name)",
                                  "tinydep-tryloop==1.0")
    assert subprocess.run(["python3", "-c", f"import {DEP}"], capture_output=True).returncode != 0
    tasks = [task_from_instance(inst, repo, tmp_path / inst["instance_id"]) for inst in instances]
    plain = task_from_instance(instances[0], repo, tmp_path / "plain")  # never built: the host root
    env = tasks[0].meta.origin["environment"]
    assert env["requirements"] == ["tinydep-tryloop==1.0"] and env["skipped"] == ["-e ."]
    assert environment_spec(tasks[0]) == environment_spec(tasks[1])  # one version, one spec

    ids, times, steps = [], [], []
    for task in tasks:
        t0 = time.perf_counter()
        ids.append(await build_environment(runtime, task, find_links=wheels, on_step=steps.append))
        times.append(time.perf_counter() - t0)
    print(f"environment image: cold {times[0]:.2f}s, second instance {times[1] * 1000:.0f}ms")
    assert ids[0] == ids[1] and len(ids[0]) == 64
    assert [s.endswith("(built)") for s in steps] == [True, True, False, False], steps  # files, pip; then cached
    assert times[1] < 1.0
    tasks = [Task.load(t.root) for t in tasks]
    assert all(t.meta.image == ids[0] for t in tasks)
    assert resolve(runtime.store, "swebench/acme__greeter:1.0") == ids[0]
    assert tasks[0].fingerprint() != plain.fingerprint()  # the image is part of the task's version
    assert task_snapshot(runtime, tasks[0]).id != task_snapshot(runtime, plain).id

    gold = Submission.from_files(tasks[0].solution_files())
    for task in tasks:
        fixed = await verify(runtime, task, gold)
        assert fixed.state == "pass", (fixed.reason, fixed.outcomes)
        broken = await verify(runtime, task, Submission())
        assert broken.state == "fail" and broken.outcomes["tests/test_core.py::test_bang"] == "failed"
        assert broken.outcomes["tests/test_core.py::test_prefix"] == "passed"
    gate = await validate(runtime, tasks[1], GateConfig(k=1, time_budget_s=120))
    assert gate.accepted, (gate.reason, gate.detail)

    # On the host root the dependency is missing: the gold patch cannot pass there.
    without = await verify(runtime, plain, gold)
    assert without.state != "pass", without.outcomes
    async with await runtime.create(task_snapshot(runtime, plain)) as sb:
        res = await sb.exec(["python3", "-c", f"import {DEP}"])
        assert not res.ok and "ModuleNotFoundError" in res.text("stderr")
    async with await runtime.create(task_snapshot(runtime, tasks[0])) as sb:
        res = await sb.exec(["python3", "-c", f"import {DEP}; print({DEP}.__file__)"])
        assert res.ok and res.text().startswith(f"/opt/tryloop/site/{DEP}/"), res.text("stderr")


@needs_root
async def test_a_dependency_that_cannot_be_installed_is_a_build_error(runtime, tmp_path):
    from tryloop.sandbox.dockerfile import BuildError

    wheels = tmp_path / "wheels"
    wheel(wheels)
    repo, (inst, _) = make_repo(tmp_path, f"from {DEP} import shout", "shout('hello, ' + name)",
                                "tinydep-tryloop==1.0")
    task = task_from_instance({**inst, "requirements": ["tinydep-tryloop==9.9"]}, repo, tmp_path / "t")
    with pytest.raises(BuildError, match=r"(?s)swebench/acme__greeter-1: the environment swebench/acme__greeter:1.0 "
                                         r"did not build: .*pip --no-index.*tinydep-tryloop==9.9"):
        await build_environment(runtime, task, find_links=wheels)
    assert Task.load(task.root).meta.image is None


@needs_root
@pytest.mark.network
async def test_the_dependencies_come_from_pypi(runtime, tmp_path):
    """`six` (not in tryloop's environment) from the package index, in a build sandbox."""
    from tryloop.sandbox.dockerfile import BuildError

    repo, instances = make_repo(tmp_path, "import six", "six.ensure_str('HELLO, ' + name.upper() + '!')",
                                "six==1.16.0")
    tasks = [task_from_instance(inst, repo, tmp_path / inst["instance_id"]) for inst in instances]
    try:
        t0 = time.perf_counter()
        iid = await build_environment(runtime, tasks[0])
        cold = time.perf_counter() - t0
    except BuildError as e:
        if not any(s in str(e) for s in ("Failed to establish", "Temporary failure in name resolution",
                                          "Network is unreachable", "Could not fetch URL", "ProxyError")):
            raise
        pytest.skip(f"package index unavailable: {str(e)[-300:]}")
    t0 = time.perf_counter()
    assert await build_environment(runtime, tasks[1]) == iid
    print(f"environment image from PyPI: cold {cold:.2f}s, second instance {(time.perf_counter() - t0) * 1000:.0f}ms")
    task = Task.load(tasks[1].root)
    fixed = await verify(runtime, task, Submission.from_files(task.solution_files()))
    assert fixed.state == "pass", (fixed.reason, fixed.outcomes)
    assert (await verify(runtime, task, Submission())).state == "fail"


@needs_root
def test_tasks_import_builds_the_environment_once_per_version(runtime_config, tmp_path):
    """`tryloop tasks import --swebench` builds the image first (once: the second instance's is
    the cache's), records it in the tasks the gate admits; --no-build keeps the host root,
    where the dependency is missing and the gate rejects them."""
    import json
    import re
    import sys

    import yaml

    wheels = tmp_path / "wheels"
    wheel(wheels)
    repo, instances = make_repo(tmp_path, f"from {DEP} import shout", "shout('hello, ' + name)",
                                "tinydep-tryloop==1.0")
    (tmp_path / "instances.jsonl").write_text("".join(json.dumps(i) + "\n" for i in instances))
    config = tmp_path / "tryloop.yaml"
    config.write_text(yaml.safe_dump({
        "runtime": {"store_dir": str(runtime_config.store_dir), "state_dir": str(runtime_config.state_dir),
                    "cgroup_name": runtime_config.cgroup_name},
        "tasks": {"store_url": str(tmp_path / "store"), "work_dir": str(tmp_path / "work")}}))
    cmd = [str(Path(sys.executable).parent / "tryloop"), "tasks", "import", "--swebench",
           str(tmp_path / "instances.jsonl"), "--repo", str(repo), "-k", "1", "-c", str(config)]
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}
    res = subprocess.run([*cmd, "--find-links", str(wheels)], capture_output=True, text=True, env=env, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    ids = re.findall(r"image ([0-9a-f]{64})", out)
    assert len(ids) == 2 and ids[0] == ids[1], out
    assert "swebench/acme__greeter:1.0" in out and out.count("(cached)") >= 2, out
    assert re.search(r"total\W+2\W+0\W", out), out
    stored = [Task.load(p.parent) for p in (tmp_path / "store").rglob("task.toml")]
    assert stored and all(t.meta.image == ids[0] for t in stored)

    res = subprocess.run([*cmd, "--no-build", "--store", str(tmp_path / "store2")], capture_output=True, text=True,
                         env=env, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "image " not in out and re.search(r"total\W+0\W+2\W", out), out
