"""`tryloop image ...`: build, import, ls, inspect, rm, prune."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tryloop.cli.main import ConfigOpt, console, load_config, run_cli
from tryloop.errors import ConfigError

app = typer.Typer(help="Sandbox images: Dockerfile builds, OCI archives, listing and garbage collection.",
                  no_args_is_help=True)

StoreDir = Annotated[Path | None, typer.Option("--store-dir", help="runtime.store_dir")]
Tag = Annotated[str | None, typer.Option("--tag", "-t", help="images.tag: name the image (name[:tag], :latest "
                                                              "if none)")]
JsonOut = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _build_args(items: list[str] | None) -> dict[str, str] | None:
    if not items:
        return None
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ConfigError(f"--build-arg {item!r}: expected NAME=VALUE")
        out[k] = v
    return out


def _store(cfg, *, create: bool = True):
    """The image store (`runtime.store_dir`); `create=False` for commands that read or clean up, so
    that a mistyped path is an error naming it rather than a new, empty store."""
    from tryloop.sandbox.layers import LayerStore

    return run_cli(LayerStore, cfg.runtime.store_dir, create=create)


@app.command()
def build(
    context: Annotated[Path, typer.Argument(help="the build context (COPY and ADD sources)")],
    file: Annotated[str | None, typer.Option("--file", "-f", help="images.dockerfile")] = None,
    tag: Tag = None,
    build_arg: Annotated[list[str] | None, typer.Option("--build-arg", help="images.build_args (NAME=VALUE, repeat)")] = None,
    network: Annotated[bool | None, typer.Option("--network/--no-network", help="images.build_network")] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", help="images.build_timeout_s")] = None,
    memory_mb: Annotated[int | None, typer.Option("--memory-mb", help="images.build_memory_mb")] = None,
    quiet: Annotated[bool | None, typer.Option("--quiet/--no-quiet", "-q", help="images.quiet: do not stream RUN "
                                                                              "output")] = None,
    config: ConfigOpt = None, store_dir: StoreDir = None,
) -> None:
    """Build a Dockerfile into an image; each step is a cached layer. Prints the image id."""
    from tryloop.sandbox import SandboxRuntime
    from tryloop.sandbox.dockerfile import BuildOptions, build_dockerfile

    args = run_cli(_build_args, build_arg)
    cfg = run_cli(load_config, config, {
        "images.dockerfile": file, "images.build_args": args, "images.build_network": network,
        "images.build_timeout_s": timeout, "images.build_memory_mb": memory_mb, "runtime.store_dir": store_dir,
        "images.tag": tag, "images.quiet": quiet})
    ic = cfg.images
    tag, quiet = ic.tag, ic.quiet
    dockerfile = Path(ic.dockerfile)
    if not dockerfile.is_absolute():
        dockerfile = (Path.cwd() / dockerfile) if file is not None else context / dockerfile
    rt = run_cli(SandboxRuntime, cfg.runtime)
    opts = BuildOptions(build_args=dict(ic.build_args), network=ic.build_network, timeout_s=ic.build_timeout_s,
                        memory_mb=ic.build_memory_mb, disk_mb=ic.build_disk_mb)
    t0 = time.monotonic()
    counts = {"built": 0, "cached": 0}

    def step(i: int, n: int, text: str, status: str) -> None:
        counts[status] = counts.get(status, 0) + 1
        style = {"built": "green", "cached": "dim"}.get(status)
        mark = f"[{style}]{status}[/]" if style else ""
        console.print(f"  [bold]{i}/{n}[/] {text[:110]} {mark}", highlight=False)

    def output(_name: str, chunk: bytes) -> None:
        if not quiet:
            sys.stderr.write(chunk.decode(errors="replace"))

    image = run_cli(lambda: asyncio.run(build_dockerfile(
        rt, context, dockerfile, options=opts, tag=tag, on_step=step, on_output=output)))
    took = time.monotonic() - t0
    console.print(f"image [bold]{image.id[:12]}[/] ({len(image.layers)} layers; {counts['built']} step(s) built, "
                  f"{counts['cached']} cached) in {took:.1f}s" + (f", tagged {tag}" if tag else ""))
    print(image.id)


@app.command("import")
def import_cmd(
    archive: Annotated[Path, typer.Argument(help="a `docker save` tarball or an OCI image layout (directory or "
                                                 "tar); - reads a tarball from stdin")],
    ref: Annotated[str | None, typer.Argument(help="which image of a multi-image archive (tag or ref name)")] = None,
    tag: Tag = None,
    config: ConfigOpt = None, store_dir: StoreDir = None,
) -> None:
    """Import an OCI image archive: its layers into the store, its config as the image's."""
    import shutil
    import tempfile

    from tryloop.sandbox.catalog import tag_image
    from tryloop.sandbox.oci import import_archive

    cfg = run_cli(load_config, config, {"runtime.store_dir": store_dir, "images.tag": tag})
    tag = cfg.images.tag
    store = _store(cfg)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=store.tmp_dir) as tmp:
        if str(archive) == "-":  # `docker save IMAGE | tryloop image import -`
            archive = Path(tmp) / "stdin.tar"
            with open(archive, "wb") as f:
                shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
        image = run_cli(import_archive, store, archive, ref=ref,
                        on_layer=lambda i, n, d: console.print(f"  layer {i}/{n} {d[:12]}"))
    names = [tag] if tag else [t for t in image.meta.get("tags", []) if t]
    for name in names:
        run_cli(lambda n=name: _tag(tag_image, store, n, image.id))
    skipped = image.meta.get("skipped") or []
    if skipped:
        console.print(f"  [yellow]{len(skipped)} device node(s)/FIFO(s) not unpacked[/] (sandboxes have their own /dev)")
    console.print(f"image [bold]{image.id[:12]}[/] ({len(image.layers)} layers) in {time.monotonic() - t0:.1f}s"
                  + (f", tagged {', '.join(names)}" if names else ""))
    print(image.id)


def _tag(tag_image, store, name: str, image_id: str) -> str:
    try:
        return tag_image(store, name, image_id)
    except ValueError as e:
        raise ConfigError(str(e)) from None


@app.command()
def debian(
    packages: Annotated[list[str] | None, typer.Argument(help="packages on top of the Essential set")] = None,
    tag: Tag = None,
    quiet: Annotated[bool | None, typer.Option("--quiet/--no-quiet", "-q", help="images.quiet: do not stream the "
                                                                              "maintainer scripts' output")] = None,
    config: ConfigOpt = None, store_dir: StoreDir = None,
) -> None:
    """A Debian root of the host's release: Essential packages plus PACKAGES, cached by the
    resolved package list's digest. Prints the image id."""
    from tryloop.sandbox import SandboxRuntime
    from tryloop.sandbox.catalog import tag_image
    from tryloop.sandbox.debian import debian_root

    cfg = run_cli(load_config, config, {"runtime.store_dir": store_dir, "images.tag": tag, "images.quiet": quiet})
    tag, quiet = cfg.images.tag, cfg.images.quiet
    rt = run_cli(SandboxRuntime, cfg.runtime)
    t0 = time.monotonic()

    def output(_name: str, chunk: bytes) -> None:
        if not quiet:
            sys.stderr.write(chunk.decode(errors="replace"))

    image = run_cli(lambda: asyncio.run(debian_root(
        rt, list(packages or []), on_step=lambda m: console.print(f"  {m}"), on_output=output)))
    if tag:
        run_cli(lambda: _tag(tag_image, rt.store, tag, image.id))
    console.print(f"image [bold]{image.id[:12]}[/] ({image.meta.get('installed')} packages, "
                  f"{len(image.layers)} layers) in {time.monotonic() - t0:.1f}s" + (f", tagged {tag}" if tag else ""))
    print(image.id)


@app.command("ls")
def ls(json_out: JsonOut = False, config: ConfigOpt = None, store_dir: StoreDir = None) -> None:
    """List the store's images with their names, layers and disk use."""
    from tryloop.sandbox.catalog import disk_usage, list_images

    cfg = run_cli(load_config, config, {"runtime.store_dir": store_dir})
    store = _store(cfg, create=False)
    rows = sorted(run_cli(list_images, store), key=lambda r: (not r.tags, r.tags, r.image.id))
    if json_out:
        print(json.dumps([{"id": r.image.id, "tags": r.tags, "kind": r.image.meta.get("kind"),
                           "layers": len(r.image.layers), "size_bytes": r.size_bytes,
                           "unique_bytes": r.unique_bytes, "snapshots": r.snapshots} for r in rows], indent=1))
        return
    table = Table(title=f"images in {store.root}")
    for col in ("id", "names", "kind", "layers", "size", "unique", "snapshots", "user", "workdir"):
        table.add_column(col, justify="right" if col in ("layers", "size", "unique", "snapshots") else "left")
    for r in rows:
        img = r.image
        table.add_row(img.id[:12], ", ".join(r.tags) or "-", str(img.meta.get("kind", "-")), str(len(img.layers)),
                      _size(r.size_bytes), _size(r.unique_bytes), str(r.snapshots), img.user or "-",
                      img.workdir or "-")
    console.print(table)
    console.print(f"layer store: {len(store.list())} layers, {_size(disk_usage(store))} on disk")


@app.command()
def inspect(ref: Annotated[str, typer.Argument(help="image name, id or id prefix")],
            config: ConfigOpt = None, store_dir: StoreDir = None) -> None:
    """Print an image's record (layers, env, user, workdir, metadata) as JSON."""
    from dataclasses import asdict

    from tryloop.sandbox.catalog import load_record, resolve, tags

    cfg = run_cli(load_config, config, {"runtime.store_dir": store_dir})
    store = _store(cfg, create=False)
    try:
        iid = run_cli(resolve, store, ref)
        image = run_cli(load_record, store, iid)
        if image is None:  # removed since it was named
            raise KeyError(f"no image named {ref!r} in the store at {store.root} (see `tryloop image ls`)")
    except KeyError as e:
        console.print(f"[bold red]error:[/] {e.args[0]}")
        raise typer.Exit(66) from None
    names = run_cli(tags, store)
    doc = asdict(image)
    doc["names"] = sorted(n for n, i in names.items() if i == image.id)
    doc["layer_bytes"] = {d: store.size_bytes(d) if store.has(d) else None for d in image.layers}
    print(json.dumps(doc, indent=1, sort_keys=True))


@app.command()
def rm(refs: Annotated[list[str], typer.Argument(help="image names, ids or id prefixes")],
       force: Annotated[bool, typer.Option("--force", help="also an image saved snapshots use")] = False,
       config: ConfigOpt = None, store_dir: StoreDir = None) -> None:
    """Remove images (or one of several names of an image); `prune` then frees their layers."""
    from tryloop.sandbox.catalog import remove_image

    cfg = run_cli(load_config, config, {"runtime.store_dir": store_dir})
    store = _store(cfg, create=False)
    failed = False
    for ref in refs:
        try:
            iid, names = run_cli(remove_image, store, ref, force=force)
        except (KeyError, ValueError) as e:
            console.print(f"[bold red]error:[/] {ref}: {e.args[0]}")
            failed = True
            continue
        console.print(f"removed {'name ' + ', '.join(names) if names else 'image'} {iid[:12]}")
    if failed:
        raise typer.Exit(66)


@app.command()
def prune(dry_run: Annotated[bool, typer.Option("--dry-run", help="report only")] = False,
          grace: Annotated[float | None, typer.Option("--grace", help="images.prune_grace_s")] = None,
          config: ConfigOpt = None, store_dir: StoreDir = None) -> None:
    """Remove layers no image and no snapshot references; reports the disk freed and left."""
    from tryloop.sandbox.catalog import disk_usage
    from tryloop.sandbox.catalog import prune as do_prune

    cfg = run_cli(load_config, config, {"runtime.store_dir": store_dir, "images.prune_grace_s": grace})
    store = _store(cfg, create=False)
    rep = run_cli(do_prune, store, grace_s=cfg.images.prune_grace_s, dry_run=dry_run)
    table = Table(title=("would prune" if dry_run else "pruned") + f" {store.root}")
    for col in ("", "layers", "disk"):
        table.add_column(col, justify="right" if col else "left")
    table.add_row("removed" if not dry_run else "to remove", str(rep.layers_removed), _size(rep.bytes_freed))
    table.add_row("kept", str(rep.layers_kept), _size(rep.bytes_kept))
    table.add_row("  of which recent (grace)", str(rep.young_kept), "")
    table.add_row("build-cache entries dropped", str(rep.cache_entries_removed), "")
    console.print(table)
    console.print(f"layer store now: {_size(disk_usage(store))} on disk")
