"""Importers: turn outside material into projects and tasks.

    local      project_from_dir, project_from_git, sanitize_git_workspace, assert_clean_history
    pypi       project_from_sdist (a pinned sdist from PyPI), project_from_archive
    swebench   load_instances, task_from_instance (SWE-bench-style instances, local repo)
    humaneval  humaneval_tasks (the 164 HumanEval problems as function-level tasks)
    harbor     import_harbor (a plain Harbor task), export_harbor (ours, Harbor-valid)
"""

from tryloop.tasks.sources.harbor import export_harbor, import_harbor
from tryloop.tasks.sources.humaneval import humaneval_task, humaneval_tasks, load_humaneval
from tryloop.tasks.sources.local import (
    HistoryLeak,
    SourceError,
    assert_clean_history,
    detect_test_paths,
    project_from_dir,
    project_from_git,
    sanitize_git_workspace,
)
from tryloop.tasks.sources.pypi import project_from_archive, project_from_sdist
from tryloop.tasks.sources.swebench import load_instances, task_from_instance

__all__ = [
    "HistoryLeak", "SourceError", "assert_clean_history", "detect_test_paths", "export_harbor",
    "humaneval_task", "humaneval_tasks", "import_harbor", "load_humaneval", "load_instances",
    "project_from_archive", "project_from_dir", "project_from_git", "project_from_sdist",
    "sanitize_git_workspace", "task_from_instance",
]
