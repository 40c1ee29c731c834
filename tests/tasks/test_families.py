"""Answer-graded families (data analysis, structured documents): reproducible from a seed, gold answers
that follow the documented rules, gated for real in sandboxes, split by template, bad input rejected."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import sqlite3
from datetime import datetime

import pytest

from tryloop.rewards.answers import grade
from tryloop.tasks.factory import admit, build_family
from tryloop.tasks.families import synthesize
from tryloop.tasks.families.check import (
    CHECK_INVALID,
    CHECK_MISSING,
    DATA_UNREADABLE,
    CheckError,
    load_check,
)
from tryloop.tasks.families.data import BY_FAMILY, QUESTIONS, make_data_task
from tryloop.tasks.families.documents import KINDS
from tryloop.tasks.families.gate import CONSTANT_PASSES, validate_answer
from tryloop.tasks.gate import REFERENCE_FAILS, GateConfig, GateReport
from tryloop.tasks.model import Task
from tryloop.tasks.splits import check_leakage
from tryloop.tasks.store import TaskStore


def _with(task: Task, files: dict[str, bytes]) -> dict[str, bytes]:
    return {**task.workspace_files(), **files}


def _gold(task: Task) -> dict:
    return json.loads(task.solution_files()["answer.json"])


@pytest.mark.parametrize("family", ["data", "docs"])
def test_same_seed_same_tasks_other_seed_other_tasks(tmp_path, family):
    a = synthesize(family, tmp_path / "a", per_family=1)
    b = synthesize(family, tmp_path / "b", per_family=1)
    assert [t.fingerprint() for t in a] == [t.fingerprint() for t in b]
    c = synthesize(family, tmp_path / "c", per_family=1, seed=1)
    assert not {t.fingerprint() for t in a} & {t.fingerprint() for t in c}
    assert {t.meta.tier for t in a} == {"easy", "medium", "hard"}
    assert all(t.meta.grader == "answer" and t.check_path.is_file() for t in a)
    only = synthesize(family, tmp_path / "d", per_family=1, tier=2, count=3)
    assert len(only) == 3 and {t.meta.tier for t in only} == {"medium"}


def test_the_check_never_enters_the_workspace(tmp_path):
    for t in synthesize("data", tmp_path / "d", per_family=1) + synthesize("docs", tmp_path / "o", per_family=1):
        ws = t.workspace_files()
        assert "answer.json" not in ws and not any("check" in p for p in ws)
        check = load_check(t)
        secrets = [s.sql for s in check.steps] if t.meta.source == "data" else [json.dumps(check.gold)]
        assert not any(s.encode() in data for s in secrets for data in ws.values()), t.id
        assert all(p.startswith("data/") for p in ws) if t.meta.source == "data" else \
            set(ws) == {"document.txt", "schema.json"}


# ---- the gold follows the README's rules (computed here independently, in plain Python) ----------

def _orders(task: Task) -> dict[str, dict]:
    rows = list(csv.DictReader(io.StringIO(task.workspace_files()["data/orders.csv"].decode())))
    return {r["order_id"]: r for r in rows}   # one order per id


def _day(text: str) -> str:
    for fmt in ("%Y-%m-%d", "%d/%m/%Y", "%b %d %Y", "%d %B %Y", "%Y%m%d"):
        try:
            return datetime.strptime(text, fmt).strftime("%Y-%m-%d")
        except ValueError:
            pass
    raise AssertionError(f"undocumented date format {text!r}")


def test_sales_gold_matches_an_independent_reading_of_the_rules(tmp_path):
    t = make_data_task(BY_FAMILY["sales-region-revenue"], 0, 0, tmp_path / "t")
    p = t.meta.origin["params"]
    total = 0.0
    for o in _orders(t).values():
        price = o["unit_price"].strip().lstrip("$")
        if price in ("", "NA") or int(o["quantity"]) > 1000 or o["region"].strip().lower() != p["region"]:
            continue
        if _day(o["order_date"]).startswith(p["ym"]):
            total += int(o["quantity"]) * float(price)
    assert _gold(t) == {"rows": len(_orders(t)), "answer": pytest.approx(round(total, 2), abs=0.011)}


def test_logs_and_tickets_gold_match_independent_readings(tmp_path):
    t = make_data_task(BY_FAMILY["logs-server-errors"], 1, 0, tmp_path / "l")
    recs = {}
    for line in t.workspace_files()["data/access.jsonl"].decode().splitlines():
        r = json.loads(line)
        recs[r["request_id"]] = r
    assert _gold(t) == {"rows": len(recs), "answer": sum(500 <= int(r["status"]) <= 599 for r in recs.values())}

    t = make_data_task(BY_FAMILY["tickets-still-open"], 2, 0, tmp_path / "k")
    db = sqlite3.connect(":memory:")
    db.deserialize(t.workspace_files()["data/tickets.db"])
    tickets = {i: c for i, c in db.execute("SELECT id, closed_at FROM tickets")}
    assert _gold(t) == {"rows": len(tickets), "answer": sum(1 for c in tickets.values() if c in (None, ""))}


def test_sensors_gold_leaves_out_faults_and_duplicates(tmp_path):
    t = make_data_task(BY_FAMILY["sensors-fault-codes"], 0, 0, tmp_path / "s")
    rows = {tuple(r) for r in csv.reader(io.StringIO(t.workspace_files()["data/readings.csv"].decode()))} - \
        {("sensor_id", "ts", "temperature", "humidity")}
    assert _gold(t) == {"rows": len(rows), "answer": sum(r[2] == "-999" for r in rows)}


def test_every_question_template_makes_a_task_whose_reference_passes(tmp_path):
    for q in QUESTIONS:
        t = make_data_task(q, 0, 0, tmp_path / q.family)
        assert t is not None, q.family
        assert grade(t, _with(t, t.solution_files())).passed, q.family
        assert not grade(t, t.workspace_files()).passed
        assert t.meta.tags[-1] == f"tier-{q.tier}" and t.meta.environment == "data"
    for kind in KINDS.values():
        for tier in (1, 2, 3):
            from tryloop.tasks.families.documents import make_document_task

            t = make_document_task(kind, tier, 0, 0, tmp_path / f"{kind.name}{tier}")
            g = grade(t, _with(t, t.solution_files()))
            assert g.passed and g.score == 1.0, (kind.name, tier)


# ---- the gate, for real ------------------------------------------------------------------------

def test_gate_accepts_both_families_and_splits_keep_templates_apart(runtime, tmp_path):
    store = TaskStore(tmp_path / "store")
    gate = GateConfig(k=2)
    data = asyncio.run(build_family(runtime, store, tmp_path / "w", "data", gate=gate, eval_fraction=0.5,
                                    per_family=1, count=12))
    docs = asyncio.run(build_family(runtime, store, tmp_path / "w", "docs", gate=gate, eval_fraction=0.5,
                                    per_family=2, count=12))
    assert data.total_kept == 12 and docs.total_kept == 12, (data.rejected, docs.rejected)
    entries = store.query()
    assert len(entries) == 24
    by_family: dict[str, set] = {}
    for e in entries:
        by_family.setdefault(e.meta.family, set()).add(e.meta.split)
        assert e.meta.fail_to_pass and all(k.startswith(("step:", "field:", "schema")) for k in e.meta.fail_to_pass)
    assert all(len(s) == 1 for s in by_family.values())
    assert {s for v in by_family.values() for s in v} == {"train", "eval"}
    assert check_leakage(store).clean


def _copy(task: Task, dest) -> Task:
    import shutil

    shutil.copytree(task.root, dest)
    return Task.load(dest)


def test_gate_rejects_malformed_tasks_with_a_reason(runtime, tmp_path):
    base = make_data_task(BY_FAMILY["tickets-busiest-agent"], 0, 0, tmp_path / "base")
    gate = GateConfig(k=1)

    def run(t: Task):
        return asyncio.run(validate_answer(runtime, t, gate))

    assert run(base).accepted
    t = _copy(base, tmp_path / "nocheck")
    t.check_path.unlink()
    r = run(t)
    assert (r.reason, "missing") == (CHECK_MISSING, "missing") and "check.json" in r.detail
    t = _copy(base, tmp_path / "badjson")
    t.check_path.write_text("{not json")
    assert run(t).reason == CHECK_INVALID
    t = _copy(base, tmp_path / "nosql")
    doc = json.loads(t.check_path.read_text())
    del doc["steps"][1]["sql"]
    t.check_path.write_text(json.dumps(doc))
    r = run(t)
    assert r.reason == CHECK_INVALID and "steps.1.sql" in r.detail
    t = _copy(base, tmp_path / "corrupt")
    (t.workspace_dir / "data" / "tickets.db").write_bytes(b"not a database at all" * 100)
    r = run(Task.load(t.root))
    assert r.reason == DATA_UNREADABLE and "tickets.db" in r.detail
    t = _copy(base, tmp_path / "wrongref")
    gold = _gold(t)
    gold["answer"] = "Nobody"
    (t.solution_dir / "answer.json").write_text(json.dumps(gold))
    r = run(Task.load(t.root))
    assert r.reason == REFERENCE_FAILS and "answer" in r.detail
    t = _copy(base, tmp_path / "trivial")
    doc = json.loads(t.check_path.read_text())
    doc["steps"] = [{"name": "answer", "type": "number", "sql": "SELECT 0"}]
    t.check_path.write_text(json.dumps(doc))
    (t.solution_dir / "answer.json").write_text('{"answer": 0}')
    assert run(Task.load(t.root)).reason == CONSTANT_PASSES
    # a document check whose gold does not satisfy its own schema
    d = synthesize("docs", tmp_path / "docs", per_family=1, count=1)[0]
    doc = json.loads(d.check_path.read_text())
    doc["gold"]["total"] = "a lot"
    d.check_path.write_text(json.dumps(doc))
    r = run(Task.load(d.root))
    assert r.reason == CHECK_INVALID and "schema" in r.detail
    with pytest.raises(CheckError):
        load_check(Task.load(d.root))


def test_a_planted_answer_cache_is_refused_and_the_store_keeps_what_it_had(runtime, tmp_path):
    store = TaskStore(tmp_path / "store")
    good = synthesize("data", tmp_path / "g", per_family=1, count=1)[0]
    report = GateReport()
    assert asyncio.run(admit(runtime, store, good, report, "data", GateConfig(k=1)))
    leaky = _copy(synthesize("data", tmp_path / "l", per_family=1, count=2)[1], tmp_path / "leaky")
    (leaky.workspace_dir / ".cache").mkdir()
    (leaky.workspace_dir / ".cache" / "last_answer.json").write_bytes(leaky.solution_files()["answer.json"])
    assert asyncio.run(admit(runtime, store, Task.load(leaky.root), report, "data", GateConfig(k=1))) is None
    assert report.rejected["data"]["answer_in_workspace"] == 1
    assert [e.id for e in store.query()] == [good.id]
    assert "copy of the reference answer" in store.rejections()[-1]["detail"]


@pytest.mark.parametrize("family", ["data", "docs", "ops"])
def test_near_duplicates_never_span_two_families(tmp_path, family):
    """Splits are by family: tasks whose fixes look alike must share one, or they could leak across."""
    from tryloop.tasks.dedup import near_duplicate_key

    families: dict[str, set[str]] = {}
    for t in synthesize(family, tmp_path, per_family=3):
        families.setdefault(near_duplicate_key(t), set()).add(t.meta.family)
    assert all(len(f) == 1 for f in families.values()), [f for f in families.values() if len(f) > 1]


def test_a_backup_equal_to_a_fixed_file_is_no_leak_but_a_copy_of_the_answer_is(tmp_path):
    from tryloop.tasks.factory import answer_traces

    ops = synthesize("ops", tmp_path / "o", per_family=1, count=3)[2]      # corrupt_data: restore the backup
    assert ops.solution_files()["svc/data/rates.json"] == ops.workspace_files()["svc/data/rates.json.bak"]
    assert answer_traces(ops) == []
    data = synthesize("data", tmp_path / "d", per_family=1, count=1)[0]
    (data.workspace_dir / "notes.txt").write_bytes(data.solution_files()["answer.json"])
    assert answer_traces(Task.load(data.root)) == ["notes.txt is a copy of the reference answer answer.json"]
