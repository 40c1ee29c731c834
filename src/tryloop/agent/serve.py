"""An OpenAI-compatible HTTP server over the local `Engine`: a real model server for the bundled model.

Endpoints: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`,
`GET /health`, `GET /metrics` (Prometheus text, vLLM's metric names for queue depth).
Anything speaking the OpenAI protocol can use it; tryloop's own `ChatClient`
gets token-exact results through vLLM's extensions:

- `"return_token_ids": true` adds `prompt_token_ids` and `choices[i].token_ids`
  (the sampled ids, the stop token included: the policy sampled it);
- `"return_tokens_as_token_ids": true` writes each logprob entry's token as
  `"token_id:N"` instead of text;
- `"stop_token_ids": [...]` adds stop tokens.

Log-probabilities follow vLLM's `--logprobs-mode`: "raw" (default, as vLLM) reports the
policy's log-probability at temperature 1; "processed" reports it under the
distribution actually sampled from (temperature and top-p applied).

Tool calls: when the request has `tools`, the chat template (or, for templates
without tools, our system-prompt instructions) tells the model the format, and
the reply's calls are parsed by `tryloop.agent.chat.parse_tool_calls` into
OpenAI `tool_calls` with finish reason "tool_calls".

HTTP/1.1 with keep-alive on stdlib asyncio, JSON bodies with Content-Length; no
streaming (`"stream": true` is refused with 400). A client that disconnects
while its request generates cancels the generation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

from tryloop.agent.chat import ChatTokenizer, parse_tool_calls
from tryloop.agent.engine import Engine, EngineClosed, Sample

LogprobsMode = Literal["raw", "processed"]
_MAX_HEAD = 64 * 1024
_MAX_BODY = 32 * 1024 * 1024


class HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


@dataclass
class _Reply:
    status: int
    body: bytes
    content_type: str = "application/json"


class OpenAIServer:
    """Serves `engine` as `model_name`. `await start()`, then `url`; `await aclose()` to stop."""

    def __init__(self, engine: Engine, *, model_name: str = "smollm2-135m",
                 host: str = "127.0.0.1", port: int = 0, default_max_tokens: int = 512,
                 logprobs_mode: LogprobsMode = "raw") -> None:
        self.engine = engine
        self.chat = ChatTokenizer(engine.tokenizer)
        self.model_name = model_name
        self.host, self.port = host, port
        self.default_max_tokens = default_max_tokens
        self.logprobs_mode = logprobs_mode
        self.created = int(time.time())
        self._server: asyncio.Server | None = None
        self._routes: dict[tuple[str, str], Callable[[dict[str, Any]], Awaitable[_Reply]]] = {
            ("POST", "/v1/chat/completions"): self._chat_completions,
            ("POST", "/v1/completions"): self._completions,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/metrics"): self._metrics,
        }

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, self.host, self.port,
                                                  limit=_MAX_HEAD)
        self.port = self._server.sockets[0].getsockname()[1]

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    async def __aenter__(self) -> OpenAIServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- HTTP ------------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        buffered = b""                    # a byte read while watching for a disconnect
        try:
            while True:
                try:
                    head = buffered + await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.LimitOverrunError:
                    await _write(writer, _error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                                                "request head too large"), keep_alive=False)
                    return
                buffered = b""
                method, path, headers, keep_alive, error = _parse_head(head)
                body = b""
                if error is None:
                    try:
                        body = await _read_body(reader, headers)
                    except HTTPError as e:
                        error = e
                    except (asyncio.IncompleteReadError, ConnectionError):
                        return
                if error is not None:
                    await _write(writer, _error(error.status, error.message, error.kind),
                                 keep_alive=False)
                    return
                handling = asyncio.ensure_future(self._dispatch(method, path, body))
                # Watch the connection meanwhile: EOF means the client gave up on this request.
                watch = asyncio.ensure_future(reader.read(1))
                await asyncio.wait({handling, watch}, return_when=asyncio.FIRST_COMPLETED)
                if watch.done() and _received(watch) == b"" and not handling.done():
                    handling.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await handling
                    return
                reply = await handling
                if watch.done():
                    buffered = _received(watch)       # a pipelined request's first byte, or EOF
                    keep_alive = keep_alive and buffered != b""
                else:
                    watch.cancel()                    # unread bytes stay in the reader
                    with contextlib.suppress(asyncio.CancelledError):
                        await watch
                await _write(writer, reply, keep_alive=keep_alive)
                if not keep_alive:
                    return
        except ConnectionError:
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _dispatch(self, method: str, path: str, body: bytes) -> _Reply:
        handler = self._routes.get((method, path))
        if handler is None:
            known_path = any(p == path for _, p in self._routes)
            return _error(HTTPStatus.METHOD_NOT_ALLOWED if known_path else HTTPStatus.NOT_FOUND,
                          f"{method} {path} is not served", "NotFoundError")
        try:
            request: dict[str, Any] = {}
            if method == "POST":
                try:
                    request = json.loads(body or b"{}")
                except ValueError as e:
                    raise HTTPError(400, f"body is not JSON: {e}") from None
                if not isinstance(request, dict):
                    raise HTTPError(400, "body must be a JSON object")
            return await handler(request)
        except HTTPError as e:
            return _error(e.status, e.message, e.kind)
        except EngineClosed as e:
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, str(e), "ServiceUnavailableError")
        except ValueError as e:          # the engine's checks of a request (context, parameters)
            return _error(HTTPStatus.BAD_REQUEST, str(e))

    # --- endpoints --------------------------------------------------------------------------

    async def _health(self, _: dict[str, Any]) -> _Reply:
        return _Reply(200, b"")

    async def _models(self, _: dict[str, Any]) -> _Reply:
        return _json({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created, "owned_by": "tryloop",
            "max_model_len": self.engine.max_context,
            "weights_version": self.engine.weights_version}]})

    async def _metrics(self, _: dict[str, Any]) -> _Reply:
        s = self.engine.stats()
        lines = [
            f'vllm:num_requests_running{{model_name="{self.model_name}"}} {s.active}',
            f'vllm:num_requests_waiting{{model_name="{self.model_name}"}} {s.waiting}',
            f"tryloop_engine_requests_total {s.requests_done}",
            f"tryloop_engine_generated_tokens_total {s.tokens_generated}",
            f"tryloop_engine_prompt_tokens_total {s.prompt_tokens}",
            f"tryloop_engine_busy_seconds_total {s.busy_s}",
            f"tryloop_engine_mean_batch_occupancy {s.mean_batch_occupancy}",
        ]
        return _Reply(200, ("\n".join(lines) + "\n").encode(), "text/plain; version=0.0.4")

    async def _chat_completions(self, req: dict[str, Any]) -> _Reply:
        self._check_common(req)
        messages = req.get("messages")
        if not isinstance(messages, list) or not messages or \
                not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise HTTPError(400, "messages must be a non-empty list of {role, content} objects")
        tools = req.get("tools") or None
        if tools is not None and (not isinstance(tools, list) or
                                  not all(isinstance(t, dict) for t in tools)):
            raise HTTPError(400, "tools must be a list of objects")
        try:
            prompt = self.chat.start(self.chat.from_openai(messages), tools)
        except Exception as e:            # the template rejected these messages
            raise HTTPError(400, f"cannot apply the chat template: {e}") from None
        samples = await self._sample(req, prompt)
        known = {(t.get("function", t)).get("name") for t in tools} if tools else set()
        choices = []
        for i, s in enumerate(samples):
            text = self._text(s, req)
            message: dict[str, Any] = {"role": "assistant", "content": text}
            finish = s.finish_reason
            if tools:
                parsed = parse_tool_calls(text, shell_tool=None, known_tools=known)
                if parsed.calls:
                    message["tool_calls"] = [
                        {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                         "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                        for c in parsed.calls]
                    finish = "tool_calls"
            choice: dict[str, Any] = {"index": i, "message": message, "finish_reason": finish,
                                      "logprobs": None}
            if req.get("logprobs"):
                choice["logprobs"] = {"content": [
                    {"token": name, "logprob": lp, "top_logprobs": [],
                     "bytes": list(self.engine.tokenizer.decode([tid]).encode())}
                    for tid, (name, lp) in zip(s.token_ids, self._logprob_entries(s, req),
                                               strict=True)]}
            if req.get("return_token_ids"):
                choice["token_ids"] = s.token_ids
            choices.append(choice)
        return _json(self._envelope("chat.completion", "chatcmpl", req, prompt, samples, choices))

    async def _completions(self, req: dict[str, Any]) -> _Reply:
        self._check_common(req)
        if req.get("echo"):
            raise HTTPError(400, "echo is not supported")
        raw = req.get("prompt")
        if isinstance(raw, str) and raw:
            prompt = list(self.engine.tokenizer(raw).input_ids)
        elif isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool)
                                                  for t in raw):
            prompt = list(raw)
        elif isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str | list):
            raise HTTPError(400, "send one prompt per request: a string or a list of token ids")
        else:
            raise HTTPError(400, "prompt must be a non-empty string or list of token ids")
        samples = await self._sample(req, prompt)
        choices = []
        for i, s in enumerate(samples):
            choice: dict[str, Any] = {"index": i, "text": self._text(s, req),
                                      "finish_reason": s.finish_reason, "logprobs": None}
            if req.get("logprobs") is not None and req.get("logprobs") is not False:
                entries = self._logprob_entries(s, req)
                offsets, at = [], 0
                for tok, _ in entries:
                    offsets.append(at)
                    at += 0 if tok.startswith("token_id:") else len(tok)
                choice["logprobs"] = {"tokens": [t for t, _ in entries],
                                      "token_logprobs": [lp for _, lp in entries],
                                      "top_logprobs": None, "text_offset": offsets}
            if req.get("return_token_ids"):
                choice["token_ids"] = s.token_ids
            choices.append(choice)
        return _json(self._envelope("text_completion", "cmpl", req, prompt, samples, choices))

    # --- helpers ---------------------------------------------------------------------------

    def _check_common(self, req: dict[str, Any]) -> None:
        model = req.get("model")
        if model is not None and model != self.model_name:
            raise HTTPError(404, f"model {model!r} is not served here (serving {self.model_name!r})",
                            "NotFoundError")
        if req.get("stream"):
            raise HTTPError(400, "stream is not supported by this server")

    async def _sample(self, req: dict[str, Any], prompt: list[int]) -> list[Sample]:
        n = _int(req, "n", 1)
        if not 1 <= n <= 64:
            raise HTTPError(400, "n must be between 1 and 64")
        max_tokens = req.get("max_completion_tokens", req.get("max_tokens"))
        max_tokens = self.default_max_tokens if max_tokens is None else _int(req, "max_tokens", 0,
                                                                              value=max_tokens)
        max_tokens = min(max_tokens, self.engine.max_context - len(prompt))
        stop = req.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise HTTPError(400, "stop must be a string or a list of strings")
        extra_stop_ids = req.get("stop_token_ids") or []
        if not isinstance(extra_stop_ids, list) or not all(isinstance(t, int) for t in extra_stop_ids):
            raise HTTPError(400, "stop_token_ids must be a list of ints")
        seed = req.get("seed")
        if seed is not None and not isinstance(seed, int):
            raise HTTPError(400, "seed must be an integer")
        kwargs = dict(max_new_tokens=max_tokens, temperature=_float(req, "temperature", 1.0),
                      top_p=_float(req, "top_p", 1.0),
                      stop_token_ids=sorted(self.engine.default_stop_ids | set(extra_stop_ids)),
                      stop_strings=stop)
        return list(await asyncio.gather(*[
            self.engine.generate(prompt, seed=None if seed is None else seed + i, **kwargs)
            for i in range(n)]))

    def _text(self, s: Sample, req: dict[str, Any]) -> str:
        ids = s.token_ids
        if s.finish_reason == "stop" and isinstance(s.stop, int):
            ids = ids[:-1]                # the stop token is in token_ids, not in the text
        text = self.engine.tokenizer.decode(ids, skip_special_tokens=True)
        if isinstance(s.stop, str) and not req.get("include_stop_str_in_output"):
            text = text[:text.rfind(s.stop)] if s.stop in text else text
        return text

    def _logprob_entries(self, s: Sample, req: dict[str, Any]) -> list[tuple[str, float]]:
        values = s.policy_logprobs if self.logprobs_mode == "raw" else s.logprobs
        if req.get("return_tokens_as_token_ids"):
            names = [f"token_id:{t}" for t in s.token_ids]
        else:
            names = [self.engine.tokenizer.decode([t]) for t in s.token_ids]
        return list(zip(names, values, strict=True))

    def _envelope(self, kind: str, prefix: str, req: dict[str, Any], prompt: list[int],
                  samples: list[Sample], choices: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
            "model": self.model_name, "choices": choices,
            "usage": {"prompt_tokens": len(prompt),
                      "completion_tokens": sum(len(s.token_ids) for s in samples),
                      "total_tokens": len(prompt) + sum(len(s.token_ids) for s in samples)},
            "system_fingerprint": samples[0].weights_version,
        }
        if req.get("return_token_ids"):
            out["prompt_token_ids"] = prompt
        return out


def _received(watch: asyncio.Future[bytes]) -> bytes:
    """What the disconnect watch read: a byte, or b"" for end of stream (or a reset)."""
    if watch.cancelled() or watch.exception() is not None:
        return b""
    return watch.result()


def _int(req: dict[str, Any], key: str, default: int, *, value: Any = None) -> int:
    v = req.get(key, default) if value is None else value
    if not isinstance(v, int) or isinstance(v, bool):
        raise HTTPError(400, f"{key} must be an integer")
    return v


def _float(req: dict[str, Any], key: str, default: float) -> float:
    v = req.get(key)
    if v is None:
        return default
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise HTTPError(400, f"{key} must be a number")
    return float(v)


def _json(payload: dict[str, Any], status: int = 200) -> _Reply:
    return _Reply(status, json.dumps(payload).encode())


def _error(status: int, message: str, kind: str = "BadRequestError") -> _Reply:
    return _json({"error": {"message": message, "type": kind, "code": int(status)}}, int(status))


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str], bool, HTTPError | None]:
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
    except ValueError:
        return "", "", {}, False, HTTPError(400, "malformed request head")
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    return method, target.split("?", 1)[0], headers, keep_alive, None


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HTTPError(411, "send the body with Content-Length, not chunked")
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise HTTPError(400, "bad Content-Length") from None
    if length > _MAX_BODY:
        raise HTTPError(413, f"body over {_MAX_BODY} bytes")
    return await reader.readexactly(length) if length else b""


async def _write(writer: asyncio.StreamWriter, reply: _Reply, *, keep_alive: bool) -> None:
    reason = HTTPStatus(reply.status).phrase
    head = (f"HTTP/1.1 {reply.status} {reason}\r\nContent-Type: {reply.content_type}\r\n"
            f"Content-Length: {len(reply.body)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n")
    writer.write(head.encode() + reply.body)
    await writer.drain()


def main(argv: list[str] | None = None) -> None:
    """python -m tryloop.agent.serve --model smollm2-135m --port 8000"""
    from tryloop.agent.hf import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--served-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--logprobs-mode", choices=["raw", "processed"], default="raw")
    args = parser.parse_args(argv)
    loaded = load_model(args.model, device=args.device)

    async def run() -> None:
        with Engine(loaded.model, loaded.tokenizer, max_batch=args.max_batch,
                    weights_version=loaded.weights_version, num_threads=args.threads) as engine:
            server = OpenAIServer(engine, model_name=args.served_name or args.model,
                                  host=args.host, port=args.port, logprobs_mode=args.logprobs_mode)
            await server.start()
            print(f"serving {server.model_name} ({loaded.weights_version}) at {server.url}/v1",
                  flush=True)
            await server.serve_forever()

    asyncio.run(run())


if __name__ == "__main__":
    main()
