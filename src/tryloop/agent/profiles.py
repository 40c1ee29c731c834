"""Environments declare their prompt and tools: a profile per kind of work.

A task names its profile in `[metadata.tryloop] environment` (default
`software`); the episode takes the system prompt's opening and the tool set from
it, and the policies offer the model exactly those tools.

    software   fix code: shell, view, replace, write, search, submit (the prompt and tools every
               code task has always had, byte for byte)
    data       answer a question over data files: shell, view, write, search, sql, submit
    documents  extract a JSON document: shell, view, write, validate_json, submit

The extra tools act in the agent's sandbox like the others (tryloop.agent.tools):
`sql` runs one read-only query with the sandbox's python3 and sqlite3;
`validate_json` checks a workspace JSON file against a workspace JSON Schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tryloop.agent.tools import ALL_SCHEMAS, SUBMIT
from tryloop.tasks.model import Task, TaskError


@dataclass(frozen=True)
class Profile:
    name: str
    intro: str                  # the system prompt's opening: who the agent is and what "done" means
    tools: tuple[str, ...]      # tool names, in the order the prompt lists them

    @property
    def schemas(self) -> list[dict[str, Any]]:
        by_name = {s["function"]["name"]: s for s in ALL_SCHEMAS}
        return [by_name[t] for t in self.tools]


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("software", "You are a software engineer working in a Linux sandbox. The repository is in /workspace.\n"
                        "Fix the problem described by the user: read the code, edit files, run the tests, and call "
                        "submit when done.",
            ("shell", "view", "replace", "write", "search", SUBMIT)),
    Profile("data", "You are a data analyst working in a Linux sandbox. The data files are in /workspace.\n"
                    "Answer the user's question: inspect the files and their README, compute the answer (python3 "
                    "or the sql tool), write the answer file the user asks for, and call submit when done.",
            ("shell", "view", "write", "search", "sql", SUBMIT)),
    Profile("documents", "You extract structured data in a Linux sandbox. The document is in /workspace.\n"
                         "Read it, write the JSON answer file the user asks for, check it against the schema with "
                         "validate_json, and call submit when done.",
            ("shell", "view", "write", "validate_json", SUBMIT)),
)}


def profile_for(task: Task | None) -> Profile:
    """The task's profile (software without a task); an unknown name is the task's error."""
    name = task.meta.environment if task is not None else "software"
    try:
        return PROFILES[name]
    except KeyError:
        raise TaskError(f"task {task.id if task else '?'}: [metadata.tryloop] environment {name!r} is not one of "
                        f"{', '.join(PROFILES)}") from None
