"""The run's live state file: the registry's samples written atomically while the run goes, and
once more, marked ended, when it stops."""

from __future__ import annotations

import json
import time

from prometheus_client import CollectorRegistry, Gauge, Histogram

from tryloop.telemetry.live import live_state, snapshot


def test_state_file_follows_the_registry_and_ends_not_live(tmp_path):
    registry = CollectorRegistry()
    idle = Gauge("tryloop_pool_idle", "idle", ["pool"], registry=registry)
    Histogram("tryloop_pool_acquire_seconds", "acquire", registry=registry).observe(0.2)
    idle.labels(pool="p").set(1)
    with live_state(tmp_path, registry, every_s=0.05) as path:
        first = json.loads(path.read_text()) if path.exists() else None
        idle.labels(pool="p").set(4)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            doc = json.loads(path.read_text()) if path.exists() else {}
            if doc.get("metrics", {}).get("tryloop_pool_idle") == [{"labels": {"pool": "p"}, "value": 4.0}]:
                break
            time.sleep(0.02)
        assert doc["live"] is True and doc["every_s"] == 0.05
    assert first is None or first["live"] is True
    final = json.loads(path.read_text())
    assert final["live"] is False
    assert final["metrics"]["tryloop_pool_acquire_seconds_count"][0]["value"] == 1.0
    assert not any(name.endswith("_bucket") for name in final["metrics"])
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]      # no temporary file left


def test_snapshot_of_an_empty_registry():
    assert snapshot(CollectorRegistry()) == {}
