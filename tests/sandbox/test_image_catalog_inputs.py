"""`tryloop image ls | inspect | prune | rm` over a damaged image record or a mistyped store:
the file or setting is named, and prune removes nothing while a record cannot be read."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from tryloop.cli.main import app
from tryloop.sandbox.catalog import list_images, prune, tags
from tryloop.sandbox.images import Image, ImageError, save_image
from tryloop.sandbox.layers import LayerError, LayerStore


def invoke(*args: str):
    res = CliRunner().invoke(app, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception  # no traceback
    return res.exit_code, "".join(re.sub(r"[│╭╮╰╯─]", " ", res.output).split())


@pytest.fixture
def store(tmp_path):
    """A layer store with one image of one layer, installed long enough ago for prune."""
    store = LayerStore(tmp_path / "store")
    src = tmp_path / "root"
    (src / "etc").mkdir(parents=True)
    (src / "etc" / "hostname").write_text("box\n")
    layer = store.add_tree(src)
    save_image(store, Image(id="a" * 64, layers=(layer,)))
    return store


def config(tmp_path, store_dir) -> str:
    path = tmp_path / "tryloop.yaml"
    path.write_text(yaml.safe_dump({"runtime": {"store_dir": str(store_dir)}}))
    return str(path)


@pytest.mark.parametrize("damage", ["truncate", "[]", '{"id": "x"}', b"\xff\xfe"])
def test_an_unreadable_image_record_is_named_and_its_layers_are_kept(store, tmp_path, damage):
    record = store.root / "images" / f"{'a' * 64}.json"
    if damage == "truncate":
        record.write_text(record.read_text()[:50])
    else:
        record.write_bytes(damage if isinstance(damage, bytes) else damage.encode())
    layers = store.list()
    with pytest.raises(ImageError, match=rf"image record {record} cannot be read"):
        list_images(store)
    with pytest.raises(ImageError, match=str(record)):
        prune(store, grace_s=0)
    assert store.list() == layers
    cfg = config(tmp_path, store.root)
    for args in (["ls"], ["inspect", "aaaaaa"], ["prune", "--grace", "0"]):
        code, out = invoke("image", *args, "-c", cfg)
        assert code == 65 and f"imagerecord{record}cannotberead" in out, (args, out)
    assert store.list() == layers


def test_a_damaged_names_file_or_snapshot_record_stops_prune(store, tmp_path):
    names = store.root / "images" / "tags.json"
    names.write_text('["base:1"]')
    with pytest.raises(ImageError, match=rf"image names file {names}"):
        tags(store)
    names.unlink()
    snap = store.snapshots_dir / f"{'b' * 64}.json"
    snap.write_text("{")
    with pytest.raises(LayerError, match="corrupt snapshot record"):
        prune(store, grace_s=0)
    assert len(store.list()) == 1


def test_image_commands_never_make_a_store_where_a_path_was_mistyped(store, tmp_path):
    (tmp_path / "afile").write_text("x")
    for where, why in (("typo", "nosuchdirectory"), ("afile", "notadirectory"), ("root", "nolayers/")):
        cfg = config(tmp_path, tmp_path / where)
        for args in (["ls"], ["inspect", "base"], ["rm", "base"], ["prune"]):
            code, out = invoke("image", *args, "-c", cfg)
            assert code == 66 and "runtime.store_dir:noimagestoreat" in out and why in out, (where, args, out)
    assert not (tmp_path / "typo").exists() and not (tmp_path / "root" / "layers").exists()
    with pytest.raises(LayerError, match="cannot be a layer store"):
        LayerStore(tmp_path / "afile")
    assert json.loads((store.root / "images" / f"{'a' * 64}.json").read_text())["id"] == "a" * 64
