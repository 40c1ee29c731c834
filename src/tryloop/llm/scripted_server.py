"""A real HTTP server that speaks the OpenAI protocol and answers from a script.

For tests and benchmarks that need a model endpoint without a model: a judge,
the OpenAI-compatible policy, the scheduler's fault injection. It listens on a
real socket (stdlib `http.server`, one thread per connection), so clients go
through the same HTTP stack as against vLLM.

    script = [ScriptedReply.say("hello"),
              ScriptedReply.call("bash", {"cmd": "ls"}),
              ScriptedReply.error(503),
              ScriptedReply.hang(30)]
    with ScriptedServer(script) as srv:
        client = ChatClient(srv.url, srv.model)
        ...
        assert srv.request_count == 4

The script is either a list of replies, consumed in order (one per
chat/completion request; when it runs out the server answers 500 and records
an error), or a callable `(request_json) -> ScriptedReply | str` called for
every chat/completion request (a str is shorthand for `ScriptedReply.say`).
Script calls are serialised under a lock, so a callable need not be
thread-safe; delays run outside the lock, so slow replies overlap. A script
that raises gets a 500 and the traceback is kept in `errors`: a test should
assert `not srv.errors`.

Endpoints, shaped like vLLM's:
  GET  /v1/models            the one model (`model`); other names get 404 on generation
  POST /v1/chat/completions  text, `tool_calls`, `logprobs` (tokens as "token_id:N" when the
                             request sets `return_tokens_as_token_ids`), `token_ids` and
                             `prompt_token_ids` when it sets `return_token_ids`
  POST /v1/completions       the legacy shape, same token data
  GET  /health               200 with an empty body
  GET  /metrics              Prometheus text: vllm:num_requests_running (the real number of
                             generation requests in progress), vllm:num_requests_waiting,
                             vllm:gpu_cache_usage_perc, vllm:request_success_total

Token ids and logprobs come from a toy tokenizer (whitespace-led word pieces,
ids from a CRC) unless the reply gives its own; they are deterministic and
consistent with the text, which is all a client test needs. `stream: true` is
refused with 400.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
import traceback
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_PIECE_RE = re.compile(r"\s*\S+|\s+")


@dataclass(frozen=True)
class ScriptedReply:
    """One answer of the server. Build with the class methods; fields combine (e.g. a slow tool call)."""

    text: str = ""
    # (name, arguments): a dict is JSON-encoded; a str is sent verbatim (malformed arguments).
    tool_calls: Sequence[tuple[str, Mapping[str, Any] | str]] = ()
    finish_reason: str | None = None          # default: "tool_calls" if any, else "stop" / "length"
    status: int = 200                         # non-2xx: an OpenAI-style error body with `text` as message
    body: str | bytes | None = None           # sent verbatim instead of the generated JSON
    delay_s: float = 0.0                      # wait before answering (latency, or a hang)
    drop: bool = False                        # close the connection without an answer
    token_ids: Sequence[int] | None = None    # the completion's tokens; default: the toy tokenizer
    logprobs: Sequence[float] | None = None   # their logprobs; default: a fixed deterministic pattern
    reasoning: str | None = None              # sent as message.reasoning_content
    headers: Mapping[str, str] = field(default_factory=dict)   # extra response headers (e.g. Retry-After)

    @classmethod
    def say(cls, text: str, **kw: Any) -> ScriptedReply:
        return cls(text=text, **kw)

    @classmethod
    def call(cls, name: str, arguments: Mapping[str, Any] | str, *, text: str = "",
             **kw: Any) -> ScriptedReply:
        return cls(text=text, tool_calls=((name, arguments),), **kw)

    @classmethod
    def error(cls, status: int, message: str = "", **kw: Any) -> ScriptedReply:
        return cls(text=message or HTTPStatus(status).phrase, status=status, **kw)

    @classmethod
    def hang(cls, seconds: float) -> ScriptedReply:
        """Answer only after `seconds` (or never, if the server closes first)."""
        return cls(text="(late answer)", delay_s=seconds)

    @classmethod
    def malformed(cls, body: str | bytes = '{"choices": [', status: int = 200) -> ScriptedReply:
        return cls(body=body, status=status)

    @classmethod
    def disconnect(cls) -> ScriptedReply:
        return cls(drop=True)


@dataclass(frozen=True)
class ReceivedRequest:
    method: str
    path: str
    body: Any                                 # parsed JSON, or the raw text if it was not JSON
    headers: dict[str, str] = field(default_factory=dict)


Script = Sequence[ScriptedReply | str] | Callable[[dict[str, Any]], ScriptedReply | str]


class ScriptedServer:
    def __init__(self, script: Script, *, model: str = "scripted-model", host: str = "127.0.0.1",
                 port: int = 0, latency_s: float = 0.0, token_data: bool = True,
                 gpu_cache_usage: float = 0.0, max_model_len: int = 32768):
        """`latency_s` is added to every generation; `token_data=False` plays a server that
        offers no logprobs or token ids (the client must then report them unavailable)."""
        if isinstance(script, ScriptedReply | str):
            raise TypeError("script must be a list of replies or a callable, not a single reply")
        self._queue: deque[ScriptedReply | str] = deque()
        if callable(script):
            self._next: Callable[[dict[str, Any]], ScriptedReply | str] = script
        else:
            self._queue.extend(script)
            self._next = self._pop_queue
        self.model = model
        self.latency_s = latency_s
        self.token_data = token_data
        self.gpu_cache_usage = gpu_cache_usage
        self.max_model_len = max_model_len
        self.requests: list[ReceivedRequest] = []
        self.errors: list[str] = []
        self._host, self._port = host, port
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._running = 0
        self._succeeded = 0
        self._served = 0
        self._conns: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------

    @property
    def url(self) -> str:
        """The server root, e.g. http://127.0.0.1:41234 (ChatClient accepts it with or without /v1)."""
        if self._httpd is None:
            raise RuntimeError("ScriptedServer is not started; use it as a context manager or call start()")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> ScriptedServer:
        if self._httpd is not None:
            return self
        self._closing.clear()
        self._httpd = _HTTPServer((self._host, self._port), _handler_for(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"scripted-server:{self.url}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop listening and cut every open connection; hanging replies are abandoned unanswered."""
        if self._httpd is None:
            return
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):     # already closed by the peer
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what it saw ---------------------------------------------------------------

    @property
    def request_count(self) -> int:
        """Every request received, on any path (health checks and metrics included)."""
        with self._lock:
            return len(self.requests)

    def bodies(self, path: str = "/v1/chat/completions") -> list[Any]:
        """The JSON bodies received on one path, in order."""
        with self._lock:
            return [r.body for r in self.requests if r.path == path]

    # -- internals --------------------------------------------------------------

    def _pop_queue(self, _request: dict[str, Any]) -> ScriptedReply | str:
        if not self._queue:
            raise LookupError(f"script exhausted after {self._served} replies")
        return self._queue.popleft()

    def _reply_for(self, request: dict[str, Any]) -> tuple[ScriptedReply, int]:
        """The script's next reply and its serial number (for response and tool-call ids)."""
        with self._lock:
            reply = self._next(request)
            self._served += 1
            number = self._served
        if isinstance(reply, str):
            reply = ScriptedReply.say(reply)
        if not isinstance(reply, ScriptedReply):
            raise TypeError(f"script returned {type(reply).__name__}, expected ScriptedReply or str")
        return reply, number

    def _metrics_text(self) -> str:
        label = f'{{model_name="{self.model}"}}'
        with self._lock:
            running, ok = self._running, self._succeeded
        return (
            "# HELP vllm:num_requests_running Number of requests currently running on GPU.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{label} {float(running)}\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{label} 0.0\n"
            "# TYPE vllm:gpu_cache_usage_perc gauge\n"
            f"vllm:gpu_cache_usage_perc{label} {float(self.gpu_cache_usage)}\n"
            "# TYPE vllm:request_success_total counter\n"
            f"vllm:request_success_total{label} {float(ok)}\n"
        )


class _HTTPServer(ThreadingHTTPServer):
    # The stdlib default backlog of 5 drops bursts of connections (benchmarks open hundreds).
    request_queue_size = 1024
    allow_reuse_address = True


def _handler_for(srv: ScriptedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        server_state = srv
    return Handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"              # keep-alive, like a real inference server
    server_state: ScriptedServer

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes; without NODELAY, Nagle holds the body
        # back for the client's delayed ACK (~40 ms a request).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server_state._lock:
            self.server_state._conns.add(self.connection)

    def finish(self) -> None:
        with self.server_state._lock:
            self.server_state._conns.discard(self.connection)
        with contextlib.suppress(OSError):         # the client went away first
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass                                   # tests read `requests`, not stderr

    # -- routing ------------------------------------------------------------------

    def do_GET(self) -> None:
        srv = self.server_state
        self._record(None)
        if self.path == "/health":
            self._send(200, b"", "text/plain")
        elif self.path == "/metrics":
            self._send(200, srv._metrics_text().encode(), "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{
                "id": srv.model, "object": "model", "created": 0, "owned_by": "tryloop",
                "root": srv.model, "max_model_len": srv.max_model_len}]})
        else:
            self._send_error(404, f"no route GET {self.path}", "NotFoundError")

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            self._record(raw.decode(errors="replace"))
            self._send_error(400, "request body is not JSON", "BadRequestError")
            return
        self._record(body)
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            self._send_error(404, f"no route POST {self.path}", "NotFoundError")
            return
        problem = _request_problem(self.path, body, self.server_state.model)
        if problem is not None:
            status, message = problem
            self._send_error(status, message, "NotFoundError" if status == 404 else "BadRequestError")
            return
        self._generate(body)

    def _generate(self, request: dict[str, Any]) -> None:
        srv = self.server_state
        with srv._lock:
            srv._running += 1
        try:
            self._answer(request)
        finally:
            with srv._lock:
                srv._running -= 1

    def _answer(self, request: dict[str, Any]) -> None:
        srv = self.server_state
        try:
            reply, number = srv._reply_for(request)
            wait = srv.latency_s + reply.delay_s
            # Event.wait, not sleep: closing the server releases a hang at once.
            if (wait > 0 and srv._closing.wait(wait)) or reply.drop:
                self.close_connection = True   # no answer at all
                return
            if reply.body is not None:
                data = reply.body.encode() if isinstance(reply.body, str) else reply.body
                self._send(reply.status, data, "application/json", reply.headers)
                return
            if not 200 <= reply.status < 300:
                self._send_error(reply.status, reply.text, "ScriptedError", reply.headers)
                return
            payload = _response(srv, request, reply, number, chat=self.path == "/v1/chat/completions")
        except Exception as e:
            with srv._lock:
                srv.errors.append(f"{self.path}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
            self._send_error(500, f"script error: {type(e).__name__}: {e}", "InternalServerError")
            return
        if self._send_json(200, payload):
            with srv._lock:
                srv._succeeded += 1

    # -- writing ----------------------------------------------------------------------

    def _record(self, body: Any) -> None:
        srv = self.server_state
        with srv._lock:
            srv.requests.append(ReceivedRequest(self.command, self.path, body, dict(self.headers.items())))

    def _send_error(self, status: int, message: str, kind: str,
                    headers: Mapping[str, str] | None = None) -> None:
        self._send(status, json.dumps({"error": {"message": message, "type": kind, "param": None,
                                                 "code": status}}).encode(), "application/json", headers)

    def _send_json(self, status: int, payload: dict[str, Any]) -> bool:
        return self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str,
              headers: Mapping[str, str] | None = None) -> bool:
        """Write a whole response; False when the client had already gone."""
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True       # the client gave up (e.g. its timeout) first
            return False
        return True


def _request_problem(path: str, body: Any, model: str) -> tuple[int, str] | None:
    """What vLLM would refuse, as (status, message); None when the request is fine."""
    if not isinstance(body, dict):
        return 400, "request body must be a JSON object"
    if body.get("model") != model:
        return 404, f"The model `{body.get('model')}` does not exist."
    if body.get("stream"):
        return 400, "ScriptedServer does not stream; send stream=false"
    if path == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            return 400, "messages must be a non-empty list of objects"
    elif not isinstance(body.get("prompt"), str | list):
        return 400, "prompt must be a string or a list of token ids"
    return None


# -- response bodies ----------------------------------------------------------------


def _toy_pieces(text: str) -> list[str]:
    return _PIECE_RE.findall(text)


def _toy_id(piece: str) -> int:
    return 100 + zlib.crc32(piece.encode()) % 50_000


def _prompt_text(request: dict[str, Any]) -> str:
    if "messages" not in request:
        prompt = request.get("prompt")
        return prompt if isinstance(prompt, str) else ""
    parts = []
    for m in request["messages"]:
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
    return "\n".join(parts)


def _response(srv: ScriptedServer, request: dict[str, Any], reply: ScriptedReply, n: int, *,
              chat: bool) -> dict[str, Any]:
    calls = [{"id": f"call_{n}_{i}", "type": "function",
              "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
             for i, (name, args) in enumerate(reply.tool_calls)]
    text = reply.text
    finish = reply.finish_reason or ("tool_calls" if calls else "stop")
    # What the model "generated": the text, plus the tool calls as a Hermes-style model writes them.
    generated = text + "".join(f"<tool_call>{json.dumps(c['function'])}</tool_call>" for c in calls)
    pieces = _toy_pieces(generated)
    max_tokens = request.get("max_tokens")
    if isinstance(max_tokens, int) and not calls and reply.token_ids is None and len(pieces) > max_tokens:
        pieces = pieces[:max_tokens]
        text = "".join(pieces)
        finish = reply.finish_reason or "length"
    ids = list(reply.token_ids) if reply.token_ids is not None else [_toy_id(p) for p in pieces]
    if len(pieces) != len(ids):
        pieces = [f"<{i}>" for i in ids]
    lps = (list(reply.logprobs) if reply.logprobs is not None
           else [-0.05 * (1 + i % 7) for i in range(len(ids))])
    if len(lps) != len(ids):
        raise ValueError(f"ScriptedReply has {len(ids)} tokens but {len(lps)} logprobs")
    prompt = request.get("prompt")
    prompt_ids = (list(prompt) if isinstance(prompt, list)
                  else [_toy_id(p) for p in _toy_pieces(_prompt_text(request))])
    as_ids = bool(request.get("return_tokens_as_token_ids"))
    shown = [f"token_id:{i}" if as_ids else p for i, p in zip(ids, pieces, strict=True)]

    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if calls:
            message["tool_calls"] = calls
        if reply.reasoning is not None:
            message["reasoning_content"] = reply.reasoning
        choice["message"] = message
        choice["logprobs"] = None
        if srv.token_data and request.get("logprobs"):
            choice["logprobs"] = {"content": [
                {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                for t, lp in zip(shown, lps, strict=True)]}
    else:
        choice["text"] = text
        choice["logprobs"] = None
        if srv.token_data and request.get("logprobs") is not None:
            offsets, at = [], 0
            for p in pieces:
                offsets.append(at)
                at += len(p)
            choice["logprobs"] = {"tokens": shown, "token_logprobs": lps,
                                  "top_logprobs": [{} for _ in ids], "text_offset": offsets}
    out: dict[str, Any] = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{n}", "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()), "model": srv.model, "choices": [choice],
        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                  "total_tokens": len(prompt_ids) + len(ids)},
    }
    if srv.token_data and request.get("return_token_ids"):
        choice["token_ids"] = ids
        if chat:
            out["prompt_token_ids"] = prompt_ids
        else:
            choice["prompt_token_ids"] = prompt_ids
    return out
