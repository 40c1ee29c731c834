"""The task store and `tryloop tasks export` on bad input: the file or setting at fault is
named, and nothing a user wrote is deleted."""

from __future__ import annotations

import json
import re

import pytest
from test_store_splits import make_task
from typer.testing import CliRunner

from tryloop.cli.main import app
from tryloop.errors import ConfigError, InputMissing
from tryloop.tasks.model import Task
from tryloop.tasks.sources import SourceError, export_harbor
from tryloop.tasks.store import StoreCorrupt, TaskStore


def invoke(*args: str):
    res = CliRunner().invoke(app, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception  # no traceback
    return res.exit_code, " ".join(re.sub(r"[│╭╮╰╯─]", " ", res.output).split())


def test_export_never_deletes_a_directory_that_is_not_a_task(tmp_path):
    store = TaskStore(tmp_path / "store")
    store.add(make_task(tmp_path / "w"))
    store.add(make_task(tmp_path / "w", name="add-times", bug=("a + b", "a * b")))
    mine = tmp_path / "mywork"
    mine.mkdir()
    (mine / "notes.txt").write_text("a week of work\n")
    code, out = invoke("tasks", "export", "calc/add-minus", str(mine), "--store", str(tmp_path / "store"))
    assert code == 65 and "not empty and not a task directory" in out
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    (tmp_path / "afile").write_text("x")
    code, out = invoke("tasks", "export", "calc/add-minus", str(tmp_path / "afile"), "--store", str(tmp_path / "store"))
    assert code == 65 and "exists and is not a directory" in out and (tmp_path / "afile").read_text() == "x"
    # a new directory, an empty one, and an earlier export (replaced) are fine
    for dest, ref in (("new", "calc/add-minus"), ("mywork/empty", "calc/add-minus"), ("new", "calc/add-times")):
        (tmp_path / "mywork" / "empty").mkdir(exist_ok=True)
        code, out = invoke("tasks", "export", ref, str(tmp_path / dest), "--store", str(tmp_path / "store"))
        assert code == 0, out
        assert Task.load(tmp_path / dest).meta.id == ref
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no staging left behind


def test_a_failed_export_leaves_the_earlier_one(tmp_path, monkeypatch):
    task = make_task(tmp_path / "w")
    out = export_harbor(task, tmp_path / "out")
    (out / "NOTES.md").write_text("added to the export by hand\n")
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    monkeypatch.setattr(Task, "save_meta", lambda self: (_ for _ in ()).throw(OSError(28, "No space left")))
    with pytest.raises(OSError, match="No space"):
        export_harbor(task, tmp_path / "out")
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
    with pytest.raises(SourceError, match="not a directory"):
        export_harbor(task, tmp_path / "out" / "task.toml" / "below")


@pytest.mark.parametrize("doc, problem", [
    ([], "a JSON object is needed, not list"),
    ({"id": "calc/x"}, "no 'fingerprint' field"),
    ({"id": 5, "fingerprint": "f"}, "id and fingerprint must be strings"),
    ({"id": "calc/x", "fingerprint": "f", "added": 1.0, "meta": {"id": 3}}, "meta.id: Input should be a valid string"),
])
def test_an_index_file_of_the_wrong_shape_is_named(tmp_path, doc, problem):
    store = TaskStore(tmp_path / "store")
    e = store.add(make_task(tmp_path / "w"))
    index = tmp_path / "store" / "index" / f"{e.fingerprint}.json"
    index.write_text(json.dumps(doc))
    with pytest.raises(StoreCorrupt, match=rf"task store file {index} is not an index entry \(.*{problem}"):
        store.entries()
    with pytest.raises(StoreCorrupt, match=str(index)):
        store.get(e.fingerprint)                                 # the entry's own file, read alone
    code, out = invoke("tasks", "list", "--store", str(tmp_path / "store"))
    assert code == 65 and str(index) in out.replace(" ", "")     # (the long path is wrapped)


def test_other_store_files_of_the_wrong_shape_are_named(tmp_path):
    store = TaskStore(tmp_path / "store")
    e = store.add(make_task(tmp_path / "w"))
    stats = tmp_path / "store" / "stats" / f"{e.fingerprint}.json"
    stats.write_text("[]")
    with pytest.raises(StoreCorrupt, match=rf"{stats} holds a JSON list, not an object"):
        store.record_pass_rate(e.fingerprint, "p", 1, 2)
    (tmp_path / "store" / "rejections.jsonl").write_text('"just a string"\n')
    with pytest.raises(StoreCorrupt, match=r"rejections.jsonl, line 1 holds a JSON str"):
        store.decided_ids("mutation")


def test_a_store_url_that_cannot_be_a_store(tmp_path):
    with pytest.raises(ConfigError, match="tasks.store_url: empty"):
        TaskStore("")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match="cannot be a task store"):
        TaskStore(tmp_path / "afile")
    with pytest.raises(InputMissing, match="tasks.store_url: no task store at .*no such directory"):
        TaskStore(tmp_path / "typo", create=False)
    assert not (tmp_path / "typo").exists()
    with pytest.raises(InputMissing, match="not a directory"):
        TaskStore(tmp_path / "afile", create=False)
    TaskStore(tmp_path / "store")
    assert TaskStore(tmp_path / "store", create=False).entries() == []
