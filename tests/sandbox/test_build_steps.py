"""An image spec's steps: where `files` and `inputs` may be laid."""

from __future__ import annotations

import pytest

from tryloop.sandbox.build import Step


@pytest.mark.parametrize("dst", ["/opt/../../../tmp/escaped", "../escaped", "/opt/data/.."])
@pytest.mark.parametrize("kind", ["files", "inputs"])
def test_a_destination_that_leaves_the_image_root_is_refused(kind, dst):
    """The sources are copied under a temporary directory of the host at their destination: one
    with `..` in it would be written outside it, on the host."""
    with pytest.raises(ValueError, match=r"\.\."):
        Step(**{kind: {dst: "."}, **({"run": "true"} if kind == "inputs" else {})})


def test_plain_destinations_are_taken():
    assert Step(files={"/opt/data/words.txt": "words.txt", "opt/x": "."}).files
    assert Step(run="true", inputs={"/opt/tryloop/sdist": "."}).inputs
