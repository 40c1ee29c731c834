"""`tryloop bench reward --quick` end to end. No timing thresholds: this checks that every arm ran
on the reference solutions, every verdict passed, and the decoy run happened in the default arm."""

from __future__ import annotations

import io
import json

from rich.console import Console

from tryloop.config import TryloopConfig


def test_quick_reward_bench_times_every_arm(runtime_config, tmp_path):
    from tryloop.bench.reward import run

    out = tmp_path / "reward.json"
    console = Console(file=io.StringIO(), width=200)
    res = run(TryloopConfig(runtime=runtime_config), quick=True, out=out, console=console)

    assert json.loads(out.read_text()) == res
    assert res["samples"] == 4 and res["verdicts"] == {"pass": 8}
    for arm in ("bare_pytest", "verifier", "verifier_no_decoy"):
        assert 0 < res[arm]["p50_s"] <= res[arm]["p99_s"], arm
    assert res["decoy_runs"] == 4  # every default-arm verdict of a passing solution, none of the other arm
    assert "ratio, no decoy" in console.file.getvalue()
