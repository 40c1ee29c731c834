"""llama.cpp's server as a second generation engine, measured on the generation benchmark's workload.

Another engine could be the faster sampler on this machine; llama.cpp's `llama-server` is the
obvious candidate on a CPU: C++ decode loops, continuous batching over
`--parallel` slots, quantized weights read straight from the GGUF that ships with the bundled model.
This module starts one server per concurrency level (slots = c, one context of c x the longest
request), sends the same token-id prompts with the same lengths at T=1 with every truncation off
(top-k, top-p, min-p, penalties) and end-of-sequence ignored, so each request produces exactly its
length, and asks for each sampled token's id and log-probability, as training would need. Tokens/s
= generated tokens / wall time from the first request sent to the last answer (prefills included).

Not an engine of `tryloop train`: its weights are the GGUF's 4-bit blocks, not the learner's, and a
weight refresh after each update would need a GGUF export and a reload; the benchmark measures it so
that choosing an engine is a matter of numbers.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from tryloop.errors import TryloopError


class LlamaServerError(TryloopError):
    """The llama.cpp server could not be started or answered badly; the message says what happened."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_binary(binary: Path) -> None:
    """Refuse a path that cannot be the server before any work is done (the benchmark checks first)."""
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise LlamaServerError(f"--llama-server: {binary} is not an executable file (a llama.cpp `llama-server` "
                               "binary)")


def start_server(binary: Path, gguf: Path, *, slots: int, ctx: int, threads: int,
                 timeout_s: float = 120.0) -> tuple[subprocess.Popen, str]:
    """`llama-server` on a free loopback port, returned once /health answers 200."""
    check_binary(binary)
    port = _free_port()
    cmd = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--parallel", str(slots),
           "--ctx-size", str(ctx), "--threads", str(threads), "--threads-batch", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            raise LlamaServerError(f"{binary} exited with status {proc.returncode}: {err}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop_server(proc)
    raise LlamaServerError(f"{binary} did not answer /health within {timeout_s:.0f} s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _body(prompt: list[int], n: int, seed: int) -> dict[str, Any]:
    return {"prompt": prompt, "n_predict": n, "ignore_eos": True, "seed": seed, "temperature": 1.0,
            "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0,
            "cache_prompt": True, "return_tokens": True, "n_probs": 1, "stream": False}


async def _complete(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(f"{url}/completion", json=body)
    if r.status_code != 200:
        raise LlamaServerError(f"/completion answered {r.status_code}: {r.text[:500]}")
    return r.json()


def _sampled(answer: dict[str, Any]) -> tuple[int, int]:
    """(tokens generated, tokens that came back with an id and a log-probability)."""
    probs = answer.get("completion_probabilities") or []
    with_logprob = sum(1 for p in probs if "id" in p and ("logprob" in p or "prob" in p))
    return int(answer.get("tokens_predicted") or len(answer.get("tokens") or [])), with_logprob


def run_llama_server(binary: Path, gguf: Path, prompts: list[list[int]], lengths: list[int], concurrency: int,
                     *, threads: int, seed: int = 0) -> dict[str, Any]:
    """All requests sent at once to a server with `concurrency` slots; the engine row's fields."""
    ctx = concurrency * (max(len(p) for p in prompts) + max(lengths) + 16)
    proc, url = start_server(binary, gguf, slots=concurrency, ctx=ctx, threads=threads)

    async def go() -> tuple[float, list[dict[str, Any]]]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0)) as client:
            await _complete(client, url, _body(prompts[0][:32], 4, seed))             # warm-up
            t0 = time.perf_counter()
            answers = await asyncio.gather(*[_complete(client, url, _body(p, n, seed + i))
                                             for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))])
            return time.perf_counter() - t0, answers

    try:
        wall, answers = asyncio.run(go())
    finally:
        stop_server(proc)
    counted = [_sampled(a) for a in answers]
    tokens = sum(n for n, _ in counted)
    if tokens != sum(lengths):
        raise LlamaServerError(f"the server generated {tokens} tokens, {sum(lengths)} were asked for")
    per_token_ms = [a["timings"]["predicted_ms"] / max(1, a["timings"]["predicted_n"])
                    for a in answers if a.get("timings")]
    return {"tokens": tokens, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2),
            "tokens_with_logprob": sum(k for _, k in counted),
            "mean_token_ms": round(sum(per_token_ms) / len(per_token_ms), 2) if per_token_ms else None,
            "prompt_tokens_evaluated": sum(a.get("timings", {}).get("prompt_n", 0) for a in answers)}
