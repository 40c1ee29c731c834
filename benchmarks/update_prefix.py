"""The update with and without the shared prefix (`algo.shared_prefix`), side by side, on the
episodes a real training run stored.

    python benchmarks/update_prefix.py [--run RUN_ID] [--steps 0,1] [--pairs 2] [--config FILE] [--out FILE]

For each chosen step of the run, the step's stored episodes and the advantages the run computed
from them go through `Learner.step` twice per pair, once with the prompt a micro-batch shares run
once and once with every row run in full, in ABBA order, each time on a fresh copy of the bundled
model, with the train run's settings (micro-batch 4, bf16 autocast where the CPU has it,
activation checkpointing, fused AdamW), all threads, inside the train loop's lean heap. Reported per
arm: the update's seconds (p50 over pairs and steps), the tokens the decoder ran, and the loss (it
must agree between the arms: the two paths compute the same thing). Also the per-pair time ratio.
Writes results-update-prefix.json beside this file (or --out).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _decoder_tokens(learner, trajs, adv) -> int:
    """Token positions the decoder runs for this update on the learner's path."""
    from tryloop.train import shared_prefix

    kept = [(t, a) for t, a in zip(trajs, adv, strict=True) if a is not None]
    total = 0
    for mini in learner._plan([t for t, _ in kept], [a for _, a in kept]):
        for b in mini:
            p = shared_prefix.prefix_length(b.input_ids, b.attention_mask) if learner.shared_prefix else 0
            total += p + b.input_ids.shape[0] * (b.input_ids.shape[1] - p)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="the run whose stored episodes to train on (default: the newest run "
                                  "directory under the config's store.runs_dir)")
    ap.add_argument("--steps", default="0,1", help="the run's steps to take episodes from (comma-separated)")
    ap.add_argument("--pairs", type=int, default=2, help="updates per arm and step, in ABBA order")
    ap.add_argument("--config", type=Path, help="tryloop config (default: the embedded defaults)")
    ap.add_argument("--out", type=Path, default=HERE / "results-update-prefix.json")
    args = ap.parse_args()

    import torch

    from tryloop.agent.hf import load_model
    from tryloop.config import TryloopConfig, load_yaml
    from tryloop.train import memory
    from tryloop.train.advantages import compute_advantages
    from tryloop.train.run import stored_episodes, stored_run
    from tryloop.train.update import Learner

    cfg = load_yaml(args.config) if args.config else TryloopConfig()
    run, tcfg = stored_run(cfg.store.runs_dir, args.run)
    steps = [int(s) for s in args.steps.split(",")]
    loaded = load_model(tcfg.policy.name, device="cpu")
    base = loaded.model
    rows, ratios = {"shared": [], "full": []}, []
    for step in steps:
        trajs = stored_episodes(cfg.store.trajectories_url, run, step)
        if not trajs:
            raise SystemExit(f"run {run} stored no episodes for step {step}")
        adv = compute_advantages(trajs, tcfg.algo).for_update()
        for pair in range(args.pairs):
            order = ["shared", "full"] if pair % 2 == 0 else ["full", "shared"]
            seconds = {}
            for arm in order:
                algo = tcfg.algo.model_copy(update={"shared_prefix": arm == "shared"})
                learner = Learner(copy.deepcopy(base), algo, tokenizer=loaded.tokenizer)
                tokens = _decoder_tokens(learner, trajs, adv)
                memory.release()
                with memory.lean_heap():
                    t0 = time.perf_counter()
                    out = learner.step(trajs, adv)
                    seconds[arm] = time.perf_counter() - t0
                rows[arm].append({"step": step, "pair": pair, "seconds": round(seconds[arm], 2),
                                  "decoder_tokens": tokens, "loss": out.get("loss"),
                                  "sequences": out["sequences"], "loss_tokens": out["tokens"]})
                print(f"step {step} pair {pair} {arm:6s} {seconds[arm]:7.1f} s  {tokens:7d} decoder tokens  "
                      f"loss {out.get('loss')}", flush=True)
                del learner
            ratios.append(seconds["shared"] / seconds["full"])

    def arm(name: str) -> dict:
        r = rows[name]
        return {"seconds_p50": statistics.median(x["seconds"] for x in r),
                "decoder_tokens": sum(x["decoder_tokens"] for x in r) // len(r), "rows": r}

    result = {"run": run, "steps": steps, "pairs": args.pairs, "threads": torch.get_num_threads(),
              "shared": arm("shared"), "full": arm("full"),
              "ratio_p50": statistics.median(ratios), "ratios": [round(x, 3) for x in ratios],
              "loss_max_abs_diff": max(abs((a["loss"] or 0) - (b["loss"] or 0))
                                       for a, b in zip(rows["shared"], rows["full"], strict=True))}
    print(f"shared prefix / full: p50 time ratio {result['ratio_p50']:.2f} "
          f"({result['shared']['seconds_p50']:.1f} s vs {result['full']['seconds_p50']:.1f} s); decoder tokens "
          f"{result['shared']['decoder_tokens']} vs {result['full']['decoder_tokens']}; "
          f"loss differs by at most {result['loss_max_abs_diff']:.2e}")
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
