"""Clients of `tryloop serve env`: one WebSocket per episode.

    with EnvClient("http://127.0.0.1:8000", token=...) as env:
        r = env.reset(task_id="...")                       # r.observation["instruction"], ["tools"]
        r = env.step({"tool_calls": [{"name": "shell", "arguments": {"command": "ls"}}]})
        r = env.step({"tool_calls": [{"name": "submit", "arguments": {}}]})
        r.done, r.reward, r.observation["verdict"]

`AsyncEnvClient` is the same over asyncio (many episodes from one thread); `GymEnv` wraps
`EnvClient` in Gymnasium's calling convention. A server error arrives as `ServeError` with its
code (OpenEnv's: VALIDATION_ERROR, CAPACITY_REACHED, SESSION_ERROR, ...; tryloop's: UNKNOWN_SESSION,
SESSION_BUSY, UNAUTHORIZED), a refused handshake too; a connection closed because another
one took its session over raises SESSION_TAKEN_OVER.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as aconnect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection as SyncConnection
from websockets.sync.client import connect

from tryloop.errors import TryloopError


class ServeError(TryloopError):
    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.data = data or {}


@dataclass
class StepResult:
    observation: dict[str, Any]
    reward: float | None
    done: bool

    @property
    def verdict(self) -> dict[str, Any] | None:
        return self.observation.get("verdict")


def _ws_url(base_url: str, session_id: str | None) -> str:
    url = base_url.rstrip("/")
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(http):
            url = ws + url[len(http):]
    return f"{url}/ws" + (f"?session_id={session_id}" if session_id else "")


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _reset_data(task_id: str | None, seed: int | None, episode_id: str | None) -> dict[str, Any]:
    return {k: v for k, v in (("task_id", task_id), ("seed", seed), ("episode_id", episode_id)) if v is not None}


def _reply(raw: str | bytes) -> dict[str, Any]:
    msg = json.loads(raw)
    if msg.get("type") == "error":
        data = msg.get("data", {})
        raise ServeError(str(data.get("code", "ERROR")), str(data.get("message", "")), data)
    return msg.get("data", {})


def _refusal(e: InvalidStatus) -> Exception:
    """A handshake the server refused, as the ServeError its JSON body names (data["status"]: the
    HTTP status), or as it is when the body is not the protocol's error."""
    try:
        err = json.loads(e.response.body or b"")["error"]
        return ServeError(str(err["code"]), str(err.get("message", "")), {**err, "status": e.response.status_code})
    except (ValueError, KeyError, TypeError):
        return e


# The server closes a connection whose session another connection took over with this code.
TAKEN_OVER_CLOSE = 4000


def _closed(e: ConnectionClosed) -> Exception:
    """A closed connection as the client should see it: a session another connection took over
    is a ServeError (SESSION_TAKEN_OVER); any other close stays what it is."""
    if e.rcvd is not None and e.rcvd.code == TAKEN_OVER_CLOSE:
        return ServeError("SESSION_TAKEN_OVER", e.rcvd.reason or "another connection took over this session",
                          {"close_code": e.rcvd.code})
    return e


def _result(data: dict[str, Any]) -> StepResult:
    return StepResult(data.get("observation", {}), data.get("reward"), bool(data.get("done", False)))


class EnvClient:
    """A blocking client; `session_id` resumes an episode after a lost connection."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 600.0,
                 session_id: str | None = None, max_message_bytes: int = 16 << 20):
        self.url = _ws_url(base_url, session_id)
        self.token, self.timeout_s, self.max_message_bytes = token, timeout_s, max_message_bytes
        self.session_id = session_id
        self._ws: SyncConnection | None = None

    def connect(self) -> EnvClient:
        if self._ws is None:
            # Entered by hand: the connection outlives this call (closed in close()).
            try:
                self._ws = connect(self.url, additional_headers=_headers(self.token), open_timeout=30,
                                   max_size=self.max_message_bytes).__enter__()
            except InvalidStatus as e:
                raise _refusal(e) from None
        return self

    def _call(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.connect()
        assert self._ws is not None
        try:
            self._ws.send(json.dumps(msg))
            return _reply(self._ws.recv(timeout=self.timeout_s))
        except ConnectionClosed as e:
            raise _closed(e) from None

    def reset(self, task_id: str | None = None, *, seed: int | None = None,
              episode_id: str | None = None) -> StepResult:
        r = _result(self._call({"type": "reset", "data": _reset_data(task_id, seed, episode_id)}))
        self.session_id = r.observation.get("session_id")
        return r

    def step(self, action: dict[str, Any]) -> StepResult:
        return _result(self._call({"type": "step", "data": action}))

    def state(self) -> dict[str, Any]:
        return self._call({"type": "state"})

    def close(self) -> None:
        if self._ws is not None:
            # Already gone: the server closes the session after its grace period.
            with contextlib.suppress(Exception):
                self._ws.send(json.dumps({"type": "close"}))
            self._ws.close()
            self._ws = None

    def __enter__(self) -> EnvClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEnvClient:
    """`EnvClient` over asyncio."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 600.0,
                 session_id: str | None = None, max_message_bytes: int = 16 << 20):
        self.url = _ws_url(base_url, session_id)
        self.token, self.timeout_s, self.max_message_bytes = token, timeout_s, max_message_bytes
        self.session_id = session_id
        self._ws: ClientConnection | None = None

    async def connect(self) -> AsyncEnvClient:
        if self._ws is None:
            try:
                self._ws = await aconnect(self.url, additional_headers=_headers(self.token), open_timeout=60,
                                          max_size=self.max_message_bytes, ping_interval=None)
            except InvalidStatus as e:
                raise _refusal(e) from None
        return self

    async def _call(self, msg: dict[str, Any]) -> dict[str, Any]:
        import asyncio

        await self.connect()
        assert self._ws is not None
        try:
            await self._ws.send(json.dumps(msg))
            return _reply(await asyncio.wait_for(self._ws.recv(), self.timeout_s))
        except ConnectionClosed as e:
            raise _closed(e) from None

    async def reset(self, task_id: str | None = None, *, seed: int | None = None,
                    episode_id: str | None = None) -> StepResult:
        r = _result(await self._call({"type": "reset", "data": _reset_data(task_id, seed, episode_id)}))
        self.session_id = r.observation.get("session_id")
        return r

    async def step(self, action: dict[str, Any]) -> StepResult:
        return _result(await self._call({"type": "step", "data": action}))

    async def state(self) -> dict[str, Any]:
        return await self._call({"type": "state"})

    async def close(self) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.send(json.dumps({"type": "close"}))
            await self._ws.close()
            self._ws = None

    async def __aenter__(self) -> AsyncEnvClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# Terminations that are the episode's natural end (Gymnasium's `terminated`); the others are a
# limit cutting it short (`truncated`).
_TERMINATED = frozenset({"submitted", "error"})


class GymEnv:
    """Gymnasium's calling convention over a served task:

        obs, info = env.reset(seed=0)          # obs: instruction, tools, ...; info: session and task ids
        obs, reward, terminated, truncated, info = env.step(action)

    `reward` is 0.0 until the episode ends, then the verifier's reward; `info["verdict"]` is the
    whole verdict. `terminated`: the agent submitted (or the episode failed); `truncated`: a limit
    (turns, time, context) ended it.
    """

    def __init__(self, base_url: str, *, token: str | None = None, task_id: str | None = None,
                 timeout_s: float = 600.0):
        self.base_url, self.token, self.task_id, self.timeout_s = base_url, token, task_id, timeout_s
        self._client: EnvClient | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        self.close()
        self._client = EnvClient(self.base_url, token=self.token, timeout_s=self.timeout_s).connect()
        task_id = (options or {}).get("task_id", self.task_id)
        r = self._client.reset(task_id, seed=seed)
        info = {k: r.observation.get(k) for k in ("session_id", "episode_id", "task_id")}
        return r.observation, info

    def step(self, action: dict[str, Any]) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self._client is None:
            raise ServeError("SESSION_ERROR", "step before reset")
        r = self._client.step(action)
        info: dict[str, Any] = {"session_id": r.observation.get("session_id"), "turn": r.observation.get("turn")}
        terminated = truncated = False
        if r.done:
            info["verdict"] = r.verdict
            termination = r.observation.get("termination")
            terminated = termination in _TERMINATED
            truncated = not terminated
        return r.observation, float(r.reward or 0.0), terminated, truncated, info

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
