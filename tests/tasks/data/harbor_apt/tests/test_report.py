import os
import shutil

from report import count_files


def test_tree_comes_from_the_image():
    assert shutil.which("tree") == "/usr/bin/tree"


def test_count_files(tmp_path):
    for rel in ("a.txt", "b.txt", "sub/c.txt"):
        os.makedirs(os.path.dirname(tmp_path / rel), exist_ok=True)
        (tmp_path / rel).write_text("x")
    assert count_files(str(tmp_path)) == 3
