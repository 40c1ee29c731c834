"""`tryloop bench train`: synchronous against overlapped training steps, the simulator's half in
seconds and (slow) the real half on a local multi-node Ray cluster."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from host import require_sandbox_host
from tryloop.bench import train as bench
from tryloop.cli.main import app

runner = CliRunner()


def _bench(*args: str):
    return runner.invoke(app, ["bench", "train", *args], terminal_width=200)


def test_sim_only_quick_writes_both_modes_per_preset_with_sensible_ratios(tmp_path):
    out = tmp_path / "sim.json"
    res = _bench("--sim-only", "--quick", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "simulator: synchronous vs overlapped" in res.output and "real run (results-overlap.json)" in res.output
    data = json.loads(out.read_text())
    assert data["benchmark"] == "overlap-sim" and tuple(data["presets"]) == bench.QUICK_PRESETS
    for name, p in data["presets"].items():
        sync, *overs = p["runs"]
        assert sync["mode"] == "synchronous" and sync["staleness"]["max"] == 0 and overs, name
        assert all(r["mode"] == "overlapped" for r in overs), name
        assert sync["episodes_consumed"] == overs[0]["episodes_consumed"], name
        for r in overs:
            assert r["speedup"] == pytest.approx(sync["makespan_s"] / r["makespan_s"], rel=1e-3), name
            assert r["staleness"]["max"] <= r["max_staleness"], name
        # tryloop train's pipeline (bound 1, one step ahead) hides some of the update, drops nothing
        first = overs[0]
        assert (first["max_staleness"], first["ahead"]) == (1, 1), name
        assert 1.0 < first["speedup"] < 2.0 and first["stale_dropped"] == 0, name
    # fitted to the committed real run: its synchronous pace within 10 %
    assert data["presets"]["real-run"]["sim_over_real_synchronous"]["step_interval_mean"] == pytest.approx(1, abs=0.1)
    assert data["presets"]["real-run"]["source"]["file"] == "results-overlap.json"


def test_sim_only_takes_the_real_run_from_another_file(tmp_path):
    real = tmp_path / "my-run.json"
    shutil.copy(bench.CHECKOUT_REAL, real)
    out = tmp_path / "sim.json"
    res = _bench("--sim-only", "--quick", "--preset", "real-run", "--from-real", str(real), "--out", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert list(data["presets"]) == ["real-run"] and data["presets"]["real-run"]["source"]["file"] == "my-run.json"


def test_a_missing_real_run_file_is_a_clear_error(tmp_path):
    missing = tmp_path / "none.json"
    out = tmp_path / "sim.json"
    res = _bench("--sim-only", "--from-real", str(missing), "--out", str(out))
    assert res.exit_code == 78, res.output
    text = " ".join(res.output.split())
    # A path longer than the terminal is folded across lines: compared without whitespace.
    assert str(missing) in "".join(text.split()) and "--real-only" in text and "Traceback" not in res.output
    assert not out.exists()
    # the presets that need no real run still run without it
    res = _bench("--sim-only", "--quick", "--preset", "gpu-4-fast-learner", "--from-real", str(missing))
    assert res.exit_code == 0, res.output


def test_a_broken_real_run_file_and_bad_choices_are_refused(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"date": "x"}))
    res = _bench("--sim-only", "--from-real", str(broken))
    assert res.exit_code == 78 and "not a real run's results" in " ".join(res.output.split())
    res = _bench("--sim-only", "--quick", "--preset", "gpu-64")
    assert res.exit_code == 78 and "gpu-4" in res.output
    res = _bench("--sim-only", "--real-only")
    assert res.exit_code == 78
    # Rows without the fields the fit needs, or no tokens at all: an error naming the file.
    real = json.loads(bench.CHECKOUT_REAL.read_text())
    for row in real["synchronous"]["rows"]:
        row["completion_tokens"] = 0
    empty = tmp_path / "no-tokens.json"
    empty.write_text(json.dumps(real))
    res = _bench("--sim-only", "--from-real", str(empty), "--preset", "real-run")
    assert res.exit_code == 78 and "no-tokens.json: its synchronous run cannot give" in " ".join(res.output.split())
    real = json.loads(bench.CHECKOUT_REAL.read_text())
    del real["synchronous"]["rows"][0]["time_generation_s"]
    empty.write_text(json.dumps(real))
    res = _bench("--sim-only", "--from-real", str(empty), "--preset", "real-run")
    assert res.exit_code == 78 and "KeyError" in res.output
    # A real run with no sandbox node would wait forever: refused before anything starts.
    res = _bench("--real-only", "--nodes", "0")
    assert res.exit_code == 78 and "nodes >= 1, got 0" in res.output


def test_the_default_real_run_is_the_checkout_file():
    assert bench.CHECKOUT_REAL.is_file()
    real, name = bench.load_real()
    assert name == "results-overlap.json" and real["settings"]["steps"] == len(real["synchronous"]["rows"])


@pytest.mark.slow
@pytest.mark.ray
def test_quick_real_run_then_the_simulator_fitted_to_it(tmp_path):
    """`tryloop bench train --quick`: 3 real steps of 2 episodes per mode on a local Ray cluster
    (a few minutes on 2 CPUs), then the simulator with that run's timings."""
    require_sandbox_host()
    out = tmp_path / "train.json"
    res = _bench("--quick", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "real run: 3 steps of 2 episodes" in res.output
    data = json.loads(out.read_text())
    real, sim = data["real"], data["sim"]
    assert data["benchmark"] == "train"
    for mode in ("synchronous", "overlapped"):
        assert real[mode]["steps"] == 3 and real[mode]["episodes"] == 6
        assert real[mode]["step_interval_s"]["p50"] > 0
    assert real["synchronous"]["staleness_max"] == 0 and real["overlapped"]["staleness_max"] <= 1
    assert all(r > 0 for r in real["ratios"].values())
    src = sim["presets"]["real-run"]["source"]
    assert src["file"] == "this invocation's real run" and src["measured"]["synchronous"]["wall_s"] == pytest.approx(
        real["synchronous"]["wall_s"])
    assert sim["presets"]["real-run"]["learner"]["steps"] == 3
