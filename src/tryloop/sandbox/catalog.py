"""The images of a layer store: names, listing, removal and garbage collection.

Images are records under `images/<id>.json` (see `images.save_image`); names ("tag"s,
`name[:tag]`, `:latest` when no tag is given) map to ids in `images/tags.json`. An
image can be named by a tag, its full id or a unique prefix of at least 6 hex digits.

`prune` removes the layers that no image and no snapshot references, and the build
cache entries that pointed at them. Layers installed within the last `grace_s`
seconds are kept: a build in progress holds layers that no record names yet.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from tryloop.sandbox.images import Image, ImageError, load_image
from tryloop.sandbox.layers import LayerError, LayerStore, Snapshot, SnapshotNotFound

_HEX = re.compile(r"[0-9a-f]{6,64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*(:[A-Za-z0-9._-]+)?")


def normalize_tag(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"image name {name!r} is not valid (letters, digits, . _ - /, then an optional :tag)")
    return name if ":" in name else f"{name}:latest"


def _tags_file(store: LayerStore) -> Path:
    return store.root / "images" / "tags.json"


def tags(store: LayerStore) -> dict[str, str]:
    path = _tags_file(store)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        raise ImageError(f"image names file {path} cannot be read ({e}); restore it, or remove it to drop "
                         "every name (the images stay, by id)") from None
    if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
        raise ImageError(f"image names file {path} is not an object of name: image id; restore it, or remove it "
                         "to drop every name (the images stay, by id)")
    return doc


def _write_tags(store: LayerStore, t: dict[str, str]) -> None:
    p = _tags_file(store)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".tags.{os.getpid()}")
    tmp.write_text(json.dumps(t, sort_keys=True, indent=1))
    os.replace(tmp, p)


def tag_image(store: LayerStore, name: str, image_id: str) -> str:
    name = normalize_tag(name)
    load_image(store, image_id)  # must exist
    t = tags(store)
    t[name] = image_id
    _write_tags(store, t)
    return name


def image_ids(store: LayerStore) -> list[str]:
    d = store.root / "images"
    if not d.is_dir():
        return []
    return sorted(n[:-5] for n in os.listdir(d) if n.endswith(".json") and re.fullmatch(r"[0-9a-f]{64}", n[:-5]))


def resolve(store: LayerStore, ref: str) -> str:
    """The id of the image named `ref` (a tag, an id or an id prefix); KeyError if none."""
    t = tags(store)
    for name in (ref, f"{ref}:latest"):
        if name in t:
            return t[name]
    if _HEX.fullmatch(ref):
        hits = [i for i in image_ids(store) if i.startswith(ref)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise KeyError(f"image id prefix {ref!r} is ambiguous ({len(hits)} images)")
    raise KeyError(f"no image named {ref!r} in the store at {store.root} (see `tryloop image ls`)")


def load_record(store: LayerStore, image_id: str) -> Image | None:
    """The image record `image_id`, None when it is gone (removed since it was listed), or
    ImageError naming the file when it cannot be read: a record that is skipped instead
    would hide the image, and `prune` would take its layers."""
    path = store.root / "images" / f"{image_id}.json"
    try:
        return load_image(store, image_id)
    except KeyError as e:
        if not path.exists():
            return None
        problem = f"no {e.args[0]!r} field"
    except (OSError, ValueError, TypeError, AttributeError) as e:  # UnicodeDecodeError is a ValueError
        problem = str(e)
    raise ImageError(f"image record {path} cannot be read ({problem}); nothing was changed: restore it, or remove "
                     "the file to drop the image (its layers go at the next `tryloop image prune`)")


def _images(store: LayerStore) -> list[Image]:
    """Every image record of the store (ImageError if one cannot be read)."""
    return [img for iid in image_ids(store) if (img := load_record(store, iid)) is not None]


def _snapshots(store: LayerStore) -> list[Snapshot]:
    """Every saved snapshot, on disk or in memory; a corrupt record is a LayerError naming it,
    never skipped (its layers would look unused)."""
    out = []
    for sid in store.list_snapshots():
        with contextlib.suppress(SnapshotNotFound):  # removed since it was listed
            out.append(store.load_snapshot(sid))
    return out


def _snapshot_images(store: LayerStore) -> tuple[set[str], set[str]]:
    """(images, layers) referenced by saved snapshots."""
    images: set[str] = set()
    layers: set[str] = set()
    for snap in _snapshots(store):
        images.add(snap.image)
        layers.update(snap.layers)
    return images, layers


def _layer_bytes(store: LayerStore, digest: str, cache: dict[str, int]) -> int:
    """Disk blocks of a layer (what removing it frees)."""
    if digest not in cache:
        total = 0
        with contextlib.suppress(FileNotFoundError):
            for dirpath, dirs, files in os.walk(store.path(digest)):
                for name in dirs + files:
                    with contextlib.suppress(FileNotFoundError):
                        total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
        cache[digest] = total
    return cache[digest]


@dataclass
class ImageRow:
    image: Image
    tags: list[str]
    size_bytes: int  # disk of its layers
    unique_bytes: int  # disk of the layers no other image shares
    snapshots: int


def list_images(store: LayerStore) -> list[ImageRow]:
    t = tags(store)
    by_id: dict[str, list[str]] = {}
    for name, iid in t.items():
        by_id.setdefault(iid, []).append(name)
    images = _images(store)
    uses: dict[str, int] = {}
    for img in images:
        for layer in set(img.layers):
            uses[layer] = uses.get(layer, 0) + 1
    snap_count: dict[str, int] = {}
    for snap in _snapshots(store):
        snap_count[snap.image] = snap_count.get(snap.image, 0) + 1
    cache: dict[str, int] = {}
    rows = []
    for img in images:
        present = [ly for ly in set(img.layers) if store.has(ly)]
        rows.append(ImageRow(img, sorted(by_id.get(img.id, [])),
                             sum(_layer_bytes(store, ly, cache) for ly in present),
                             sum(_layer_bytes(store, ly, cache) for ly in present if uses[ly] == 1),
                             snap_count.get(img.id, 0)))
    return rows


def remove_image(store: LayerStore, ref: str, *, force: bool = False) -> tuple[str, list[str]]:
    """Remove an image record and its names; its layers go at the next `prune`.

    Refused while a saved snapshot is built on it, unless `force`. A name that is not
    the only one of its image removes just the name. Returns (id, names removed)."""
    t = tags(store)
    iid = resolve(store, ref)
    names = sorted(n for n, i in t.items() if i == iid)
    name = ref if ref in t else f"{ref}:latest" if f"{ref}:latest" in t else None
    if name is not None and len(names) > 1:
        del t[name]
        _write_tags(store, t)
        return iid, [name]
    used, _ = _snapshot_images(store)
    if iid in used and not force:
        raise ValueError(f"image {iid[:12]} is used by saved snapshots; remove them first or force")
    for n in names:
        del t[n]
    _write_tags(store, t)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(store.root / "images" / f"{iid}.json")
    return iid, names


@dataclass
class PruneReport:
    layers_removed: int = 0
    bytes_freed: int = 0
    layers_kept: int = 0
    bytes_kept: int = 0
    young_kept: int = 0
    cache_entries_removed: int = 0
    removed: list[str] = field(default_factory=list)


def prune(store: LayerStore, *, grace_s: float = 600.0, dry_run: bool = False) -> PruneReport:
    """Remove layers no image and no snapshot references (see the module doc)."""
    keep: set[str] = set()
    for img in _images(store):  # an unreadable record stops the prune before anything is removed
        keep.update(img.layers)
    _, snap_layers = _snapshot_images(store)
    keep |= snap_layers
    rep = PruneReport()
    cache: dict[str, int] = {}
    now = time.time()
    for digest in store.list():
        size = _layer_bytes(store, digest, cache)
        if digest in keep:
            rep.layers_kept += 1
            rep.bytes_kept += size
            continue
        try:
            young = now - os.lstat(store.layers_dir / digest).st_ctime < grace_s
        except FileNotFoundError:
            continue
        if young:
            rep.young_kept += 1
            rep.layers_kept += 1
            rep.bytes_kept += size
            continue
        rep.removed.append(digest)
        rep.layers_removed += 1
        rep.bytes_freed += size
        if not dry_run:
            with contextlib.suppress(LayerError, KeyError, FileNotFoundError):
                store.remove(digest)
    removed = set(rep.removed)
    cache_dir = store.root / "build-cache"
    if cache_dir.is_dir():
        for entry in os.scandir(cache_dir):
            if not entry.is_file(follow_symlinks=False) or entry.name.startswith("."):
                continue
            with contextlib.suppress(OSError):
                layer = Path(entry.path).read_text().strip()
                if layer and (layer in removed or not store.has(layer)):
                    rep.cache_entries_removed += 1
                    if not dry_run:
                        os.unlink(entry.path)
    return rep


def disk_usage(store: LayerStore) -> int:
    """Disk blocks of every layer on disk."""
    cache: dict[str, int] = {}
    return sum(_layer_bytes(store, d, cache) for d in store.list())
