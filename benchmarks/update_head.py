"""The output projection's log-probabilities and their gradient, side by side: autograd's chain
over a checkpointed float32 chunk (the baseline) against the learner's fused chunk
(`_ChunkLogprobs`) in float32 and with bf16 matmuls, on hidden states of a real run's episodes.

    python benchmarks/update_head.py [--run RUN_ID] [--step 0] [--rounds 5] [--config FILE] [--out FILE]

The run's policy is loaded as the run loaded it; the chosen step's stored episodes are collated
into the learner's micro-batches and run through the decoder once (under the run's autocast).
Then, per round and in rotating order, each arm computes the tempered log-probabilities of the
sampled tokens (`algo.temperature`, chunks of LOGIT_CHUNK) and the gradient of their weighted sum
with respect to the hidden states and the projection's weight, on all threads. Reported per arm:
seconds per round (p50, p90), the ratio to the baseline's p50, and how far its log-probabilities
and gradients are from the baseline's. Writes results-update-head.json beside this file (or --out).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="the train run (default: the newest run directory under store.runs_dir)")
    ap.add_argument("--step", type=int, default=0, help="the step whose episodes to use")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per arm")
    ap.add_argument("--config", type=Path, help="tryloop config the run used (default: the embedded defaults)")
    ap.add_argument("--out", type=Path, default=HERE / "results-update-head.json")
    args = ap.parse_args()

    import torch
    from torch.utils.checkpoint import checkpoint

    from tryloop.agent.hf import load_model
    from tryloop.config import TryloopConfig, load_yaml
    from tryloop.telemetry.stats import nearest_rank
    from tryloop.train import update
    from tryloop.train.advantages import compute_advantages
    from tryloop.train.run import stored_episodes, stored_run

    cfg = load_yaml(args.config) if args.config else TryloopConfig()
    run, tcfg = stored_run(cfg.store.runs_dir, args.run)
    loaded = load_model(tcfg.policy.name, device=tcfg.policy.device)
    trajs = stored_episodes(cfg.store.trajectories_url, run, args.step)
    if not trajs:
        raise SystemExit(f"run {run}, step {args.step}: no stored episodes")
    learner = update.Learner(loaded.model, tcfg.algo, tokenizer=loaded.tokenizer)
    adv = compute_advantages(trajs, tcfg.algo).for_update()
    kept = [(t, a) for t, a in zip(trajs, adv, strict=True) if a is not None]
    batches = [b for mini in learner._plan([t for t, _ in kept], [a for _, a in kept]) for b in mini]
    head = loaded.model.get_output_embeddings()
    temperature = tcfg.algo.temperature
    inputs = []
    with torch.no_grad():
        for b in batches:
            hidden, _ = learner._hidden(learner.model, b)
            select = b.loss_mask > 0
            inputs.append((hidden[select].float(), b.input_ids[:, 1:][select]))
    tokens = sum(h.shape[0] for h, _ in inputs)

    def baseline(h, tg, w):
        def chunk(x, t):
            return update.token_logprobs(torch.nn.functional.linear(x, w), t, temperature)
        return torch.cat([checkpoint(chunk, h[i:i + update.LOGIT_CHUNK], tg[i:i + update.LOGIT_CHUNK],
                                     use_reentrant=False) for i in range(0, h.shape[0], update.LOGIT_CHUNK)])

    def fused(dtype):
        def arm(h, tg, w):
            wc = w.to(dtype)
            return torch.cat([update._ChunkLogprobs.apply(h[i:i + update.LOGIT_CHUNK], wc, None,
                                                          tg[i:i + update.LOGIT_CHUNK], temperature, False)[0]
                              for i in range(0, h.shape[0], update.LOGIT_CHUNK)])
        return arm

    arms = {"baseline (autograd, float32)": baseline, "fused, float32": fused(torch.float32)}
    if learner.amp:
        arms["fused, bf16 matmuls"] = fused(torch.bfloat16)

    def one(fn):
        """Seconds, log-probabilities and gradients of one pass over every micro-batch."""
        w = head.weight.detach().clone().requires_grad_(True)
        lps, ghs = [], []
        t0 = time.perf_counter()
        for h, tg in inputs:
            h = h.clone().requires_grad_(True)
            lp = fn(h, tg, w)
            weights = torch.linspace(-1.0, 1.0, lp.shape[0])   # a loss whose gradient is not uniform
            (lp * weights).sum().backward()
            lps.append(lp.detach())
            ghs.append(h.grad)
        return time.perf_counter() - t0, torch.cat(lps), torch.cat(ghs), w.grad

    one(arms["baseline (autograd, float32)"])   # first-call set-up out of the timings
    times: dict[str, list[float]] = {name: [] for name in arms}
    out_of: dict[str, tuple] = {}
    for r in range(args.rounds):
        names = list(arms)
        for name in names[r % len(names):] + names[:r % len(names)]:
            s, lp, gh, gw = one(arms[name])
            times[name].append(s)
            out_of[name] = (lp, gh, gw)
    ref = out_of["baseline (autograd, float32)"]
    base_p50 = nearest_rank(times["baseline (autograd, float32)"], 50)
    result = {
        "run": run, "step": args.step, "policy": tcfg.policy.name, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "tokens": tokens, "micro_batches": len(inputs),
        "temperature": temperature, "rounds": args.rounds, "arms": {},
    }
    for name, ts in times.items():
        lp, gh, gw = out_of[name]
        result["arms"][name] = {
            "p50_s": round(nearest_rank(ts, 50), 3), "p90_s": round(nearest_rank(ts, 90), 3),
            "ratio_to_baseline_p50": round(nearest_rank(ts, 50) / base_p50, 3),
            "logprob_mean_abs_diff": float((lp - ref[0]).abs().mean()),
            "logprob_max_abs_diff": float((lp - ref[0]).abs().max()),
            "grad_hidden_rel_err": float((gh - ref[1]).norm() / ref[1].norm()),
            "grad_weight_rel_err": float((gw - ref[2]).norm() / ref[2].norm()),
        }
    print(json.dumps(result, indent=1))
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
