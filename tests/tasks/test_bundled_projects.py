"""The bundled projects (tryloop/assets/projects): their own test suites pass, their metadata
is complete, and every hand-written multi-file bug applies cleanly and breaks some tests but
not all of them.

Each project's tests run in a temporary copy, in a subprocess, the way a sandbox runs them
(`python -m pytest -q` from the project root, nothing installed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tryloop.assets import ASSETS
from tryloop.tasks.project import Project

PROJECTS = ASSETS / "projects"
BUGS_FILE = PROJECTS / "MULTIFILE_BUGS.toml"
PROJECT_NAMES = sorted(p.name for p in PROJECTS.iterdir() if (p / "project.toml").is_file())
BUGS = tomllib.loads(BUGS_FILE.read_text())["bugs"]
EXPECTED = {"strutils", "mathkit", "inventory", "textstats", "minijson", "scheduler"}


def read_meta(name: str) -> dict:
    return tomllib.loads((PROJECTS / name / "project.toml").read_text())["project"]


def copy_project(name: str, dest: Path) -> Path:
    root = dest / name
    shutil.copytree(PROJECTS / name, root,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
    return root


def run_tests(root: Path) -> dict[str, str]:
    """{test id: 'passed' | 'failed' | 'skipped'} from one pytest run in `root`."""
    report = root.parent / f"{root.name}-junit.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "PYTHON"))}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the host's plugins are not the sandbox's
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert report.exists(), f"pytest produced no report:\n{proc.stdout}\n{proc.stderr}"
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            results[test_id] = "failed"
        elif case.find("skipped") is not None:
            results[test_id] = "skipped"
        else:
            results[test_id] = "passed"
    # Collection errors leave no testcase for the tests they hide: count them as failures.
    if proc.returncode not in (0, 1) and not any(r == "failed" for r in results.values()):
        results["<collection>"] = "failed"
    return results


@pytest.fixture(scope="module")
def baselines(tmp_path_factory) -> dict[str, dict[str, str]]:
    base = tmp_path_factory.mktemp("baseline")
    return {name: run_tests(copy_project(name, base)) for name in PROJECT_NAMES}


def test_the_suite_is_complete():
    assert set(PROJECT_NAMES) >= EXPECTED
    tiers = {read_meta(name)["tier"] for name in PROJECT_NAMES}
    assert tiers == {"easy", "medium", "hard"}


@pytest.mark.parametrize("name", PROJECT_NAMES)
def test_project_metadata(name):
    meta = read_meta(name)
    assert meta["name"] == name
    assert meta["description"].strip()
    assert meta["test_command"] == "python3 -m pytest -q"
    assert meta["test_paths"] == ["tests"]
    assert meta["tier"] in ("easy", "medium", "hard")
    root = PROJECTS / name
    assert (root / name / "__init__.py").is_file(), "the package is named after the project"
    assert not (root / "conftest.py").exists()

    project = Project(name=name, root=root, source="bundled", test_command=meta["test_command"],
                      test_paths=meta["test_paths"])
    workspace, hidden = project.split_files()
    assert hidden and all(rel.startswith("tests/") for rel in hidden)
    assert any(rel.startswith("tests/test_") and rel.endswith(".py") for rel in hidden)
    sources = project.source_files()
    assert sources and all(rel.startswith(f"{name}/") for rel in sources)
    lines = sum(data.decode().count("\n") for data in sources.values())
    assert 100 <= lines <= 400, f"{name}: {lines} lines of source"
    assert "project.toml" in workspace


@pytest.mark.parametrize("name", PROJECT_NAMES)
def test_project_tests_pass(baselines, name):
    results = baselines[name]
    failed = sorted(t for t, r in results.items() if r != "passed")
    assert not failed, f"{name}: {failed}"
    assert len(results) >= 10, f"{name}: only {len(results)} tests"


def test_bug_ids_are_unique_and_complete():
    keys = [(bug["project"], bug["id"]) for bug in BUGS]
    assert len(keys) == len(set(keys))
    assert len(BUGS) >= 6
    for bug in BUGS:
        assert bug["project"] in PROJECT_NAMES
        assert read_meta(bug["project"])["tier"] in ("medium", "hard")
        assert bug["description"].strip() and bug["report"].strip()
        assert len({edit["path"] for edit in bug["edits"]}) >= 2, f"{bug['id']} touches one file"
        for edit in bug["edits"]:
            assert not Project(name="x", root=PROJECTS, source="bundled").is_test_path(edit["path"])
            # The report describes behaviour, never where the fix goes.
            assert edit["path"] not in bug["report"]
            assert Path(edit["path"]).name not in bug["report"]


def apply_edits(root: Path, edits: list[dict]) -> None:
    for edit in edits:
        path = root / edit["path"]
        text = path.read_text()
        count = text.count(edit["find"])
        assert count == 1, f"{edit['path']}: `find` occurs {count} times: {edit['find']!r}"
        assert edit["find"] != edit["replace"]
        path.write_text(text.replace(edit["find"], edit["replace"]))


@pytest.mark.parametrize("bug", BUGS, ids=[f"{b['project']}-{b['id']}" for b in BUGS])
def test_multifile_bug(baselines, bug, tmp_path):
    root = copy_project(bug["project"], tmp_path)
    apply_edits(root, bug["edits"])
    for rel in {edit["path"] for edit in bug["edits"]}:
        compile((root / rel).read_text(), rel, "exec")  # still valid Python
    before = baselines[bug["project"]]
    after = run_tests(root)
    flipped = [t for t, r in before.items() if r == "passed" and after.get(t) == "failed"]
    still = [t for t, r in after.items() if r == "passed"]
    assert flipped, f"{bug['id']}: no test fails"
    assert still, f"{bug['id']}: every test fails"
