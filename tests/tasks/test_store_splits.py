"""The gate's rules, the task store, splits and the leakage check."""

from __future__ import annotations

from pathlib import Path

import pytest

from tryloop.assets import CALC_PROJECT
from tryloop.tasks.dedup import near_duplicate_groups, near_duplicate_key
from tryloop.tasks.difficulty import static_difficulty
from tryloop.tasks.gate import (
    BROKEN_PASSES,
    FLAKY,
    REFERENCE_FAILS,
    TOO_SLOW,
    GateConfig,
    judge,
    validate,
)
from tryloop.tasks.model import Task, TaskError, TaskMeta
from tryloop.tasks.splits import assign_split, check_leakage, split_group
from tryloop.tasks.store import StoreCorrupt, TaskNotFound, TaskStore
from tryloop.tasks.testrun import TestRun

SRC = (CALC_PROJECT / "calc" / "__init__.py").read_text()
TESTS = (CALC_PROJECT / "tests" / "test_calc.py").read_text()
ADD, MEAN = "tests/test_calc.py::test_add", "tests/test_calc.py::test_mean"


def make_task(root: Path, name: str = "add-minus", project: str = "calc", family: str | None = None,
              bug: tuple[str, str] = ("a + b", "a - b"), source: str = "mutation") -> Task:
    meta = TaskMeta(id=f"{project}/{name}", family=family or f"{project}-{name}", project=project, source=source)
    return Task.create(root / project / name, meta, "add(2, 3) returns -1 instead of 5.",
                       workspace={"calc/__init__.py": SRC.replace(*bug)},
                       tests={"tests/test_calc.py": TESTS}, solution={"calc/__init__.py": SRC})


def run(outcomes: dict[str, str], wall: float = 0.5, exit_code: int = 0) -> TestRun:
    return TestRun(exit_code=exit_code, outcomes=outcomes, wall_s=wall, reported=True)


# ---- the gate's rules (pure) -----------------------------------------------------

def test_judge_accepts_and_splits_fail_to_pass_from_pass_to_pass():
    fixed = [run({ADD: "passed", MEAN: "passed"})] * 3
    broken = [run({ADD: "failed", MEAN: "passed"}, exit_code=1)] * 3
    res = judge("t", broken, fixed, GateConfig(require_pass_to_pass=True))
    assert res.accepted and res.fail_to_pass == [ADD] and res.pass_to_pass == [MEAN]


def test_judge_rejects_a_task_whose_broken_state_passes():
    ok = [run({ADD: "passed", MEAN: "passed"})] * 3
    res = judge("t", ok, ok, GateConfig())
    assert not res.accepted and res.reason == BROKEN_PASSES


def test_judge_rejects_when_the_reference_fails_everything():
    bad = [run({ADD: "failed", MEAN: "failed"}, exit_code=1)] * 3
    res = judge("t", bad, bad, GateConfig())
    assert not res.accepted and res.reason == REFERENCE_FAILS


def test_judge_drops_flaky_tests_and_rejects_when_only_flaky_ones_discriminate():
    fixed = [run({ADD: "passed", MEAN: "passed"}), run({ADD: "passed", MEAN: "failed"}), run({ADD: "passed", MEAN: "passed"})]
    broken = [run({ADD: "failed", MEAN: "passed"})] * 3
    res = judge("t", broken, fixed, GateConfig())
    assert res.accepted and res.flaky == [MEAN] and res.pass_to_pass == [] and "flaky" in res.detail
    flaky_add = [run({ADD: "passed"}), run({ADD: "failed"}), run({ADD: "passed"})]
    res = judge("t", [run({ADD: "failed"})] * 3, flaky_add, GateConfig())
    assert not res.accepted and res.reason == FLAKY


def test_judge_enforces_the_time_budget():
    fixed = [run({ADD: "passed"}, wall=90)] * 3
    res = judge("t", [run({ADD: "failed"})] * 3, fixed, GateConfig(time_budget_s=60))
    assert not res.accepted and res.reason == TOO_SLOW


# ---- the real gate in real sandboxes ------------------------------------------------

async def test_gate_accepts_a_real_task_and_rejects_a_no_op_bug(runtime, tmp_path):
    good = make_task(tmp_path)
    res = await validate(runtime, good, GateConfig(k=2, require_pass_to_pass=True))
    assert res.accepted, res
    assert res.fail_to_pass == [ADD] and res.pass_to_pass == [MEAN]
    # "bug" that changes nothing observable: the broken state passes, a no-op attempt would too
    fake = make_task(tmp_path, "noop", bug=("a + b", "b + a"))
    res = await validate(runtime, fake, GateConfig(k=2))
    assert not res.accepted and res.reason == BROKEN_PASSES


# ---- format and store -------------------------------------------------------------------

def test_fingerprint_changes_with_anything_that_decides_grading(tmp_path):
    a = make_task(tmp_path / "a")
    b = make_task(tmp_path / "b")
    assert a.fingerprint() == b.fingerprint()
    (b.tests_dir / "tests" / "test_calc.py").write_text(TESTS + "\n# changed\n")
    assert Task.load(b.root).fingerprint() != a.fingerprint()
    c = make_task(tmp_path / "c")
    c.save_meta(c.with_meta(split="eval", tier="easy"))  # not grading
    assert Task.load(c.root).fingerprint() == a.fingerprint()
    c.save_meta(c.with_meta(test_command="python3 -m pytest -x"))
    assert Task.load(c.root).fingerprint() != a.fingerprint()


def test_bad_task_directories_give_errors_naming_the_file(tmp_path):
    with pytest.raises(TaskError, match="no task.toml"):
        Task.load(tmp_path)
    t = make_task(tmp_path)
    (t.root / "task.toml").write_text((t.root / "task.toml").read_text().replace('source = "mutation"', 'source = 5'))
    with pytest.raises(TaskError, match=r"task.toml.*source"):
        Task.load(t.root)


def test_store_versions_queries_stats_and_errors(tmp_path):
    store = TaskStore(tmp_path / "store")
    t1 = make_task(tmp_path / "w1")
    e1 = store.add(t1)
    assert store.add(t1).fingerprint == e1.fingerprint  # idempotent
    t2 = make_task(tmp_path / "w2", bug=("a + b", "a * b"))
    e2 = store.add(t2)
    assert [v.fingerprint for v in store.versions("calc/add-minus")] == [e1.fingerprint, e2.fingerprint]
    assert store.get("calc/add-minus").fingerprint() == e2.fingerprint  # newest
    assert store.get(e1.fingerprint[:10]).fingerprint() == e1.fingerprint  # old versions stay addressable
    store.add(make_task(tmp_path / "w3", name="other", project="strutils", bug=("a + b", "b - a")))
    assert store.add(make_task(tmp_path / "w4", name="copy", project="x")).fingerprint == e1.fingerprint  # exact dup
    assert {e.id for e in store.query(project="calc")} == {"calc/add-minus"}
    assert len(store.query(latest=False)) == 3
    store.update_meta(e2.fingerprint, split="eval", tier="easy")
    assert [e.id for e in store.query(split="eval", tier="easy")] == ["calc/add-minus"]
    with pytest.raises(Exception, match="grading"):
        store.update_meta(e2.fingerprint, fail_to_pass=["x"])
    assert store.record_pass_rate(e2.fingerprint, "smollm2", 1, 4)["rate"] == 0.25
    assert store.record_pass_rate(e2.fingerprint, "smollm2", 1, 4)["rate"] == 0.25
    assert store.pass_rates(e2.fingerprint)["smollm2"]["attempts"] == 8
    store.record_rejection("x/y", "mutation", "mutation:binop", "flaky", "because")
    assert store.rejections()[0]["reason"] == "flaky"
    with pytest.raises(TaskNotFound, match="no task"):
        store.get("nope/nope")


def test_a_task_by_its_whole_fingerprint_reads_its_own_index_file_only(tmp_path, monkeypatch):
    """Loading a suite task by task (its entries' fingerprints) read the whole index for each task:
    886 tasks took minutes. A whole fingerprint names its index file."""
    store = TaskStore(tmp_path / "store")
    e1 = store.add(make_task(tmp_path / "w1"))
    e2 = store.add(make_task(tmp_path / "w2", bug=("a + b", "a * b")))
    store.update_meta(e1.fingerprint, split="eval")

    def whole_index():
        raise AssertionError("the whole index was read")

    monkeypatch.setattr(store, "entries", whole_index)
    task = store.get(e1.fingerprint)
    assert task.fingerprint() == e1.fingerprint and task.meta.split == "eval"   # the old version, its meta
    assert store.get(e2.fingerprint).fingerprint() == e2.fingerprint
    monkeypatch.undo()
    assert store.get("calc/add-minus").fingerprint() == e2.fingerprint          # by id: still the newest


def test_a_damaged_store_file_is_named_and_nothing_stored_is_lost(tmp_path):
    store = TaskStore(tmp_path / "store")
    e = store.add(make_task(tmp_path / "w"))
    store.record_rejection("x/y", "mutation", "mutation:binop", "flaky", "because")
    store.set_build_state("mutation", "started")
    index = tmp_path / "store" / "index" / f"{e.fingerprint}.json"
    good = index.read_text()
    index.write_text(good[:40])                                   # cut short by a copy gone wrong
    with pytest.raises(StoreCorrupt, match=rf"task store file {index} is not valid JSON"):
        store.query()
    index.write_text(good)
    rejections = tmp_path / "store" / "rejections.jsonl"
    rejections.write_text(rejections.read_text() + "{not json\n")
    with pytest.raises(StoreCorrupt, match=rf"{rejections}, line 2 is not valid JSON"):
        store.decided_ids("mutation")
    rejections.write_text(rejections.read_text().splitlines()[0] + "\n")
    build = tmp_path / "store" / "builds" / "mutation.json"
    for damaged, match in (("{", "is not valid JSON"), ('{"state": "half"}', "state is 'half'")):
        build.write_text(damaged)
        with pytest.raises(StoreCorrupt, match=rf"task store file {build}.*{match}"):
            store.build_state("mutation")
    assert store.decided_ids("mutation") == {"calc/add-minus", "x/y"}   # the rest reads as before
    assert store.get("calc/add-minus").fingerprint() == e.fingerprint


def test_store_works_over_a_non_local_fsspec_url(tmp_path):
    store = TaskStore("memory://tryloop-test-store", cache_dir=tmp_path / "cache")
    e = store.add(make_task(tmp_path / "w"))
    got = store.get("calc/add-minus")
    assert got.fingerprint() == e.fingerprint and got.root.is_relative_to(tmp_path / "cache")


# ---- splits, leakage, dedup, difficulty ---------------------------------------------------

def test_splits_follow_projects_and_families_never_tasks(tmp_path):
    metas = [TaskMeta(id=f"p{i % 3}/t{i}", family=f"f{i}", project=f"p{i % 3}", source="mutation") for i in range(30)]
    by_project: dict[str, set[str]] = {}
    for m in metas:
        by_project.setdefault(m.project, set()).add(assign_split(m, 0.5, seed=1))
    assert all(len(s) == 1 for s in by_project.values())
    he = TaskMeta(id="humaneval/1", family="humaneval-1", project="humaneval", source="humaneval")
    assert split_group(he) == "family:humaneval-1"


def test_leakage_check_catches_a_planted_leak(tmp_path):
    store = TaskStore(tmp_path / "store")
    a = store.add(make_task(tmp_path / "a", name="t1"))
    b = store.add(make_task(tmp_path / "b", name="t2", bug=("a + b", "a * b")))
    store.update_meta(a.fingerprint, split="train")
    store.update_meta(b.fingerprint, split="train")
    assert check_leakage(store).clean
    # A variant of a train task (same family, identifiers renamed) planted in eval:
    renamed = SRC.replace("xs", "values")
    meta = TaskMeta(id="calc-copy/t1-variant", family="calc-t1", project="calc-copy", source="variant")
    v = Task.create(tmp_path / "c", meta, "x", workspace={"calc/__init__.py": renamed.replace("a + b", "a - b")},
                    tests={"tests/test_calc.py": TESTS}, solution={"calc/__init__.py": renamed})
    ev = store.add(v)
    store.update_meta(ev.fingerprint, split="eval")
    rep = check_leakage(store)
    assert not rep.clean
    assert "calc-t1" in rep.shared_families
    assert any("t1-variant" in pair[1] for pair in rep.near_duplicates)


def test_near_duplicates_ignore_renaming(tmp_path):
    a = make_task(tmp_path / "a", name="one")
    renamed_src = SRC.replace("xs", "values")
    meta = TaskMeta(id="calc/two", family="calc-two", project="calc", source="variant")
    b = Task.create(tmp_path / "b", meta, "x", workspace={"calc/__init__.py": renamed_src.replace("a + b", "a - b")},
                    tests={"tests/test_calc.py": TESTS}, solution={"calc/__init__.py": renamed_src})
    c = make_task(tmp_path / "c", name="three", bug=("a + b", "a * b"))
    assert near_duplicate_key(a) == near_duplicate_key(b) != near_duplicate_key(c)
    assert near_duplicate_groups([a, b, c]) == [["calc/one", "calc/two"]]


def test_static_difficulty_orders_function_single_and_multi_file_bugs(tmp_path):
    single = make_task(tmp_path / "s")
    meta = TaskMeta(id="calc/multi", family="calc-multi", project="calc", source="bundled")
    other = "def helper(x):\n    return x * 2\n"
    multi = Task.create(tmp_path / "m", meta, "x",
                        workspace={"calc/__init__.py": SRC.replace("a + b", "a - b"),
                                   "calc/helper.py": other.replace("* 2", "* 3")},
                        tests={"tests/test_calc.py": TESTS},
                        solution={"calc/__init__.py": SRC, "calc/helper.py": other})
    s1, _ = static_difficulty(single)
    s2, tier2 = static_difficulty(multi)
    assert s2 > s1 and tier2 in ("medium", "hard")


def test_answer_traces_catch_tests_solution_or_history_in_the_workspace(tmp_path):
    import subprocess

    from tryloop.tasks.factory import answer_traces

    assert answer_traces(make_task(tmp_path / "clean")) == []
    meta = TaskMeta(id="calc/leaky", family="calc-leaky", project="calc", source="local")
    leaky = Task.create(tmp_path / "leaky", meta, "x",
                        workspace={"calc/__init__.py": SRC.replace("a + b", "a - b"), "tests/test_calc.py": TESTS},
                        tests={"tests/test_calc.py": TESTS}, solution={"calc/__init__.py": SRC})
    assert any("hidden test" in t for t in answer_traces(leaky))
    git = make_task(tmp_path / "git")
    ws = git.workspace_dir
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "-c", "user.email=a@b", "-c", "user.name=a",
                                                             "commit", "-qm", "one"], ["git", "tag", "v1"]):
        subprocess.run(cmd, cwd=ws, check=True)
    assert any("git history" in t for t in answer_traces(Task.load(git.root)))


def test_measured_pass_rates_refine_the_static_tier(tmp_path):
    from tryloop.tasks.difficulty import refine_from_pass_rates

    store = TaskStore(tmp_path / "store")
    e = store.add(make_task(tmp_path / "w"))
    store.update_meta(e.fingerprint, tier="easy", difficulty=0.2)
    store.record_pass_rate(e.fingerprint, "smollm2", 0, 4)
    assert refine_from_pass_rates(store, "smollm2", min_attempts=8) == 0  # not enough attempts yet
    store.record_pass_rate(e.fingerprint, "smollm2", 0, 4)
    assert refine_from_pass_rates(store, "smollm2", min_attempts=8) == 1
    assert store.entry(e.fingerprint).meta.tier == "hard"


def test_eval_fraction_by_source_overrides_the_share_for_that_source_only():
    from tryloop.config import TasksConfig

    cfg = TasksConfig(eval_fraction=0.25, eval_fraction_by_source={"functions": 1.0})
    assert cfg.eval_fraction_for("functions") == 1.0
    assert cfg.eval_fraction_for("humaneval") == 0.25 and cfg.eval_fraction_for(None) == 0.25
    with pytest.raises(ValueError, match="eval_fraction_by_source"):
        TasksConfig(eval_fraction_by_source={"functions": 1.5})
