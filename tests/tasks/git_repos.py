"""Git in the task-source tests' scratch repositories: a fixed identity, and the steps every
SWE-bench-style fixture repeats (commit everything, take a patch and undo it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tryloop.tasks.sources.local import GIT_IDENTITY, git_env


def sh(cwd: Path, *args: str) -> str:
    """Run git in `cwd` with a fixed identity (commits, tags, stashes need one)."""
    res = subprocess.run(["git", *args], cwd=cwd, env=git_env(GIT_IDENTITY), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout


def commit_all(repo: Path, message: str) -> str:
    """Commit every change (new files too); the new commit's id."""
    sh(repo, "add", "-A")
    sh(repo, "commit", "-qm", message)
    return sh(repo, "rev-parse", "HEAD").strip()


def take_patch(repo: Path) -> str:
    """The working tree's changes to tracked files as a diff, then undone."""
    patch = sh(repo, "diff")
    sh(repo, "checkout", "--", ".")
    return patch
