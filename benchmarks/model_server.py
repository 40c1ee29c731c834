"""What `tryloop serve model` costs: tokens/s of the same engine called in-process, through the
server with the `openai` client, and streamed, side by side in one run.

    python benchmarks/model_server.py [--concurrency 1,8] [--tokens 64] [--rounds 3] [--threads 1] [--out FILE]

One engine (the bundled model, float32, 1 torch thread by default, max_batch = the highest
concurrency) serves all three modes, so they share its prefix cache and the machine's load:

  in-process  `Engine.generate` on the chat-templated prompt, as HFPolicy calls it;
  served      `AsyncOpenAI.chat.completions.create` against the server on 127.0.0.1 (the request
              parsed and validated, the chat template applied, the reply built and sent back);
  streamed    the same with `stream=True`: one server-sent event per token.

Each request is one of 8 short chat questions, sampled at temperature 1 with its own seed to
exactly `--tokens` new tokens (end-of-sequence off: `ignore_eos` when served), with logprobs and
token ids asked for, as tryloop's trainer asks. At concurrency c, c requests are sent at once;
tokens/s = tokens generated / wall time from the first request sent to the last reply. In each
round the modes run one after another at every concurrency, so load from other work hits all of
them; the medians over rounds are reported, with time to first token (p50 over a round's streamed
requests) and the per-request latency p50. Writes results-model-server.json beside this file (or
--out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUESTIONS = [
    "What is the capital of France?", "Write a Python function that reverses a string.", "hi",
    "List three colours of the rainbow.", "Explain recursion in one paragraph.", "What is 2 + 2?",
    "Name a fruit that is yellow.", "How do I open a file in Python?",
]


async def _round(engine, chat, url: str, c: int, tokens: int) -> dict[str, dict[str, float]]:
    import openai

    messages = [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(c)]
    out: dict[str, dict[str, float]] = {}

    async def inproc(i: int) -> tuple[int, float, None]:
        t0 = time.perf_counter()
        s = await engine.generate(chat.start(messages[i]), max_new_tokens=tokens, temperature=1.0, seed=i,
                                  stop_token_ids=[])
        return len(s.token_ids), time.perf_counter() - t0, None

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    kw = dict(model="bench", max_tokens=tokens, temperature=1.0, logprobs=True,
              extra_body={"ignore_eos": True, "return_token_ids": True})

    async def served(i: int) -> tuple[int, float, None]:
        t0 = time.perf_counter()
        r = await client.chat.completions.create(messages=messages[i], seed=i, **kw)
        return len(r.choices[0].model_extra["token_ids"]), time.perf_counter() - t0, None

    async def streamed(i: int) -> tuple[int, float, float | None]:
        t0, n, first = time.perf_counter(), 0, None
        async for chunk in await client.chat.completions.create(messages=messages[i], seed=i, stream=True, **kw):
            ids = chunk.choices[0].model_extra.get("token_ids") if chunk.choices else None
            if ids:
                first = first if first is not None else time.perf_counter() - t0
                n += len(ids)
        return n, time.perf_counter() - t0, first

    try:
        for name, one in (("in_process", inproc), ("served", served), ("streamed", streamed)):
            t0 = time.perf_counter()
            results = await asyncio.gather(*[one(i) for i in range(c)])
            wall = time.perf_counter() - t0
            n = sum(r[0] for r in results)
            assert n == c * tokens, f"{name}: {n} tokens, expected {c * tokens}"
            row = {"tokens_per_s": n / wall, "latency_p50_s": statistics.median(r[1] for r in results)}
            firsts = [r[2] for r in results if r[2] is not None]
            if firsts:
                row["ttft_p50_s"] = statistics.median(firsts)
            out[name] = row
    finally:
        await client.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results-model-server.json")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]

    from tryloop.agent.chat import ChatTokenizer
    from tryloop.agent.engine import Engine
    from tryloop.agent.hf import load_model
    from tryloop.serve.config import ServeModelConfig
    from tryloop.serve.model import model_server_in_thread

    loaded = load_model("smollm2-135m", device="cpu")
    chat = ChatTokenizer(loaded.tokenizer)
    rounds: list[dict] = []
    with Engine(loaded.model, loaded.tokenizer, max_batch=max(levels), num_threads=args.threads,
                weights_version=loaded.weights_version) as engine, \
            model_server_in_thread(engine, ServeModelConfig(port=0, access_log=None), model_name="bench") as url:
        asyncio.run(_round(engine, chat, url, 1, 8))                  # warm up every path once
        for r in range(args.rounds):
            for c in levels:
                got = asyncio.run(_round(engine, chat, url, c, args.tokens))
                rounds.append({"round": r, "concurrency": c, **got})
                print(f"round {r} c={c}: " + ", ".join(f"{k} {v['tokens_per_s']:.1f} tok/s" for k, v in got.items())
                      + f", ttft p50 {got['streamed']['ttft_p50_s'] * 1000:.0f} ms", flush=True)
    summary = []
    for c in levels:
        mine = [x for x in rounds if x["concurrency"] == c]
        row: dict = {"concurrency": c}
        for mode in ("in_process", "served", "streamed"):
            for key in ("tokens_per_s", "latency_p50_s", "ttft_p50_s"):
                values = [x[mode][key] for x in mine if key in x[mode]]
                if values:
                    row[f"{mode}_{key}"] = round(statistics.median(values), 4)
        summary.append(row)
        print(json.dumps(row))
    args.out.write_text(json.dumps({
        "when": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": platform.machine(), "cpus": os.cpu_count(),
        "load_average": os.getloadavg(), "threads": args.threads, "tokens": args.tokens,
        "rounds": args.rounds, "summary": summary, "per_round": rounds}, indent=1) + "\n")


if __name__ == "__main__":
    main()
