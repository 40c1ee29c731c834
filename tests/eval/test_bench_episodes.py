"""`tryloop bench episodes --quick` end to end. No timing thresholds: the numbers depend on the
machine; this checks that every row ran, every oracle episode passed, and the shares add up."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from tryloop.config import TryloopConfig


@pytest.mark.slow
def test_quick_episode_bench_fills_every_row(runtime_config, tmp_path):
    from tryloop.bench.episodes import LEVELS, run

    out = tmp_path / "episodes.json"
    console = Console(file=io.StringIO(), width=200)
    res = run(TryloopConfig(runtime=runtime_config), quick=True, out=out, console=console)

    assert json.loads(out.read_text()) == res
    assert len(res["tasks"]) == 3 and any(t.startswith("humaneval/") for t in res["tasks"])
    assert set(res["levels"]) == {str(c) for c in LEVELS}
    for level in res["levels"].values():
        assert level["episodes"] == 3 and level["verdicts"] == {"pass": 3}
        assert level["episodes_per_s"] > 0 and level["latency"]["p50_s"] <= level["latency"]["p99_s"]
        assert 0 < level["overhead_share"] < 1
        parts = level["breakdown_mean_s"]
        assert parts["tests_agent"] > 0 and parts["tests_verifier"] > 0
    assert res["bare"]["p50_s"] > 0 and res["ratio_p50"] > 0
    assert [r["task"] for r in res["per_task"]] == res["tasks"]
    printed = console.file.getvalue()
    assert "tryloop share" in printed and "bare run_tests" in printed
