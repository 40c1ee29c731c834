"""The default image's id names the host's installation, and nothing about the process that asks."""

from __future__ import annotations

import subprocess
import sys

ASK = """
import sys
{before}
from tryloop.sandbox.images import host_image
from tryloop.sandbox.layers import LayerStore
print(host_image(LayerStore(sys.argv[1])).id)
"""


def _image_id(store: str, before: str = "") -> str:
    out = subprocess.run([sys.executable, "-c", ASK.format(before=before), store], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_host_image_id_does_not_depend_on_what_the_process_imported_first(tmp_path):
    """Ray puts folders of its own on sys.path when imported (a package among them): a trainer that
    computes the id before importing it and a rollout worker that computes it after must agree,
    or their reward versions differ."""
    store = str(tmp_path / "store")
    plain = _image_id(store)
    assert len(plain) == 64
    assert _image_id(store, "import ray") == plain
    # A folder of packages on this process's sys.path alone (as PYTHONPATH or Ray's would be): the
    # sandbox's Python does not see it, and the id does not change for it.
    extra = tmp_path / "extra" / "notinstalled-1.0.dist-info"
    extra.mkdir(parents=True)
    (extra / "METADATA").write_text("Metadata-Version: 2.1\nName: notinstalled\nVersion: 1.0\n")
    assert _image_id(store, f"sys.path.insert(0, {str(extra.parent)!r})") == plain
