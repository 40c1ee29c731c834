"""Disk kept in check: a learner checkpoint of the bundled model is 1.6 GB (weights and AdamW
moments), and the training tests write several into one module-scoped store. Each test's
checkpoints go when it ends, so the suite's peak disk is one test's, not their sum."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(autouse=True)
def _drop_checkpoints(request):
    yield
    if "train_root" in request.fixturenames:
        for ckpts in (request.getfixturevalue("train_root") / "runs").glob("*/checkpoints"):
            shutil.rmtree(ckpts, ignore_errors=True)
