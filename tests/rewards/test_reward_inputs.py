"""`tryloop reward spot-check | judge-check` on bad input: the file or field at fault is named,
without a traceback, and no label already written is lost or joined to a broken line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tryloop.agent.trajectory import Trajectory
from tryloop.cli.main import app
from tryloop.errors import TryloopError
from tryloop.rewards.gold import GoldItem, GoldSet
from tryloop.rewards.judge import LabelledAnswer, adversarial_answers, judge_check
from tryloop.rewards.spotcheck import LabelStore, SpotLabel
from tryloop.store.trajectories import TrajectoryStore
from tryloop.tasks.store import TaskStore

UNREACHABLE = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "rubric": "be right", "timeout_s": 2}


class Said:
    """A command's exit status and its output with the panel frames and line wrapping taken out."""

    def __init__(self, res):
        self.exit_code = res.exit_code
        self.output = " ".join(re.sub(r"[│╭╮╰╯─]", " ", res.output).split())
        self.flat = self.output.replace(" ", "")  # a long path may be folded anywhere

    def names(self, text: str) -> bool:
        return text.replace(" ", "") in self.flat


def invoke(*args: str) -> Said:
    res = CliRunner().invoke(app, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception  # no traceback
    return Said(res)


@pytest.fixture
def cfg(tmp_path) -> str:
    """A trajectory store with one run of two episodes, an empty task store, label and gold files."""
    TrajectoryStore(tmp_path / "traj").write([
        Trajectory(episode_id=f"ep-{i}", task_id="calc/add", task_fingerprint="f" * 64, run_id="r", step=0,
                   reward=1.0, verdict="pass") for i in range(2)])
    TaskStore(tmp_path / "tasks")
    path = tmp_path / "tryloop.yaml"
    path.write_text(yaml.safe_dump({
        "tasks": {"store_url": str(tmp_path / "tasks")},
        "store": {"trajectories_url": str(tmp_path / "traj")},
        "rewards": {"labels_path": str(tmp_path / "labels.jsonl"), "gold_path": str(tmp_path / "gold.jsonl")}}))
    return str(path)


def test_an_append_after_a_last_line_without_its_newline_keeps_both(tmp_path):
    labels = tmp_path / "labels.jsonl"
    first = SpotLabel("a", "p/t", "f" * 64, "correct", time=1.0)
    labels.write_text(json.dumps(first.__dict__))              # the newline never made it to disk
    LabelStore(labels).record(SpotLabel("b", "p/t", "f" * 64, "hack"))
    assert sorted(LabelStore(labels).labels()) == ["a", "b"]
    gold = tmp_path / "gold.jsonl"
    item = GoldItem("p/t", "f" * 64, "p", "reference", "pass")
    gold.write_text(json.dumps(item.__dict__, sort_keys=True))
    GoldSet(gold).add([GoldItem("p/t", "f" * 64, "p", "do_nothing", "fail")])
    assert sorted(i.label for i in GoldSet(gold).items()) == ["do_nothing", "reference"]


def test_an_unreadable_label_file_is_named_by_line(tmp_path):
    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps(SpotLabel("a", "p/t", "f", "wrong").__dict__) + "\n{\"episode_id\": \"b\", \n")
    with pytest.raises(TryloopError, match=rf"{labels}:2: not a spot-check label"):
        LabelStore(labels).labels()
    labels.write_text('{"episode_id": "a", "task_id": "t", "task_fingerprint": "f", "label": "great"}\n')
    with pytest.raises(TryloopError, match=rf"{labels}:1: .*label must be one of"):
        LabelStore(labels).labels()
    with pytest.raises(TryloopError, match=f"{tmp_path}: cannot read the spot-check labels"):
        LabelStore(tmp_path).labels()


def test_spot_check_reads_the_label_file_before_it_appends(cfg, tmp_path):
    labels = tmp_path / "labels.jsonl"
    labels.write_text("not json\n")
    res = invoke("reward", "spot-check", "--run", "r", "--label", "ep-0=correct", "-c", cfg)
    assert res.exit_code == 1 and res.names(f"{labels}:1: not a spot-check label")
    assert labels.read_text() == "not json\n"                   # nothing appended behind the broken line
    res = invoke("reward", "spot-check", "--run", "r", "--labels", str(tmp_path), "-c", cfg)
    assert res.exit_code == 1 and "cannot read the spot-check labels" in res.output


def test_spot_check_checks_every_label_before_recording_any(cfg, tmp_path):
    res = invoke("reward", "spot-check", "--run", "r", "--label", "ep-0=correct", "--label", "ep-1=great", "-c", cfg)
    assert res.exit_code == 2 and "no label was recorded" in res.output
    assert not (tmp_path / "labels.jsonl").exists()
    res = invoke("reward", "spot-check", "--run", "r", "--label", "ep-0=correct", "--label", "ep-1=hack", "-c", cfg)
    assert res.exit_code == 0, res.output
    assert {k: v.label for k, v in LabelStore(tmp_path / "labels.jsonl").labels().items()} == \
        {"ep-0": "correct", "ep-1": "hack"}


def test_spot_check_settings_are_config_fields_and_stores_must_exist(cfg, tmp_path):
    res = invoke("reward", "spot-check", "--run", "r", "--uniform", "-3", "-c", cfg)
    assert res.exit_code == 78 and "rewards.spot_check_uniform" in res.output
    res = invoke("reward", "spot-check", "--run", "r", "--trajectories", str(tmp_path / "typo"), "-c", cfg)
    assert res.exit_code == 66 and "no trajectory store at" in res.output
    assert not (tmp_path / "typo").exists()                    # a read never makes a store
    res = invoke("reward", "spot-check", "--run", "r", "--trajectories", "", "-c", cfg)
    assert res.exit_code == 78 and "store.trajectories_url: empty" in res.output
    doc = yaml.safe_load(Path(cfg).read_text())
    doc["rewards"]["spot_check_uniform"] = 0
    doc["tasks"]["store_url"] = str(tmp_path / "no-tasks")
    Path(cfg).write_text(yaml.safe_dump(doc))
    res = invoke("reward", "spot-check", "--run", "r", "-c", cfg)
    assert res.exit_code == 66 and "tasks.store_url: no task store at" in res.output
    assert not (tmp_path / "no-tasks").exists()


def test_judge_check_names_a_gold_file_it_cannot_use(tmp_path):
    judge = tmp_path / "judge.yaml"
    judge.write_text(yaml.safe_dump(UNREACHABLE))
    res = invoke("reward", "judge-check", "--judge", str(judge), "--gold", str(tmp_path / "nogold.jsonl"))
    assert res.exit_code == 78 and "rewards.judge_gold_path: cannot read" in res.output and "nogold" in res.output
    res = invoke("reward", "judge-check", "--judge", str(judge), "--gold", str(tmp_path))
    assert res.exit_code == 78 and "rewards.judge_gold_path: cannot read" in res.output
    gold = tmp_path / "gold.jsonl"
    gold.write_text('{"task_instruction": "x", "answer": "y", "correct": true}\n'
                    '{"task_instruction": "x", "answer": "y", "correct": "maybe"}\n')
    res = invoke("reward", "judge-check", "--judge", str(judge), "--gold", str(gold))
    assert res.exit_code == 78 and res.names(f"{gold}:2: not a labelled answer: correct")
    res = invoke("reward", "judge-check", "--judge", str(judge), "--max-fpr", "5", "--max-fnr", "-3")
    assert res.exit_code == 78 and "rewards.judge_max_fpr" in res.output and "rewards.judge_max_fnr" in res.output
    with pytest.raises(ValueError, match="valid boolean"):
        LabelledAnswer("x", "y", "maybe")  # type: ignore[arg-type]


async def test_a_judge_that_cannot_be_reached_is_reported_not_counted_as_refusing():
    from tryloop.rewards.judge import JudgeConfig

    report = await judge_check(JudgeConfig(**UNREACHABLE), [LabelledAnswer("What is 2+2?", "4", True),
                                                           LabelledAnswer("What is 2+2?", "5", False)])
    assert report.adversarial_failures == [] and not report.ok
    # the cases that reached the model (the rest fail their pre-checks) got no verdict: not refused
    assert len(report.adversarial_no_verdict) == len(adversarial_answers()) - 7
    assert report.no_verdict_reasons[0].startswith("judge call failed: LLMConnectionError")
    assert any(p.startswith("no verdict: judge call failed") for p in report.problems)


def test_judge_check_takes_its_settings_from_the_config(tmp_path):
    gold = tmp_path / "gold.jsonl"
    gold.write_text('{"task_instruction": "What is 2+2?", "answer": "4", "correct": true}\n')
    path = tmp_path / "tryloop.yaml"
    path.write_text(yaml.safe_dump({"rewards": {"spec": {"judge": UNREACHABLE}, "judge_gold_path": str(gold),
                                                "judge_max_fpr": 0.1}}))
    res = invoke("reward", "judge-check", "-c", str(path))
    assert res.exit_code == 1, res.output
    assert "all refused" not in res.output and "no verdict on 12 of 19" in res.output
    assert "judge call failed" in res.output and "1 of 1 gold answers" in res.output
    path.write_text(yaml.safe_dump({"rewards": {"judge_max_fpr": 0.1}}))
    res = invoke("reward", "judge-check", "-c", str(path))
    assert res.exit_code == 78 and "give --judge FILE or set rewards.spec.judge" in res.output
