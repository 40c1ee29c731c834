"""Does a train run keep its token-exact contract on its device? The sampler's log-probabilities
against the learner's, and one update's cost, on the episodes the run stored.

    python benchmarks/sampler_learner.py [--run RUN_ID] [--step 0] [--config FILE] [--out FILE]

The run's policy is loaded as the run loaded it (`train.policy.name` on `train.policy.device`).
The chosen step's episodes that were sampled by those weights (the first step's, unless the run
resumed) are read back from the trajectory store. For every sampled token the learner's
log-probability at temperature 1, under the run's `algo.amp`, is set against the one the sampler
recorded (`Trajectory.logprobs`, raw at temperature 1): the importance ratio a run with
`old_logprobs: sampler` would start from is exp(learner - sampler), 1 where both agree. Then one
`Learner.step` on those episodes and the advantages the run computed from them, on a fresh copy of
the weights: its seconds and the process's peak memory on the device (`torch.cuda` on a GPU, the
kernel's high-water mark of resident memory on the CPU). Writes JSON (default
results-sampler-learner.json beside this file).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="the train run (default: the newest run directory under store.runs_dir)")
    ap.add_argument("--step", type=int, default=0, help="the step whose episodes to use")
    ap.add_argument("--config", type=Path, help="tryloop config the run used (default: the embedded defaults)")
    ap.add_argument("--out", type=Path, default=HERE / "results-sampler-learner.json")
    args = ap.parse_args()

    import torch

    from tryloop.agent.hf import load_model, resolve_engine_dtype
    from tryloop.config import TryloopConfig, load_yaml
    from tryloop.telemetry.stats import nearest_rank
    from tryloop.train.advantages import compute_advantages
    from tryloop.train.memory import peak_rss_mb
    from tryloop.train.run import stored_episodes, stored_run
    from tryloop.train.update import Learner

    cfg = load_yaml(args.config) if args.config else TryloopConfig()
    run, tcfg = stored_run(cfg.store.runs_dir, args.run)
    loaded = load_model(tcfg.policy.name, device=tcfg.policy.device)
    device = loaded.device
    stored = stored_episodes(cfg.store.trajectories_url, run, args.step)
    trajs = [t for t in stored if t.token_source == "exact" and t.policy_version == loaded.weights_version]
    if not trajs:
        raise SystemExit(f"run {run}, step {args.step}: no stored episode was sampled by {tcfg.policy.name}'s "
                         f"weights {loaded.weights_version} ({len(stored)} episodes stored)")

    # Log-probabilities at temperature 1, where the sampler records them.
    learner = Learner(loaded.model, tcfg.algo.model_copy(update={"temperature": 1.0}), tokenizer=loaded.tokenizer)
    t0 = time.perf_counter()
    ours = learner.logprobs(trajs)
    logprob_s = time.perf_counter() - t0
    diffs = [lps[i] - t.logprobs[i] for t, lps in zip(trajs, ours, strict=True)
             for i, m in enumerate(t.loss_mask) if m]
    absd = [abs(d) for d in diffs]
    ratios = [math.exp(d) for d in diffs]
    del learner

    # One update on a fresh copy of the weights, as the run's learner takes it.
    fresh = load_model(tcfg.policy.name, device=tcfg.policy.device).model
    updater = Learner(fresh, tcfg.algo, tokenizer=loaded.tokenizer)
    adv = compute_advantages(trajs, tcfg.algo).for_update()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    out = updater.step(trajs, adv)
    if device.type == "cuda":
        torch.cuda.synchronize()
    update_s = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else peak_rss_mb())

    result = {
        "run": run, "step": args.step, "policy": tcfg.policy.name, "weights_version": loaded.weights_version,
        "device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "sampler_dtype": str(resolve_engine_dtype(tcfg.policy.dtype, device)).removeprefix("torch."),
        "learner_amp_bf16": updater.amp,
        "episodes": len(trajs), "sampled_tokens": len(diffs),
        "logprob_abs_diff": {"max": max(absd), "mean": statistics.fmean(absd), "p50": nearest_rank(absd, 50),
                             "p99": nearest_rank(absd, 99)},
        "ratio": {"mean": statistics.fmean(ratios), "min": min(ratios), "max": max(ratios),
                  "p01": nearest_rank(ratios, 1), "p99": nearest_rank(ratios, 99)},
        "logprob_pass_s": round(logprob_s, 3),
        "update": {"seconds": round(update_s, 3), "sequences": out["sequences"], "loss_tokens": out["tokens"],
                   "loss": out.get("loss"), "grad_norm": out.get("grad_norm"),
                   "optimizer_steps": out["optimizer_steps"],
                   "peak_mib": round(peak, 1),
                   "peak_kind": "torch.cuda.max_memory_allocated" if device.type == "cuda" else "ru_maxrss"},
    }
    print(json.dumps(result, indent=1))
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
