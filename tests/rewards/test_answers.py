"""Answer grading on the host: typed comparisons with tolerances, schema first for documents, and the
red team of answer-graded tasks judged by the real verifier (none may pass)."""

from __future__ import annotations

import json

import pytest

from tryloop.rewards.answer_redteam import ANSWER_ATTACKS, DATA_ONLY, DOCS_ONLY, OPS_ONLY
from tryloop.rewards.answers import compare, field_score, grade, read_answer
from tryloop.rewards.spec import RewardSpec
from tryloop.rewards.submission import Submission
from tryloop.rewards.verifier import verify
from tryloop.tasks.families import synthesize
from tryloop.tasks.families.check import FieldRule, Step


def _step(type_: str, **kw) -> Step:
    return Step(name="answer", type=type_, sql="SELECT 1", **kw)


def test_numbers_use_the_tolerance_and_refuse_non_numbers():
    s = _step("number", abs_tol=0.011)
    assert compare(s, 10.005, 10.0) and compare(s, 9.99, 10.0) and not compare(s, 10.02, 10.0)
    assert not compare(s, "10", 10.0) and not compare(s, True, 1.0) and not compare(s, None, 10.0)
    exact = _step("number")
    assert compare(exact, 41, 41) and compare(exact, 41.0, 41) and not compare(exact, 42, 41)
    assert compare(_step("number", rel_tol=0.01), 1005, 1000) and not compare(_step("number", rel_tol=0.01), 1011, 1000)


def test_strings_lists_and_tables():
    assert compare(_step("string"), "  Ana  SILVA ", "Ana Silva") and not compare(_step("string"), "Ana", "Ana Silva")
    ordered = _step("list", ordered=True)
    assert compare(ordered, ["b", "a", "c"], ["b", "a", "c"]) and not compare(ordered, ["a", "b", "c"], ["b", "a", "c"])
    assert compare(_step("list"), ["a", "c", "b"], ["b", "a", "c"])
    assert not compare(_step("list"), ["a", "a", "b"], ["a", "b", "b"])          # multisets, not sets
    assert compare(ordered, [1096, 1222], [1096, 1222]) and not compare(ordered, ["1096", "1222"], [1096, 1222])
    table = _step("table", abs_tol=0.011)
    gold = [["east", 3057.88], ["north", 920.15]]
    assert compare(table, [["north", 920.151], ["EAST", 3057.88]], gold)
    assert not compare(table, [["north", 920.15]], gold)                           # a row missing
    assert not compare(table, [["north", 920.15], ["east", 3057.88], ["west", 1.0]], gold)
    assert not compare(table, [["north", 920.15], ["east", 3050.0]], gold)
    assert not compare(table, {"north": 920.15, "east": 3057.88}, gold)


def test_document_fields():
    assert field_score(FieldRule(path="d", match="date"), "2024-03-05", "2024-03-05") == 1.0
    assert field_score(FieldRule(path="d", match="date"), "05/03/2024", "2024-03-05") == 1.0
    assert field_score(FieldRule(path="d", match="date"), "2024-05-03", "2024-03-05") == 0.0
    assert field_score(FieldRule(path="a", match="amount"), 1234.5, 1234.5) == 1.0
    assert field_score(FieldRule(path="a", match="amount"), 1240.0, 1234.5) == 1.0   # 0.45% off, within 0.5%
    assert field_score(FieldRule(path="a", match="amount"), 1250.0, 1234.5) == 0.0
    assert field_score(FieldRule(path="i", match="exact"), "INV-2024-0042", "INV-2024-0042") == 1.0
    assert field_score(FieldRule(path="i", match="exact"), "inv-2024-0042", "INV-2024-0042") == 0.0
    assert field_score(FieldRule(path="e", match="enum"), "EUR", "eur") == 1.0
    assert field_score(FieldRule(path="t", match="text"), "Acme Supplies, Ltd.", "acme supplies ltd") == 1.0
    s = FieldRule(path="s", match="set")
    assert field_score(s, ["b", "a"], ["a", "b"]) == 1.0 and field_score(s, ["a"], ["a", "b"]) == pytest.approx(2 / 3)
    r = FieldRule(path="r", match="records", record_match={"owner": "text", "due": "date"})
    gold = [{"owner": "Ana Kim", "due": "2024-03-05"}, {"owner": "Ben Ito", "due": "2024-03-09"}]
    assert field_score(r, list(reversed(gold)), gold) == 1.0
    assert field_score(r, [gold[0], {"owner": "Ben Ito", "due": "2024-03-10"}], gold) == 0.5


def test_answer_files_that_are_not_json_values_are_refused():
    for raw in (b"{", b'{"answer": NaN}', b'{"answer": Infinity}', b"[" * 50_000 + b"]" * 50_000, b" " * (2 << 20)):
        doc, why = read_answer({"answer.json": raw}, "answer.json")
        assert doc is None and why
    assert read_answer({}, "answer.json") == (None, "no answer.json in the final workspace")


def test_documents_need_the_schema_first_then_score_fields(tmp_path):
    t = synthesize("docs", tmp_path, per_family=1, count=1)[0]      # an invoice
    gold = json.loads(t.solution_files()["answer.json"])
    ws = t.workspace_files()
    assert grade(t, {**ws, "answer.json": json.dumps(gold).encode()}).passed
    wrong = {**gold, "total": gold["total"] + 50, "vendor": "Someone Else"}
    g = grade(t, {**ws, "answer.json": json.dumps(wrong).encode()})
    assert not g.passed and g.outcomes["schema"] == "passed" and g.outcomes["field:total"] == "failed"
    assert 0.5 < g.score < 1.0 and "total" in g.reason and "vendor" in g.reason
    invalid = {**gold, "currency": "euro"}
    g = grade(t, {**ws, "answer.json": json.dumps(invalid).encode()})
    assert g.outcomes == {"schema": "failed"} and g.score == 0.0 and "currency" in g.reason


@pytest.fixture(scope="module")
def family_tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    data = synthesize("data", root / "d", per_family=1)
    docs = synthesize("docs", root / "o", per_family=1)
    # one per dataset and tier shape (number, string, list, table), and one per document kind
    pick = {t.meta.origin["template"]: t for t in data}
    ops = synthesize("ops", root / "s", per_family=1, tier=3, count=1)   # two faults at once
    return [pick[f] for f in ("sales-region-revenue", "logs-top-error-paths", "sensors-mean-by-site",
                              "tickets-busiest-agent")] + docs[::3] + ops


async def test_the_verifier_passes_the_reference_and_partial_credit_is_declared(runtime, family_tasks):
    for t in family_tasks:
        v = await verify(runtime, t, Submission(changes=dict(t.solution_files())))
        assert v.state == "pass" and v.reward == pytest.approx(1.0) and not v.flags, (t.id, v.reason, v.flags)
        assert v.outcomes and all(o == "passed" for o in v.outcomes.values())
    t = family_tasks[0]
    gold = json.loads(t.solution_files()["answer.json"])
    half = Submission.from_files({"answer.json": json.dumps({"rows": gold["rows"], "answer": -1})})
    spec = RewardSpec(partial_credit=True)
    v = await verify(runtime, t, half, spec)
    assert v.state == "fail" and v.outcomes == {"step:rows": "passed", "step:answer": "failed"}
    assert v.components["correctness"] == pytest.approx(0.25)        # rows weighs 1, the answer 3
    assert (await verify(runtime, t, half)).reward == 0.0


@pytest.mark.parametrize("attack", sorted(ANSWER_ATTACKS))
async def test_answer_attacks_never_pass(runtime, family_tasks, attack):
    for t in family_tasks:
        if (attack in DATA_ONLY and t.meta.source != "data") or (attack in DOCS_ONLY and t.meta.source != "docs") \
                or (attack in OPS_ONLY and t.meta.source != "ops"):
            continue
        sub = ANSWER_ATTACKS[attack](t)
        v = await verify(runtime, t, sub)
        assert v.state == "fail" and v.reward <= 0.0, (attack, t.id, v.state, v.reason)


def test_the_gold_is_recomputed_from_the_pristine_files_not_the_agents(family_tasks):
    t = family_tasks[0]
    sub = ANSWER_ATTACKS["edit_data"](t)
    final = {**t.workspace_files(), **{p: d for p, d in sub.changes.items() if d is not None}}
    assert not grade(t, final).passed
    # ...and the right answer still passes beside edited data: the gold never comes from the agent's files
    assert grade(t, {**final, "answer.json": t.solution_files()["answer.json"]}).passed


async def test_the_check_is_not_reachable_from_the_agents_sandbox(runtime, family_tasks):
    from tryloop.tasks.testrun import sandbox_config_for, task_snapshot

    t = family_tasks[0]
    sql = json.loads(t.check_path.read_text())["steps"][-1]["sql"][-40:]
    async with await runtime.create(task_snapshot(runtime, t), sandbox_config_for(t)) as sb:
        res = await sb.exec(["bash", "-c", f"test -e {t.check_path} && echo VISIBLE; test -e {t.root} && echo ROOT; "
                            f"grep -rlF -- {json.dumps(sql)} /workspace /tmp /home /root /var /opt /srv /mnt "
                            "2>/dev/null; echo done"], merge_stderr=True, timeout=60)
    assert res.text().strip() == "done", res.text()


def test_attack_names_do_not_shadow_the_code_red_team():
    from tryloop.rewards.redteam import ATTACKS

    assert not set(ANSWER_ATTACKS) & set(ATTACKS)
