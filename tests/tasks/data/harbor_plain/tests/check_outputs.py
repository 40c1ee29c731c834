import sys

sys.path.insert(0, "/app")

from textutil import slugify  # noqa: E402


def test_examples_file():
    with open("/app/data/examples.tsv") as f:
        for line in f:
            text, expected = line.rstrip("\n").split("\t")
            assert slugify(text) == expected


def test_edges():
    assert slugify("--A--b--") == "a-b"
    assert slugify("") == ""
