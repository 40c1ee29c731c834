"""`tryloop bench train`: synchronous against overlapped training steps, side by side.

Two measurements, each run in both modes with the same settings and seed:

  `run_real`  a real run: `tryloop train` on the Ray engine on a local multi-node Ray cluster
              (Ray's `cluster_utils.Cluster`: a head and `nodes` sandbox nodes of one CPU each),
              HumanEval tasks in a temporary store with an approved reward gate, the bundled 135M
              model served by the learner's process, a real optimizer step per step. Once
              synchronous (`train.overlap: false`), once overlapped (`train.overlap: true`,
              `max_staleness: 1`), one after the other (at once they would share the cores).
              Per run: the interval between consecutive step ends (step 0, which has nothing to
              overlap with, left out), the learner's wait for episodes (`time_rollout_wait_s`
              overlapped; the rollout's wall time synchronous), the update time and staleness.
              Its JSON is `benchmarks/results-overlap.json`'s.
  `run_sim`   the simulator (`tryloop.scheduler.sim.simulate_training`: the real scheduler on
              virtual time, modelled GPUs and sandbox slots, a modelled learner whose push stops
              every sampler GPU) on presets: `real-run` and `real-run-overlapped-timings` take
              their timings from a real run's results (`real_run_preset`), `gpu-64` and its
              variants assume a cluster (`gpu_preset`). Deterministic (`wall_s` aside). Its JSON
              is `benchmarks/results-overlap-sim.json`'s.

`benchmarks/overlap.py` and `benchmarks/overlap_sim.py` wrap this module.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tryloop.errors import ConfigError
from tryloop.scheduler import AdmissionConfig
from tryloop.scheduler.sim import LearnerConfig, SimConfig, simulate_training
from tryloop.telemetry.stats import nearest_rank

#: The real run's results in a checkout (absent from an installed package).
CHECKOUT_REAL = Path(__file__).resolve().parents[3] / "benchmarks" / "results-overlap.json"
SPEC = {"components": [{"name": "correctness", "kind": "tests", "weight": 1.0},
                       {"name": "compiles", "kind": "compiles", "weight": 0.1},
                       {"name": "brevity", "kind": "tokens", "weight": 0.1, "budget": 160}]}
# What the real run runs with and its results do not record: the served model's batch
# (`train.policy.max_batch`), one CPU per sandbox node (so one execution slot), and fixed
# admission at `train.concurrency`.
REAL_MAX_BATCH = 8
REAL_SLOTS_PER_NODE = 1
REAL_CONCURRENCY = 8
#: The real run's settings, full and quick (`tryloop bench train --quick`).
REAL_DEFAULTS = {"steps": 5, "nodes": 2, "tasks_per_step": 2, "group_size": 2, "max_new_tokens": 64}
REAL_QUICK = {"steps": 3, "nodes": 2, "tasks_per_step": 1, "group_size": 2, "max_new_tokens": 32}

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


# ---- the real run ---------------------------------------------------------------------------

def real_config(root: Path, settings: dict[str, Any], runtime: dict[str, Any] | None = None, **train: Any) -> Path:
    """The YAML config of one real run (`train` adds to `train:`; `run_id` names the file)."""
    import yaml

    doc = {
        "runtime": {**(runtime or {}), "store_dir": str(root / "rt"), "state_dir": str(root / "state"),
                    "cgroup_name": "tryloop-bench"},
        "tasks": {"store_url": str(root / "tasks"), "work_dir": str(root / "work"), "eval_fraction": 0.3},
        "rewards": {"spec": SPEC, "gate_dir": str(root / "gate"), "gold_path": str(root / "gold.jsonl")},
        "store": {"trajectories_url": str(root / "traj"), "runs_dir": str(root / "runs")},
        "scheduler": {"engine": "ray", "ray": {"host_resource": "sandbox_host", "episodes_per_host": 4},
                      "admission": {"adaptive": False, "initial": 8, "max": 8}},
        "train": {"steps": settings["steps"], "tasks_per_step": settings["tasks_per_step"],
                  "group_size": settings["group_size"], "concurrency": 8, "eval_tasks": 0, "source": "humaneval",
                  "zone": False, "check_source": None, "refill_groups": 0, "eval_at_start": False,
                  "policy": {"temperature": 1.0, "max_batch": REAL_MAX_BATCH},
                  "algo": {"lr": 1e-5, "micro_batch": 2, "old_logprobs": "recompute"},
                  "sampler": {"weights_dir": str(root / "weights")},
                  "limits": {"max_turns": 1, "max_new_tokens": settings["max_new_tokens"],
                             "max_total_tokens": settings["max_new_tokens"], "max_context_tokens": 1024}, **train},
    }
    path = root / f"{train['run_id']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def prepare(root: Path, runtime: dict[str, Any] | None = None) -> None:
    """The store: HumanEval tasks (8 candidates, K=1 gate) and an approved reward gate."""
    from tryloop.config import load_yaml
    from tryloop.rewards.gold import GateRecords, builtin_items, run_gate
    from tryloop.sandbox import SandboxRuntime
    from tryloop.tasks.factory import build_humaneval
    from tryloop.tasks.gate import GateConfig
    from tryloop.tasks.store import TaskStore

    cfg = load_yaml(real_config(root, {"steps": 1, "tasks_per_step": 1, "group_size": 2, "max_new_tokens": 64},
                                runtime, run_id="prepare"))
    rt = SandboxRuntime(cfg.runtime)
    store = TaskStore(cfg.tasks.store_url)
    asyncio.run(build_humaneval(rt, store, root / "work", gate=GateConfig(k=1), eval_fraction=0.3, limit=8))
    task = store.get(store.query(split="train")[0].fingerprint)
    gold = [i for i in builtin_items(task) if i.label in ("reference", "do_nothing")]
    out = asyncio.run(run_gate(rt, {task.fingerprint(): task}, gold, cfg.rewards.spec,
                               GateRecords(cfg.rewards.gate_dir)))
    if not out.approved:
        raise ConfigError(f"the reward gate refused the benchmark's spec: {out.report()}")


def summarise(rows: list[dict], started: float) -> dict[str, Any]:
    """One run's metrics rows: step interval, learner wait, update time, staleness."""
    ends = [started] + [r["time"] for r in rows]
    intervals = [b - a for a, b in zip(ends, ends[1:], strict=False)][1:]   # step 0 has nothing to overlap
    waits = [r.get("time_rollout_wait_s", r["time_rollout_wall_s"]) for r in rows][1:]
    updates = [r["time_update_s"] for r in rows][1:]
    return {"steps": len(rows), "wall_s": rows[-1]["time"] - started,
            "step_interval_s": {"p50": nearest_rank(intervals, 50), "p90": nearest_rank(intervals, 90),
                                "mean": statistics.fmean(intervals)},
            "learner_wait_s": {"p50": nearest_rank(waits, 50), "p90": nearest_rank(waits, 90), "mean": statistics.fmean(waits)},
            "update_s": {"p50": nearest_rank(updates, 50), "mean": statistics.fmean(updates)},
            "staleness_max": max((r.get("staleness_max", 0) for r in rows), default=0),
            "stale_dropped": sum(r.get("stale_dropped", 0) for r in rows),
            "episodes": sum(r["episodes"] for r in rows), "rows": rows}


def run_real(*, steps: int = 5, nodes: int = 2, tasks_per_step: int = 2, group_size: int = 2,
             max_new_tokens: int = 64, out: Path | None = None, runtime: dict[str, Any] | None = None,
             log: Log = _stderr) -> dict[str, Any]:
    """Both real runs, one after the other; writes the results to `out` if given. `runtime`:
    runtime settings (a config file's) under the run's own store and state directories."""
    if steps < 2:
        raise ConfigError("the real run needs at least 2 steps (step 0 has nothing to overlap with)")
    for name, value in (("nodes", nodes), ("tasks_per_step", tasks_per_step), ("group_size", group_size),
                        ("max_new_tokens", max_new_tokens)):
        if value < 1:
            raise ConfigError(f"the real run needs {name} >= 1, got {value}")
    settings = {"steps": steps, "nodes": nodes, "tasks_per_step": tasks_per_step, "group_size": group_size,
                "max_new_tokens": max_new_tokens}
    root = Path(tempfile.mkdtemp(prefix="tryloop-overlap-"))
    try:
        return _run_real(root, settings, out, runtime, log)
    finally:
        shutil.rmtree(root, ignore_errors=True)   # the runs' store, sandboxes' state and checkpoints


def _run_real(root: Path, settings: dict[str, Any], out: Path | None, runtime: dict[str, Any] | None,
              log: Log) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    import tryloop.cli.main  # noqa: F401  (the CLI's import order)
    from tryloop.config import load_yaml
    from tryloop.train.run import train

    steps, nodes = settings["steps"], settings["nodes"]
    tasks_per_step, group_size = settings["tasks_per_step"], settings["group_size"]
    t0 = time.perf_counter()
    log("building the store (HumanEval tasks, reward gate) ...")
    prepare(root, runtime)
    log(f"store ready in {time.perf_counter() - t0:.0f} s")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(nodes):
        c.add_node(num_cpus=1, resources={"sandbox_host": 1})
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"),
                               "settings": settings | {"out": str(out) if out else None}}
    try:
        for name, extra in (("synchronous", {"overlap": False}), ("overlapped", {"overlap": True, "max_staleness": 1})):
            log(f"{name} run: {steps} steps of {tasks_per_step * group_size} episodes ...")
            cfg = load_yaml(real_config(root, settings, runtime, run_id=name, **extra))
            started = time.time()
            res = asyncio.run(train(cfg, cfg.train))
            results[name] = summarise(res.metrics, started)
            s = results[name]
            log(f"{name}: {s['wall_s']:.1f} s for {s['steps']} steps; step interval p50 "
                f"{s['step_interval_s']['p50']:.1f} s")
    finally:
        ray.shutdown()
        c.shutdown()
    sync, over = results["synchronous"], results["overlapped"]
    results["ratios"] = {
        "step_interval_p50": over["step_interval_s"]["p50"] / sync["step_interval_s"]["p50"],
        "step_interval_mean": over["step_interval_s"]["mean"] / sync["step_interval_s"]["mean"],
        "learner_wait_mean": over["learner_wait_s"]["mean"] / sync["learner_wait_s"]["mean"],
    }
    if out:
        out.write_text(json.dumps(results, indent=1, default=str))
    return results


# ---- the simulator --------------------------------------------------------------------------

def load_real(path: Path | None = None) -> tuple[dict[str, Any], str]:
    """A real run's results (default: the checkout's `benchmarks/results-overlap.json`) and the
    file's name; a clear error where the file is not there."""
    path = path or CHECKOUT_REAL
    if not path.is_file():
        default = " (the default, benchmarks/results-overlap.json in a checkout)" if path == CHECKOUT_REAL else ""
        raise ConfigError(
            f"no real-run results at {path}{default}: the real-run presets take their timings from one. "
            "Produce it with `tryloop bench train --real-only --out FILE` (or `--quick` for a smoke run) and "
            "pass it with --from-real FILE, or leave out the real-run presets (--preset gpu-64)")
    try:
        real = json.loads(path.read_text())
        real["settings"], real["synchronous"]["rows"], real["overlapped"]["rows"]  # noqa: B018
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path} is not a real run's results (tryloop bench train --real-only): {e}") from None
    return real, path.name


def real_run_preset(real: Path | dict[str, Any] | None = None, seed: int = 0, half: str = "synchronous",
                    name: str | None = None) -> dict[str, Any]:
    """The simulator fitted to one half (`synchronous` or `overlapped`) of a real run's results
    (a file, default the checkout's, or the dict `run_real` returned; `name` then says where it came from).

    Per episode (sums over every step's episodes, divided by their number): tokens generated and
    seconds of generation give one decode step's time (the run's batch, not a batch-size law:
    `decode_per_seq_s` is 0); verification and environment seconds give the verifier's and the
    tool call's mean. The learner replays each step's update (`time_update_s` less the push it
    includes), pushes for the mean `time_push_s`, and takes the mean time between a step's
    metrics row and the next step's start (checkpoint, bookkeeping) as `checkpoint_s`. Not in
    the file, so not modelled: sandbox provisioning (0) and prefill (0; one short prompt)."""
    if isinstance(real, dict):
        name = name or "this run"
    else:
        real, name = load_real(real)
    try:
        settings, rows = real["settings"], real[half]["rows"]
        episodes = sum(r["episodes"] for r in rows)
        tokens = sum(r["completion_tokens"] for r in rows) / episodes
        gen_s = sum(r["time_generation_s"] for r in rows) / episodes
        verify_s = sum(r["time_verification_s"] for r in rows) / episodes
        env_s = sum(r["time_environment_s"] for r in rows) / episodes
        between = [b["time"] - a["time"] - b["time_step_s"] for a, b in zip(rows, rows[1:], strict=False)]
        if tokens <= 0 or len(rows) < 2:
            raise ValueError(f"{len(rows)} steps and {tokens:g} tokens per episode: nothing to fit to")
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise ConfigError(f"{name}: its {half} run cannot give the simulator its timings "
                          f"({type(e).__name__}: {e}); produce it with tryloop bench train --real-only") from None
    sim = SimConfig(
        gpus=1, decode_base_s=gen_s / tokens, decode_per_seq_s=0.0, prefill_s_per_token=0.0,
        max_batch=REAL_MAX_BATCH, sandbox_slots=settings["nodes"] * REAL_SLOTS_PER_NODE,
        episodes=settings["tasks_per_step"] * settings["group_size"], turns=(1, 1), prompt_tokens=200,
        gen_tokens=tokens, gen_sigma=0.0, tool_output_tokens=0, tool_cpu_s=max(env_s, 1e-6),
        provision_s=0.0, verify_cpu_s=verify_s, seed=seed)
    learner = LearnerConfig(
        steps=settings["steps"], tasks_per_step=settings["tasks_per_step"], group_size=settings["group_size"],
        update_s_by_step=tuple(r["time_update_s"] - r["time_push_s"] for r in rows),
        push_s=statistics.fmean(r["time_push_s"] for r in rows), checkpoint_s=max(0.0, statistics.fmean(between)),
        max_staleness=1)
    adm = AdmissionConfig(adaptive=False, initial=REAL_CONCURRENCY, max=REAL_CONCURRENCY)
    measured = {m: {"step_interval_s": real[m]["step_interval_s"], "learner_wait_s": real[m]["learner_wait_s"],
                    "wall_s": real[m]["wall_s"], "update_s_mean": real[m]["update_s"]["mean"],
                    "staleness_max": real[m]["staleness_max"], "stale_dropped": real[m]["stale_dropped"],
                    "rollout_wall_s_mean": statistics.fmean(r["time_rollout_wall_s"] for r in real[m]["rows"][1:])}
                for m in ("synchronous", "overlapped")}
    return {"sim": sim, "learner": learner, "admission": adm, "variants": [(1, 1)],
            "source": {"file": name, "date": real.get("date"), "fitted_to": half, "measured": measured,
                       "derived": {"tokens_per_episode": round(tokens, 2), "generation_s_per_episode": round(gen_s, 3),
                                   "decode_step_s": round(gen_s / tokens, 5), "verify_s": round(verify_s, 3),
                                   "update_s_by_step": [round(x, 3) for x in learner.update_s_by_step],
                                   "push_s": round(learner.push_s, 3), "checkpoint_s": round(learner.checkpoint_s, 3)}}}


def gpu_preset(gpus: int = 64, seed: int = 0, update_s_per_token: float = 5e-5, adaptive: bool = False,
               variants: tuple[tuple[int, int], ...] = ((1, 1), (0, 1), (2, 2), (1, 2)),
               steps: int = 6) -> dict[str, Any]:
    """`gpus` sampler GPUs (16 sandbox slots each, the simulator's default agent episode, as in
    docs/scaling.md) and a learner on GPUs of its own. Assumed, not measured: 16 episodes per GPU
    per step (64 tasks x 16 samples at 64 GPUs); an update of 20 s plus 50 us per generated token
    (about 3.3M generated tokens a step: some 185 s, the order of a full fine-tune of an 8B model
    on one 8-GPU node); a 20 s push (16 GB of weights read from a shared filesystem) that stops
    every sampler; admission fixed at 32 episodes per GPU (where adaptive admission settled in
    docs/scaling.md), so that only the learner differs between runs."""
    sim = SimConfig(gpus=gpus, sandbox_slots=gpus * 16, episodes=gpus * 16, seed=seed)
    learner = LearnerConfig(steps=steps, tasks_per_step=gpus, group_size=16, update_s=20.0,
                            update_s_per_token=update_s_per_token, push_s=20.0, max_staleness=1)
    adm = (AdmissionConfig(adaptive=True, initial=gpus * 8, max=gpus * 256) if adaptive else
           AdmissionConfig(adaptive=False, initial=gpus * 32, max=gpus * 32))
    assumed = gpu_preset.__doc__.split("Assumed, not measured: ")[1]
    return {"sim": sim, "learner": learner, "admission": adm, "variants": list(variants),
            "source": {"assumed": " ".join(assumed.split())}}


def _gpu_presets(gpus: int, steps: int) -> dict[str, Callable[[int], dict[str, Any]]]:
    # Variants are (max_staleness, ahead): tryloop train's pipeline (one step ahead) at the bound it
    # runs with and at 0; two steps ahead with the bound at 2 and at 1.
    return {
        f"gpu-{gpus}": lambda seed: gpu_preset(gpus, seed, steps=steps),
        # a learner 4x faster: the rollout, not the update, sets the pace
        f"gpu-{gpus}-fast-learner": lambda seed: gpu_preset(gpus, seed, update_s_per_token=1.25e-5,
                                                            variants=((1, 1),), steps=steps),
        # the scheduler's adaptive admission instead of a fixed limit
        f"gpu-{gpus}-adaptive": lambda seed: gpu_preset(gpus, seed, adaptive=True, variants=((1, 1),), steps=steps),
    }


#: The presets fitted to a real run, and the half each is fitted to.
REAL_PRESETS = {"real-run": "synchronous", "real-run-overlapped-timings": "overlapped"}
_GPU = _gpu_presets(64, 6)
_GPU_QUICK = _gpu_presets(4, 3)
#: Every preset's name. The gpu presets at 64 GPUs take about 1.5 min on 2 vCPUs.
PRESETS: tuple[str, ...] = (*REAL_PRESETS, *_GPU)
#: `--quick`: the gpu presets at 4 GPUs and 3 steps (seconds).
QUICK_PRESETS: tuple[str, ...] = (*REAL_PRESETS, *_GPU_QUICK)


def run_sim(presets: tuple[str, ...] | None = None, seed: int = 0, *, real: Path | dict[str, Any] | None = None,
            real_name: str | None = None, quick: bool = False, log: Log | None = None) -> dict[str, Any]:
    """Each preset synchronous and in each of its overlapped variants. `real`: where the real-run
    presets take their timings: a results file (default the checkout's benchmarks/results-overlap.json)
    or `run_real`'s dict (`real_name` says where it came from)."""
    names = QUICK_PRESETS if quick else PRESETS
    presets = names if presets is None else presets
    if unknown := [p for p in presets if p not in names]:
        raise ConfigError(f"unknown preset(s) {', '.join(unknown)}{' with --quick' if quick else ''}; "
                          f"choose from {', '.join(names)}")
    if any(p in REAL_PRESETS for p in presets) and not isinstance(real, dict):
        real, real_name = load_real(real)
    gpu = _GPU_QUICK if quick else _GPU
    out: dict[str, Any] = {"benchmark": "overlap-sim", "format": 1, "seed": seed, "presets": {}}
    for name in presets:
        if log:
            log(f"simulating {name} ...")
        p = (real_run_preset(real, seed, REAL_PRESETS[name], name=real_name) if name in REAL_PRESETS
             else gpu[name](seed))
        sim, learner, adm = p["sim"], p["learner"], p["admission"]
        sync = simulate_training(sim, learner.model_copy(update={"overlap": False}), adm)
        runs = [sync]
        for k, ahead in p["variants"]:
            r = simulate_training(sim, learner.model_copy(update={"overlap": True, "max_staleness": k, "ahead": ahead}),
                                  adm)
            r["speedup"] = round(sync["makespan_s"] / r["makespan_s"], 4)
            r["step_interval_p50_ratio"] = round(r["step_interval_s"]["p50"] / sync["step_interval_s"]["p50"], 4)
            runs.append(r)
        entry = {"sim": sim.model_dump(mode="json"), "learner": learner.model_dump(mode="json", exclude={"overlap"}),
                 "admission": adm.model_dump(mode="json", include={"adaptive", "initial", "max"}),
                 "source": p["source"], "runs": runs}
        if name.startswith("real-run"):    # the simulated run of the fitted half over the real one
            half = p["source"]["fitted_to"]
            mine, meas = runs[0] if half == "synchronous" else runs[1], p["source"]["measured"][half]
            entry[f"sim_over_real_{half}"] = {
                "step_interval_p50": round(mine["step_interval_s"]["p50"] / meas["step_interval_s"]["p50"], 4),
                "step_interval_mean": round(mine["step_interval_s"]["mean"] / meas["step_interval_s"]["mean"], 4),
                "rollout_wall_mean": round(mine["rollout_wall_s"]["mean"] / meas["rollout_wall_s_mean"], 4),
            }
        out["presets"][name] = entry
    return out


# ---- tables ---------------------------------------------------------------------------------

def sim_markdown(results: dict[str, Any]) -> str:
    """Every simulated run as a Markdown table (docs/scaling.md's)."""
    head = ("| preset | mode | max staleness (ahead) | makespan s | step interval p50 / p90 s | learner idle | "
            "GPU busy | GPU paused | staleness max (mean) | stale dropped | speedup |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, p in results["presets"].items():
        for r in p["runs"]:
            over = r["mode"] == "overlapped"
            bound = f"{r['max_staleness']} ({r['ahead']})" if over else "–"
            speedup = f"{r['speedup']:.2f}×" if over else "1.00×"
            lines.append(
                f"| {name} | {r['mode']} | {bound} | "
                f"{r['makespan_s']:,.1f} | {r['step_interval_s']['p50']:,.1f} / {r['step_interval_s']['p90']:,.1f} | "
                f"{r['learner_idle_share']:.1%} | {r['gpu_busy_share']:.1%} | {r['gpu_paused_share']:.1%} | "
                f"{r['staleness']['max']} ({r['staleness']['mean']:.2f}) | {r['stale_dropped']:,} | "
                f"{speedup} |")
    return "\n".join(lines)


def real_vs_sim_markdown(results: dict[str, Any]) -> str:
    """The real run's two halves, then the simulator fitted to each half running both modes ("" without
    the real-run presets)."""
    real = {n: p for n, p in results["presets"].items() if n.startswith("real-run")}
    if not real:
        return ""
    head = "| | step interval p50 s | p90 s | mean s | rollout wall mean s | learner wait p50 s | wall s |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    meas = next(iter(real.values()))["source"]["measured"]
    for mode, m in meas.items():
        lines.append(f"| real run, {mode} | {m['step_interval_s']['p50']:.1f} | {m['step_interval_s']['p90']:.1f} | "
                     f"{m['step_interval_s']['mean']:.1f} | {m['rollout_wall_s_mean']:.1f} | "
                     f"{m['learner_wait_s']['p50']:.1f} | {m['wall_s']:.1f} |")
    for p in real.values():
        for r in p["runs"]:
            lines.append(f"| simulator fitted to the {p['source']['fitted_to']} half, {r['mode']} | "
                         f"{r['step_interval_s']['p50']:.1f} | {r['step_interval_s']['p90']:.1f} | "
                         f"{r['step_interval_s']['mean']:.1f} | {r['rollout_wall_s']['mean']:.1f} | "
                         f"{r['learner_wait_s']['p50']:.1f} | {r['makespan_s']:.1f} |")
    return "\n".join(lines)


def _x(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a is not None and b else "–"


def real_table(results: dict[str, Any]) -> Any:
    """The real run: synchronous and overlapped side by side, and overlapped / synchronous."""
    from rich.table import Table

    s, o = results["synchronous"], results["overlapped"]
    st = results["settings"]
    t = Table(title=f"real run: {s['steps']} steps of {st['tasks_per_step'] * st['group_size']} episodes, "
                    f"{st['nodes']} sandbox nodes, answers ≤ {st['max_new_tokens']} tokens")
    for col in ("", "synchronous", "overlapped", "overlapped / synchronous"):
        t.add_column(col, justify="left" if not col else "right")
    rows = [("step interval p50", s["step_interval_s"]["p50"], o["step_interval_s"]["p50"]),
            ("step interval p90", s["step_interval_s"]["p90"], o["step_interval_s"]["p90"]),
            ("step interval mean", s["step_interval_s"]["mean"], o["step_interval_s"]["mean"]),
            ("learner wait p50", s["learner_wait_s"]["p50"], o["learner_wait_s"]["p50"]),
            ("learner wait mean", s["learner_wait_s"]["mean"], o["learner_wait_s"]["mean"]),
            ("update mean", s["update_s"]["mean"], o["update_s"]["mean"]),
            ("wall time", s["wall_s"], o["wall_s"])]
    for label, a, b in rows:
        t.add_row(label, f"{a:.1f} s", f"{b:.1f} s", _x(b, a))
    t.add_row("staleness max", str(s["staleness_max"]), str(o["staleness_max"]), "")
    t.add_row("stale dropped", str(s["stale_dropped"]), str(o["stale_dropped"]), "")
    return t


def sim_table(results: dict[str, Any]) -> Any:
    """Every preset: its synchronous run, then each overlapped variant with its ratio to the synchronous one."""
    from rich.table import Table

    t = Table(title="simulator: synchronous vs overlapped (ratios: overlapped / synchronous)")
    for col in ("preset", "mode", "bound (ahead)", "makespan s", "step interval p50 / p90 s",
                "learner wait p50 s", "learner idle", "stale max", "stale dropped"):
        t.add_column(col, justify="left" if col in ("preset", "mode") else "right")
    for i, (name, p) in enumerate(results["presets"].items()):
        sync = p["runs"][0]
        for j, r in enumerate(p["runs"]):
            over = r["mode"] == "overlapped"
            si, ss = r["step_interval_s"], sync["step_interval_s"]
            t.add_row(name if j == 0 else "", r["mode"], f"{r['max_staleness']} ({r['ahead']})" if over else "–",
                      f"{r['makespan_s']:,.1f}" + (f" ({_x(r['makespan_s'], sync['makespan_s'])})" if over else ""),
                      f"{si['p50']:,.1f}" + (f" ({_x(si['p50'], ss['p50'])})" if over else "") + f" / {si['p90']:,.1f}",
                      f"{r['learner_wait_s']['p50']:,.1f}", f"{r['learner_idle_share']:.0%}",
                      str(r["staleness"]["max"]), f"{r['stale_dropped']:,}",
                      end_section=j == len(p["runs"]) - 1 and i < len(results["presets"]) - 1)
    return t


def real_vs_sim_table(results: dict[str, Any]) -> Any | None:
    """The real run's halves beside the simulator fitted to each (None without the real-run presets)."""
    from rich.table import Table

    real = {n: p for n, p in results["presets"].items() if n.startswith("real-run")}
    if not real:
        return None
    src = next(iter(real.values()))["source"]
    t = Table(title=f"real run ({src['file']}) vs the simulator fitted to it")
    for col in ("", "step interval p50 s", "p90 s", "mean s", "rollout wall mean s", "learner wait p50 s", "wall s"):
        t.add_column(col, justify="left" if not col else "right")
    for mode, m in src["measured"].items():
        t.add_row(f"real run, {mode}", f"{m['step_interval_s']['p50']:.1f}", f"{m['step_interval_s']['p90']:.1f}",
                  f"{m['step_interval_s']['mean']:.1f}", f"{m['rollout_wall_s_mean']:.1f}",
                  f"{m['learner_wait_s']['p50']:.1f}", f"{m['wall_s']:.1f}")
    for p in real.values():
        for r in p["runs"]:
            t.add_row(f"simulator, {p['source']['fitted_to']} half's timings, {r['mode']}",
                      f"{r['step_interval_s']['p50']:.1f}", f"{r['step_interval_s']['p90']:.1f}",
                      f"{r['step_interval_s']['mean']:.1f}", f"{r['rollout_wall_s']['mean']:.1f}",
                      f"{r['learner_wait_s']['p50']:.1f}", f"{r['makespan_s']:.1f}")
    return t


# ---- `tryloop bench train` ------------------------------------------------------------------

def run(*, quick: bool = False, sim_only: bool = False, real_only: bool = False, real_settings: dict | None = None,
        from_real: Path | None = None, presets: tuple[str, ...] | None = None, seed: int = 0,
        runtime: dict[str, Any] | None = None, out: Path | None = None, console: Any) -> dict[str, Any]:
    """The real run and/or the simulator, with rich progress and tables. The simulator's real-run
    presets take their timings from `from_real` if given, else from the real run just made, else
    from the checkout's benchmarks/results-overlap.json. `out`: the real run's JSON (`real_only`),
    the simulator's (`sim_only`), or {"benchmark": "train", "real": ..., "sim": ...}."""
    if sim_only and real_only:
        raise ConfigError("--sim-only and --real-only exclude each other")
    settings = (REAL_QUICK if quick else REAL_DEFAULTS) | {k: v for k, v in (real_settings or {}).items()
                                                           if v is not None}
    real: dict[str, Any] | None = None
    sim: dict[str, Any] | None = None
    if from_real is not None and not real_only and (presets is None or any(p in REAL_PRESETS for p in presets)):
        load_real(from_real)    # a missing or broken file fails before a real run of minutes
    if not sim_only:
        with console.status("real run ...") as status:
            def log(msg: str) -> None:
                status.update(msg)
                console.log(msg)

            real = run_real(**settings, out=out if real_only else None, runtime=runtime, log=log)
        console.print(real_table(real))
    if not real_only:
        source: Path | dict[str, Any] | None = from_real
        name = None
        if source is None and real is not None:
            source, name = real, "this invocation's real run"
        with console.status("simulating ...") as status:
            sim = run_sim(presets, seed, real=source, real_name=name, quick=quick, log=status.update)
        console.print(sim_table(sim))
        if (t := real_vs_sim_table(sim)) is not None:
            console.print(t)
    if real is not None and sim is not None:
        res = {"benchmark": "train", "real": real, "sim": sim}
        if out:
            out.write_text(json.dumps(res, indent=1, default=str) + "\n")
        return res
    if sim is not None:
        if out:
            out.write_text(json.dumps(sim, indent=2) + "\n")
        return sim
    assert real is not None
    return real
