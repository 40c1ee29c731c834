"""Peak memory of the whole train process, step by step: the train loop as it is, side by side with
the loop without parking the engine (its weights kept through the update), with the prefix cache a
multi-turn run keeps (every finished sequence, up to 1 GB) in a single-turn run, with oneDNN's
caches of bf16 matmul kernels at their default capacity, without any of its memory measures
(the engine's prefix cache and weights kept through the update, no lean heap, the engine loading a
full copy of the exported weights, the default caches), with AdamW's moments kept through the
final evaluations (the learner not finished after the last checkpoint), and without the engine's
CPU kernels (`policy.cpu_kernels: false`: transformers' attention and matmuls, no packed weights).

    python benchmarks/train_memory.py --config STORE.yaml [--steps 3] [--eval-tasks N] [--final]
                                      [--configs train_loop,without_park] [--out FILE]

`--final` runs the steps to the end of the run, as `tryloop train` does: after the last step come
its final evaluations (`--eval-tasks` held-out tasks and the config's check set, `train.check_source`),
with no evaluation before the first step. Each configuration then also reports the peak RSS of
the final evaluations alone (`final_eval_peak_mb`: the kernel's high-water mark is reset as they
begin, /proc/self/clear_refs) and of its whole process (`process_peak_mb`).

`--config` names a tryloop config whose task store holds a suite (`tryloop tasks build-default`),
with the learning zone of the default model measured in it (the first `tryloop train` there, or
`tryloop tasks zone`), or whose `train.zone` is false: each configuration runs `tryloop train`'s
loop for `--steps` steps with the config's train settings in a fresh process (peak RSS is a per-process high-water mark), all at once so
load on the machine hits them alike, and reads the per-step `peak_rss_mb` and update time the run
records. `--eval-tasks N` first evaluates N held-out tasks (`train.eval_k` samples each), as
`tryloop train` does before its first step; without it no evaluation runs. The reward version's
regression gate is not required: no reward here is a result.
Writes results-train-memory.json beside this file (or --out).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the loop as it is; without parking the engine (its prefix cache is still dropped); with a multi-turn
#: run's prefix cache; with oneDNN's caches at their default capacity (1024 shapes); without any of
#: the memory measures.
#: the memory measures; with AdamW's moments resident through the final evaluations (use with --final);
#: without the engine's CPU kernels.
CONFIGS = ("train_loop", "without_park", "multi_turn_prefix_cache", "onednn_default_caches",
           "without_memory_measures", "without_finish", "without_cpu_kernels")


def run_one(name: str, config: Path, steps: int, runs_dir: Path, eval_tasks: int = 0,
            final: bool = False) -> dict:
    """One configuration, in this process: the per-step rows of its run and the process's peak RSS."""
    import asyncio
    import contextlib

    import tryloop.cli.main  # noqa: F401  (the CLI's import order)
    import tryloop.train.run as run
    from tryloop.agent.engine import Engine
    from tryloop.config import load_yaml
    from tryloop.train import memory

    run.require_approved = lambda *a, **k: None
    if name == "without_memory_measures":
        import torch

        memory.lean_heap = contextlib.nullcontext
        update = Engine.update_weights

        async def keep_prefixes(self: Engine) -> None:
            return None

        async def from_a_copy(self: Engine, weights, *, version=None):   # as the loop exported them before
            if isinstance(weights, torch.nn.Module):
                weights = {k: v.detach().to("cpu", copy=True) for k, v in weights.state_dict().items()}
            return await update(self, weights, version=version)

        Engine.park = keep_prefixes
        Engine.update_weights = from_a_copy
    elif name == "without_park":
        Engine.park = Engine.drop_prefix_cache      # the engine keeps its weights through the update
    marks: dict[str, float] = {}
    if final:
        from tryloop.train.update import Learner

        finish = Learner.finish if name != "without_finish" else lambda self: None   # moments kept

        def finish_and_mark(self: Learner) -> None:   # the final evaluations begin right after
            marks["before_final_eval_peak_mb"] = _status_mb("VmHWM")
            finish(self)
            marks["final_eval_start_mb"] = _status_mb("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")   # the high-water mark from here on

        Learner.finish = finish_and_mark
    if name in ("onednn_default_caches", "without_memory_measures"):
        import os

        from tryloop.agent.hf import ONEDNN_CACHE_ENV

        for var in ONEDNN_CACHE_ENV:
            os.environ[var] = "1024"                # before the first bf16 matmul: what load_model bounds
    if name in ("multi_turn_prefix_cache", "without_memory_measures"):
        from tryloop.agent.hf_policy import HFPolicy

        init = HFPolicy.__init__

        def multi_turn(self, *a, **k):              # every finished sequence cached, the 1 GB budget
            return init(self, *a, **(k | {"multi_turn": True}))

        HFPolicy.__init__ = multi_turn
    cfg = load_yaml(config)
    cfg = cfg.model_copy(update={"store": cfg.store.model_copy(update={"runs_dir": runs_dir})})
    if name == "without_cpu_kernels":
        policy = cfg.train.policy.model_copy(update={"cpu_kernels": False})
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"policy": policy})})
    run_id = f"memory-{name}-{int(time.time())}"
    if final:   # the whole run: its steps, then the final evaluations
        tcfg = cfg.train.model_copy(update={"run_id": run_id, "steps": steps, "eval_at_start": False,
                                            "eval_tasks": eval_tasks, "eval_every": 10_000})
        result = asyncio.run(run.train(cfg, tcfg))
    else:       # the steps alone: the run stops before its last step and its final evaluation
        tcfg = cfg.train.model_copy(update={"run_id": run_id, "steps": steps + 1, "eval_at_start": eval_tasks > 0,
                                            "eval_tasks": eval_tasks or None, "eval_every": 10_000,
                                            "check_source": None})
        result = asyncio.run(run.train(cfg, tcfg, stop_after_step=steps - 1))
    rows = [{k: row.get(k) for k in ("step", "peak_rss_mb", "time_update_s", "time_rollout_wall_s", "episodes")}
            for row in result.metrics]
    evals = [{k: row.get(k) for k in ("step", "name", "episodes", "pass_at_1")} for row in result.evals]
    out = {"steps": rows, "evals": evals}
    if final:
        out |= marks | {"final_eval_peak_mb": _status_mb("VmHWM")}
        out["process_peak_mb"] = max(out["before_final_eval_peak_mb"], out["final_eval_peak_mb"])
    return out


def _status_mb(field: str) -> float:
    """A memory figure of this process from /proc/self/status, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024   # kB
    raise KeyError(field)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--eval-tasks", type=int, default=0,
                    help="held-out tasks evaluated before the first step, or with --final after the last "
                         "(default 0: none)")
    ap.add_argument("--final", action="store_true",
                    help="run to the end, final evaluations included, and report each process's peak")
    ap.add_argument("--out", type=Path, default=HERE / "results-train-memory.json")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help=f"comma-separated, run side by side (default: all of {', '.join(CONFIGS)})")
    ap.add_argument("--one", choices=CONFIGS, help=argparse.SUPPRESS)
    ap.add_argument("--runs-dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    if not configs or set(configs) - set(CONFIGS) or "train_loop" not in configs:
        ap.error(f"--configs: train_loop and any of {', '.join(CONFIGS[1:])}")
    if args.one:
        print(json.dumps(run_one(args.one, args.config, args.steps, args.runs_dir, args.eval_tasks, args.final)))
        return
    with tempfile.TemporaryDirectory(prefix="tryloop-train-memory-") as runs_dir:
        procs = {name: subprocess.Popen([sys.executable, __file__, "--one", name, "--config", str(args.config),
                                         "--steps", str(args.steps), "--runs-dir", runs_dir,
                                         "--eval-tasks", str(args.eval_tasks), *(["--final"] if args.final else [])],
                                        stdout=subprocess.PIPE, text=True) for name in configs}
        rows = {}
        for name, p in procs.items():
            out, _ = p.communicate()
            if p.returncode:
                raise SystemExit(f"{name}: exit {p.returncode}")
            rows[name] = json.loads(out.strip().splitlines()[-1])
    result = {"date": time.strftime("%Y-%m-%d"), "steps": args.steps, "eval_tasks": args.eval_tasks,
              "final": args.final,
              **{name: {"peak_rss_mb_max": max(r["peak_rss_mb"] for r in out["steps"]), **out}
                 for name, out in rows.items()}}
    result["peak_ratio"] = {f"train_loop/{name}": result["train_loop"]["peak_rss_mb_max"] / result[name]["peak_rss_mb_max"]
                            for name in configs if name != "train_loop"}
    if args.final:
        for key in ("final_eval_peak_mb", "process_peak_mb"):
            result[key.replace("_mb", "_ratio")] = {
                f"train_loop/{name}": result["train_loop"][key] / result[name][key]
                for name in configs if name != "train_loop"}
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items()}, indent=1))


if __name__ == "__main__":
    main()
