"""The task factory: candidates from projects and collections, through the gate, into the store.

Every candidate goes through `gate.validate` in fresh sandboxes; what passes is
stamped with its acceptance tests, a static difficulty and its provenance, and
stored; what fails is logged with the reason. The default suite is rebuilt by
`build_default` from sources that ship with tryloop, with fixed seeds.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tryloop.assets import ASSETS
from tryloop.sandbox import SandboxRuntime
from tryloop.tasks.difficulty import static_difficulty
from tryloop.tasks.gate import GateConfig, GateReport, GateResult, validate
from tryloop.tasks.model import SubStep, SubSteps, Task, TaskError, TaskMeta
from tryloop.tasks.project import Project
from tryloop.tasks.splits import assign_split, eval_share
from tryloop.tasks.store import Entry, TaskStore

PROJECTS_DIR = ASSETS / "projects"
LEAKS_FIX = "instruction_leaks_fix"
ANSWER_IN_WORKSPACE = "answer_in_workspace"
DUPLICATE = "duplicate"

Progress = Callable[[str, GateResult | None], None]

# What a bug-fix task declaring the repro sub-step adds to its instruction.
REPRO_NOTE = ("\n\nFirst add a test that reproduces the bug: a new test file outside `tests/` (for example "
              "`test_repro.py` at the top of the workspace; the tests under `tests/` stay as they are) whose "
              "test fails now and passes once the bug is fixed. Then fix the bug.\n")


def code_substeps(repro_weight: float = 1.0, fix_weight: float = 3.0, track: bool = True) -> SubSteps:
    """The bug-fix sub-steps: "a test that reproduces the bug", then "the fix passes"."""
    return SubSteps(track=track, steps=[SubStep(name="repro", check="repro", weight=repro_weight),
                                        SubStep(name="fix", check="tests", weight=fix_weight)])


def repro_instruction(text: str, substeps: SubSteps | None) -> str:
    """The instruction, with the repro note when the task declares a repro sub-step."""
    if substeps is None or not any(s.check == "repro" for s in substeps.steps):
        return text
    return text.rstrip("\n") + REPRO_NOTE


@dataclass
class BuildOptions:
    per_project: int = 8           # mutation tasks kept per bundled project
    data_per_family: int = 3       # data-analysis variants per question template (24 templates)
    docs_per_family: int = 5       # structured-document variants per (kind, tier) family (12 families)
    ops_per_family: int = 4        # broken-service variants per fault plan (14 plans)
    variants_per_project: int = 1  # renamed-identifier variants of the first kept tasks
    humaneval: int | None = None   # HumanEval problems (None: all 164)
    multifile: bool = True
    seed: int = 0
    eval_fraction: float = 0.25
    # Overrides per source of independent problems (split by family). Tasks split by project keep
    # eval_fraction: a project's mutation and multi-file tasks must land on one side.
    eval_fraction_by_source: dict[str, float] = field(default_factory=dict)
    gate: GateConfig = field(default_factory=GateConfig)

    def fraction(self, source: str) -> float:
        return eval_share(source, self.eval_fraction, self.eval_fraction_by_source)


def bundled_projects(root: Path = PROJECTS_DIR) -> list[Project]:
    out = []
    for toml_path in sorted(root.glob("*/project.toml")):
        doc = tomllib.loads(toml_path.read_text())["project"]
        out.append(Project(name=doc["name"], root=toml_path.parent, source="bundled",
                           test_command=doc.get("test_command", "python3 -m pytest -q"),
                           test_paths=list(doc.get("test_paths", ["tests"])),
                           origin={"bundled": doc["name"], "tier": doc.get("tier")}))
    return out


def answer_traces(task: Task) -> list[str]:
    """What in the workspace would give the answer away (empty when clean): hidden test
    files, the reference solution's files, or git history beyond one orphan commit."""
    ws = task.workspace_files()
    found = [f"hidden test {p} is in the workspace" for p, data in task.hidden_tests().items() if ws.get(p) == data]
    solution = task.solution_files()
    if solution and all(ws.get(p) == data for p, data in solution.items()):
        found.append("the workspace already equals the reference solution")
    if task.meta.grader == "answer":
        # An answer is small: a copy anywhere (a planted cache) or the hidden check itself gives it away.
        # (Other reference files may rightly equal a workspace file: a fix that restores a backup.)
        check = task.check_path.read_bytes() if task.check_path.is_file() else None
        try:
            answer_file = json.loads(check or b"{}").get("answer_file", "answer.json")
        except ValueError:
            answer_file = "answer.json"
        answer = solution.get(answer_file)
        found += [f"{p} is a copy of the reference answer {answer_file}" for p, data in ws.items()
                  if answer is not None and data == answer]
        found += [f"{p} holds the hidden answer check" for p, data in ws.items() if check and check in data]
    if (task.workspace_dir / ".git").exists():
        from tryloop.tasks.sources.local import HistoryLeak, assert_clean_history

        try:
            assert_clean_history(task.workspace_dir)
        except HistoryLeak as e:
            found.append(f"git history: {e}")
    return found


async def admit(runtime: SandboxRuntime, store: TaskStore, task: Task, report: GateReport, group: str,
                gate: GateConfig, *, finalize: Callable[[Task, GateResult], Task | str] | None = None,
                eval_fraction: float | None = None, seed: int = 0) -> Entry | None:
    """Gate one candidate; store it (with acceptance tests, difficulty, split) or log the rejection.

    `finalize` may rewrite the task once the runs are known (e.g. write the bug
    report from the observed failure) or return a rejection reason.
    """
    trace = answer_traces(task)
    if trace:
        report.reject(group, ANSWER_IN_WORKSPACE)
        store.record_rejection(task.id, task.meta.source, group, ANSWER_IN_WORKSPACE, "; ".join(trace))
        return None
    result = await validate(runtime, task, gate)
    if not result.accepted:
        report.add(group, result)
        store.record_rejection(task.id, task.meta.source, group, result.reason or "unknown", result.detail)
        return None
    task.save_meta(task.with_meta(fail_to_pass=result.fail_to_pass, pass_to_pass=result.pass_to_pass))
    if finalize is not None:
        out = finalize(task, result)
        if isinstance(out, str):
            result.accepted, result.reason = False, out
            report.add(group, result)
            store.record_rejection(task.id, task.meta.source, group, out)
            return None
        task = out
    score, tier = static_difficulty(task)
    changes: dict[str, Any] = {"difficulty": score, "tier": task.meta.tier or tier}
    if eval_fraction is not None and task.meta.split is None:
        changes["split"] = assign_split(task.meta.model_copy(update=changes), eval_fraction, seed)
    task.save_meta(task.with_meta(**changes))
    if store.has(task.fingerprint()):  # exact duplicate of a stored task
        report.reject(group, DUPLICATE)
        return None
    report.add(group, result)
    return store.add(task, {"k": gate.k, "max_test_s": round(result.max_test_s, 3), "flaky": result.flaky})


class ProjectTestsFail(TaskError):
    """The project's own tests, unmutated, do not pass in a task's sandbox: no bug planted in it
    could pass the gate (its reference would fail), so nothing is tried."""


def _error_lines(output: str, limit: int = 3) -> list[str]:
    """The distinct `...Error: ...` lines of a test run's output (the first `limit`)."""
    import re

    seen: list[str] = []
    for line in output.splitlines():
        m = re.search(r"\b([A-Za-z_.]*(?:Error|Exception): .+)$", line)
        if m and m.group(1).strip() not in seen:
            seen.append(m.group(1).strip())
    return seen[:limit]


async def check_project(runtime: SandboxRuntime, project: Project, work_dir: Path, *,
                        image: str | None = None):
    """Run the project's tests once, unmutated, in a sandbox as its tasks' would be (on `image`,
    else the host-derived root) and return the TestRun; raise ProjectTestsFail naming what failed
    (its errors, such as a missing compiled extension) when no test passes."""
    from tryloop.tasks.testrun import run_tests

    ws, tests = project.split_files()
    meta = TaskMeta(id=f"{project.name}/baseline", family=f"{project.name}-baseline", project=project.name,
                    source="mutation", test_command=project.test_command, image=image)
    task = Task.create(work_dir / "baseline" / project.name, meta, "(the project's own tests)", workspace=ws,
                       tests=tests, solution={})
    run = await run_tests(runtime, task, with_solution=False)
    bad = sorted(t for t, o in run.outcomes.items() if o in ("failed", "error"))
    if run.reported and run.passing and not run.timed_out:
        return run
    where = f"image {image[:12]}" if image else "the host-derived root"
    what = ("timed out" if run.timed_out else
            f"{len(run.passing)} passed, {len(bad)} failed or errored" if run.reported else
            f"no per-test report (exit {run.exit_code})")
    errors = _error_lines(run.output_tail)
    raise ProjectTestsFail(f"{project.name}: its own tests do not pass in a sandbox on {where} ({what})"
                           + (": " + "; ".join(errors) if errors else "")
                           + (f"; first failing: {', '.join(bad[:3])}" if bad else ""))


async def synthesize(runtime: SandboxRuntime, store: TaskStore, project: Project, work_dir: Path, *,
                     keep: int, seed: int = 0, operators: Iterable[str] | None = None,
                     gate: GateConfig | None = None, report: GateReport | None = None,
                     max_candidates: int | None = None, eval_fraction: float | None = None,
                     progress: Progress | None = None, substeps: SubSteps | None = None,
                     image: str | None = None) -> list[Entry]:
    """Plant bugs in `project` with AST mutations until `keep` tasks pass the gate. `substeps`: the
    tasks declare them (e.g. `code_substeps()`: a repro test, then the fix). `image`: the id of the
    environment image the tasks run on (`meta.image`: the gate's, the agent's and the verifier's
    sandboxes; part of each task's fingerprint); None: the host-derived root."""
    from tryloop.tasks.mutate import candidates
    from tryloop.tasks.report import bug_report, leaks_fix

    gate = gate or GateConfig(require_pass_to_pass=True)
    report = report if report is not None else GateReport()
    ws, tests = project.split_files()
    muts = candidates(project.source_files(), operators=list(operators) if operators else None, seed=seed)
    kept: list[Entry] = []
    for n, m in enumerate(muts):
        if len(kept) >= keep or (max_candidates is not None and n >= max_candidates):
            break
        files = m.apply(ws)  # every file of a combined (multi-file) mutation
        meta = TaskMeta(id=f"{project.name}/{m.operator.replace(':', '-').replace('+', '-')}-{m.id}",
                        family=f"{project.name}-{m.id}", project=project.name, source="mutation",
                        test_command=project.test_command, tags=["mutation", m.operator.split(":")[0]],
                        origin={"operator": m.operator, "path": m.path, "line": m.lineno, "summary": m.summary,
                                "project": project.origin}, substeps=substeps, image=image)
        cand = Task.create(work_dir / meta.id, meta, "(bug report written after the gate)", workspace=files,
                           tests=tests, solution=m.solution())

        def finalize(task: Task, result: GateResult, m=m) -> Task | str:
            text = bug_report(project.name, result.broken_runs[0], result.fixed_runs[0], seed=seed)
            if leaks_fix(text, m):
                return LEAKS_FIX
            (task.root / "instruction.md").write_text(repro_instruction(text, substeps))
            return Task.load(task.root)

        entry = await admit(runtime, store, cand, report, f"mutation:{m.operator.split(':')[0]}", gate,
                            finalize=finalize, eval_fraction=eval_fraction, seed=seed)
        if entry:
            kept.append(entry)
        if progress:
            progress(meta.id, None)
    return kept


async def add_variant(runtime: SandboxRuntime, store: TaskStore, fingerprint: str, kind: str, seed: int,
                      work_dir: Path, gate: GateConfig, report: GateReport) -> Entry | None:
    """A variant of a stored task (same family and split as its origin), gated and stored."""
    from tryloop.tasks.variants import VariantError, make_variant

    origin = store.get(fingerprint)
    try:
        variant = make_variant(origin, work_dir / f"{origin.id}-{kind}{seed}", kind, seed)
    except VariantError as e:
        report.reject(f"variant:{kind}", "variant_changes_nothing")
        store.record_rejection(origin.id, "variant", f"variant:{kind}", "variant_changes_nothing", str(e))
        return None
    return await admit(runtime, store, variant, report, f"variant:{kind}", gate)


def multifile_bugs(root: Path = PROJECTS_DIR) -> list[dict[str, Any]]:
    path = root / "MULTIFILE_BUGS.toml"
    if not path.exists():
        return []
    doc = tomllib.loads(path.read_text())
    return list(doc.get("bug", doc.get("bugs", [])))


def multifile_task(project: Project, bug: dict[str, Any], work_dir: Path, substeps: SubSteps | None = None) -> Task:
    ws, tests = project.split_files()
    files, solution = dict(ws), {}
    for edit in bug["edits"]:
        text = files[edit["path"]].decode()
        if text.count(edit["find"]) != 1:
            raise ValueError(f"multi-file bug {bug['id']}: {edit['find']!r} not found exactly once in {edit['path']}")
        solution.setdefault(edit["path"], ws[edit["path"]])
        files[edit["path"]] = text.replace(edit["find"], edit["replace"]).encode()
    meta = TaskMeta(id=f"{project.name}/{bug['id']}", family=f"{project.name}-{bug['id']}", project=project.name,
                    source="bundled", test_command=project.test_command, tags=["multi-file", "handwritten"],
                    tier="hard", origin={"bug": bug["id"], "project": project.origin}, substeps=substeps)
    return Task.create(work_dir / meta.id, meta, repro_instruction(bug["report"], substeps), workspace=files,
                       tests=tests, solution=solution)


async def build_default(runtime: SandboxRuntime, store: TaskStore, work_dir: Path, opts: BuildOptions | None = None,
                        progress: Progress | None = None) -> GateReport:
    """The bundled suite: HumanEval functions, mutation bugs in the bundled projects, data-analysis,
    structured-document and operations tasks, hand-written multi-file bugs — all gated, split by project/family."""
    from tryloop.tasks.sources.humaneval import humaneval_tasks

    opts = opts or BuildOptions()
    report = GateReport()
    projects = {p.name: p for p in bundled_projects()}
    he = humaneval_tasks(work_dir / "humaneval", limit=opts.humaneval)
    for task in he:
        await admit(runtime, store, task, report, "humaneval", opts.gate, eval_fraction=opts.fraction("humaneval"),
                    seed=opts.seed)
        if progress:
            progress(task.id, None)
    mut_gate = GateConfig(k=opts.gate.k, time_budget_s=opts.gate.time_budget_s, require_pass_to_pass=True)
    for project in projects.values():
        kept = await synthesize(runtime, store, project, work_dir / "mutations", keep=opts.per_project,
                                seed=opts.seed, gate=mut_gate, report=report, eval_fraction=opts.eval_fraction,
                                progress=progress)
        for entry in kept[: opts.variants_per_project]:
            await add_variant(runtime, store, entry.fingerprint, "rename", opts.seed, work_dir / "variants",
                              mut_gate, report)
    for family, per in (("data", opts.data_per_family), ("docs", opts.docs_per_family),
                        ("ops", opts.ops_per_family)):
        if per:
            sub = await build_family(runtime, store, work_dir, family, gate=opts.gate, per_family=per,
                                     eval_fraction=opts.fraction(family), seed=opts.seed, progress=progress)
            report.merge(sub)
    if opts.multifile:
        for bug in multifile_bugs():
            task = multifile_task(projects[bug["project"]], bug, work_dir / "multifile")
            await admit(runtime, store, task, report, "multi-file", mut_gate, eval_fraction=opts.eval_fraction,
                        seed=opts.seed)
            if progress:
                progress(task.id, None)
    return report


async def _admit_all(runtime: SandboxRuntime, store: TaskStore, tasks: list[Task], group: Callable[[Task], str],
                     *, gate: GateConfig, eval_fraction: float, seed: int, concurrency: int,
                     progress: Progress | None, skip: Collection[str] = ()) -> GateReport:
    """Gate independent candidates `concurrency` at a time (each in its own sandboxes), all but
    those whose id is in `skip` (decided by an earlier, interrupted build)."""
    import asyncio

    tasks = [t for t in tasks if t.id not in skip]
    report = GateReport()
    sem = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> None:
        async with sem:
            await admit(runtime, store, task, report, group(task), gate, eval_fraction=eval_fraction, seed=seed)
        if progress:
            progress(task.id, None)

    await asyncio.gather(*(one(t) for t in tasks))
    return report


async def build_humaneval(runtime: SandboxRuntime, store: TaskStore, work_dir: Path, *, gate: GateConfig,
                          eval_fraction: float, seed: int = 0, limit: int | None = None, concurrency: int = 2,
                          progress: Progress | None = None, skip: Collection[str] = ()) -> GateReport:
    """The HumanEval part of the bundled suite alone (the default check set of `tryloop train`), gated
    (all but the ids in `skip`)."""
    from tryloop.tasks.sources.humaneval import humaneval_tasks

    return await _admit_all(runtime, store, humaneval_tasks(work_dir / "humaneval", limit=limit),
                            lambda t: "humaneval", gate=gate, eval_fraction=eval_fraction, seed=seed,
                            concurrency=concurrency, progress=progress, skip=skip)


async def build_functions(runtime: SandboxRuntime, store: TaskStore, work_dir: Path, *, gate: GateConfig,
                          eval_fraction: float, seed: int = 0, per_family: int | None = None,
                          concurrency: int = 2, families: list[str] | None = None, progress: Progress | None = None,
                          skip: Collection[str] = ()) -> GateReport:
    """The synthesized function tasks (tiers 1-3, split by family; all templates or `families`), gated
    (all but the ids in `skip`)."""
    from tryloop.tasks.sources.functions import PER_FAMILY, function_tasks

    tasks = function_tasks(work_dir / "functions", per_family=per_family or PER_FAMILY, seed=seed, families=families)
    return await _admit_all(runtime, store, tasks, lambda t: f"functions:tier-{t.meta.origin['tier']}",
                            gate=gate, eval_fraction=eval_fraction, seed=seed, concurrency=concurrency,
                            progress=progress, skip=skip)


def default_build_key(source: str, seed: int = 0) -> str | None:
    """What the default build of `source` (`build_functions`, `build_humaneval`) is made of in this
    release; None for a source that does not change between releases (HumanEval is a fixed set)."""
    from tryloop.tasks.sources import functions

    return functions.build_key(seed=seed) if source == functions.SOURCE else None


async def build_family(runtime: SandboxRuntime, store: TaskStore, work_dir: Path, family: str, *,
                       gate: GateConfig, eval_fraction: float, seed: int = 0, per_family: int = 3,
                       count: int | None = None, tier: int | None = None, concurrency: int = 2,
                       progress: Progress | None = None) -> GateReport:
    """A family of answer-graded tasks (data | docs | ops) synthesized from `seed`, gated, split by template."""
    from tryloop.tasks.families import synthesize as synth_family

    tasks = synth_family(family, work_dir / family, count=count, per_family=per_family, seed=seed, tier=tier)
    return await _admit_all(runtime, store, tasks, lambda t: f"{family}:tier-{t.meta.origin['tier']}",
                            gate=gate, eval_fraction=eval_fraction, seed=seed, concurrency=concurrency,
                            progress=progress)
