"""`tryloop bench sandbox --quick` runs end to end with tiny numbers. No timing assertions:
the numbers depend on the machine; this only checks every row ran and nothing leaked."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from host import require_sandbox_host
from tryloop.config import TryloopConfig


@pytest.mark.slow
def test_quick_bench_covers_every_row_and_leaks_nothing(runtime_config, tmp_path):
    require_sandbox_host()
    from tryloop.bench.sandbox import LATENCY_ROWS, LEAK_CHECKS, run

    out = tmp_path / "results.json"
    console = Console(file=io.StringIO(), width=200)
    run(TryloopConfig(runtime=runtime_config), quick=True, density=20, cycles=100, out=out,
        console=console)

    data = json.loads(out.read_text())
    assert set(data["rows"]) == set(LATENCY_ROWS)
    for key, row in data["rows"].items():
        assert row["ours"]["n"] > 0, key
        assert row["ours"]["p50_ms"] > 0, key
        assert row["baselines"], key
    for key in ("cold_create", "exec_true", "exec_python", "reset", "fork", "warm_acquire"):
        assert all(b["n"] > 0 or b.get("unavailable") for b in data["rows"][key]["baselines"]), key

    density = data["density"]
    assert density["n"] == 20
    assert density["held"] == 20 and density["responsive"] == 20 and density["n_errors"] == 0

    leaks = data["leaks"]
    assert leaks["cycles"] == 100
    assert leaks["hits"] + leaks["misses"] == 100
    assert set(leaks["counts"]) == set(LEAK_CHECKS)
    assert leaks["counts"] == dict.fromkeys(LEAK_CHECKS, 0)

    printed = console.file.getvalue()
    assert "cold create" in printed and "leaks after 100" in printed
