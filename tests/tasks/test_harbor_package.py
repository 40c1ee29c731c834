"""Harbor, checked with the `harbor` package itself: the task directories `tryloop tasks export`
writes load with Harbor's own task loader (harbor.models.task.Task) with the fields tryloop meant,
and the example tasks Harbor makes (`harbor tasks init`, from the templates the package ships)
import into tryloop.

harbor needs Python >= 3.12, so it lives in a venv of its own (.venv-harbor beside the project's
.venv, made by scripts/setup.sh; TRYLOOP_HARBOR_PYTHON overrides the path) and runs here in a
subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from tryloop.tasks.model import Task, harbor_name
from tryloop.tasks.sources import SourceError, export_harbor, humaneval_tasks, import_harbor

DATA = Path(__file__).parent / "data"

# Loads each task directory given with Harbor's Task and prints what Harbor read, as JSON.
LOAD = textwrap.dedent("""
    import json, sys, warnings
    from harbor.models.task.task import Task
    out = {}
    for d in sys.argv[1:]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t = Task(d)
        c = t.config
        out[d] = {
            "name": t.name, "instruction": t.instruction, "valid": Task.is_valid_dir(d),
            "verifier_timeout": c.verifier.timeout_sec, "agent_timeout": c.agent.timeout_sec,
            "cpus": c.environment.cpus, "memory_mb": c.environment.memory_mb,
            "network_mode": c.environment.network_mode.value, "keywords": c.task.keywords,
            "tryloop": c.metadata.get("tryloop"),
            "dockerfile": str(t.paths.environment_dir / "Dockerfile"),
            "test": str(t.paths.discovered_test_path), "solve": str(t.paths.discovered_solve_path),
            "warnings": [str(w.message) for w in caught],
        }
    print(json.dumps(out))
""")

# Makes Harbor's example tasks with its own initializer (what `harbor tasks init` runs): one with
# the verifier in a separate container (the default), one sharing the agent's, one in steps.
INIT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from harbor.cli.init import _init_task
    from harbor.models.task.config import VerifierEnvironmentMode
    out = Path(sys.argv[1])
    _init_task("harbor/hello-separate", out, include_standard_metadata=True)
    _init_task("harbor/hello-shared", out, verifier_mode=VerifierEnvironmentMode.SHARED,
               include_standard_metadata=True)
    _init_task("harbor/hello-steps", out, steps=2)
""")


@pytest.fixture(scope="module")
def harbor_python() -> str:
    path = os.environ.get("TRYLOOP_HARBOR_PYTHON") or str(Path(sys.prefix).parent / ".venv-harbor" / "bin" / "python")
    if not Path(path).is_file():
        pytest.fail(f"no Harbor venv at {path}: run scripts/setup.sh (it makes .venv-harbor) "
                    "or set TRYLOOP_HARBOR_PYTHON")
    return path


def harbor(python: str, script: str, *args: str | Path) -> str:
    r = subprocess.run([python, "-c", script, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def harbor_load(python: str, *dirs: Path) -> dict[str, dict]:
    return json.loads(harbor(python, LOAD, *dirs))


def test_harbor_is_the_real_package(harbor_python):
    out = harbor(harbor_python, "import importlib.metadata as m, harbor.models.task.task as t; "
                                "print(m.version('harbor'), t.__file__)")
    version, path = out.split()
    assert tuple(int(x) for x in version.split(".")[:2]) >= (0, 26) and "site-packages/harbor/" in path


def test_exported_tasks_load_with_harbor(harbor_python, reward_tasks, tmp_path):
    plain = import_harbor(DATA / "harbor_plain", tmp_path / "plain")
    tasks = [*reward_tasks, *humaneval_tasks(tmp_path / "he", limit=2), plain]
    # one with the network, and an id Harbor's org/name cannot hold as it is
    tasks.append(Task.load(export_harbor(tasks[-2], tmp_path / "renamed")))
    tasks[-1].save_meta(tasks[-1].with_meta(id="humaneval/extra/1", network=True))
    # a task stored before Harbor deprecated allow_internet and memory exports in today's form
    old = tmp_path / "he" / "humaneval" / "0" / "task.toml"
    old.write_text(old.read_text().replace('network_mode = "no-network"', 'allow_internet = false\nmemory = "1G"'))
    tasks[3] = Task.load(old.parent)
    assert "allow_internet" in old.read_text() and tasks[3].meta.id == "humaneval/0"
    exported = {export_harbor(t, tmp_path / "out" / str(i)): t for i, t in enumerate(tasks)}
    seen = harbor_load(harbor_python, *exported)
    assert len(seen) == len(tasks) == 7
    for out, task in exported.items():
        h, m = seen[str(out)], task.meta
        assert h["valid"] and h["warnings"] == [], (out, h["warnings"])
        assert h["name"] == harbor_name(m.id) and h["keywords"] == m.tags
        assert h["instruction"] == task.instruction
        assert (h["verifier_timeout"], h["agent_timeout"]) == (m.test_timeout_s, m.agent_timeout_s)
        assert (h["cpus"], h["memory_mb"]) == (m.cpus, m.memory_mb)
        assert h["network_mode"] == ("public" if m.network else "no-network")
        assert h["test"] == str(out / "tests/test.sh") and h["solve"] == str(out / "solution/solve.sh")
        assert "COPY workspace /workspace" in Path(h["dockerfile"]).read_text()
        # what Harbor uploads to /tests holds the hidden tests test.sh lays over /workspace
        for rel in task.hidden_tests():
            assert (out / "tests" / "workspace" / rel).is_file()
        assert f"if {m.test_command}; then" in (out / "tests/test.sh").read_text()
        # tryloop's own section travels in Harbor's metadata, and the export loads back unchanged
        assert h["tryloop"]["id"] == m.id
        assert Task.load(out).fingerprint() == task.fingerprint()
    assert seen[str(tmp_path / "out" / "6")]["name"] == "humaneval/extra__1"


def test_harbor_example_tasks_import(harbor_python, tmp_path):
    harbor(harbor_python, INIT, tmp_path / "examples")
    for name, mode in (("hello-separate", "separate"), ("hello-shared", "shared")):
        src = tmp_path / "examples" / name
        assert harbor_load(harbor_python, src)[str(src)]["valid"]  # Harbor's own view of its example
        task = import_harbor(src, tmp_path / f"imported-{name}")
        m = task.meta
        assert m.id == f"harbor/harbor-{name}" and m.source == "harbor"
        assert (m.test_timeout_s, m.agent_timeout_s) == (600.0, 600.0)
        assert m.network  # Harbor's example asks for network_mode = "public"
        assert m.test_command == "bash .harbor-tests/tryloop-verify.sh"
        assert m.origin["harbor_workdir"] == "/app" and m.origin["harbor_solve"] is True
        hidden = task.hidden_tests()
        assert {".harbor-tests/test.sh", ".harbor-tests/test_outputs.py", ".harbor-tests/tryloop-verify.sh"} <= set(hidden)
        assert not any("__pycache__" in rel for rel in hidden)  # the package's byte-code is left behind
        test_sh = hidden[".harbor-tests/test.sh"].decode()
        assert "/workspace/.harbor-tests/test_outputs.py" in test_sh and "/tmp/harbor-logs/verifier/" in test_sh
        assert "/tests/" not in test_sh.replace("/workspace/.harbor-tests/", "")
        assert sorted(task.solution_files()) == [".harbor-solution/solve.sh"]
        separate = [n for n in m.origin["harbor_unsupported"] if "separate" in n]
        assert bool(separate) == (mode == "separate")
        # exported again, Harbor loads it: the tests now run in the agent's container
        out = export_harbor(task, tmp_path / f"exported-{name}")
        assert "environment_mode" not in tomllib.loads((out / "task.toml").read_text())["verifier"]
        h = harbor_load(harbor_python, out)[str(out)]
        assert h["valid"] and h["warnings"] == [] and h["network_mode"] == "public"
        assert h["name"] == f"harbor/harbor-{name}" and h["tryloop"]["source"] == "harbor"
    with pytest.raises(SourceError, match="multi-step"):
        import_harbor(tmp_path / "examples" / "hello-steps", tmp_path / "imported-steps")
