"""`tryloop export hf|verl|sft`: stored trajectories as datasets other tools train on."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from tryloop.cli.main import ConfigOpt, console, field_help, load_config, run_cli

app = typer.Typer(help="Export stored trajectories as datasets (see docs/trajectories.md).", no_args_is_help=True)

Out = Annotated[str, typer.Argument(help="where to write: a directory (hf, sft; verl writes <out>/<split>.parquet), "
                                         "local or an fsspec URL")]
Run = Annotated[str | None, typer.Option("--run", help=field_help("store.export.run_id"))]
Step = Annotated[list[int] | None, typer.Option("--step", help=field_help("store.export.steps") + "; repeatable")]
Store = Annotated[str | None, typer.Option("--store", help=field_help("store.trajectories_url"))]
JsonOut = Annotated[bool, typer.Option("--json", help="print a JSON summary (format, path, rows, files, "
                                                      "skipped) instead of a line")]


def _export(cfg, kind: str, out: str, json_out: bool) -> None:
    from tryloop.store.exports import existing_store, export_hf, export_sft, export_verl

    ecfg = cfg.store.export
    store = existing_store(cfg.store.trajectories_url, run_id=ecfg.run_id, steps=ecfg.steps)
    common = dict(run_id=ecfg.run_id, step=ecfg.steps)
    if kind == "hf":
        res = export_hf(store, out, split=ecfg.split, rows_per_shard=ecfg.rows_per_shard, title=ecfg.title, **common)
    elif kind == "verl":
        res = export_verl(store, out, split=ecfg.split, data_source=ecfg.data_source, ability=ecfg.ability,
                          agent_name=ecfg.agent_name, **common)
    else:
        res = export_sft(store, out, name=ecfg.sft_name, formats=ecfg.sft_formats,
                         exclude_severities=ecfg.exclude_severities, **common)
    summary = {"format": kind, "path": res.path, "rows": res.rows, "files": list(res.files),
               "skipped": res.skipped, "store": store.url, "run_id": ecfg.run_id, "steps": ecfg.steps}
    if json_out:
        print(json.dumps(summary))
        return
    what = {"hf": "trajectories", "verl": "task prompts", "sft": "successful trajectories"}[kind]
    skipped = f", {res.skipped} skipped" if res.skipped else ""
    console.print(f"exported {res.rows} {what} to {res.path} ({len(res.files)} file(s){skipped})")


def _run(kind: str, out: str, config, overrides: dict[str, object], json_out: bool) -> None:
    cfg = run_cli(load_config, config, overrides)
    run_cli(_export, cfg, kind, out, json_out)


def _selection(run: str | None, step: list[int] | None, store: str | None) -> dict[str, object]:
    return {"store.export.run_id": run, "store.export.steps": step or None, "store.trajectories_url": store}


@app.command("hf")
def export_hf_cmd(
    out: Out, run: Run = None, step: Step = None,
    split: Annotated[str | None, typer.Option("--split", help=field_help("store.export.split"))] = None,
    rows_per_shard: Annotated[int | None, typer.Option("--rows-per-shard",
                                                       help=field_help("store.export.rows_per_shard"))] = None,
    title: Annotated[str | None, typer.Option("--title", help=field_help("store.export.title"))] = None,
    store: Store = None, json_out: JsonOut = False, config: ConfigOpt = None,
) -> None:
    """A Hugging Face dataset directory: Parquet shards and a README card, for
    `datasets.load_dataset(<out>)` or an upload to the Hub."""
    _run("hf", out, config, {**_selection(run, step, store), "store.export.split": split,
                             "store.export.rows_per_shard": rows_per_shard, "store.export.title": title}, json_out)


@app.command("verl")
def export_verl_cmd(
    out: Out, run: Run = None, step: Step = None,
    split: Annotated[str | None, typer.Option("--split", help=field_help("store.export.split"))] = None,
    data_source: Annotated[str | None, typer.Option("--data-source",
                                                    help=field_help("store.export.data_source"))] = None,
    ability: Annotated[str | None, typer.Option("--ability", help=field_help("store.export.ability"))] = None,
    agent_name: Annotated[str | None, typer.Option("--agent-name",
                                                   help=field_help("store.export.agent_name"))] = None,
    store: Store = None, json_out: JsonOut = False, config: ConfigOpt = None,
) -> None:
    """verl's RL dataset, one row per task: <out>/<split>.parquet for data.train_files / data.val_files,
    judged by tryloop.integrations.verl.compute_score."""
    _run("verl", out, config, {**_selection(run, step, store), "store.export.split": split,
                               "store.export.data_source": data_source, "store.export.ability": ability,
                               "store.export.agent_name": agent_name}, json_out)


@app.command("sft")
def export_sft_cmd(
    out: Out, run: Run = None, step: Step = None,
    name: Annotated[str | None, typer.Option("--name", help=field_help("store.export.sft_name"))] = None,
    formats: Annotated[list[str] | None, typer.Option("--format", help=field_help("store.export.sft_formats")
                                                      + "; repeatable")] = None,
    exclude_severity: Annotated[list[str] | None, typer.Option(
        "--exclude-severity", help=field_help("store.export.exclude_severities") + "; repeatable")] = None,
    store: Store = None, json_out: JsonOut = False, config: ConfigOpt = None,
) -> None:
    """A chat SFT dataset of the successful, unflagged trajectories: <out>/<name>.jsonl (OpenAI chat
    format) and <out>/<name>.parquet."""
    _run("sft", out, config, {**_selection(run, step, store), "store.export.sft_name": name,
                              "store.export.sft_formats": formats or None,
                              "store.export.exclude_severities": exclude_severity or None}, json_out)
