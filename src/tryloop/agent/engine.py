"""An asyncio generation engine with continuous batching over one local HF model.

Requests (`await engine.generate(prompt_ids, ...)`) go through a queue to ONE
background thread that owns the model (torch releases the GIL inside its
kernels, so the event loop keeps running). The thread keeps a batch of running
sequences and, at every step boundary, lets new requests join the slots that
finished ones left: faster than static batches, whose finished rows keep occupying
the batch (`tryloop bench generation`: 2.4-3.1x HF generate's static batches at 16-32
sequences of the bundled model).

How the batch is laid out. All rows share one KV cache whose columns are
right-aligned: row i's n_i cached tokens are the last n_i of L columns, the
columns before them are zero padding that the attention mask hides. A decode
step feeds one token per row, at column L for everybody, with each row's own
position id n_i. A new request is prefilled alone (batch of one, no padding,
so its prompt is processed exactly as if it ran by itself), and its cache is
then left-padded and stacked onto the batch. Finished rows are dropped and the
columns that became padding for every remaining row are cut off, so L follows
the longest live row.

The cache's tensors have spare room (`_SlotCache`): each layer's keys/values
live in [slots, heads, capacity, head_dim] buffers with margins of at least
`kv_block` columns on both sides of the L live ones; the model sees a view, and
a decode step writes its new column in place. A finished row's slot is taken
by the batch's last row (one row copied), a joining row is written into a free
slot, and a shorter batch just narrows the view. The buffers are reallocated
(the whole cache copied) only when a margin or the slots run out, where growing
by concatenation would copy the whole cache at every decode step and again at
every join and drop.

On a CPU (`cpu_kernels`), a decode step attends to the buffers directly, each
row to its own live columns (`slot_attention`: SDPA and torch's batched matmuls
are several times slower on the strided view), with a C loop
(`native_attention`) where the host can build one; in bfloat16 it also
multiplies by weights packed once for oneDNN (`packed_linear`) instead of at
every call, the packed products being the same numbers. At 16 sequences of the
bundled model in bfloat16 a decode step went from ~190 ms without them to ~85 ms
(profiles; `tryloop bench generation`: 1.65-1.86x the tokens/s of the engine without
them at 1-32 sequences in bfloat16, 1.05-1.14x in float32; benchmarks/README.md).

Sampling is batched (`sampling.sample_batch`): one log_softmax over the batch's
[rows, vocab] logits, and each row's draw uses only its own seeded generator,
so a request's tokens do not depend on what else is in the batch.

Precision. The engine runs the model in `dtype` (default: the model's own; the
model is cast in place, the engine owns it). bfloat16 is ~1.7x faster on a CPU
with AMX or AVX512-BF16 and on GPUs, at the price of log-probabilities that differ from a
float32 forward by ~1e-2 (the trainer's ratio sees that as off-policyness).
`update_weights` casts incoming tensors (float32 from a trainer) to it.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from transformers.cache_utils import Cache, DynamicLayer

from tryloop.agent.packed_linear import pack as pack_linears
from tryloop.agent.prefix_cache import PrefixCache
from tryloop.agent.sampling import SamplingParams, sample_batch
from tryloop.agent.slot_attention import SlotDecode, use_slot_attention
from tryloop.errors import TryloopError

FinishReason = Literal["stop", "length"]


#: The prefix cache's budget unless told otherwise: room for many agents' conversations.
DEFAULT_PREFIX_CACHE_MB = 1024


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
    on_token: Callable[[int, float, float], None] | None = None


@dataclass(eq=False)
class _Update:
    state_dict: dict[str, torch.Tensor] | None   # None: the weights were changed in place
    version: str
    done: concurrent.futures.Future[str]


@dataclass(eq=False)
class _DropPrefixes:
    done: concurrent.futures.Future[None]
    weights: bool = False          # also park the weights (`Engine.park`)


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
                 prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB, prefix_cache_entries: int | None = None,
                 dtype: torch.dtype | str | None = None, kv_block: int = 64, cache_completions: bool = True, cpu_kernels: bool = True,
                 name: str = "tryloop-engine") -> None:
        """`num_threads`, if given, sets torch's CPU thread count for the whole process
        (torch has one pool). On 2 cores shared with other work, 1 thread decoded ~7x
        faster than 2: OpenMP's barriers wait for whichever thread lost its core.

        `prefix_cache_entries`: at most this many sequences in the prefix cache besides its
        `prefix_cache_mb` (None: the bytes alone bound it).

        `cache_completions`: keep each finished sequence's keys/values for a next prompt that
        extends it (an agent's next turn). Off where no request continues a finished sequence
        (single-turn episodes): the prefix cache then holds prompts, which the samples of a
        group share, and not one full sequence per sample that nothing will read.

        `dtype` (a torch dtype or its name, e.g. "bfloat16"): run the model in it, casting
        `model` in place; None keeps the model's dtype. `kv_block`: the KV cache grows by
        this many columns at a time.

        `cpu_kernels`: on a CPU, decode steps attend over the KV buffers with
        `slot_attention` (the model is switched to it, SDPA otherwise; in float32 only
        where its C kernel builds) and bfloat16 models multiply by weights packed once
        (`packed_linear`). False keeps transformers' own attention and matmuls."""
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if kv_block < 1:
            raise ValueError("kv_block must be >= 1")
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        if dtype is not None:
            dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
            if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
                raise ValueError(f"dtype must be a floating-point torch dtype, got {dtype!r}")
            if next(model.parameters()).dtype != dtype:
                model = model.to(dtype)
        self.model = model.eval()
        self.dtype = next(model.parameters()).dtype
        self.kv_block = kv_block
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.device = next(model.parameters()).device
        self.max_context = model_context(model)
        self.default_stop_ids = frozenset(_eos_ids(model, tokenizer))
        params = inspect.signature(model.forward).parameters
        self._cache_kw = cache_kwarg(model)
        self._keep_kw = "logits_to_keep" if "logits_to_keep" in params else "num_logits_to_keep"
        check_cache_layout(model.config)
        self._slot_attention = cpu_kernels and use_slot_attention(model, self.device)
        self._packed = pack_linears(model, max_batch) if cpu_kernels else None
        self._weights_version = weights_version
        self._updates = 0
        self._stats = EngineStats(weights_version=weights_version)
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._waiting: deque[_Request] = deque()
        self._rows: list[_Row] = []
        self._cache: _SlotCache | None = None  # the batch's KV cache, rows in `_rows` order
        self._prefixes = PrefixCache(int(prefix_cache_mb * 2**20), prefix_cache_entries)
        self.cache_completions = cache_completions
        self._closed = False
        self._parked: list[tuple[Any, int]] = []   # (storage, bytes) of weights freed by `park`
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
                       seed: int | None = None,
                       on_token: Callable[[int, float, float], None] | None = None) -> Sample:
        """Sample a continuation of `prompt_ids`.

        `stop_token_ids` defaults to the model's end-of-sequence ids; a stop token is
        included in `token_ids` (it is what the policy sampled). A stop string ends
        generation after the token that completes it; tokens are never trimmed.

        `on_token(token_id, logprob, policy_logprob)`, if given, is called in the caller's
        event loop for every token as it is sampled (streaming), all of them before this
        returns.
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
        req = _Request(prompt, params, loop, loop.create_future(), time.perf_counter(), on_token=on_token)
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
        "its weights were changed in place": the version is bumped and, where the engine
        packs its weights (`cpu_kernels`), they are packed again; until then its linear
        layers keep multiplying by the weights packed before the change.
        """
        return await asyncio.wrap_future(self._submit_update(weights, version))

    async def drop_prefix_cache(self) -> None:
        """Free the prefix cache's memory now. A trainer calls it before an update: the update
        makes every cached prefix stale, and until it is applied they would sit beside the
        learner's gradients (up to `prefix_cache_mb`)."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise EngineClosed("engine is closed")
            self._inbox.put(_DropPrefixes(done))
        await asyncio.wrap_future(done)

    async def park(self) -> None:
        """Free the prefix cache and the weights' memory until the next `update_weights`.

        A trainer on the same host calls it before an update: the update makes both stale,
        and the engine gets every weight back from the learner after it. Requests that come
        while the engine is parked wait for that update. Weights memory-mapped from the
        checkpoint are moved off the file (nothing is copied: the update writes them)."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise EngineClosed("engine is closed")
            self._inbox.put(_DropPrefixes(done, weights=True))
        await asyncio.wrap_future(done)

    @property
    def parked(self) -> bool:
        return bool(self._parked)

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
            if self._parked:
                raise EngineError("the engine is parked: its weights must come from another model or a "
                                  "state dict, not from its own freed tensors")
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
            packed = self._packed.active() if self._packed is not None else contextlib.nullcontext()
            with torch.inference_mode(), packed:
                while self._receive(block=not self._rows and (not self._waiting or bool(self._parked))):
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
            elif isinstance(msg, _DropPrefixes):
                self._prefixes.clear()
                if msg.weights:
                    self._park_weights()
                msg.done.set_result(None)

    def _park_weights(self) -> None:
        # Between steps no row runs (a parked engine admits none), so nothing reads the weights.
        # Each storage is resized to nothing and back: the tensors keep their shapes, strides
        # and identity, so the model needs no rebuilding and tied weights stay tied.
        if self._parked or self._rows:
            return
        if self._packed is not None:
            self._packed.drop()
        # Grouped first, while every storage is alive: once one is freed its address can be reused.
        groups: dict[int, tuple[Any, list[torch.nn.Parameter]]] = {}
        for p in self.model.parameters():
            st = p.untyped_storage()
            if st.nbytes():
                groups.setdefault(st.data_ptr(), (st, []))[1].append(p)
        for st, params in groups.values():
            if not st.resizable():
                # Memory-mapped from the checkpoint (a float32 model as loaded): its pages count as
                # the process's memory and cannot be freed while mapped. Its tensors move onto a
                # storage of their own, allocated but never written (the next update fills it),
                # and the mapping goes once no tensor holds it.
                own = torch.UntypedStorage(st.nbytes(), device=st.device)
                with torch.no_grad():
                    for p in params:
                        p.set_(own, p.storage_offset(), p.shape, p.stride())
                st = own
            self._parked.append((st, st.nbytes()))
            st.resize_(0)

    def _apply_update(self, upd: _Update) -> None:
        parked = self._parked
        try:
            for st, nbytes in parked:     # room for the new weights; load_state_dict fills it all
                st.resize_(nbytes)
            if upd.state_dict is not None:
                self.model.load_state_dict(upd.state_dict, strict=True)
        except Exception as e:  # a bad state dict fails the caller, not the engine
            for st, _ in parked:          # parked it stays: those bytes are not weights
                st.resize_(0)
            if not parked and self._packed is not None:
                self._packed.refresh()    # the load may have changed some weights before failing
            upd.done.set_exception(e)
            return
        if self._packed is not None:      # also when the weights were changed in place
            self._packed.refresh()
        self._parked = []
        self._prefixes.clear()                # computed with the old weights
        self._weights_version = upd.version
        upd.done.set_result(upd.version)

    def _admit(self) -> None:
        if self._parked:                      # no weights until the next update
            return
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
        self._record(row, sample_batch(out.logits[:, -1, :].float(), [req.params], [gen])[0])
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
        if self._cache is None or not self._rows:
            self._cache = _SlotCache(len(joining[0][1].layers), self.kv_block, self.max_batch)
        self._cache.add([c for _, c in joining])
        self._rows.extend(row for row, _ in joining)

    def _decode_step(self) -> None:
        t0 = time.perf_counter()
        rows = self._rows
        assert self._cache is not None
        self._cache.reserve(1)
        cache_len = _cache_len(self._cache)
        kv = torch.tensor([r.kv_len for r in rows], device=self.device)
        input_ids = torch.tensor([[r.tokens[-1]] for r in rows], device=self.device)
        # Row i attends to its own kv_len cached columns (right-aligned) plus the new one.
        cols = torch.arange(cache_len + 1, device=self.device)
        mask = (cols[None, :] >= (cache_len - kv)[:, None]).long()
        extra: dict[str, Any] = {}
        if self._slot_attention:
            extra["slot_decode"] = self._cache.slot_decode(kv + 1)
        try:
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=kv[:, None],
                             use_cache=True, **{self._cache_kw: self._cache, self._keep_kw: 1}, **extra)
        except Exception as e:
            for r in rows:
                _resolve(r.req, error=EngineError(f"decode step failed: {e!r}"))
            self._rows, self._cache = [], None
            return
        logits = out.logits[:, -1, :].float()
        drawn = sample_batch(logits, [r.req.params for r in rows], [r.generator for r in rows])
        for r, sampled in zip(rows, drawn, strict=True):
            r.kv_len += 1
            self._record(r, sampled)
        self._stats.decode_steps += 1
        self._stats.occupancy_sum += len(rows)
        self._stats.busy_s += time.perf_counter() - t0
        keep = [i for i, r in enumerate(rows) if r.finish is None and not r.req.cancelled]
        for i, r in enumerate(rows):
            if r.finish is not None and self._prefixes.enabled and self.cache_completions:
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

    def _record(self, row: _Row, sampled: tuple[int, float, float]) -> None:
        """Append the token sampled for `row` (token, logprob, policy logprob); check for an end."""
        token, logprob, policy_logprob = sampled
        if row.req.on_token is not None:
            # Queued before the request's result (one FIFO), so every token comes before it.
            with contextlib.suppress(RuntimeError):       # the caller's loop is closed
                row.req.loop.call_soon_threadsafe(row.req.on_token, token, logprob, policy_logprob)
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
        if not keep:
            self._rows, self._cache = [], None
            return
        assert self._cache is not None
        order = self._cache.remove(keep, max(self._rows[i].kv_len for i in keep))
        self._rows = [self._rows[i] for i in order]

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
            if self._packed is not None:
                self._packed.release()
            while True:
                try:
                    msg = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if isinstance(msg, _Request):
                    _resolve(msg, error=error())
                elif isinstance(msg, (_Update, _DropPrefixes)):
                    msg.done.set_exception(error())


def model_context(model: Any) -> int:
    """The longest sequence `model` takes (its position embeddings), unbounded if it does not say."""
    return int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)


def kv_bytes_per_token(model: Any, dtype: torch.dtype | None = None) -> int:
    """Bytes of keys and values one token takes in the KV cache of a decoder-only `model`
    (in `dtype`, default the model's own)."""
    cfg = model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    itemsize = (dtype or next(model.parameters()).dtype).itemsize
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * itemsize


def cache_kwarg(module: Any) -> str:
    """The name `module.forward` takes its KV cache by: transformers 5 renamed `past_key_values`
    to `cache`."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def full_attention_cache(config: Any) -> bool | None:
    """Whether every layer of `config`'s model keeps a plain, full-attention KV cache (no sliding
    windows); None for a transformers whose caches have no layers (before 4.56)."""
    from transformers import DynamicCache

    layers = getattr(DynamicCache(config=config), "layers", None)
    if layers is None:
        return None
    return all(type(layer) is DynamicLayer for layer in layers)


def check_cache_layout(config: Any) -> None:
    """Refuse a model the engine cannot batch: right-aligned batching assumes every layer keeps all
    its columns (no sliding windows). Needs only the config, so a run can check before loading."""
    full = full_attention_cache(config)
    if full is None:
        raise EngineError("the engine needs transformers >= 4.56 (DynamicCache with layers)")
    if not full:
        arch = ", ".join(getattr(config, "architectures", None) or [type(config).__name__])
        raise EngineError(f"{arch}: the engine supports only models whose every layer keeps a full-attention "
                          "KV cache (this one has sliding-window or other cache layers)")


class _SlotLayer(DynamicLayer):
    """One layer of the batch's KV cache, in [slots, heads, capacity, head_dim] buffers.

    Live row i is slot i (i < `rows`); its n_i cached tokens are columns
    [start + length - n_i, start + length), right-aligned, and every column left of
    them is zero. `keys`/`values` are the views [:rows, :, start:start + length]: what
    the model attends to. A forward writes its new columns in place after them.
    `_SlotCache` keeps the geometry of all layers the same."""

    def __init__(self, k_buf: torch.Tensor, v_buf: torch.Tensor) -> None:
        super().__init__()
        self._k, self._v = k_buf, v_buf
        self.rows = self.start = self.length = 0
        self.device, self.is_initialized = k_buf.device, True
        self._views()

    def _views(self) -> None:
        cols = slice(self.start, self.start + self.length)
        self.keys = self._k[:self.rows, :, cols]
        self.values = self._v[:self.rows, :, cols]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        at, n = self.start + self.length, key_states.shape[-2]
        if at + n > self._k.shape[-2]:                # `_SlotCache.reserve` should have made room
            raise RuntimeError("KV cache buffer is full")
        self._k[:self.rows, :, at:at + n] = key_states
        self._v[:self.rows, :, at:at + n] = value_states
        self.length += n
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length


class _SlotCache(Cache):
    """The running batch's KV cache, with spare slots (rows) and spare columns on both sides.

    Decoding writes one column in place; a finished row is replaced by the last live
    row (one row copied); a joining row is written into a free slot. The buffers are
    reallocated, copying the whole cache, only when they are full: a row joins with
    more tokens than the left margin allows, the right margin is used up by decoding,
    or more rows than slots. Margins are `block` columns or a quarter of the
    length, whichever is more, so that happens every few dozen steps at most."""

    def __init__(self, n_layers: int, block: int, max_rows: int) -> None:
        super().__init__(layers=[])
        self.n_layers, self.block, self.max_rows = n_layers, block, max_rows
        self._geometry = (0, 0, 0)            # (rows, start, length) while there are no layers

    # The geometry, the same in every layer (the forward advances each layer's length).
    @property
    def rows(self) -> int:
        return self.layers[0].rows if self.layers else self._geometry[0]

    @property
    def start(self) -> int:
        return self.layers[0].start if self.layers else self._geometry[1]

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else self._geometry[2]

    def _set(self, rows: int, start: int, length: int) -> None:
        self._geometry = (rows, start, length)
        for layer in self.layers:
            layer.rows, layer.start, layer.length = rows, start, length
            layer._views()

    def _margin(self, length: int) -> int:
        return max(self.block, length // 4)

    def _reallocate(self, rows_needed: int, length: int, like: torch.Tensor) -> None:
        """New buffers for `rows_needed` rows of up to `length` columns (+ margins); live rows
        copied, right-aligned at the new end."""
        rows, old_start, old_len = self.rows, self.start, self.length
        slots = min(self.max_rows, max(rows_needed, 2 * (self.layers[0]._k.shape[0] if self.layers else 0)))
        slots = max(slots, rows_needed)
        left = right = self._margin(length)
        cap = _round_up(left + length + right, self.block)
        end = cap - right                     # the live rows end here, right-aligned
        # Replaced layer by layer, each old layer's buffers freed once copied: the old and the new
        # cache are never both whole (a float32 cache of 16 rows is hundreds of megabytes).
        layers, fresh = self.layers, not self.layers
        for i in range(self.n_layers):
            bufs = []
            for attr in ("_k", "_v"):
                src = like if fresh else getattr(layers[i], attr)
                b, h, _, d = src.shape
                # Zeroed: the live rows' left parts must be zeros, and a decode step's slot
                # attention on torch's matmuls reads (masked) every column of the live slots,
                # which must be finite.
                buf = src.new_zeros(slots, h, cap, d)
                if rows:
                    buf[:rows, :, end - old_len:end] = src[:rows, :, old_start:old_start + old_len]
                bufs.append(buf)
            if fresh:
                layers.append(_SlotLayer(*bufs))
            else:
                layers[i] = _SlotLayer(*bufs)
        self._set(rows, end - old_len, old_len)

    def add(self, caches: list[Any]) -> None:
        """Append the rows of the prefilled caches `caches` (batch of 1 each) to the batch."""
        lengths = [int(c.layers[0].keys.shape[-2]) for c in caches]
        new_len = max([self.length, *lengths])
        rows = self.rows + len(caches)
        start = self.start - (new_len - self.length)
        slots = self.layers[0]._k.shape[0] if self.layers else 0
        if not self.layers or start < 0 or rows > slots or start + new_len >= self.layers[0]._k.shape[-2]:
            self._reallocate(rows, new_len, caches[0].layers[0].keys)
            start = self.start - (new_len - self.length)
        end = start + new_len
        for i, layer in enumerate(self.layers):
            for attr, buf in (("keys", layer._k), ("values", layer._v)):
                for j, (c, n) in enumerate(zip(caches, lengths, strict=True)):
                    slot = self.rows + j
                    buf[slot, :, :end - n].zero_()
                    buf[slot, :, end - n:end] = getattr(c.layers[i], attr)[0]
        self._set(rows, start, new_len)

    def remove(self, keep: list[int], new_len: int) -> list[int]:
        """Keep the live rows `keep`; returns the rows' new order (old indices). A removed row's
        slot is filled by a kept row from the end of the batch."""
        order = list(range(self.rows))
        kept = set(keep)
        n = len(keep)
        holes = [i for i in range(n) if i not in kept]
        movers = [i for i in range(n, self.rows) if i in kept]
        for dst, src in zip(holes, movers, strict=True):
            order[dst] = src
            for layer in self.layers:
                layer._k[dst] = layer._k[src]
                layer._v[dst] = layer._v[src]
        self._set(n, self.start + self.length - new_len, new_len)
        return order[:n]

    def slot_decode(self, attended: torch.Tensor) -> SlotDecode:
        """The next decode step's buffers and columns for `slot_attention`: live row i attends
        to its last `attended[i]` columns up to and including the one the step writes."""
        end = self.start + self.length + 1
        return SlotDecode([(layer._k[:self.rows], layer._v[:self.rows]) for layer in self.layers],
                          end - attended, end)

    def reserve(self, n: int) -> None:
        """Room for `n` more columns on the right."""
        if self.start + self.length + n > self.layers[0]._k.shape[-2]:
            self._reallocate(self.rows, self.length + n, self.layers[0]._k)


def _round_up(n: int, block: int) -> int:
    return -(-n // block) * block


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
