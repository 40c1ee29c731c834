"""A run's live state on disk: its Prometheus registry (scheduler, warm pools, sessions, the train
loop's gauges) written as `state.json` in the run directory every few seconds while it goes.

`tryloop dashboard` reads the file to show the scheduler and pool state of a run without reaching
into the process: nothing needs a port, and the last state stays readable after the run ends.

    {"time": 1764585600.1, "pid": 4242, "live": true, "every_s": 2.0,
     "metrics": {"tryloop_pool_idle": [{"labels": {"pool": "..."}, "value": 3.0}], ...}}

`live` is false in the last write (the run ended); a state whose `time` is much older than
`every_s` while `live` is true belongs to a run that was killed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

STATE_FILE = "state.json"


def snapshot(registry: CollectorRegistry) -> dict[str, list[dict[str, Any]]]:
    """Every sample of the registry by name: [{"labels": {...}, "value": v}] (histogram buckets
    left out: their _count and _sum stay)."""
    return _samples(registry.collect())


def parse_exposition(text: str) -> dict[str, list[dict[str, Any]]]:
    """The same, from a Prometheus text exposition (what a /metrics endpoint serves)."""
    from prometheus_client.parser import text_string_to_metric_families

    return _samples(text_string_to_metric_families(text))


def _samples(families) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for family in families:
        for s in family.samples:
            if s.name.endswith("_bucket") or s.name.endswith("_created"):
                continue
            value = s.value if math.isfinite(s.value) else None
            out.setdefault(s.name, []).append({"labels": dict(s.labels), "value": value})
    return out


def write_state(path: Path, registry: CollectorRegistry, *, live: bool = True, every_s: float = 2.0) -> None:
    """One atomic write of the state file."""
    doc = {"time": time.time(), "pid": os.getpid(), "live": live, "every_s": every_s,
           "metrics": snapshot(registry)}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


@contextlib.contextmanager
def live_state(run_dir: Path, registry: CollectorRegistry, every_s: float = 2.0) -> Iterator[Path]:
    """Write `run_dir/state.json` every `every_s` seconds inside the block, and once more (not
    live) at its end. A failed write is retried at the next tick: it never stops the run."""
    path = Path(run_dir) / STATE_FILE
    stop = threading.Event()

    def loop() -> None:
        while True:
            with contextlib.suppress(OSError, ValueError):
                write_state(path, registry, every_s=every_s)
            if stop.wait(every_s):
                return

    thread = threading.Thread(target=loop, name="tryloop-live-state", daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        thread.join(10)
        with contextlib.suppress(OSError, ValueError):
            write_state(path, registry, live=False, every_s=every_s)
