"""An async client for OpenAI-compatible model servers (vLLM, SGLang, OpenAI, ...).

`base_url` is the server root or the root plus `/v1`, either way: chat and
completions live under `/v1`, vLLM's `/health` and `/metrics` at the root.

Every call has one wall-clock deadline (`timeout_s`) for the whole exchange, not
httpx's per-phase timeouts: a server that trickles bytes forever still times
out. Failures are typed (`tryloop.llm.errors`); with `max_retries > 0` the
retryable ones (timeouts, broken connections, 5xx, 408, 429) are sent again after
a jittered exponential backoff, or no sooner than the server's `Retry-After` when
it sends one (`retry_delay`), so one call can take up to (max_retries + 1) *
timeout_s plus the waits.

Token ids: a plain OpenAI server does not return them and rejects fields it
does not know, so the client asks for vLLM's token-id extensions only when
`request_token_ids=True`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import email.utils
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from tryloop.llm.errors import (
    LLMConnectionError,
    LLMError,
    LLMHTTPError,
    LLMProtocolError,
    LLMTimeout,
)
from tryloop.llm.result import ChatResult, parse_chat, parse_completion

T = TypeVar("T")

_BODY_EXCERPT = 2000            # chars of an error body kept on LLMHTTPError
_MAX_BACKOFF_S = 30.0
# A Retry-After longer than this is not waited out in full (a misconfigured server must not park
# an episode for hours): the retry comes after this many seconds.
_MAX_RETRY_AFTER_S = 120.0
# Request fields the client sets itself; `extra` may not replace them by accident.
_RESERVED = frozenset({"model", "messages", "prompt", "tools", "tool_choice"})


class ChatClient:
    def __init__(self, base_url: str, model: str, api_key: str | None = None, *,
                 timeout_s: float = 60.0, max_retries: int = 0, retry_backoff_s: float = 0.5,
                 request_token_ids: bool = False, headers: Mapping[str, str] | None = None):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url {base_url!r} must start with http:// or https://")
        if not model:
            raise ValueError("model must be a non-empty model name")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        root = base_url.rstrip("/")
        self.root_url = root.removesuffix("/v1")
        self.api_url = self.root_url + "/v1"
        self.model = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.request_token_ids = request_token_ids
        self._headers = dict(headers or {})
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._http = LoopHTTP(self._headers, timeout_s)

    # -- public calls -------------------------------------------------------------

    async def chat(self, messages: Sequence[Mapping[str, Any]], *,
                   tools: Sequence[Mapping[str, Any]] | None = None,
                   tool_choice: str | Mapping[str, Any] | None = None,
                   temperature: float = 1.0, max_tokens: int | None = None,
                   logprobs: bool = False, stop: str | Sequence[str] | None = None,
                   seed: int | None = None, extra: Mapping[str, Any] | None = None) -> ChatResult:
        if not messages:
            raise ValueError("messages must be a non-empty list of chat messages")
        body: dict[str, Any] = {"model": self.model, "messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
            if tool_choice is not None:
                body["tool_choice"] = tool_choice
        body.update(self._sampling(temperature, max_tokens, stop, seed))
        if logprobs:
            body["logprobs"] = True
            if self.request_token_ids:
                body["return_tokens_as_token_ids"] = True
        return await self._generate("/chat/completions", body, extra, parse_chat)

    async def completion(self, prompt: str | Sequence[int], *, temperature: float = 1.0,
                         max_tokens: int | None = None, logprobs: bool = False,
                         stop: str | Sequence[str] | None = None, seed: int | None = None,
                         extra: Mapping[str, Any] | None = None) -> ChatResult:
        """/v1/completions; a list of ints is sent as token ids (token-in, no re-tokenizing)."""
        if isinstance(prompt, str):
            body: dict[str, Any] = {"model": self.model, "prompt": prompt}
        else:
            ids = list(prompt)
            if not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise ValueError("prompt must be a string or a non-empty list of token ids")
            body = {"model": self.model, "prompt": ids}
        body.update(self._sampling(temperature, max_tokens, stop, seed))
        if logprobs:
            body["logprobs"] = 0       # legacy API: an int; 0 = the sampled token's logprob only
            if self.request_token_ids:
                body["return_tokens_as_token_ids"] = True
        return await self._generate("/completions", body, extra, parse_completion)

    async def models(self) -> list[str]:
        data = await self._retrying(lambda: self._json("GET", self.api_url + "/models"))
        entries = data.get("data")
        if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("id"), str)
                                                    for e in entries):
            raise LLMProtocolError(f"GET {self.api_url}/models: data is not a list of objects with an id")
        return [e["id"] for e in entries]

    async def health(self, *, timeout_s: float = 5.0) -> bool:
        """True when GET /health answers 2xx within min(timeout_s, the client's); never raises."""
        try:
            await self._send("GET", self.root_url + "/health", timeout_s=min(timeout_s, self.timeout_s))
        except LLMError:
            return False
        return True

    async def metrics(self) -> dict[str, float]:
        """The server's Prometheus metrics (e.g. `vllm:num_requests_running`), summed over labels."""
        resp = await self._retrying(lambda: self._send("GET", self.root_url + "/metrics"))
        return parse_prometheus(resp.text)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- plumbing -------------------------------------------------------------------

    @staticmethod
    def _sampling(temperature: float, max_tokens: int | None, stop: str | Sequence[str] | None,
                  seed: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {"temperature": temperature}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if stop:
            body["stop"] = stop if isinstance(stop, str) else list(stop)
        if seed is not None:
            body["seed"] = seed
        return body

    async def _generate(self, path: str, body: dict[str, Any], extra: Mapping[str, Any] | None,
                        parse: Callable[[dict[str, Any]], ChatResult]) -> ChatResult:
        if self.request_token_ids:
            body["return_token_ids"] = True
        if extra:
            clash = sorted(_RESERVED & set(extra))
            if clash:
                raise ValueError(f"extra may not set {clash}: pass them as arguments")
            body.update(extra)
        url = self.api_url + path
        attempts = 0

        async def once() -> tuple[dict[str, Any], float]:
            nonlocal attempts
            attempts += 1
            start = time.monotonic()
            data = await self._json("POST", url, body)
            return data, time.monotonic() - start

        data, latency = await self._retrying(once)
        try:
            result = parse(data)
        except LLMProtocolError as e:
            raise LLMProtocolError(f"POST {url}: {e}") from None
        # The parser sees only the body; the transport adds what it measured.
        return dataclasses.replace(result, latency_s=latency, attempts=attempts)

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        attempt = 0
        while True:
            try:
                return await call()
            except LLMError as e:
                if not e.retryable or attempt >= self.max_retries:
                    raise
                delay = retry_delay(attempt, self.retry_backoff_s, getattr(e, "retry_after_s", None))
            await asyncio.sleep(delay)
            attempt += 1

    async def _json(self, method: str, url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        resp = await self._send(method, url, body)
        try:
            data = resp.json()
        except ValueError:
            raise LLMProtocolError(f"{method} {url}: body is not JSON: {resp.text[:200]!r}") from None
        if not isinstance(data, dict):
            raise LLMProtocolError(f"{method} {url}: body is a JSON {type(data).__name__}, expected an object")
        return data

    async def _send(self, method: str, url: str, body: dict[str, Any] | None = None, *,
                    timeout_s: float | None = None) -> httpx.Response:
        client = self._http.client()
        limit = timeout_s or self.timeout_s
        try:
            async with asyncio.timeout(limit):
                resp = await client.request(method, url, json=body)
        except (TimeoutError, httpx.TimeoutException):
            raise LLMTimeout(f"{method} {url}: no complete answer within {limit}s", limit) from None
        except httpx.TransportError as e:
            raise LLMConnectionError(f"{method} {url}: {type(e).__name__}: {e}") from None
        if not 200 <= resp.status_code < 300:
            text = resp.text[:_BODY_EXCERPT]
            raise LLMHTTPError(f"{method} {url}: HTTP {resp.status_code}: {text[:300]}",
                               resp.status_code, text, parse_retry_after(resp.headers.get("retry-after")))
        return resp



class LoopHTTP:
    """An `httpx.AsyncClient` for the running event loop. An httpx client is bound to the loop that
    opened its connections; a holder reused under a new loop (e.g. successive `asyncio.run` calls)
    gets a fresh one instead of failing on the old loop's sockets."""

    def __init__(self, headers: Mapping[str, str], timeout_s: float):
        self.headers, self.timeout_s = dict(headers), timeout_s
        self._http: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop or self._http.is_closed:
            self._http = httpx.AsyncClient(headers=self.headers, timeout=httpx.Timeout(self.timeout_s))
            self._loop = loop
        return self._http

    async def aclose(self) -> None:
        http, self._http = self._http, None
        # A pool opened under an earlier event loop cannot be closed from this one; its
        # sockets went with that loop.
        if http is not None and self._loop is asyncio.get_running_loop():
            await http.aclose()


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())


def retry_delay(attempt: int, backoff_s: float, retry_after_s: float | None = None) -> float:
    """Seconds before retry number `attempt` + 1. Exponential backoff with jitter (a random half of
    it on top of the other half), so clients that failed together do not come back together; a
    server's Retry-After is a floor (never retry earlier than asked), plus up to 20 % jitter. Both
    are capped at _MAX_RETRY_AFTER_S / _MAX_BACKOFF_S."""
    if retry_after_s is not None:
        return min(retry_after_s, _MAX_RETRY_AFTER_S) * (1.0 + 0.2 * random.random())
    base = min(backoff_s * 2 ** attempt, _MAX_BACKOFF_S)
    return base / 2 + random.random() * base / 2


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name -> value, summed over label sets; comments and unparsable lines are skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            fields = rest[rest.rfind("}") + 1:].split()
        else:
            name, *fields = line.split()
        try:
            value = float(fields[0])
        except (IndexError, ValueError):
            continue
        out[name.strip()] = out.get(name.strip(), 0.0) + value
    return out
