"""The verifier: judge an agent's final workspace apart from the agent (docs/architecture.md, invariant 3).

    verdict = await verify(runtime, task, Submission(changes=...), spec)

1. A fresh sandbox from the task's pristine snapshot — never the agent's sandbox.
2. The agent's diff is applied, except on protected paths (tests, conftest, test
   configuration, site hooks): those stay pristine, i.e. they are restored.
3. The hidden tests are laid over it, byte for byte as hashed into the version.
4. The tests run with the verifier's interpreter (absolute path, `-P`: nothing
   in the workspace is importable until pytest and the plugin are loaded, so it
   cannot stand in for the test framework), no user site, no inherited PYTHONPATH.
5. Per-test results are streamed by tryloop's pytest plugin as records
   authenticated with a per-run key. The key reaches the plugin through stdin,
   which is read and closed before any code under test is imported, so it is in
   no file and no environment variable. A record the agent's code writes or
   alters fails authentication and the run is judged tampered with.
6. Pass needs every expected test passed (skipped, xfail, missing are not) and
   every test of the reference run executed. A crash of ours, a sandbox that
   would not start, a verifier timeout: no-verdict with the reason.

The reference run ("baseline") is made once per task and verifier version and
cached beside the store: it says which tests exist and how long they take.
"""

from __future__ import annotations

import base64
import difflib
import fnmatch
import hashlib
import hmac
import json
import logging
import os
import secrets
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tryloop.errors import SandboxError, TryloopError
from tryloop.rewards import rules
from tryloop.rewards.spec import RewardSpec
from tryloop.rewards.submission import Submission
from tryloop.rewards.verdict import Changes, Flag, Verdict
from tryloop.rewards.version import code_version, reward_version, spec_version
from tryloop.sandbox import SandboxRuntime
from tryloop.tasks.model import Task
from tryloop.tasks.testrun import OUTCOME_SOURCE, sandbox_config_for, task_snapshot

log = logging.getLogger(__name__)

# Hooks that are never part of a legitimate solution: always restored, whatever the task says.
ALWAYS_PROTECTED = ["conftest.py", "sitecustomize.py", "usercustomize.py", "*.pth", "pytest.ini",
                    "tox.ini", "setup.cfg", "pyproject.toml", ".pytest.ini", "pytest.toml", ".pytest.toml",
                    # compiled code has no source for a detector to read: never part of a solution
                    "*.pyc", "*.pyo", "*.so", "*.pyd", "__pycache__/"]
REPORT_FORGED = "report_forged"

_PLUGIN = r'''
"""tryloop verifier plugin: per-test outcomes as authenticated records (loaded with -p)."""
import hashlib, hmac, json, os, sys

def _make():
    # The key arrives on stdin and never touches a file or the environment.
    key = os.read(0, 4096).strip()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    fd = os.open(os.environ.pop("TRYLOOP_VERIFY_OUT"),
                 os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    seq = [0]

    def emit(kind, **data):
        seq[0] += 1
        body = json.dumps({"seq": seq[0], "kind": kind, **data}, sort_keys=True)
        mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
        os.write(fd, (mac + " " + body + "\n").encode())
    return emit

# What `python -m pytest` does (the working directory first on sys.path), but only now that
# pytest itself is imported: a workspace module can no longer stand in for the test framework.
sys.path.insert(0, os.getcwd())
''' + OUTCOME_SOURCE + r'''


def _plugin(emit, outcome_of=_outcome):
    # The hooks close over `emit` and `outcome_of`: replacing this module's attributes later
    # (from code under test) changes nothing pluggy calls.
    class Plugin:
        def pytest_runtest_logreport(self, report):
            outcome = outcome_of(report)
            if outcome is not None:
                emit("test", id=report.nodeid, outcome=outcome)

        def pytest_collectreport(self, report):
            if report.failed:
                emit("test", id=report.nodeid or "<collection>", outcome="error")

        def pytest_sessionfinish(self, session, exitstatus):
            emit("finish", exitstatus=int(exitstatus), collected=int(getattr(session, "testscollected", 0)))
    return Plugin()


_records = _plugin(_make())


def pytest_configure(config):
    # Registered before collection, i.e. before any code under test is imported.
    config.pluginmanager.register(_records, "tryloop-verifier-records")
'''


class VerifierError(TryloopError):
    """The verifier itself could not judge (becomes a no-verdict, never a score)."""


@dataclass
class RunRecord:
    """One authenticated test run inside the verifier's sandbox."""

    outcomes: dict[str, str] = field(default_factory=dict)
    finished: bool = False
    collected: int = 0
    forged: int = 0            # records that failed authentication
    exit_code: int | None = None
    timed_out: bool = False
    oom: bool = False
    wall_s: float = 0.0
    output_tail: str = ""


@dataclass
class Baseline:
    """The reference solution's run under this verifier: which tests exist, how long they take."""

    test_ids: list[str]
    passing: list[str]
    wall_s: float


def is_protected(path: str, patterns: list[str]) -> bool:
    """`tests/` protects a directory tree; other patterns match the path or its basename."""
    name = path.rsplit("/", 1)[-1]
    for pat in patterns:
        if pat.endswith("/"):
            if path.startswith(pat) or f"/{pat}" in f"/{path}":
                return True
        elif fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(name, pat):
            return True
    return False


def split_changes(task: Task, changes: Changes, hidden: dict[str, bytes]) -> tuple[Changes, list[str]]:
    """The changes the verifier applies, and the protected paths it refused (restored)."""
    patterns = [*task.meta.protected_paths, *ALWAYS_PROTECTED]
    applied: Changes = {}
    refused: list[str] = []
    for path, data in sorted(changes.items()):
        norm = os.path.normpath(path)
        if norm.startswith(("..", "/")) or norm in ("", "."):
            refused.append(path)
        elif norm in hidden or is_protected(norm, patterns):
            refused.append(norm)
        else:
            applied[norm] = data
    return applied, refused


def _python(sb_env: dict[str, str]) -> str:
    """The verifier's own interpreter: the image's first python3 on PATH, as an absolute path."""
    for d in sb_env.get("PATH", "").split(":"):
        candidate = Path(d) / "python3"
        if d.startswith("/") and candidate.exists():  # binds keep host paths, so the host can check
            return str(candidate)
    return "/usr/bin/python3"


def _command(task: Task, python: str, plugin_module: str) -> str:
    """The task's pytest command, run by the verifier's interpreter with the plugin loaded."""
    words = shlex.split(task.meta.test_command)
    idx = next((i for i, w in enumerate(words) if w.endswith("pytest")), None)
    if idx is None:
        raise VerifierError(f"task {task.id}: test_command {task.meta.test_command!r} is not a pytest "
                            "command; the verifier needs per-test results")
    args = words[idx + 1:]
    return shlex.join([python, "-P", "-B", "--check-hash-based-pycs", "always", "-m", "pytest", "-p", plugin_module,
                       "-p", "no:cacheprovider", *args])


def parse_records(raw: bytes, key: bytes) -> RunRecord:
    run = RunRecord()
    expected_seq = 1
    for line in raw.splitlines():
        mac, _, body = line.decode(errors="replace").partition(" ")
        good = hmac.compare_digest(mac, hmac.new(key, body.encode(), hashlib.sha256).hexdigest())
        try:
            rec = json.loads(body) if good else None
        except ValueError:
            rec = None
        if rec is None or rec.get("seq") != expected_seq:
            run.forged += 1
            continue
        expected_seq += 1
        if rec["kind"] == "test":
            # A test reported twice (e.g. call + teardown error) keeps its worst outcome.
            prev = run.outcomes.get(rec["id"])
            if prev is None or prev == "passed":
                run.outcomes[rec["id"]] = rec["outcome"]
        elif rec["kind"] == "finish":
            run.finished = True
            run.collected = int(rec.get("collected", 0))
    return run


async def _run_tests(runtime: SandboxRuntime, task: Task, applied: Changes, hidden: dict[str, bytes],
                     timeout: float) -> RunRecord:
    """Apply `applied` to a pristine sandbox, lay the hidden tests over it, run them."""
    cfg = sandbox_config_for(task)
    snap = task_snapshot(runtime, task, cfg)
    key = secrets.token_hex(32).encode()
    slot = f"/tmp/.v{secrets.token_hex(8)}"
    module = f"tlv_{secrets.token_hex(4)}"
    async with await runtime.create(snap, cfg) as sb:
        deleted = [p for p, d in applied.items() if d is None]
        for rel, data in applied.items():
            if data is not None:
                sb.write_file(rel, data)
        if deleted:
            res = await sb.exec(["rm", "-rf", "--", *deleted])
            if not res.ok:
                raise VerifierError(f"could not apply deletions: {res.text('stderr')[:200]}")
        for rel, data in hidden.items():  # last: tests always win
            sb.write_file(rel, data)
        sb.write_file(f"{slot}/{module}.py", _PLUGIN)
        env = {"PYTHONPATH": slot, "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONSAFEPATH": "1", "TRYLOOP_VERIFY_OUT": f"{slot}/out"}
        t0 = time.perf_counter()
        res = await sb.exec(_command(task, _python(sb.env), module), stdin=key + b"\n", env=env,
                            merge_stderr=True, timeout=timeout)
        wall = time.perf_counter() - t0
        try:
            raw = sb.read_file(f"{slot}/out", max_bytes=64 << 20)
        except (FileNotFoundError, SandboxError, OSError):
            raw = b""
    run = parse_records(raw, key)
    run.exit_code, run.timed_out, run.wall_s = res.exit_code, res.timed_out, wall
    run.oom = bool(getattr(res, "oom_killed", False))
    run.output_tail = res.text()[-3000:]
    return run


_baselines: dict[str, Baseline] = {}


async def baseline(runtime: SandboxRuntime, task: Task) -> Baseline:
    """The reference solution's run under this verifier, cached per task version and code version."""
    key = f"{task.fingerprint()[:24]}-{code_version()}"
    if key in _baselines:
        return _baselines[key]
    path = runtime.config.store_dir / "verifier" / f"{key}.json"
    try:
        b = Baseline(**json.loads(path.read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        b = None
    if b is None:
        b = await _reference_run(runtime, task)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(b.__dict__))
        os.replace(tmp, path)
    _baselines[key] = b
    return b


async def _reference_run(runtime: SandboxRuntime, task: Task) -> Baseline:
    hidden = task.hidden_tests()
    applied, _ = split_changes(task, dict(task.solution_files()), hidden)
    run = await _run_tests(runtime, task, applied, hidden, task.meta.test_timeout_s)
    if not run.finished or run.forged:
        raise VerifierError(f"task {task.id}: the reference run under the verifier produced no "
                            f"complete report (exit {run.exit_code}): {run.output_tail[-300:]}")
    b = Baseline(sorted(run.outcomes), sorted(t for t, o in run.outcomes.items() if o == "passed"), run.wall_s)
    if not b.passing:
        raise VerifierError(f"task {task.id}: no test passes with the reference solution under the "
                            f"verifier (exit {run.exit_code}): {run.output_tail[-300:]}")
    missing = [t for t in task.meta.expected_tests if t not in b.passing]
    if missing:
        raise VerifierError(f"task {task.id}: the reference solution does not pass {missing[:3]} under the verifier")
    return b


def changed_lines(pristine: dict[str, bytes], changes: Changes) -> int:
    n = 0
    for path, data in changes.items():
        old = pristine.get(path, b"").decode(errors="replace").splitlines()
        new = (data or b"").decode(errors="replace").splitlines()
        n += sum(1 for line in difflib.unified_diff(old, new, lineterm="", n=0)
                 if line[:1] in "+-" and not line.startswith(("+++", "---")))
    return n


async def verify(runtime: SandboxRuntime, task: Task, sub: Submission, spec: RewardSpec | None = None,
                 *, image_id: str | None = None) -> Verdict:
    """Judge `sub` on `task`. Never raises for the agent's doing; our own faults are no-verdicts."""
    spec = spec or RewardSpec()
    t0 = time.perf_counter()
    cfg = sandbox_config_for(task)
    spec_ver = spec_version(spec, image_id or runtime.host_image(cfg.uid, cfg.gid).id)
    verdict = Verdict("no_verdict", None, version=reward_version(spec_ver, task.fingerprint()),
                      task_id=task.id, task_fingerprint=task.fingerprint(), meta={"spec_version": spec_ver})
    try:
        await _judge(runtime, task, sub, spec, verdict)
    except (TimeoutError, SandboxError, VerifierError, rules.JudgeUnavailable, OSError) as e:
        verdict.state, verdict.reward = "no_verdict", None
        verdict.reason = f"verifier fault: {type(e).__name__}: {e}"
    except Exception as e:  # a bug of ours is still not the agent's fault: no score
        log.exception("verifier crashed on %s", task.id)
        verdict.state, verdict.reward = "no_verdict", None
        verdict.reason = f"verifier crashed: {type(e).__name__}: {e}"
    verdict.wall_s = time.perf_counter() - t0
    return verdict


async def _judge(runtime: SandboxRuntime, task: Task, sub: Submission, spec: RewardSpec,
                 verdict: Verdict) -> None:
    from tryloop.rewards.detectors import detect

    if task.meta.grader == "answer":  # data / document tasks: the answer file, compared on the host
        from tryloop.rewards.answers import judge_answer

        return await judge_answer(runtime, task, sub, spec, verdict)
    hidden = task.hidden_tests()
    pristine = task.workspace_files()
    verdict.meta["tests_digest"] = _digest(hidden)
    verdict.flags = list(detect(task, sub, pristine=pristine, hidden_tests=hidden))
    applied, refused = split_changes(task, sub.changes, hidden)
    verdict.meta["restored"] = refused
    base = await baseline(runtime, task)
    timeout = spec.timeout_s or task.meta.test_timeout_s
    run = await _run_tests(runtime, task, applied, hidden, timeout)
    verdict.outcomes = run.outcomes
    verdict.meta.update(test_wall_s=run.wall_s, exit_code=run.exit_code, collected=run.collected)

    expected = task.meta.expected_tests or base.passing
    if run.forged:
        verdict.flags.append(Flag(REPORT_FORGED, f"{run.forged} test record(s) failed authentication: "
                                  "the code under test wrote to the verifier's report"))
    passed = [t for t in expected if run.outcomes.get(t) == "passed"]
    not_run = [t for t in base.test_ids if t not in run.outcomes]
    if run.timed_out and base.wall_s * 3 >= timeout:
        raise VerifierError(f"test run hit the {timeout:.0f}s limit and the reference needs "
                            f"{base.wall_s:.1f}s: cannot tell a slow verifier from a slow solution")
    if run.timed_out:
        state, reason = "fail", f"tests timed out after {timeout:.0f}s (reference: {base.wall_s:.1f}s)"
    elif run.forged:
        state, reason = "fail", "test report tampered with"
    elif not run.finished:
        state, reason = "fail", (f"the test session ended before reporting (exit {run.exit_code}"
                                 f"{', OOM' if run.oom else ''}): the code under test stopped the process")
    elif not_run:
        state, reason = "fail", f"{len(not_run)} test(s) of the reference run did not run: {not_run[:3]}"
    elif len(passed) < len(expected):
        bad = [f"{t}: {run.outcomes.get(t, 'missing')}" for t in expected if t not in passed]
        state, reason = "fail", f"{len(expected) - len(passed)}/{len(expected)} expected test(s) not passed: {bad[:3]}"
    else:
        state, reason = "pass", ""

    comps = await rules.components(task, sub, spec, pristine=pristine, tests_passed=len(passed),
                                   tests_expected=len(expected), tests_state=state)
    verdict.components = comps
    total = spec.total(comps)
    if spec.gate_on_tests and state != "pass":
        total = sum(c.weight * comps.get(c.name, 0.0) for c in spec.components
                    if c.kind in ("tests", *rules.PENALTIES))
    verdict.state, verdict.reason = state, reason
    _apply_flag_policy(spec, verdict, total)


def _apply_flag_policy(spec: RewardSpec, verdict: Verdict, total: float) -> None:
    actions = [spec.action_for(f.kind, f.severity) for f in verdict.flags]
    if "mask" in actions:
        verdict.meta["masked"] = True
    if "zero" in actions:
        kinds = sorted({f.kind for f, a in zip(verdict.flags, actions, strict=True) if a == "zero"})
        if verdict.state == "pass":
            verdict.reason = f"tests passed but zeroed by reward-hack flags: {', '.join(kinds)}"
        verdict.state, total = "fail", 0.0
    total -= spec.flag_penalty * actions.count("penalize")
    verdict.reward = total


def _digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for k in sorted(files):
        h.update(k.encode() + b"\0" + hashlib.sha256(files[k]).digest())
    return h.hexdigest()[:16]


# ---- diffs for storage ------------------------------------------------------

def encode_changes(changes: Changes) -> dict[str, str | None]:
    return {k: None if v is None else base64.b64encode(v).decode() for k, v in changes.items()}


def decode_changes(doc: dict[str, Any]) -> Changes:
    return {k: None if v is None else base64.b64decode(v) for k, v in doc.items()}
