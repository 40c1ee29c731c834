"""The quality gate of answer-graded tasks (data, documents).

No hidden tests run here; the gate checks what the verifier will rely on, K
times, and decides with the code gate's own rules (`gate.judge`: outcomes that
differ between runs are flaky, the do-nothing state must fail something) plus
one of its own: the reference must pass every sub-step and field:

1. the check (`tests/check.json`) loads (`check_missing`, `check_invalid`);
2. each round, in a fresh sandbox from the task's workspace snapshot, every data
   file opens with the sandbox's own python3 (csv, json lines, sqlite3) — the
   data the agent gets is readable (`data_unreadable`) — then the reference
   answer is written there and read back as the episode's diff is, and graded
   against a gold recomputed from the pristine files (the reference passes);
3. the untouched workspace (what a do-nothing attempt submits) is graded: it
   must fail — for an operations task, on the service itself (health, probe or
   backlog), not only for lack of a root cause;
4. constant answers (0, 1, "", [], {}) must fail too (`constant_answer_passes`).
"""

from __future__ import annotations

import json
import time

from tryloop.sandbox import SandboxRuntime
from tryloop.tasks.families.check import (
    DATA_UNREADABLE,
    CheckError,
    DataCheck,
    ServiceCheck,
    load_check,
)
from tryloop.tasks.gate import BROKEN_PASSES, INFRA, REFERENCE_FAILS, GateConfig, GateResult, judge
from tryloop.tasks.model import Task
from tryloop.tasks.testrun import TestRun, sandbox_config_for, task_snapshot

CONSTANT_PASSES = "constant_answer_passes"
CONSTANTS = (0, 1, "", [], {}, None)

# Opens every data file under /workspace the way an analyst's script would (exit 3 names the file).
_PROBE = r"""
import csv, json, os, sqlite3, sys
n = 0
for root, dirs, files in os.walk("/workspace"):
    for f in files:
        p = os.path.join(root, f)
        try:
            if f.endswith(".csv"):
                with open(p, newline="") as fh:
                    n += sum(1 for _ in csv.reader(fh))
            elif f.endswith(".jsonl"):
                with open(p) as fh:
                    n += sum(1 for line in fh if line.strip() and json.loads(line) is not None)
            elif f.endswith((".db", ".sqlite")):
                con = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
                for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
                    n += con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
                con.close()
        except Exception as e:
            print(f"{os.path.relpath(p, '/workspace')}: {type(e).__name__}: {e}")
            sys.exit(3)
print(n)
"""


def _run(outcomes: dict[str, str], wall_s: float, tail: str = "") -> TestRun:
    return TestRun(exit_code=0 if all(o == "passed" for o in outcomes.values()) else 1, outcomes=outcomes,
                   wall_s=wall_s, output_tail=tail, reported=True)


async def validate_answer(runtime: SandboxRuntime, task: Task, cfg: GateConfig | None = None) -> GateResult:
    from tryloop.agent.workspace import workspace_changes
    from tryloop.rewards.answers import data_gold, grade, grade_changes

    cfg = cfg or GateConfig()
    try:
        check = load_check(task)
        pristine = task.workspace_files()
        reference = task.solution_files()
        if check.answer_file not in reference:
            return GateResult(task.id, False, REFERENCE_FAILS, f"solution/workspace/{check.answer_file} is missing")
        snap = task_snapshot(runtime, task, sandbox_config_for(task))
        fixed: list[TestRun] = []
        broken: list[TestRun] = []
        for _ in range(cfg.k):
            t0 = time.perf_counter()
            gold = data_gold(check, pristine) if isinstance(check, DataCheck) else None
            async with await runtime.create(snap, sandbox_config_for(task)) as sb:
                probe = await sb.exec(["python3", "-c", _PROBE], merge_stderr=True, timeout=cfg.time_budget_s)
                if probe.exit_code != 0:
                    return GateResult(task.id, False, DATA_UNREADABLE,
                                      f"in the sandbox: {probe.text().strip()[-300:]}")
                for path, data in reference.items():
                    sb.write_file(path, data)
                changes, _ = await workspace_changes(sb, pristine)
            g = await grade_changes(runtime, task, changes, pristine, gold)
            fixed.append(_run(g.outcomes, time.perf_counter() - t0, g.reason))
            t0 = time.perf_counter()
            g = await grade_changes(runtime, task, {}, pristine, gold)
            broken.append(_run(g.outcomes, time.perf_counter() - t0, g.reason))
        gold = data_gold(check, pristine) if isinstance(check, DataCheck) else None
        # (an operations task needs a healthy service besides its answer: the broken runs cover it)
        for c in () if isinstance(check, ServiceCheck) else CONSTANTS:
            doc = {s.name: c for s in check.steps} if isinstance(check, DataCheck) else c
            if grade(task, {**pristine, check.answer_file: json.dumps(doc).encode()}, pristine, gold).passed:
                return GateResult(task.id, False, CONSTANT_PASSES, f"the constant answer {json.dumps(doc)} passes")
    except CheckError as e:
        return GateResult(task.id, False, e.reason, str(e))
    except Exception as e:  # a sandbox that failed to start is no verdict on the task
        return GateResult(task.id, False, INFRA, f"{type(e).__name__}: {e}")
    # Every sub-step and field decides the verdict, so the reference must pass all of them (the code
    # gate's judge only needs some test to pass, the others being left out of the acceptance set).
    bad = next((r for r in fixed if r.exit_code != 0), None)
    if bad is not None:
        return GateResult(task.id, False, REFERENCE_FAILS, f"the reference answer does not pass: {bad.output_tail}",
                          broken_runs=broken, fixed_runs=fixed)
    if isinstance(check, ServiceCheck) and any(all(o == "passed" for k, o in r.outcomes.items()
                                                   if k != "step:root_cause") for r in broken):
        # Naming a label must not be all it takes: the fault has to break the service itself.
        return GateResult(task.id, False, BROKEN_PASSES, "the planted fault leaves the service healthy and "
                          "converting jobs", broken_runs=broken, fixed_runs=fixed)
    return judge(task.id, broken, fixed, cfg)
