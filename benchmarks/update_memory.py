"""Peak memory and time of the policy update: without activation checkpointing, with it, and with
it inside the train loop's lean heap (`tryloop.train.memory.lean_heap`), side by side.

    python benchmarks/update_memory.py [--sequences 8] [--length 600] [--completion 192] [--steps 2] [--out FILE]

Each configuration runs in a fresh process (peak memory is a per-process high-water mark) on the
bundled model with the train run's settings (micro-batch 4, bf16 autocast where the CPU has it,
fused AdamW): `--steps` updates on the same `--sequences` token sequences of `--length` tokens whose
last `--completion` tokens carry the loss, advantages +1/-1. The configurations rotate, `--repeats`
times each, so load on the machine hits all of them. Reported per configuration: the process's peak
resident memory (VmHWM) after loading and after the updates, and the median seconds of an update.
Then the lean heap's time cost, free of load swings: `--pairs` pairs of updates in one process, one
on each heap, in ABBA order; the ratio of each pair. Writes results-update-memory.json beside this
file (or --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


#: name -> (activation checkpointing, lean heap)
CONFIGS = {"baseline_no_checkpointing": (False, False), "activation_checkpointing": (True, False),
           "checkpointing_lean_heap": (True, True)}


def measure(name: str, sequences: int, length: int, completion: int, steps: int) -> dict:
    """One configuration, in this process."""
    import contextlib

    import torch

    from tryloop.agent.hf import load_model
    from tryloop.agent.trajectory import Trajectory
    from tryloop.train import memory
    from tryloop.train.run_config import TrainRunConfig
    from tryloop.train.update import Learner

    checkpointing, lean = CONFIGS.get(name, (True, None))
    algo = TrainRunConfig().algo.model_copy(update={"activation_checkpointing": checkpointing})
    model = load_model("smollm2-135m").model
    loaded_mb = _hwm_mb()
    learner = Learner(model, algo)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    trajs = [Trajectory(episode_id=f"e{i}", task_id="t", logprobs=[0.0] * length,
                        token_ids=torch.randint(1, vocab, (length,), generator=g).tolist(),
                        loss_mask=[0] * (length - completion) + [1] * completion) for i in range(sequences)]
    advantages = [1.0 if i % 2 else -1.0 for i in range(sequences)]

    def update(lean: bool) -> float:
        t = time.perf_counter()
        with memory.lean_heap() if lean else contextlib.nullcontext():
            learner.step(trajs, advantages)
        return time.perf_counter() - t

    if name == "paired":
        # The time cost of the lean heap, free of load swings: updates alternate between the two
        # heaps in one process (ABBA order), and each pair gives a ratio.
        pairs = []
        for i in range(steps):
            order = (False, True) if i % 2 == 0 else (True, False)
            secs = {lean: update(lean) for lean in order}
            pairs.append({"default_s": secs[False], "lean_s": secs[True]})
        return {"config": name, "pairs": pairs}
    seconds = [update(lean) for _ in range(steps)]
    return {"config": name, "loaded_mb": round(loaded_mb),
            "peak_mb": round(_hwm_mb()), "update_s": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--length", type=int, default=600)
    ap.add_argument("--completion", type=int, default=192)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results-update-memory.json")
    ap.add_argument("--pairs", type=int, default=4, help="default/lean update pairs timed in one process")
    ap.add_argument("--one", choices=[*CONFIGS, "paired"], help=argparse.SUPPRESS)  # a child's configuration
    args = ap.parse_args()
    shape = (args.sequences, args.length, args.completion, args.steps)
    if args.one:
        print(json.dumps(measure(args.one, *shape)))
        return

    def child(which: str, steps: int) -> dict:
        cmd = [sys.executable, __file__, "--one", which, "--sequences", str(args.sequences),
               "--length", str(args.length), "--completion", str(args.completion), "--steps", str(steps)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    names = list(CONFIGS)
    for r in range(args.repeats):
        for which in names[r % len(names):] + names[:r % len(names)]:
            runs[which].append(child(which, args.steps))
            print(which, runs[which][-1], flush=True)

    def row(rs: list[dict]) -> dict:
        return {"peak_mb_p50": statistics.median(r["peak_mb"] for r in rs),
                "loaded_mb_p50": statistics.median(r["loaded_mb"] for r in rs),
                "update_s_p50": statistics.median(s for r in rs for s in r["update_s"])}

    rows = {name: row(rs) for name, rs in runs.items()}
    base = rows["baseline_no_checkpointing"]
    for r in rows.values():
        r["peak_ratio"] = r["peak_mb_p50"] / base["peak_mb_p50"]
        r["update_time_ratio"] = r["update_s_p50"] / base["update_s_p50"]
    paired = child("paired", args.pairs)["pairs"]
    print("paired", paired, flush=True)
    ratios = [p["lean_s"] / p["default_s"] for p in paired]
    result = {"date": time.strftime("%Y-%m-%d"), "shape": dict(zip(("sequences", "length", "completion", "steps"),
                                                                    shape, strict=True)),
              **rows, "lean_heap_time_ratio_paired": {"p50": statistics.median(ratios), "min": min(ratios),
                                                      "max": max(ratios), "pairs": paired},
              "runs": runs}
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
