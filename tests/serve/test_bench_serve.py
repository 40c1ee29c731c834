"""`tryloop bench serve` end to end at a small scale: both sides measured, verdicts real, nothing left behind."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from host import CGROUP_PARENT
from tryloop.config import TryloopConfig


@pytest.mark.slow
def test_bench_serve_small_run_leaves_nothing(tmp_path):
    from tryloop.bench.serve import run

    cfg = TryloopConfig.model_validate({"runtime": {"store_dir": str(tmp_path / "rt"),
                                                    "state_dir": str(tmp_path / "state"),
                                                    "cgroup_name": CGROUP_PARENT}})
    out = tmp_path / "res.json"
    run(cfg, sessions=6, steps=2, verify=2, out=out, console=Console(file=io.StringIO(), width=200))
    res = json.loads(out.read_text())
    served, local = res["served"], res["in_process"]
    assert served["errors"] == 0 and served["step"]["n"] == 12 and local["step"]["n"] == 12
    assert served["verdicts"] == {"pass": 2} and local["verdicts"] == {"pass": 2}
    assert res["left_behind"] == {"sandboxes": [], "threads": 0}
