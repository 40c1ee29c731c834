"""A sampler that is a set of OpenAI-compatible model servers: the engine's `generate` over HTTP.

`HFPolicy(loaded, engine=EndpointSampler(...))` keeps its sessions token-exact as over the local
engine: the chat template is applied here, each turn is sent as token ids to `/v1/completions`
(`return_token_ids`, `logprobs: 0`, `return_tokens_as_token_ids`), and the sampled ids and their
log-probabilities come back as the server sampled them. Requests go to the endpoint with the
fewest requests in flight (ties in turn).

Losing an endpoint mid-run is not losing the run. A completion the endpoint did not answer
(connection refused or reset, timeout, 5xx), or answered with other weights than asked for, is
sent to another endpoint, up to `retries` more, and the endpoint is set aside for `down_s` seconds
(tried again after that, last). A completion is stateless (the whole context goes with every
turn), so an episode's next turn may come from another endpoint without changing its tokens. A
push that cannot reach an endpoint leaves it out: it holds older weights, so it gets no request
until a later push reaches it again. Only when no endpoint answers a completion, or none takes a
push, does the error (naming each one) stop the trainer.

Weights carry a version. The trainer announces one (`connect(expected)` at the start: every
endpoint must serve the learner's initial weights; `push(weights, version)` after each update:
every endpoint must acknowledge it), and every completion says which weights sampled it
(tryloop's server: `choices[i].weights_versions`). A completion sampled with other weights than
announced is an error naming the endpoint — never silently off-policy tokens.

Kinds of server (`kind`):

- "tryloop" (`tryloop serve model` with `serve.model.weight_updates`): versions are checked per
  completion; weights go to `POST /v1/weights`, as safetensors bytes in the body, or as a path
  on a shared filesystem when `weights_dir` is set.
- "vllm" / "sglang" (untested here: neither installs on a CPU-only machine): the request shapes
  of their docs. Neither reports a weights version per completion, so the version recorded is the
  last one they acknowledged (the synchronous loop never samples during a push). Weights are
  written to `weights_dir/<version>/` (config.json + model.safetensors; a shared path) and
  loaded by SGLang's `POST /update_weights_from_disk` {"model_path", "weight_version"} or vLLM's
  `POST /collective_rpc` {"method": "reload_weights", "kwargs": {"weights_path"}} (vLLM's
  development mode, `VLLM_SERVER_DEV_MODE=1`). vLLM returns `token_ids` with
  `return_token_ids` (0.10.2+) and raw log-probabilities by default (`--logprobs-mode
  raw_logprobs`), as this sampler needs.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from tryloop.errors import TryloopError
from tryloop.llm.client import LoopHTTP

Kind = Literal["tryloop", "vllm", "sglang"]


class SamplerError(TryloopError):
    """A sampler endpoint is down, refused a request, or served other weights than announced."""

    fatal = True    # an episode it ends fails fatal (scheduler.failures): a trainer stops, never trains around it


@dataclass
class RemoteSample:
    """What `Engine.generate` returns, as far as a policy session reads it."""

    token_ids: list[int]
    policy_logprobs: list[float]
    finish_reason: str
    weights_versions: tuple[str, ...]
    endpoint: str = ""

    @property
    def weights_version(self) -> str:
        return self.weights_versions[-1]


@dataclass
class _Endpoint:
    url: str
    in_flight: int = 0
    requests: int = 0
    model: str = ""
    max_context: int = 0
    push_s: list[float] = field(default_factory=list)
    version: str = ""            # the weights it holds, as far as this sampler knows (connect, pushes)
    down_until: float = 0.0      # monotonic time before which it gets requests only as a last resort
    failures: int = 0            # completions it did not answer or answered with other weights
    missed_pushes: int = 0


class _Retry(Exception):
    """This endpoint's answer cannot be used; another endpoint may give one."""


class EndpointSampler:
    def __init__(self, endpoints: list[str], *, kind: Kind = "tryloop", api_key: str | None = None,
                 timeout_s: float = 300.0, retries: int = 1, weights_dir: str | Path | None = None,
                 model_config: Any = None, check_versions: bool = True, down_s: float = 10.0):
        """`check_versions=False`: record the versions each completion reports without comparing them
        to the announced one (a Ray rollout worker, which names the version per call, and overlapped
        rollouts, whose trainer checks the versions per episode)."""
        if not endpoints:
            raise ValueError("an EndpointSampler needs at least one endpoint")
        for u in endpoints:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"sampler endpoint {u!r} must start with http:// or https://")
        if kind != "tryloop" and weights_dir is None:
            raise ValueError(f"a {kind} sampler loads weights from a shared path: set weights_dir")
        self.endpoints = [_Endpoint(u.rstrip("/").removesuffix("/v1")) for u in endpoints]
        self.kind, self.timeout_s, self.retries, self.down_s = kind, timeout_s, retries, down_s
        self.weights_dir = Path(weights_dir) if weights_dir is not None else None
        self.model_config = model_config          # written beside vLLM's / SGLang's weights
        self.check_versions = check_versions
        self.api_key = api_key                    # handed on to rollout workers that sample here too
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._turn = itertools.count()
        self._http = LoopHTTP(self._headers, self.timeout_s)
        self.announced = ""
        self.max_context = 0
        self.failure: SamplerError | None = None
        self.missed: list[str] = []             # the last push: each endpoint it left out, and why
        self._written: Path | None = None       # the last push's file or folder under weights_dir

    # --- what a policy session reads ----------------------------------------------------

    @property
    def weights_version(self) -> str:
        return self.announced

    async def connect(self, expected_version: str, *, check_version: bool = True, all_up: bool = True) -> None:
        """Every endpoint answers and (tryloop's server) serves `expected_version`, in raw
        log-probability mode; the error names each endpoint that does not. `check_version=False`
        (a resumed run, which pushes its checkpoint's weights next) accepts any version.
        `all_up=False` (a rollout worker starting mid-run, when an endpoint may be lost): one that
        does not answer is set aside, as after a failed completion, and only none answering is an
        error."""
        problems, down = [], []
        for ep in self.endpoints:
            try:
                r = await self._http.client().get(f"{ep.url}/v1/models", timeout=min(30.0, self.timeout_s))
                r.raise_for_status()
                entry = r.json()["data"][0]
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
                (problems if all_up else down).append(
                    f"{ep.url}: GET /v1/models failed ({type(e).__name__}: {str(e)[:200]})")
                if not all_up:
                    ep.version = expected_version
                    self._set_aside(ep)
                continue
            ep.model = entry.get("id", "")
            ep.max_context = int(entry.get("max_model_len") or 0)
            ep.version = expected_version
            if self.kind != "tryloop":
                continue
            served = entry.get("weights_version")
            if check_version and served != expected_version:
                problems.append(f"{ep.url} serves weights {served!r}, but the learner starts from "
                                f"{expected_version!r}: start it with the same model")
            if entry.get("logprobs_mode", "raw") != "raw":
                problems.append(f"{ep.url} reports {entry['logprobs_mode']!r} log-probabilities; the trainer "
                                "needs the policy's at temperature 1 (serve.model.logprobs_mode: raw)")
        if len(down) == len(self.endpoints):
            problems = down
        if problems:
            raise SamplerError("sampler endpoints not ready: " + "; ".join(problems))
        # Those set aside serve the same model as the others (the trainer checked at its start).
        model = next((ep.model for ep in self.endpoints if ep.model), "")
        for ep in self.endpoints:
            ep.model = ep.model or model
        self.announced = expected_version
        self.max_context = min((ep.max_context for ep in self.endpoints if ep.max_context), default=1 << 20)

    # --- sampling ---------------------------------------------------------------------------

    def live(self) -> list[str]:
        """The endpoints that hold the announced weights (the others missed a push)."""
        return [ep.url for ep in self.endpoints if ep.version == self.announced]

    def _order(self, among: list[str] | None = None) -> list[_Endpoint]:
        """Endpoints to try: those holding the announced weights (of `among`, if given), the least
        loaded first (ties in turn); the ones set aside after a failure last."""
        n = len(self.endpoints)
        start = next(self._turn) % n
        rotated = self.endpoints[start:] + self.endpoints[:start]
        usable = [ep for ep in rotated if ep.version == self.announced and (among is None or ep.url in among)]
        now = time.monotonic()
        # Set aside: last, the soonest back first. Its time out over: ordered by load like the others.
        return sorted(usable, key=lambda ep: (ep.down_until > now, ep.down_until if ep.down_until > now else 0.0,
                                              ep.in_flight))

    def _set_aside(self, ep: _Endpoint) -> None:
        ep.failures += 1
        ep.down_until = time.monotonic() + self.down_s

    def check(self) -> None:
        """Raise the first sampling failure: the episodes it ended hold no usable tokens, and a
        trainer must stop rather than train on what is left (it calls this after each rollout)."""
        if self.failure is not None:
            raise self.failure

    async def generate(self, prompt_ids: list[int], *, max_new_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, seed: int | None = None, stop_strings: tuple[str, ...] = (),
                       accept: str | None = None, among: list[str] | None = None, **_: Any) -> RemoteSample:
        """One completion, sampled with `accept` (None: the announced weights, if checked) on one of
        `among` (None: any endpoint). A failure (no endpoint left) is kept: every later call fails
        with it."""
        self.check()
        try:
            return await self._generate(prompt_ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                        top_p=top_p, seed=seed, stop_strings=stop_strings, accept=accept,
                                        among=among)
        except SamplerError as e:
            if self.failure is None:
                self.failure = e
            raise

    async def _generate(self, prompt_ids: list[int], *, max_new_tokens: int, temperature: float,
                        top_p: float, seed: int | None, stop_strings: tuple[str, ...], accept: str | None,
                        among: list[str] | None) -> RemoteSample:
        body: dict[str, Any] = {"prompt": list(prompt_ids), "max_tokens": max_new_tokens,
                                "temperature": temperature, "top_p": top_p, "logprobs": 0,
                                "return_token_ids": True, "return_tokens_as_token_ids": True}
        if seed is not None:
            body["seed"] = seed
        if stop_strings:
            body["stop"] = list(stop_strings)
        if accept is None and self.check_versions:
            accept = self.announced
        order = self._order(among)
        if not order:
            raise SamplerError(f"no sampler endpoint holds weights {self.announced!r}: "
                               f"{', '.join(among or []) or 'every one'} missed a push")
        failures = []
        for ep in order[: self.retries + 1]:
            ep.in_flight += 1
            ep.requests += 1
            try:
                r = await self._http.client().post(f"{ep.url}/v1/completions", json={"model": ep.model, **body})
            except httpx.HTTPError as e:
                failures.append(f"{ep.url}: {type(e).__name__}: {str(e)[:200]}")
                self._set_aside(ep)
                continue
            finally:
                ep.in_flight -= 1
            if r.status_code >= 500:
                failures.append(f"{ep.url}: HTTP {r.status_code}: {r.text[:200]}")
                self._set_aside(ep)
                continue
            if r.status_code != 200:     # the request itself was refused: no other endpoint will take it
                raise SamplerError(f"sampler endpoint {ep.url} refused the completion: HTTP {r.status_code}: "
                                   f"{r.text[:300]}")
            try:
                try:
                    data = r.json()
                except ValueError:
                    raise _Retry(f"{ep.url}: its answer is not JSON: {r.text[:200]!r}") from None
                sample = self._sample(ep, data, accept)
                if self.kind == "tryloop" and accept and any(v != accept for v in sample.weights_versions):
                    # Restarted, or pushed to by someone else: its tokens are never used.
                    raise _Retry(f"{ep.url} sampled with weights {list(sample.weights_versions)} but "
                                 f"{accept!r} was announced (restarted, or pushed to by another trainer?)")
            except _Retry as e:
                failures.append(str(e))
                self._set_aside(ep)
                continue
            ep.down_until = 0.0
            return sample
        raise SamplerError("no sampler endpoint answered with usable tokens, refusing off-policy or missing "
                           "ones: " + "; ".join(failures))

    def _sample(self, ep: _Endpoint, data: dict[str, Any], accept: str | None = None) -> RemoteSample:
        try:
            choice = data["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
            lps = [float(x) for x in choice["logprobs"]["token_logprobs"]]
            finish = str(choice.get("finish_reason") or "stop")
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise SamplerError(f"sampler endpoint {ep.url} answered without token ids and log-probabilities "
                               f"({type(e).__name__}: {e}): it must support return_token_ids and logprobs") from None
        if len(ids) != len(lps):
            raise SamplerError(f"sampler endpoint {ep.url} returned {len(ids)} token ids but {len(lps)} "
                               "log-probabilities")
        if self.kind == "tryloop":
            versions = tuple(choice.get("weights_versions") or [data.get("system_fingerprint") or ""])
        else:
            # No per-completion report: the version it acknowledged last (the pusher's `among`).
            versions = (accept or self.announced,)
        return RemoteSample(ids, lps, "length" if finish == "length" else "stop", versions, ep.url)

    # --- weights ----------------------------------------------------------------------------

    async def push(self, weights: Any, *, version: str) -> float:
        """Send `weights` (a state dict or a model) to every endpoint as `version`; returns the
        seconds it took (serialization included). Once it returns, the endpoints that acknowledged
        `version` are the ones sampled from (`live()`): one that could not be reached is left out
        until a later push reaches it, and none reached is an error. An endpoint that answers but
        refuses the weights is an error too (a server set up otherwise than the trainer)."""
        from tryloop.agent import weights_io

        t0 = time.perf_counter()
        written: Path | None = None
        if self.kind == "tryloop":
            if self.weights_dir is not None:
                path = written = await asyncio.to_thread(weights_io.to_file, weights, self.weights_dir /
                                                         f"{_safe(version)}.safetensors", version=version)
                req: dict[str, Any] = {"json": {"path": str(path.resolve()), "version": version}}
            else:
                data = await asyncio.to_thread(weights_io.to_bytes, weights, version=version)
                req = {"content": data, "headers": {"Content-Type": "application/octet-stream",
                                                    "X-Weights-Version": version}}
            took = await self._push_all("/v1/weights", req, version)
        else:
            assert self.weights_dir is not None
            folder = written = self.weights_dir / _safe(version)
            await asyncio.to_thread(self._write_folder, weights, folder, version)
            if self.kind == "sglang":
                path, body = "/update_weights_from_disk", {"model_path": str(folder.resolve()),
                                                           "weight_version": version}
            else:
                path, body = "/collective_rpc", {"method": "reload_weights",
                                                 "kwargs": {"weights_path": str(folder.resolve())}}
            took = await self._push_all(path, {"json": body}, version)
        # All at once, after the last answer: until then every endpoint still counts as holding the
        # announced weights (overlapped rollouts sample during a push; none may find no endpoint).
        for ep in took:
            ep.version, ep.down_until = version, 0.0
        self.announced = version
        # Every endpoint sampled from has loaded it: the previous push's copy is read by no one now.
        previous, self._written = self._written, written
        if previous is not None and previous != written:
            await asyncio.to_thread(shutil.rmtree if previous.is_dir() else previous.unlink, previous)
        return time.perf_counter() - t0

    def _write_folder(self, weights: Any, folder: Path, version: str) -> None:
        from tryloop.agent import weights_io

        folder.mkdir(parents=True, exist_ok=True)
        if self.model_config is not None:
            self.model_config.save_pretrained(str(folder))
        weights_io.to_file(weights, folder / "model.safetensors", version=version)

    async def _push_all(self, path: str, req: dict[str, Any], version: str) -> list[_Endpoint]:
        """The endpoints that took `version`; an error if none did."""
        why = await asyncio.gather(*[self._push_one(ep, path, req, version) for ep in self.endpoints])
        if all(why):
            raise SamplerError(f"weights {version!r} reached no sampler endpoint: " + "; ".join(why))
        self.missed = [w for w in why if w]
        return [ep for ep, w in zip(self.endpoints, why, strict=True) if not w]

    async def _push_one(self, ep: _Endpoint, path: str, req: dict[str, Any], version: str) -> str:
        """'' once `ep` took `version`; why not, if it could not be reached (it is left out)."""
        t0 = time.perf_counter()
        try:
            r = await self._http.client().post(f"{ep.url}{path}", **req)
        except httpx.HTTPError as e:
            ep.missed_pushes += 1
            return f"{ep.url}: {type(e).__name__}: {str(e)[:200]}"
        if r.status_code >= 500:
            ep.missed_pushes += 1
            return f"{ep.url}: HTTP {r.status_code}: {r.text[:200]}"
        if r.status_code != 200:
            raise SamplerError(f"sampler endpoint {ep.url} refused weights {version!r}: HTTP {r.status_code}: "
                               f"{r.text[:300]}")
        body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
        if self.kind == "tryloop" and body.get("weights_version") != version:
            raise SamplerError(f"sampler endpoint {ep.url} acknowledged weights {body.get('weights_version')!r}, "
                               f"not {version!r}")
        if self.kind == "sglang" and isinstance(body, dict) and body.get("success") is False:
            raise SamplerError(f"sampler endpoint {ep.url} did not load weights {version!r}: {body.get('message')}")
        ep.push_s.append(time.perf_counter() - t0)
        return ""

    # --- the engine's other calls -----------------------------------------------------------

    async def park(self) -> None:
        """Nothing to free here: the weights and prefix caches live in the servers' processes, and a
        server drops its cache when new weights arrive."""

    async def update_weights(self, weights: Any, *, version: str | None = None) -> str:
        v = version or f"{self.announced}+1"
        await self.push(weights, version=v)
        return v

    def stats(self) -> dict[str, Any]:
        return {ep.url: {"requests": ep.requests, "in_flight": ep.in_flight, "push_s": list(ep.push_s),
                         "failures": ep.failures, "missed_pushes": ep.missed_pushes,
                         "live": ep.version == self.announced}
                for ep in self.endpoints}

    def close(self) -> None:
        """The HTTP connections go with `aclose` (or with the event loop)."""

    async def aclose(self) -> None:
        await self._http.aclose()


def _safe(version: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.+" else "_" for c in version)
