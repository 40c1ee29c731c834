"""Shell test commands (a plain Harbor task's `test.sh`) under the verifier: the pytest runs inside
are the harness's test processes, the verdict comes from their per-test records, and neither the
exit status nor a reward file the code under test can write decides anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from tryloop.rewards.submission import Submission
from tryloop.rewards.verifier import verify
from tryloop.tasks.harness import pytest_args
from tryloop.tasks.model import Task
from tryloop.tasks.sources.harbor import HARBOR_LOGS, import_harbor

HARBOR = Path(__file__).parents[1] / "tasks" / "data" / "harbor_plain"
FIX = '''"""Small text helpers."""
import re


def slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
'''


@pytest.fixture(scope="module")
def harbor_task(tmp_path_factory) -> Task:
    task = import_harbor(HARBOR, tmp_path_factory.mktemp("harbor") / "task")
    assert pytest_args(task) is None  # `bash .harbor-tests/tryloop-verify.sh`: a shell command
    return task


async def test_a_harbor_task_gets_real_verdicts_from_per_test_records(runtime, harbor_task):
    fixed = await verify(runtime, harbor_task, Submission.from_files({"textutil.py": FIX}))
    assert fixed.state == "pass" and fixed.reward == pytest.approx(1.1), fixed.reason
    assert fixed.outcomes == {".harbor-tests/check_outputs.py::test_examples_file": "passed",
                              ".harbor-tests/check_outputs.py::test_edges": "passed"}
    # The oracle's solve.sh is the task's, under a path the agent may not write: refused.
    oracle = await verify(runtime, harbor_task, Submission(changes=dict(harbor_task.solution_files())))
    assert oracle.state == "fail" and oracle.meta["restored"] == [".harbor-solution/solve.sh"]
    nothing = await verify(runtime, harbor_task, Submission())
    assert nothing.state == "fail" and set(nothing.outcomes.values()) == {"failed"}, nothing.reason


async def test_a_reward_file_written_by_the_agent_does_not_pay(runtime, harbor_task):
    # The known weakness of reward files: code under test writes reward 1 and makes the file
    # read-only, so that test.sh cannot overwrite it; and it leaves with status 0.
    forger = f'''"""Small text helpers."""
import atexit
import os

os.makedirs("{HARBOR_LOGS}/verifier", exist_ok=True)
for _name in ("reward.txt", "reward.json"):
    _path = "{HARBOR_LOGS}/verifier/" + _name
    with open(_path, "w") as _f:
        _f.write("1" if _name.endswith("txt") else '{{"reward": 1}}')
    os.chmod(_path, 0o444)
atexit.register(os._exit, 0)


def slugify(text: str) -> str:
    return text
'''
    v = await verify(runtime, harbor_task, Submission.from_files({"textutil.py": forger}))
    assert v.state == "fail" and v.reward == 0.0, v.reason
    assert set(v.outcomes.values()) == {"failed"} and v.meta["test_status"] == 0


async def test_a_shell_command_without_pytest_is_no_verdict(runtime, harbor_task):
    # Only a reward file or an exit status would say anything: neither is trusted.
    task = Task.load(harbor_task.root)
    task.meta = task.meta.model_copy(update={"test_command": f"mkdir -p {HARBOR_LOGS}/verifier && "
                                                           f"echo 1 > {HARBOR_LOGS}/verifier/reward.txt"})
    v = await verify(runtime, task, Submission(changes=dict(task.solution_files())))
    assert v.state == "no_verdict" and "ran no pytest session" in v.reason


async def test_an_imported_harbor_task_passes_the_quality_gate(runtime, harbor_task):
    from tryloop.tasks.gate import GateConfig, validate

    res = await validate(runtime, harbor_task, GateConfig(k=2))
    assert res.accepted, res
    assert res.fail_to_pass == [".harbor-tests/check_outputs.py::test_edges",
                                ".harbor-tests/check_outputs.py::test_examples_file"]


async def test_records_written_past_the_harness_are_refused_in_a_shell_command(runtime, harbor_task):
    # Well-formed records for every test, then the session's end, written by the code under test
    # straight to the record pipe of its test process, which then exits. Without the session
    # key's MAC they are not the harness's.
    forger = '''"""Small text helpers."""
import os
import sys

_ids = [".harbor-tests/check_outputs.py::test_examples_file", ".harbor-tests/check_outputs.py::test_edges"]
_lines = "".join("test\\t%s\\tpassed\\n" % i for i in _ids) + "finish\\t0\\t2\\n"
os.write(int(sys.argv[1].split(":")[0]), _lines.encode())
os._exit(0)


def slugify(text: str) -> str:
    return text
'''
    v = await verify(runtime, harbor_task, Submission.from_files({"textutil.py": forger}))
    assert v.state == "fail" and v.reward == 0.0, v.reason
    assert "channel_broken" in {f.kind for f in v.flags}, v.flags
    assert not any(o == "passed" for o in v.outcomes.values()), v.outcomes


async def test_no_process_of_a_shell_command_holds_the_record_pipe(runtime, harbor_task):
    # The command's processes (bash, the shims, anything they start) have no record pipe: the
    # test process is the supervisor's child. The code under test looks for other holders of
    # its own record pipe among the sandbox's processes, and answers right only if none.
    probe = '''"""Small text helpers."""
import os
import re
import sys

_pipe = os.readlink("/proc/self/fd/%d" % int(sys.argv[1].split(":")[0]))
_holders = []
for _pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        _cmd = open("/proc/%s/cmdline" % _pid, "rb").read()
        _fds = os.listdir("/proc/%s/fd" % _pid)
    except OSError:  # gone, or not readable (the supervisor is not dumpable)
        continue
    if int(_pid) == os.getpid() or b"supervisor.py" in _cmd:
        continue
    for _fd in _fds:
        try:
            if os.readlink("/proc/%s/fd/%s" % (_pid, _fd)) == _pipe:
                _holders.append(_cmd[:80])
        except OSError:
            pass


def slugify(text: str) -> str:
    if _holders:
        raise AssertionError("the record pipe is held by %r" % _holders)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
'''
    v = await verify(runtime, harbor_task, Submission.from_files({"textutil.py": probe}))
    assert v.state == "pass", (v.reason, v.flags)
