"""A working project with a test suite: the raw material tasks are made from.

Importers (local directory, git repository, PyPI sdist, bundled sources) turn
what they read into a `Project`; the factory mutates projects into tasks.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tryloop.tasks.model import read_files

# Never part of a task's files: build output, caches, VCS metadata.
IGNORED = ("__pycache__", "*.pyc", ".git", ".hg", ".svn", ".tox", ".nox", ".venv", "venv", "*.egg-info",
           ".pytest_cache", ".mypy_cache", ".ruff_cache", "build", "dist", ".eggs", ".coverage", "htmlcov")


def ignored(rel: str) -> bool:
    return any(fnmatch.fnmatch(part, pat) for part in rel.split("/") for pat in IGNORED)


@dataclass
class Project:
    """A project directory whose tests pass, and how to run them."""

    name: str
    root: Path
    source: str
    test_command: str = "python3 -m pytest -q"
    test_paths: list[str] = field(default_factory=lambda: ["tests"])
    origin: dict[str, Any] = field(default_factory=dict)

    def is_test_path(self, rel: str) -> bool:
        return any(rel == p or rel.startswith(p.rstrip("/") + "/") or fnmatch.fnmatch(rel, p)
                   for p in self.test_paths)

    def files(self) -> dict[str, bytes]:
        return {rel: data for rel, data in read_files(self.root).items() if not ignored(rel)}

    def split_files(self) -> tuple[dict[str, bytes], dict[str, bytes]]:
        """(workspace files, hidden test files)."""
        ws, tests = {}, {}
        for rel, data in self.files().items():
            (tests if self.is_test_path(rel) else ws)[rel] = data
        return ws, tests

    def source_files(self) -> dict[str, bytes]:
        """Python files outside the tests: where bugs are planted."""
        ws, _ = self.split_files()
        return {rel: data for rel, data in ws.items() if rel.endswith(".py") and not rel.endswith("setup.py")
                and not rel.split("/")[-1].startswith("test_") and "conftest" not in rel}
