"""Checkpoints: model, optimizer, sampler state, RNG states and the run manifest, written atomically.

    <run_dir>/checkpoints/step-000007/{learner.pt, state.json}
    <run_dir>/checkpoints/LATEST        -> "step-000007"

A checkpoint directory is complete or absent: it is written under a temporary
name, fsynced and renamed; LATEST is replaced the same way afterwards. A kill
at any moment leaves the previous checkpoint usable.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from tryloop.store.trajectories import fsync_dir


def save(run_dir: Path, step: int, learner_state: dict[str, Any], state: dict[str, Any], keep: int = 2) -> Path:
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    tmp = root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(learner_state, tmp / "learner.pt")
    rng = {"python": random.getstate(), "torch": torch.get_rng_state().tolist()}
    (tmp / "state.json").write_text(json.dumps({**state, "step": step, "rng": rng}))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    final = root / name
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    latest_tmp = root / ".LATEST.tmp"
    latest_tmp.write_text(name)
    os.replace(latest_tmp, root / "LATEST")
    fsync_dir(root)
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "LATEST"
    if not pointer.exists():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    return path if (path / "state.json").exists() else None


def load(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(learner state, run state); restores the RNG states as a side effect."""
    state = json.loads((path / "state.json").read_text())
    learner_state = torch.load(path / "learner.pt", map_location="cpu", weights_only=False)
    py = state["rng"]["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    torch.set_rng_state(torch.tensor(state["rng"]["torch"], dtype=torch.uint8))
    return learner_state, state
