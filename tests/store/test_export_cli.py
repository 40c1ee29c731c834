"""`tryloop export hf|verl|sft` as a real subprocess; the HF export read back by the `datasets` library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from tryloop.store.trajectories import TrajectoryStore

TRYLOOP = Path(sys.executable).parent / "tryloop"
ENV = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"}


def tryloop(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TRYLOOP), "export", *args], capture_output=True, text=True, env=ENV, timeout=120)


def _store(tmp_path, make_trajectory) -> Path:
    url = tmp_path / "trajectories"
    store = TrajectoryStore(url)
    store.write([make_trajectory(f"a{i}", step=i % 2) for i in range(4)])
    store.write([make_trajectory("b0", run_id="run-2", step=0, verdict="fail", reward=0.0)])
    return url


def test_hf_export_loads_with_datasets(tmp_path, make_trajectory):
    import datasets

    url = _store(tmp_path, make_trajectory)
    out = tmp_path / "hf"
    r = tryloop("hf", str(out), "--store", str(url), "--run", "run-1", "--step", "1", "--split", "test", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["format"] == "hf" and summary["rows"] == 2 and summary["run_id"] == "run-1"
    assert summary["steps"] == [1] and summary["path"] == str(out) and len(summary["files"]) == 1
    ds = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf-cache"))      # reads the card's configs
    assert list(ds) == ["test"] and ds["test"].num_rows == 2
    row = ds["test"][0]
    assert row["run_id"] == "run-1" and row["step"] == 1 and row["token_ids"] == make_trajectory().token_ids
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert row["messages"][2]["tool_calls"][0]["function"]["name"] == "shell"
    assert ds["test"].features["reward"].dtype == "float64"


def test_verl_and_sft_exports(tmp_path, make_trajectory):
    url = _store(tmp_path, make_trajectory)
    r = tryloop("verl", str(tmp_path / "verl"), "--store", str(url), "--agent-name", "tool_agent", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["rows"] == 1 and summary["files"] == [str(tmp_path / "verl" / "train.parquet")]
    table = pq.read_table(summary["files"][0]).to_pylist()
    assert table[0]["agent_name"] == "tool_agent" and table[0]["extra_info"]["episodes"] == 5
    r = tryloop("sft", str(tmp_path / "sft"), "--store", str(url), "--format", "jsonl", "--name", "chat")
    assert r.returncode == 0, r.stderr
    assert "exported 4 successful trajectories" in r.stderr
    lines = (tmp_path / "sft" / "chat.jsonl").read_text().splitlines()
    assert len(lines) == 4 and not (tmp_path / "sft" / "chat.parquet").exists()


def test_missing_store_run_and_step_are_named(tmp_path, make_trajectory):
    missing = tmp_path / "nowhere"
    r = tryloop("hf", str(tmp_path / "out"), "--store", str(missing))
    assert r.returncode == 66 and "store.trajectories_url" in r.stderr and str(missing) in r.stderr
    assert not missing.exists(), "a missing store is not created"
    url = _store(tmp_path, make_trajectory)
    r = tryloop("sft", str(tmp_path / "out"), "--store", str(url), "--run", "run-9")
    assert r.returncode == 66 and "no run 'run-9'" in r.stderr and "run-1, run-2" in r.stderr
    r = tryloop("verl", str(tmp_path / "out"), "--store", str(url), "--run", "run-2", "--step", "1")
    assert r.returncode == 66 and "no step 1 in run 'run-2'" in r.stderr and "steps there: 0" in r.stderr
    r = tryloop("sft", str(tmp_path / "out"), "--store", str(url), "--format", "csv")
    assert r.returncode == 78 and "store.export.sft_formats" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()
