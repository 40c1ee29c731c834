"""An asyncio generation engine with continuous batching over one local HF model.

Requests (`await engine.generate(prompt_ids, ...)`) go through a queue to ONE
background thread that owns the model (torch releases the GIL inside its
kernels, so the event loop keeps running). The thread keeps a batch of running
sequences and, at every step boundary, lets new requests join the slots that
finished ones left: on this CPU that is ~3.7x faster than static batches,
whose finished rows keep occupying the batch (notes/local-model.md).

How the batch is laid out. All rows share one KV cache whose columns are
right-aligned: row i's n_i cached tokens are the last n_i of L columns, the
columns before them are zero padding that the attention mask hides. A decode
step feeds one token per row, at column L for everybody, with each row's own
position id n_i. A new request is prefilled alone (batch of one, no padding,
so its prompt is processed exactly as if it ran by itself), and its cache is
then left-padded and stacked onto the batch. Finished rows are dropped and the
columns that became padding for every remaining row are cut off, so L follows
the longest live row.

Correctness over cleverness: tokens are returned as ids (never re-tokenized),
each with two log-probabilities:

- `logprobs[i]`: the log-probability of the token under the distribution it
  was actually drawn from: softmax(logits / temperature), restricted to the
  top-p nucleus and renormalized. Greedy decoding (temperature 0) draws from a
  point mass, so it records 0.0.
- `policy_logprobs[i]`: log softmax(logits)[token] at temperature 1 over the
  full vocabulary: the raw policy, which is what a trainer recomputes.

At the defaults (temperature 1, top_p 1) the two are the same numbers.

Prefix cache. An agent's next prompt is its last prompt + what it sampled + the
tool results, and the episodes of a group share their first prompt. The engine
keeps the keys/values of recent prompts and finished sequences (up to
`prefix_cache_mb`, least recently used out first) and prefills only the part
of a new prompt after its longest cached prefix. The result differs from a full
prefill only by float rounding (~1e-6 in log-probabilities); `prefix_cache_mb=0`
turns it off. New weights empty it: cached keys/values belong to the old ones.

Weight updates (`update_weights`) are applied between two steps. Sequences in
flight keep going: their cached keys/values were computed with the old weights
and their remaining tokens are sampled with the new ones, and `Sample` lists
every weights version that produced its tokens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import queue
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F

from tryloop.agent.prefix_cache import PrefixCache
from tryloop.agent.sampling import SamplingParams, sample_token
from tryloop.errors import TryloopError

FinishReason = Literal["stop", "length"]


class EngineClosed(TryloopError):
    """The engine was closed before (or while) the request ran."""


class EngineError(TryloopError):
    """The model failed on a step; the requests in that step get this error."""


@dataclass
class Sample:
    token_ids: list[int]
    logprobs: list[float]                 # under the sampling distribution used (see module doc)
    policy_logprobs: list[float]          # raw policy, temperature 1, full vocabulary
    finish_reason: FinishReason
    stop: int | str | None                # the stop token id or stop string that ended it
    prompt_tokens: int
    time_s: float                         # submission to result
    queue_s: float                        # submission to prefill start
    weights_versions: tuple[str, ...]     # every version that produced a token, in order
    seed: int                             # the sampler's seed: same logits + seed -> same tokens

    @property
    def weights_version(self) -> str:
        return self.weights_versions[-1]


@dataclass
class EngineStats:
    requests_done: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0                # in prompts (prefilled or found in the prefix cache)
    prefix_hit_tokens: int = 0            # prompt tokens taken from the prefix cache
    prefix_cache_bytes: int = 0
    decode_steps: int = 0
    busy_s: float = 0.0                   # time spent in prefill + decode
    prefill_s: float = 0.0
    occupancy_sum: int = 0                # sum over decode steps of the batch size
    active: int = 0
    waiting: int = 0
    weights_version: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_generated / self.busy_s if self.busy_s else 0.0

    @property
    def mean_batch_occupancy(self) -> float:
        return self.occupancy_sum / self.decode_steps if self.decode_steps else 0.0


# --- messages to the worker thread --------------------------------------------------------


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Sample]
    submitted: float
    cancelled: bool = False               # set by the caller's task, read by the worker


@dataclass(eq=False)
class _Update:
    state_dict: dict[str, torch.Tensor] | None   # None: the weights were changed in place
    version: str
    done: concurrent.futures.Future[str]


_CLOSE = object()


@dataclass(eq=False)
class _Row:
    """One running sequence."""

    req: _Request
    generator: torch.Generator
    kv_len: int                           # tokens in the cache: prompt + sampled[:-1]
    max_new: int                          # max_new_tokens, capped by the context length
    started: float
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_logprobs: list[float] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    finish: FinishReason | None = None
    stop: int | str | None = None


class Engine:
    """Continuous-batching generation over `model` (device and dtype taken from the model)."""

    def __init__(self, model: Any, tokenizer: Any, *, max_batch: int = 16,
                 weights_version: str = "initial", num_threads: int | None = None,
                 prefix_cache_mb: float = 1024, name: str = "tryloop-engine") -> None:
        """`num_threads`, if given, sets torch's CPU thread count for the whole process
        (torch has one pool). On 2 cores shared with other work, 1 thread decoded ~7x
        faster than 2: OpenMP's barriers wait for whichever thread lost its core."""
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.device = next(model.parameters()).device
        self.max_context = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self.default_stop_ids = frozenset(_eos_ids(model, tokenizer))
        # transformers 5 renamed the forward's `past_key_values` to `cache`.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = "logits_to_keep" if "logits_to_keep" in params else "num_logits_to_keep"
        _check_cache_layout(model)
        self._weights_version = weights_version
        self._updates = 0
        self._stats = EngineStats(weights_version=weights_version)
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._waiting: deque[_Request] = deque()
        self._rows: list[_Row] = []
        self._cache: Any = None               # the batch's DynamicCache, rows in `_rows` order
        self._prefixes = PrefixCache(int(prefix_cache_mb * 2**20))
        self._closed = False
        # Orders `generate`'s check-and-put against the worker's final drain, so no request
        # can slip into the inbox after nobody reads it any more.
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # --- public API ----------------------------------------------------------------------

    @property
    def weights_version(self) -> str:
        return self._weights_version

    async def generate(self, prompt_ids: list[int], *, max_new_tokens: int,
                       temperature: float = 1.0, top_p: float = 1.0,
                       stop_token_ids: list[int] | frozenset[int] | None = None,
                       stop_strings: list[str] | tuple[str, ...] = (),
                       seed: int | None = None) -> Sample:
        """Sample a continuation of `prompt_ids`.

        `stop_token_ids` defaults to the model's end-of-sequence ids; a stop token is
        included in `token_ids` (it is what the policy sampled). A stop string ends
        generation after the token that completes it; tokens are never trimmed.
        """
        if self._closed:
            raise EngineClosed("engine is closed")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty")
        if len(prompt) >= self.max_context:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room in the "
                             f"{self.max_context}-token context")
        params = SamplingParams(
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
            stop_token_ids=(self.default_stop_ids if stop_token_ids is None
                            else frozenset(int(t) for t in stop_token_ids)),
            stop_strings=tuple(s for s in stop_strings if s),
            seed=secrets.randbits(63) if seed is None else seed)
        loop = asyncio.get_running_loop()
        req = _Request(prompt, params, loop, loop.create_future(), time.perf_counter())
        with self._lock:
            if self._closed:
                raise EngineClosed("engine is closed")
            self._inbox.put(req)
        try:
            return await req.future
        except asyncio.CancelledError:
            req.cancelled = True              # the worker drops the row at the next step
            raise

    async def update_weights(self, weights: Any, *, version: str | None = None) -> str:
        """Load new weights (a state dict or a model with the same keys) between two steps.

        Returns the new weights version once the engine runs with them. Don't mutate
        the given tensors before this returns. Passing the engine's own model means
        "its weights were changed in place": only the version is bumped.
        """
        return await asyncio.wrap_future(self._submit_update(weights, version))

    def update_weights_blocking(self, weights: Any, *, version: str | None = None) -> str:
        """`update_weights` for a caller outside the event loop (a trainer thread)."""
        return self._submit_update(weights, version).result()

    def stats(self) -> EngineStats:
        s = self._stats
        return EngineStats(**{**s.__dict__, "active": len(self._rows),
                              "waiting": len(self._waiting) + self._inbox.qsize(),
                              "prefix_cache_bytes": self._prefixes.nbytes,
                              "weights_version": self._weights_version})

    def close(self) -> None:
        """Stop the worker; requests not finished get `EngineClosed`. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._inbox.put(_CLOSE)
        if self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    def _submit_update(self, weights: Any, version: str | None) -> concurrent.futures.Future[str]:
        if weights is self.model:
            state_dict = None
        elif isinstance(weights, torch.nn.Module):
            state_dict = weights.state_dict()
        else:
            state_dict = dict(weights)
        done: concurrent.futures.Future[str] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise EngineClosed("engine is closed")
            self._updates += 1
            version = version or f"{self._stats.weights_version}+{self._updates}"
            self._inbox.put(_Update(state_dict, version, done))
        return done

    # --- the worker thread ---------------------------------------------------------------

    def _run(self) -> None:
        crash: BaseException | None = None
        try:
            with torch.inference_mode():
                while self._receive(block=not self._rows and not self._waiting):
                    self._admit()
                    if self._rows:
                        self._decode_step()
        except BaseException as e:            # a bug of ours: say so to everyone waiting
            crash = e
            raise
        finally:
            self._shutdown(crash)

    def _receive(self, *, block: bool) -> bool:
        """Take what is in the inbox (waiting for something if `block`); False on close."""
        while True:
            try:
                msg = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if msg is _CLOSE:
                return False
            if isinstance(msg, _Request):
                self._waiting.append(msg)
            elif isinstance(msg, _Update):
                self._apply_update(msg)

    def _apply_update(self, upd: _Update) -> None:
        try:
            if upd.state_dict is not None:
                self.model.load_state_dict(upd.state_dict, strict=True)
        except Exception as e:  # a bad state dict fails the caller, not the engine
            upd.done.set_exception(e)
            return
        self._prefixes.clear()                # computed with the old weights
        self._weights_version = upd.version
        upd.done.set_result(upd.version)

    def _admit(self) -> None:
        joining: list[tuple[_Row, Any]] = []
        while self._waiting and len(self._rows) + len(joining) < self.max_batch:
            req = self._waiting.popleft()
            if req.cancelled:
                continue
            try:
                row, cache = self._prefill(req)
            except Exception as e:
                _resolve(req, error=EngineError(f"prefill failed: {e!r}"))
                continue
            if row.finish is None:
                joining.append((row, cache))
            else:
                self._finish(row)
        if joining:
            self._join(joining)

    def _prefill(self, req: _Request) -> tuple[_Row, Any]:
        from transformers import DynamicCache

        t0 = time.perf_counter()
        gen = torch.Generator(device=self.device)
        gen.manual_seed(req.params.seed)
        prompt = req.prompt
        row = _Row(req=req, generator=gen, kv_len=len(prompt), started=t0,
                   max_new=min(req.params.max_new_tokens, self.max_context - len(prompt)))
        cache = DynamicCache(config=self.model.config)
        # At least the last prompt token goes through the model: its logits give token 1.
        prefix, hit = self._prefixes.lookup(prompt, limit=len(prompt) - 1)
        if prefix is not None:
            for layer, (k, v) in zip(cache.layers, prefix.kv, strict=True):
                layer.lazy_initialization(k, v)
                layer.keys, layer.values = k[:, :, :hit], v[:, :, :hit]
        ids = torch.tensor([prompt[hit:]], device=self.device)
        positions = torch.arange(hit, len(prompt), device=self.device)[None, :]
        out = self.model(input_ids=ids, position_ids=positions, use_cache=True,
                         **{self._cache_kw: cache, self._keep_kw: 1})
        self._record(row, out.logits[:, -1, :].float())
        # Stored as they are: nothing writes into cache tensors in place (updates concatenate).
        self._prefixes.add(prompt, [(layer.keys, layer.values) for layer in cache.layers])
        dt = time.perf_counter() - t0
        self._stats.prompt_tokens += len(prompt)
        self._stats.prefix_hit_tokens += hit
        self._stats.prefill_s += dt
        self._stats.busy_s += dt
        return row, cache

    def _join(self, joining: list[tuple[_Row, Any]]) -> None:
        """Stack the prefilled caches onto the batch, right-aligned to a common length."""
        old_len = _cache_len(self._cache) if self._rows else 0
        new_len = max([old_len] + [row.kv_len for row, _ in joining])
        caches = ([(self._cache, old_len)] if self._rows else []) + [(c, r.kv_len) for r, c in joining]
        merged = caches[0][0] if not self._rows else self._cache
        for layer_idx, layer in enumerate(merged.layers):
            for attr in ("keys", "values"):
                parts = [_pad_left(getattr(c.layers[layer_idx], attr), new_len - n) for c, n in caches]
                setattr(layer, attr, torch.cat(parts, dim=0) if len(parts) > 1 else parts[0])
        self._cache = merged
        self._rows.extend(row for row, _ in joining)

    def _decode_step(self) -> None:
        t0 = time.perf_counter()
        rows = self._rows
        cache_len = _cache_len(self._cache)
        kv = torch.tensor([r.kv_len for r in rows], device=self.device)
        input_ids = torch.tensor([[r.tokens[-1]] for r in rows], device=self.device)
        # Row i attends to its own kv_len cached columns (right-aligned) plus the new one.
        cols = torch.arange(cache_len + 1, device=self.device)
        mask = (cols[None, :] >= (cache_len - kv)[:, None]).long()
        try:
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=kv[:, None],
                             use_cache=True, **{self._cache_kw: self._cache, self._keep_kw: 1})
        except Exception as e:
            for r in rows:
                _resolve(r.req, error=EngineError(f"decode step failed: {e!r}"))
            self._rows, self._cache = [], None
            return
        logits = out.logits[:, -1, :].float()
        for i, r in enumerate(rows):
            r.kv_len += 1
            self._record(r, logits[i:i + 1])
        self._stats.decode_steps += 1
        self._stats.occupancy_sum += len(rows)
        self._stats.busy_s += time.perf_counter() - t0
        keep = [i for i, r in enumerate(rows) if r.finish is None and not r.req.cancelled]
        for i, r in enumerate(rows):
            if r.finish is not None and self._prefixes.enabled:
                # Cloned: a slice would keep the whole batch's tensor alive.
                self._prefixes.add(r.req.prompt + r.tokens[:-1], [
                    (layer.keys[i:i + 1, :, cache_len + 1 - r.kv_len:].clone(),
                     layer.values[i:i + 1, :, cache_len + 1 - r.kv_len:].clone())
                    for layer in self._cache.layers])
        if len(keep) < len(rows):
            self._drop(keep)                  # first, so a caller woken below sees the new batch
        for r in rows:
            if r.finish is not None:
                self._finish(r)

    def _record(self, row: _Row, logits: torch.Tensor) -> None:
        """Sample the next token of `row` from its [1, vocab] logits and check for an end."""
        token, logprob, policy_logprob = sample_token(logits[0], row.req.params, row.generator)
        row.tokens.append(token)
        row.logprobs.append(logprob)
        row.policy_logprobs.append(policy_logprob)
        if not row.versions or row.versions[-1] != self._weights_version:
            row.versions.append(self._weights_version)
        params = row.req.params
        if token in params.stop_token_ids:
            row.finish, row.stop = "stop", token
        elif params.stop_strings and (hit := self._stop_string(row.tokens, params.stop_strings)):
            row.finish, row.stop = "stop", hit
        elif len(row.tokens) >= row.max_new:
            row.finish = "length"

    def _stop_string(self, tokens: list[int], stops: tuple[str, ...]) -> str | None:
        # A token decodes to at least a quarter character (UTF-8 is at most 4 bytes), so this
        # window holds every stop string that could end at the newest token.
        window = 4 * max(len(s) for s in stops) + 4
        text = self.tokenizer.decode(tokens[-window:], skip_special_tokens=False)
        return next((s for s in stops if s in text), None)

    def _drop(self, keep: list[int]) -> None:
        self._rows = [self._rows[i] for i in keep]
        if not self._rows:
            self._cache = None
            return
        cut = _cache_len(self._cache) - max(r.kv_len for r in self._rows)
        index = torch.tensor(keep, device=self.device)
        for layer in self._cache.layers:
            layer.keys = layer.keys[index, :, cut:]
            layer.values = layer.values[index, :, cut:]

    def _finish(self, row: _Row) -> None:
        now = time.perf_counter()
        self._stats.requests_done += 1
        self._stats.tokens_generated += len(row.tokens)
        assert row.finish is not None
        _resolve(row.req, sample=Sample(
            token_ids=row.tokens, logprobs=row.logprobs, policy_logprobs=row.policy_logprobs,
            finish_reason=row.finish, stop=row.stop, prompt_tokens=len(row.req.prompt),
            time_s=now - row.req.submitted, queue_s=row.started - row.req.submitted,
            weights_versions=tuple(row.versions), seed=row.req.params.seed))

    def _shutdown(self, crash: BaseException | None) -> None:
        def error() -> Exception:
            if crash is not None:
                return EngineError(f"the engine's worker crashed: {crash!r}")
            return EngineClosed("engine closed before the request finished")

        with self._lock:
            self._closed = True
            for r in self._rows:
                _resolve(r.req, error=error())
            for req in self._waiting:
                _resolve(req, error=error())
            self._rows, self._cache = [], None
            self._waiting.clear()
            self._prefixes.clear()
            while True:
                try:
                    msg = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if isinstance(msg, _Request):
                    _resolve(msg, error=error())
                elif isinstance(msg, _Update):
                    msg.done.set_exception(error())


def _check_cache_layout(model: Any) -> None:
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    layers = getattr(DynamicCache(config=model.config), "layers", None)
    if layers is None:
        raise EngineError("the engine needs transformers >= 4.56 (DynamicCache with layers)")
    # Right-aligned batching assumes every layer keeps all its columns: no sliding windows.
    if any(type(layer) is not DynamicLayer for layer in layers):
        raise EngineError(f"{type(model).__name__}: only full-attention KV caches are supported")


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    # [batch, heads, seq, head_dim]: n zero columns before the sequence.
    return F.pad(t, (0, 0, n, 0)) if n else t


def _cache_len(cache: Any) -> int:
    return int(cache.layers[0].keys.shape[-2])


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def _resolve(req: _Request, *, sample: Sample | None = None,
             error: BaseException | None = None) -> None:
    def settle() -> None:
        if req.future.done():                 # cancelled by the caller meanwhile
            return
        if error is not None:
            req.future.set_exception(error)
        else:
            req.future.set_result(sample)     # type: ignore[arg-type]

    # RuntimeError: the caller's loop is closed, so nobody is waiting.
    with contextlib.suppress(RuntimeError):
        req.loop.call_soon_threadsafe(settle)
