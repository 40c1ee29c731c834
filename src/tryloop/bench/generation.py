"""`tryloop bench generation`: tokens/s of the local engine against HF generate and a FLOP floor.

For each concurrency c in (1, 8, 16, 32) and each dtype (float32, bfloat16 where
the machine has fast bf16), the same workload goes through

  engine     `tryloop.agent.engine.Engine(max_batch=c)`: all requests submitted at
             once, continuous batching keeps c in flight;
  plain      the same engine with `cpu_kernels=False`: transformers' own attention and
             matmuls (the engine before its CPU kernels);
  hf         Hugging Face `model.generate` on static batches of c (left-padded), the
             same prompts; a batch runs until its longest request is done, so only
             the requested tokens count as useful (the rest is static batching's
             waste, shown as `hf_raw_tokens_per_s`);
  floors     the model's forward FLOPs per token (2 x every Linear's weights, the
             lm head included, + the attention's 4 x heads x head_dim x context per
             layer) at (1) the machine's peak matmul rate (a large GEMM in that
             dtype) and (2) the rate of the decode's own GEMMs: every Linear of the
             model in order on its own weights at M = c rows (plain or packed, the
             faster), attention at the peak rate.

The workload is the training run's first turn: the chat-templated system prompt
of `tryloop.agent.episode.system_prompt` for a function-level task (answer-file
shortcut included) + a HumanEval-style instruction: ~460 tokens with the
bundled tokenizer (the tool list makes the system prompt ~370). Sampled at
temperature 1 to a fixed length drawn uniformly from [100, 200] new tokens
(`--quick`: [16, 32], and only the dtype "auto" would pick), stop tokens off so
every request produces exactly its length on both sides. Tokens/s = generated tokens / wall time from submission of
the first request to the last result (prefills included; the engine's prefix
cache is on, as in training, so the shared system prompt is prefilled once).

Per-token latency (p50/p99): the gap between consecutive decode steps that a
running sequence sees (prefills of joining requests included), weighted by the
sequences in the step; the first token (time to first token) is not counted.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

CONCURRENCY = (1, 8, 16, 32)

# HumanEval-style functions (the training tasks' shape: a signature, a docstring, examples).
FUNCTIONS = [
    ("below_zero", 'from typing import List\n\n\ndef below_zero(operations: List[int]) -> bool:\n    """You\'re given '
     'a list of deposit and withdrawal operations on a bank account that starts with\n    zero balance. Your task is '
     'to detect if at any point the balance of account falls below zero, and\n    at that point function should '
     'return True. Otherwise it should return False.\n    >>> below_zero([1, 2, 3])\n    False\n    >>> '
     'below_zero([1, 2, -4, 5])\n    True\n    """\n    raise NotImplementedError'),
    ("count_vowels", 'def count_vowels(s: str) -> int:\n    """Return the number of vowels (a, e, i, o, u, either case) in '
     'the string s.\n    A \'y\' counts as a vowel only when it is the last character of the string.\n    >>> '
     'count_vowels("abcde")\n    2\n    >>> count_vowels("ACEDY")\n    3\n    """\n    raise NotImplementedError'),
    ("rolling_max", 'from typing import List\n\n\ndef rolling_max(numbers: List[int]) -> List[int]:\n    """From a given '
     'list of integers, generate a list of rolling maximum element found until the given\n    moment in the '
     'sequence.\n    >>> rolling_max([1, 2, 3, 2, 3, 4, 2])\n    [1, 2, 3, 3, 3, 4, 4]\n    """\n    raise '
     'NotImplementedError'),
    ("is_palindrome", 'def is_palindrome(text: str) -> bool:\n    """Checks if the given string is a palindrome, '
     'ignoring case and every character\n    that is not a letter or a digit.\n    >>> is_palindrome(\'\')\n    '
     'True\n    >>> is_palindrome(\'A man, a plan, a canal: Panama\')\n    True\n    >>> is_palindrome(\'zbcd\')\n'
     '    False\n    """\n    raise NotImplementedError'),
    ("separate_groups", 'from typing import List\n\n\ndef separate_groups(paren_string: str) -> List[str]:\n    """Input '
     'is a string containing multiple groups of nested parentheses. Separate those groups\n    into separate '
     'strings and return the list of those. Groups are balanced and not nested\n    within each other. Ignore any '
     'spaces in the input string.\n    >>> separate_groups(\'( ) (( )) (( )( ))\')\n    [\'()\', \'(())\', '
     '\'(()())\']\n    """\n    raise NotImplementedError'),
    ("largest_prime_factor", 'def largest_prime_factor(n: int) -> int:\n    """Return the largest prime factor of n. '
     'Assume n > 1 and is not a prime.\n    >>> largest_prime_factor(13195)\n    29\n    >>> '
     'largest_prime_factor(2048)\n    2\n    """\n    raise NotImplementedError'),
    ("sort_by_digit_sum", 'from typing import List\n\n\ndef sort_by_digit_sum(nums: List[int]) -> List[int]:\n    '
     '"""Sort the given list of integers in ascending order according to the sum of their\n    digits (the sign '
     'of a negative number counts against its first digit). Items with the\n    same digit sum keep their '
     'original order.\n    >>> sort_by_digit_sum([1, 11, -1, -11, -12])\n    [-1, -11, 1, -12, 11]\n    """\n'
     '    raise NotImplementedError'),
    ("encode_shift", 'def encode_shift(s: str, k: int) -> str:\n    """Return s with every lowercase letter shifted k '
     'places forward in the alphabet,\n    wrapping around from \'z\' to \'a\'. Other characters are kept as they '
     'are.\n    >>> encode_shift(\'abc xyz\', 2)\n    \'cde zab\'\n    """\n    raise NotImplementedError'),
]


def instruction(entry: str, prompt: str) -> str:
    # The wording of tryloop.tasks.sources.humaneval.instruction_for.
    return (f"Implement `{entry}` in `solution.py` as described by its docstring. Keep its name and "
            f"signature: the tests import `{entry}` from `solution.py`. Replace the "
            "`raise NotImplementedError` body; the examples in the docstring show the expected "
            f"behaviour.\n\n```python\n{prompt.rstrip()}\n```\n")


def training_prompts(tokenizer: Any, n: int) -> list[list[int]]:
    """`n` first-turn prompts of function tasks with the tool-using system prompt (cycling over
    FUNCTIONS): the prompt of a multi-turn episode, longer than a one-turn episode's."""
    from tryloop.agent.chat import ChatTokenizer
    from tryloop.agent.episode import system_prompt

    system = system_prompt(SimpleNamespace(meta=SimpleNamespace(answer_file="solution.py",
                                                                  environment="software")))  # type: ignore[arg-type]
    chat = ChatTokenizer(tokenizer)
    return [chat.start([{"role": "system", "content": system},
                        {"role": "user", "content": instruction(*FUNCTIONS[i % len(FUNCTIONS)])}])
            for i in range(n)]


# --- machine -------------------------------------------------------------------------------------


def bf16_is_fast(device: torch.device | str = "cpu") -> bool:
    from tryloop.agent.hf import bf16_supported

    return bf16_supported(device)


def _timeit(fn: Any, min_s: float, min_reps: int = 3) -> float:
    """Median seconds per call of `fn` over at least `min_reps` calls and `min_s` seconds."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_s:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_matmul_flops(dtype: torch.dtype, *, n: int = 2048, min_s: float = 0.5) -> float:
    """FLOP/s of one large square GEMM in `dtype` with torch's current thread count."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    return 2 * n ** 3 / _timeit(lambda: a @ b, min_s)


def linear_shapes(model: Any) -> dict[tuple[int, int], int]:
    """(in_features, out_features) -> how many Linear layers of the model have it (lm head included)."""
    shapes: dict[tuple[int, int], int] = {}
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            key = (m.in_features, m.out_features)
            shapes[key] = shapes.get(key, 0) + 1
    return shapes


def attention_flops_per_token(config: Any, context: float) -> float:
    """QK^T and AV for one new token attending to `context` positions, all layers."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 4.0 * config.num_hidden_layers * heads * head_dim * context


def flops_per_token(model: Any, context: float) -> float:
    linear = sum(2.0 * i * o * n for (i, o), n in linear_shapes(model).items())
    return linear + attention_flops_per_token(model.config, context)


def decode_gemm_seconds(model: Any, dtype: torch.dtype, rows: int, *, min_s: float = 0.05) -> float:
    """Seconds of one decode step's Linear layers at M = `rows`: every Linear of the model in order
    on its own weights, so they stream from memory as in a decode step (one shape timed over and
    over on one matrix would sit in cache: at one row that read as twice the speed), through
    torch's `linear` or the engine's packed weights where packing is exact (the faster)."""
    from tryloop.agent.packed_linear import packed_linear_fn, packing_exact

    weights = [m.weight.detach().to(dtype) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1]).to(dtype) for w in weights}

    def plain() -> None:
        for w in weights:
            torch.nn.functional.linear(inputs[w.shape[1]], w)

    seconds = _timeit(plain, min_s)
    if packing_exact(dtype, rows):
        fns = [(packed_linear_fn(w, rows), inputs[w.shape[1]]) for w in weights]

        def packed() -> None:
            for fn, x in fns:
                fn(x)

        seconds = min(seconds, _timeit(packed, min_s))
    return seconds


def machine_info() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import transformers

    return {"cpu": cpu or platform.processor(), "cores": os.cpu_count(), "torch": torch.__version__,
            "transformers": transformers.__version__, "torch_threads": torch.get_num_threads(),
            "bf16_fast": bf16_is_fast("cpu"), "loadavg": os.getloadavg()}


# --- the two generators --------------------------------------------------------------------------


def _weighted_pct(gaps: list[tuple[float, int]], q: float) -> float:
    """Percentile `q` of the gaps, each counted once per sequence that waited it."""
    if not gaps:
        return 0.0
    gaps = sorted(gaps)
    total = sum(w for _, w in gaps)
    rank, seen = q * (total - 1), 0
    for g, w in gaps:
        seen += w
        if seen > rank:
            return g
    return gaps[-1][0]


def run_engine(model: Any, tokenizer: Any, prompts: list[list[int]], lengths: list[int], concurrency: int,
               *, engine_cls: Any = None, seed: int = 0, **engine_kw: Any) -> dict[str, Any]:
    """All requests submitted at once to an engine of `max_batch=concurrency`."""
    if engine_cls is None:
        from tryloop.agent.engine import Engine as engine_cls
    eng = engine_cls(model, tokenizer, max_batch=concurrency, **engine_kw)
    steps: list[tuple[float, int]] = []
    decode = eng._decode_step

    def timed_step() -> None:            # runs on the engine's worker: one entry per decode step
        rows = len(eng._rows)
        decode()
        steps.append((time.perf_counter(), rows))

    eng._decode_step = timed_step

    async def go() -> tuple[float, list[Any]]:
        await eng.generate(prompts[0][:32], max_new_tokens=4, temperature=1.0, seed=seed)   # warm-up
        steps.clear()
        t0 = time.perf_counter()
        samples = await asyncio.gather(*[
            eng.generate(p, max_new_tokens=n, temperature=1.0, stop_token_ids=[], seed=seed + i)
            for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))])
        return time.perf_counter() - t0, samples

    try:
        wall, samples = asyncio.run(go())
        stats = eng.stats()
    finally:
        eng.close()
    tokens = sum(len(s.token_ids) for s in samples)
    gaps = [(b[0] - a[0], b[1]) for a, b in zip(steps, steps[1:], strict=False)]
    return {"tokens": tokens, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2),
            "p50_token_ms": round(_weighted_pct(gaps, 0.5) * 1e3, 2),
            "p99_token_ms": round(_weighted_pct(gaps, 0.99) * 1e3, 2),
            "decode_steps": len(steps), "mean_batch": round(stats.mean_batch_occupancy, 2),
            "prefill_s": round(stats.prefill_s, 3), "prefix_hit_tokens": stats.prefix_hit_tokens}


def run_hf_generate(model: Any, tokenizer: Any, prompts: list[list[int]], lengths: list[int],
                    concurrency: int, *, seed: int = 0) -> dict[str, Any]:
    """`model.generate` on static batches of `concurrency` (left-padded), sampling at T=1."""
    from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    calls: list[float] = []

    class Clock(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: Any, **kw: Any) -> torch.Tensor:
            calls.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def generate(idx: list[int]) -> tuple[int, list[tuple[float, int]]]:
        batch = [prompts[i] for i in idx]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        n = max(lengths[i] for i in idx)
        cfg = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=n,
                               min_new_tokens=n, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id)
        calls.clear()
        model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg,
                       stopping_criteria=StoppingCriteriaList([Clock()]))
        return n, [(b - a, len(idx)) for a, b in zip(calls, calls[1:], strict=False)]

    torch.manual_seed(seed)
    with torch.inference_mode():
        generate([0])                                        # warm-up
        t0 = time.perf_counter()
        raw, gaps = 0, []
        for start in range(0, len(prompts), concurrency):
            idx = list(range(start, min(start + concurrency, len(prompts))))
            n, g = generate(idx)
            raw += n * len(idx)
            gaps += g
        wall = time.perf_counter() - t0
    tokens = sum(lengths)
    return {"tokens": tokens, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2),
            "raw_tokens_per_s": round(raw / wall, 2),
            "p50_token_ms": round(_weighted_pct(gaps, 0.5) * 1e3, 2),
            "p99_token_ms": round(_weighted_pct(gaps, 0.99) * 1e3, 2)}


# --- the benchmark -------------------------------------------------------------------------------


def run(*, quick: bool = False, dtypes: tuple[str, ...] | None = None,
        concurrency: tuple[int, ...] = CONCURRENCY, threads: int | None = None, run_dir: Path | None = None,
        llama_server: Path | None = None, out: Path | None = None,
        console: Console | None = None) -> dict[str, Any]:
    from tryloop.agent.hf import BUNDLED, load_model

    console = console or Console()
    # Wrong paths fail now, not after the engine's rows are measured.
    if llama_server is not None:
        from tryloop.bench.llamacpp import check_binary
        check_binary(llama_server)
    if run_dir is not None and not (Path(run_dir) / "metrics.jsonl").is_file():
        from tryloop.errors import TryloopError
        raise TryloopError(f"--run-dir {run_dir}: no metrics.jsonl there (not a train run's directory)")
    t_start = time.perf_counter()
    if threads:
        torch.set_num_threads(threads)
    if dtypes is None:                   # --quick: only the dtype a run would pick ("auto")
        fast = bf16_is_fast("cpu")
        dtypes = (("bfloat16",) if fast else ("float32",)) if quick else \
            (("float32", "bfloat16") if fast else ("float32",))
    lo, hi = (16, 32) if quick else (100, 200)
    res: dict[str, Any] = {"quick": quick, "machine": machine_info(), "new_tokens": [lo, hi], "levels": []}
    with console.status("loading the model ..."):
        loaded = load_model("smollm2-135m", device="cpu")
    tok = loaded.tokenizer
    models = {d: (loaded.model if d == "float32" else copy.deepcopy(loaded.model).to(getattr(torch, d)))
              for d in dtypes}
    rng = random.Random(0)
    prompts_all = training_prompts(tok, max(concurrency) * 2)
    res["prompt_tokens_mean"] = round(statistics.fmean(len(p) for p in prompts_all), 1)

    floors: dict[str, Any] = {}
    with console.status("timing matmuls (peak and decode shapes) ..."):
        for d in dtypes:
            dt = getattr(torch, d)
            floors[d] = {"peak_flops": peak_matmul_flops(dt, min_s=0.3 if quick else 1.0),
                         "gemm_s": {c: decode_gemm_seconds(models[d], dt, c, min_s=0.02 if quick else 0.08)
                                    for c in concurrency}}
    context = res["prompt_tokens_mean"] + (lo + hi) / 4            # mean attended positions while decoding
    fpt = flops_per_token(loaded.model, context)
    res["flops_per_token"] = fpt
    res["context_mean"] = context
    res["peak_matmul_gflops"] = {d: round(f["peak_flops"] / 1e9, 1) for d, f in floors.items()}

    for c in concurrency:
        n = c if c > 1 else (1 if quick else 2)                      # requests at this level
        prompts, lengths = prompts_all[:n], [rng.randint(lo, hi) for _ in range(n)]
        for d in dtypes:
            label = f"c={c} {d}"
            with console.status(f"{label}: engine ..."):
                eng = run_engine(models[d], tok, prompts, lengths, c)
            with console.status(f"{label}: engine without its CPU kernels ..."):
                plain = run_engine(models[d], tok, prompts, lengths, c, cpu_kernels=False)
            with console.status(f"{label}: HF generate ..."):
                hf = run_hf_generate(models[d], tok, prompts, lengths, c)
            f = floors[d]
            attn_s = attention_flops_per_token(loaded.model.config, context) / f["peak_flops"]
            floor_peak = f["peak_flops"] / fpt
            floor_gemm = c / (f["gemm_s"][c] + c * attn_s)
            row = {"concurrency": c, "dtype": d, "requests": n, "engine": eng, "engine_plain": plain,
                   "hf_generate": hf, "engine_over_hf": round(eng["tokens_per_s"] / hf["tokens_per_s"], 2),
                   "engine_over_plain": round(eng["tokens_per_s"] / plain["tokens_per_s"], 2),
                   "floor_peak_tokens_per_s": round(floor_peak, 1),
                   "floor_decode_gemm_tokens_per_s": round(floor_gemm, 1),
                   "engine_pct_of_floor_peak": round(100 * eng["tokens_per_s"] / floor_peak, 1),
                   "engine_pct_of_floor_decode_gemm": round(100 * eng["tokens_per_s"] / floor_gemm, 1)}
            res["levels"].append(row)
            console.print(f"  {label}: engine {eng['tokens_per_s']:.1f} tok/s, without its CPU kernels "
                          f"{plain['tokens_per_s']:.1f} tok/s, HF generate {hf['tokens_per_s']:.1f} tok/s")
        if llama_server is not None:
            res.setdefault("llama_server", []).append(
                _llama_row(llama_server, BUNDLED["smollm2-135m"].path(), prompts, lengths, c, res, console))
    res["machine"]["loadavg_after"] = os.getloadavg()
    console.print(_table(res))
    if res.get("llama_server"):
        console.print(_llama_table(res))
    if run_dir is not None:
        res["train_step_split"] = train_step_split(run_dir)
        console.print(_split_table(res["train_step_split"], run_dir))
    res["wall_s"] = round(time.perf_counter() - t_start, 1)
    if out:
        out.write_text(json.dumps(res, indent=1))
    return res


_SHORT = {"float32": "fp32", "bfloat16": "bf16"}


def _table(res: dict[str, Any]) -> Table:
    t = Table(title=f"generation tokens/s: {res['prompt_tokens_mean']:.0f}-token prompts, "
                    f"{res['new_tokens'][0]}-{res['new_tokens'][1]} new tokens at T=1 "
                    f"({res['machine']['torch_threads']} torch threads)")
    for col in ("c", "dtype", "engine tok/s", "w/o CPU kernels", "HF gen. tok/s", "floor peak (eng. %)",
                "floor decode GEMMs (eng. %)", "engine p50/p99 ms/tok", "HF p50/p99"):
        t.add_column(col, justify="right")
    for r in res["levels"]:
        e, h, p = r["engine"], r["hf_generate"], r["engine_plain"]
        t.add_row(str(r["concurrency"]), _SHORT.get(r["dtype"], r["dtype"]),
                  f"[bold]{e['tokens_per_s']:.1f}", f"{p['tokens_per_s']:.1f} ({r['engine_over_plain']:.2f}x)",
                  f"{h['tokens_per_s']:.1f} ({r['engine_over_hf']:.1f}x)",
                  f"{r['floor_peak_tokens_per_s']:,.0f} ({r['engine_pct_of_floor_peak']:.1f}%)",
                  f"{r['floor_decode_gemm_tokens_per_s']:,.0f} ({r['engine_pct_of_floor_decode_gemm']:.0f}%)",
                  f"{e['p50_token_ms']:.0f}/{e['p99_token_ms']:.0f}", f"{h['p50_token_ms']:.0f}/{h['p99_token_ms']:.0f}")
    return t


def _llama_row(binary: Path, gguf: Path, prompts: list[list[int]], lengths: list[int], c: int,
               res: dict[str, Any], console: Console) -> dict[str, Any]:
    """llama.cpp's server on this level's requests, next to the level's engine rows and floors."""
    from tryloop.bench.llamacpp import LlamaServerError, run_llama_server

    try:
        with console.status(f"c={c}: llama.cpp server ..."):
            r = run_llama_server(binary, gguf, prompts, lengths, c, threads=torch.get_num_threads())
    except LlamaServerError as e:       # one failed level keeps the rows measured so far, and the run goes on
        console.print(f"  [red]c={c}: llama.cpp server failed:[/] {e}")
        return {"concurrency": c, "requests": len(prompts), "weights": gguf.name, "error": str(e)}
    rows = [x for x in res["levels"] if x["concurrency"] == c]
    best = max(rows, key=lambda x: x["engine"]["tokens_per_s"])
    row = {"concurrency": c, "requests": len(prompts), "weights": gguf.name, "server": r,
           "best_engine_dtype": best["dtype"], "best_engine_tokens_per_s": best["engine"]["tokens_per_s"],
           "server_over_engine": round(r["tokens_per_s"] / best["engine"]["tokens_per_s"], 2),
           "pct_of_floor_peak": {x["dtype"]: round(100 * r["tokens_per_s"] / x["floor_peak_tokens_per_s"], 1)
                                 for x in rows}}
    console.print(f"  c={c}: llama.cpp server {r['tokens_per_s']:.1f} tok/s "
                  f"({row['server_over_engine']:.2f}x the engine in {best['dtype']})")
    return row


def _llama_table(res: dict[str, Any]) -> Table:
    t = Table(title="llama.cpp server on the same requests (the GGUF's 4-bit weights)")
    for col in ("c", "server tok/s", "engine tok/s (dtype)", "server / engine", "% of peak floor",
                "tokens with a log-prob"):
        t.add_column(col, justify="right")
    for r in res["llama_server"]:
        if "error" in r:
            t.add_row(str(r["concurrency"]), "[red]failed", "", "", "", r["error"][:60])
            continue
        s = r["server"]
        pct = ", ".join(f"{_SHORT.get(d, d)} {v:.1f}%" for d, v in r["pct_of_floor_peak"].items())
        t.add_row(str(r["concurrency"]), f"[bold]{s['tokens_per_s']:.1f}",
                  f"{r['best_engine_tokens_per_s']:.1f} ({r['best_engine_dtype']})",
                  f"{r['server_over_engine']:.2f}x", pct, f"{s['tokens_with_logprob']}/{s['tokens']}")
    return t


# --- a real train step's wall time -----------------------------------------------------------------

PHASES = (("generation", "time_generation_s"), ("verification", "time_verification_s"),
          ("environment", "time_environment_s"), ("update", "time_update_s"))


def train_step_split(run_dir: Path) -> dict[str, Any]:
    """Mean seconds per step of each phase in `run_dir/metrics.jsonl` (and of the step's wall time
    when the rows have `time_step_s`). Generation, verification and environment are sums over the
    step's episodes, which run concurrently: they can add up to more than the wall time."""
    path = Path(run_dir) / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    rows = [r for r in rows if any(isinstance(r.get(k), (int, float)) for _, k in PHASES)]
    mean = lambda k: statistics.fmean(r[k] for r in rows if isinstance(r.get(k), (int, float)))  # noqa: E731
    split = {name: round(mean(k), 3) for name, k in PHASES if any(isinstance(r.get(k), (int, float)) for r in rows)}
    out: dict[str, Any] = {"steps": len(rows), "mean_s": split}
    if any(isinstance(r.get("time_step_s"), (int, float)) for r in rows):
        out["step_wall_s"] = round(mean("time_step_s"), 3)
    return out


def _split_table(split: dict[str, Any], run_dir: Path) -> Table:
    t = Table(title=f"train step time split ({run_dir}, {split['steps']} steps, mean per step)")
    for col in ("phase", "seconds", "share of listed", "share of step wall"):
        t.add_column(col, justify="right")
    total = sum(split["mean_s"].values()) or 1.0
    wall = split.get("step_wall_s")
    for name, s in split["mean_s"].items():
        t.add_row(name, f"{s:.1f}", f"{s / total:.0%}", f"{s / wall:.0%}" if wall else "-")
    if wall:
        t.add_row("[bold]step (wall)", f"{wall:.1f}", "", "100%")
    return t
