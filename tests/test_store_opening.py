"""Every store a read-only command opens with `create=False` refuses a path that holds none with
`InputMissing` (exit status 66) naming the setting, and leaves nothing behind; with `create=True`
(the default) the same path becomes a store."""
from __future__ import annotations

import pytest

from tryloop.errors import InputMissing
from tryloop.sandbox.layers import LayerStore
from tryloop.store.trajectories import TrajectoryStore
from tryloop.tasks.store import TaskStore

STORES = [(TaskStore, "tasks.store_url: no task store at"),
          (TrajectoryStore, "store.trajectories_url: no trajectory store at"),
          (LayerStore, "runtime.store_dir: no image store at")]


@pytest.mark.parametrize(("cls", "message"), STORES, ids=lambda x: getattr(x, "__name__", ""))
def test_a_read_only_open_never_makes_a_store(tmp_path, cls, message):
    assert InputMissing.exit_code == 66
    (tmp_path / "afile").write_text("mine\n")
    for where, why in (("typo", "no such directory"), ("afile", "not a directory")):
        with pytest.raises(InputMissing, match=f"{message} .*{why}"):
            cls(tmp_path / where, create=False)
    assert not (tmp_path / "typo").exists() and (tmp_path / "afile").read_text() == "mine\n"
    cls(tmp_path / "made")                      # the default makes one ...
    cls(tmp_path / "made", create=False)        # ... which a read-only open then finds
