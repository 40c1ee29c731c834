"""Sessions: one episode each, played by a remote client through the ordinary episode loop.

The client is the policy. A session runs `tryloop.agent.episode.run_episode` with a policy whose
`act()` hands the tool results to the client and waits for its next action, so a served episode
is exactly an in-process one: the same sandbox from the warm pool, the same tools of the task's
profile, the same limits, the same verifier in a fresh sandbox at the end. `done` carries the
trajectory's reward and whole verdict.

The manager bounds the sessions open at once, closes those whose client went quiet
(`idle_timeout_s`) or disconnected and did not come back (`disconnect_grace_s`), and counts what
happens in Prometheus metrics. Closing a session cancels its episode; the episode's own cleanup
releases the sandbox to its pool. A session has one driver at a time: the WebSocket connection
attached to it, or one HTTP step. A connection that comes back for its session takes it over
from the one before (a client whose network dropped is back at once, whether or not the server
has noticed the drop yet); an HTTP step while a connection holds the session, or any step while
another runs, is refused (SESSION_BUSY).

An episode ends on its own when the client submits, at `max_turns`, or at `wall_time_s` (also
while the client is silent); its verdict is then recorded on the session at once, not when the
client next asks, and kept for the client to collect: its next step gets the done reply, `state`
shows it. The reaper judges the client's silence only while the episode waits for the client or
is over, never while the server works (a reset, a step, the judging of an episode whose time ran
out), and a session's idle and disconnect clocks start again when its episode ends.

Each episode runs under a scheduler (tryloop.scheduler), as `tryloop eval`'s do, made from the
`scheduler:` section by `serve_scheduler_config`: its execution capacity bounds the tool and
verifier runs of all sessions together, its `timeouts.verification_s` and (raised to cover the
session's own time limit) `timeouts.episode_s` apply, an episode that fails for the
infrastructure's sake ends with its typed failure, and its metrics (`tryloop_scheduler_*`) are
served on /metrics with the sessions'. What cannot apply to an episode whose policy is a client
is switched off there: retries (the client has seen the turns a retry would replay), the turn
time limit and the inference permits (a turn waits for the client, whose pace is
`idle_timeout_s`'s to judge, not for an inference service the scheduler protects), adaptive
admission (the limit is `max_sessions`, which the server enforces by refusing), the journal and
the Ray engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tryloop.agent.config import EpisodeLimits
from tryloop.agent.environments import Environments
from tryloop.agent.episode import EpisodeRequest, run_episode, system_prompt
from tryloop.agent.policy import Action, TokenLog
from tryloop.agent.profiles import profile_for
from tryloop.agent.trajectory import Observation, Trajectory
from tryloop.rewards.spec import RewardSpec
from tryloop.scheduler.config import SchedulerConfig
from tryloop.scheduler.core import Scheduler
from tryloop.scheduler.request import EpisodeRequest as ScheduledEpisode
from tryloop.serve import protocol as p
from tryloop.serve.config import ServeEnvConfig
from tryloop.tasks.model import Task


def serve_scheduler_config(base: SchedulerConfig, cfg: ServeEnvConfig) -> SchedulerConfig:
    """The scheduler of served episodes: `base` (the `scheduler:` section) less what cannot apply
    to an episode whose policy is a remote client (see the module doc)."""
    t = base.timeouts
    n = cfg.max_sessions
    episode_s = t.episode_s
    if episode_s is not None:   # never before the session's own limit and a verification after it
        episode_s = max(episode_s, cfg.limits.wall_time_s + (t.verification_s or 0.0) + 60.0)
    return base.model_copy(update={
        "engine": "local", "journal": None, "local_hosts": None, "max_queued": max(base.max_queued, n),
        "timeouts": t.model_copy(update={"turn_s": None, "episode_s": episode_s}),
        "retry": base.retry.model_copy(update={"max_retries": 0, "verifier_retries": 0}),
        "admission": base.admission.model_copy(update={"adaptive": False, "initial": n, "min": 1, "max": n})})


class _ExecutionOnly:
    """A scheduler context's capacity for a served episode: its execution slots around tool and
    verifier runs; a turn's wait for the client holds no inference permit."""

    def __init__(self, capacity: Any):
        self._capacity = capacity

    def inference(self, endpoint: str = "default") -> contextlib.AbstractAsyncContextManager:
        return contextlib.nullcontext()

    def execution(self) -> contextlib.AbstractAsyncContextManager:
        return self._capacity.execution()


class EpisodeFailed(Exception):
    """A served episode the scheduler ended without a trajectory (its typed failure)."""


_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServeMetrics:
    def __init__(self, registry: CollectorRegistry):
        kw = {"registry": registry}
        self.open = Gauge("tryloop_serve_sessions", "Episodes open (holding a sandbox or being verified)", **kw)
        self.attached = Gauge("tryloop_serve_sessions_attached", "Sessions with a WebSocket client", **kw)
        self.closed = Counter("tryloop_serve_sessions_closed_total", "Sessions ended, by why",
                              ["reason"], **kw)
        self.refused = Counter("tryloop_serve_refused_total", "Requests refused, by why", ["reason"], **kw)
        self.latency = Histogram("tryloop_serve_request_seconds", "Time to answer reset and step",
                                 ["op"], buckets=_LATENCY, **kw)
        self.verify = Histogram("tryloop_serve_verify_seconds", "Verifier latency of served episodes",
                                buckets=_LATENCY, **kw)
        self.verdicts = Counter("tryloop_serve_verdicts_total", "Verdicts of served episodes", ["state"], **kw)


class _ClientTurns:
    """The policy session of a served episode: each `act()` is one round trip to the client."""

    def __init__(self, system: str, instruction: str):
        self.tokens = TokenLog(source="unavailable")     # the client's tokens are its own
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system},
                                               {"role": "user", "content": instruction}]
        self.actions: asyncio.Queue[Action] = asyncio.Queue(maxsize=1)
        self.events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.asked = 0           # act() calls: one more than the turns taken once a wait for the client ran out
        self.waiting = False     # whether the episode waits for the client's action now

    async def act(self, observations: list[Observation] | None) -> Action:
        self.asked += 1
        await self.events.put(("turn", observations))
        self.waiting = True
        try:
            action = await self.actions.get()
        finally:     # (also when the episode's wall_time_s ends the wait)
            self.waiting = False
        self.messages.append({"role": "assistant", "content": action.text})
        return action


class _ClientPolicy:
    name = "remote-client"
    version = "external"

    def __init__(self, turns: _ClientTurns):
        self.turns = turns

    def session(self, system: str, instruction: str, *, seed: int = 0, task: Task | None = None) -> _ClientTurns:
        return self.turns


class Session:
    """One episode of one task, driven by one client."""

    def __init__(self, manager: SessionManager, task: Task, episode_id: str):
        self.manager = manager
        self.id = uuid.uuid4().hex
        self.task = task
        self.episode_id = episode_id
        self.tool_names = list(profile_for(task).tools)
        self.system = system_prompt(task, max_turns=manager.limits.max_turns)
        self.turns = _ClientTurns(self.system, task.instruction)
        self.step_count = 0
        self.done = False
        self.ended: str | None = None            # how the episode ended on its own: "done" (judged) or "error"
        self.reported = False                    # whether a reply has given the client that end
        self.closed_reason: str | None = None
        self.last: dict[str, Any] | None = None
        self.last_activity = time.monotonic()
        self.detached_at: float | None = None    # when its WebSocket went away (None: attached or HTTP)
        self.owner: object | None = None         # the WebSocket connection it is attached to: its one driver
        self.busy = asyncio.Lock()               # one step at a time
        self._episode: asyncio.Task | None = None

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    async def start(self) -> dict[str, Any]:
        req = EpisodeRequest(episode_id=self.episode_id, task=self.task, run_id=self.manager.run_id,
                             meta={"session_id": self.id})
        self._episode = asyncio.ensure_future(self._run(req))
        return await self._next()

    async def _run(self, req: EpisodeRequest) -> None:
        m = self.manager
        try:
            traj = await m.run(self, req)
            if m.store is not None:   # durable before the client hears the verdict, as in eval
                await asyncio.to_thread(m.store.write, [traj])
        except asyncio.CancelledError:
            raise
        except Exception as e:  # an infrastructure fault: the client is told, the session ends
            if self._ended("error"):
                self.turns.events.put_nowait(("error", e))
        else:
            # Recorded now, whether or not a step waits: an episode whose time ran out while the
            # client was silent has its verdict ready when the client comes back.
            if self._judged(traj):
                self.turns.events.put_nowait(("done", None))

    def _ended(self, how: str) -> bool:
        """The episode ended on its own (`how`: done or error): counted out of the open ones, once
        (False: it was closed first). The client's time to collect the end starts now."""
        if self.done:
            return False
        self.done, self.ended = True, how
        self.manager.episode_over(self)
        self.touch()
        if self.detached_at is not None:
            self.detached_at = time.monotonic()
        return True

    def _judged(self, traj: Trajectory) -> bool:
        """The done reply of a judged episode, kept as `last` for the client to collect."""
        if not self._ended("done"):
            return False
        self.step_count = len(traj.turns)     # (an action sent after the time limit was not taken)
        obs = self._observation()
        last_turn = traj.turns[-1] if traj.turns else None
        # The results of the action that ended the episode, unless an earlier reply carried them (the
        # episode went on to wait for the next action and its time ran out) or there are none (a
        # lone submit, whose outcome is the verdict): no empty or repeated list is passed off as this
        # reply's results.
        if last_turn is not None and last_turn.observations and self.turns.asked == len(traj.turns):
            obs["results"] = p.results(last_turn.observations)
        obs.update(termination=traj.termination, verdict=p.verdict(traj))
        self.manager.judged(traj)
        self.last = {"observation": obs, "reward": float(traj.reward or 0.0), "done": True}
        return True

    async def step(self, action: p.StepAction) -> dict[str, Any]:
        if self.closed_reason is not None:
            raise p.ProtocolError(p.SESSION_ERROR, f"session {self.id} was closed ({self.closed_reason}); reset "
                                                   "to start another episode")
        if not self.done:
            self.turns.actions.put_nowait(p.to_action(action, self.tool_names, self.step_count))
            self.step_count += 1
        elif self.reported:
            raise p.ProtocolError(p.SESSION_ERROR, f"session {self.id}: the episode is over; reset to start another")
        # (an episode that ended while the client was away: this step is answered with that end)
        return await self._next()

    def _observation(self) -> dict[str, Any]:
        return {"session_id": self.id, "episode_id": self.episode_id, "task_id": self.task.id,
                "turn": self.step_count}

    async def _next(self) -> dict[str, Any]:
        kind, value = await self.turns.events.get()
        if kind == "turn":
            obs = self._observation()
            if value is None:     # the first turn: what the task's policies are given
                obs.update(system=self.system, instruction=self.task.instruction,
                           tools=profile_for(self.task).schemas)
            else:
                obs["results"] = p.results(value)
            self.last = {"observation": obs, "reward": None, "done": False}
            return self.last
        if kind == "closed":
            raise p.ProtocolError(p.SESSION_ERROR, f"session {self.id} was closed ({value})")
        self.reported = True
        if kind == "error":
            raise p.ProtocolError(p.EXECUTION_ERROR, f"session {self.id}: the environment failed: {value}")
        assert self.last is not None      # "done": the reply _judged recorded
        return self.last

    def state(self) -> dict[str, Any]:
        return p.SessionState(episode_id=self.episode_id, step_count=self.step_count, session_id=self.id,
                              task_id=self.task.id, done=self.done, last=self.last).model_dump()

    async def close(self) -> None:
        if self._episode is not None and not self._episode.done():
            self._episode.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._episode
        self.turns.events.put_nowait(("closed", self.closed_reason))   # wakes a step still waiting


class SessionManager:
    """The open sessions, their limit and their reaping."""

    def __init__(self, cfg: ServeEnvConfig, tasks: list[Task], envs: Environments, *,
                 spec: RewardSpec | None = None, registry: CollectorRegistry | None = None,
                 store: Any = None, run_id: str = "serve", scheduler: SchedulerConfig | None = None):
        """`store`: a TrajectoryStore that judged episodes are written to (None: not recorded),
        filed under `run_id`. `scheduler`: the `scheduler:` section the episodes' scheduler is
        made from (serve_scheduler_config); its metrics go to `registry` too."""
        if not tasks:
            raise ValueError("no tasks to serve")
        self.cfg = cfg
        self.tasks = tasks
        self.envs = envs
        self.spec = spec
        self.store = store
        self.run_id = run_id
        # The client's silence is the reaper's to judge (idle_timeout_s); the episode itself only
        # ends a wait for the client at its wall-clock budget.
        self.limits: EpisodeLimits = cfg.limits.model_copy(update={"turn_timeout_s": cfg.limits.wall_time_s})
        self.registry = registry or CollectorRegistry()
        self.metrics = ServeMetrics(self.registry)
        self.sessions: dict[str, Session] = {}
        self._open = 0          # sessions whose episode still runs: what max_sessions bounds
        self._reaper: asyncio.Task | None = None
        self.scheduler: Scheduler[Trajectory] = Scheduler(
            self._runner, serve_scheduler_config(scheduler or SchedulerConfig(), cfg), registry=self.registry)
        self._runs: dict[str, tuple[Session, EpisodeRequest]] = {}   # scheduler id (session id) -> episode

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        await self.scheduler.start()
        self._reaper = asyncio.ensure_future(self._reap_forever())

    async def aclose(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for s in list(self.sessions.values()):
            await self.close(s, "shutdown")
        await self.scheduler.close(grace_s=0)

    # -- episodes, through the scheduler ---------------------------------------------------------
    async def _runner(self, sreq: ScheduledEpisode, ctx: Any) -> Trajectory:
        from tryloop.eval.scheduled import hooks

        s, req = self._runs[sreq.id]
        h = dataclasses.replace(hooks(ctx), capacity=_ExecutionOnly(ctx.capacity))
        return await run_episode(req, _ClientPolicy(s.turns), self.envs, limits=self.limits, spec=self.spec,
                                 hooks=h)

    async def run(self, s: Session, req: EpisodeRequest) -> Trajectory:
        """Session `s`'s episode, run by the scheduler (under the session's id: a client's
        episode_id need not be unique); cancelled with the calling task."""
        sched = self.scheduler
        self._runs[s.id] = (s, req)
        try:
            await sched.submit(ScheduledEpisode(s.id, s.task.id))
            outcome = await sched.wait(s.id)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await sched.cancel(s.id)
            raise
        finally:
            self._runs.pop(s.id, None)
            with contextlib.suppress(Exception):
                if sched.outcome(s.id) is not None:
                    sched.forget(s.id)     # the trajectory lives in the store, not in the scheduler
        if not outcome.ok:
            f = outcome.failure
            raise EpisodeFailed(f"{f.kind.value} failure ({f.type}): {f.reason}" if f is not None
                                else f"episode {outcome.state.value}")
        return outcome.result

    # -- sessions ------------------------------------------------------------------------------
    def pick(self, req: p.ResetRequest) -> Task:
        if req.task_id is None:
            return self.tasks[(req.seed or 0) % len(self.tasks)]
        for t in self.tasks:
            if req.task_id in (t.id, t.fingerprint()) or (len(req.task_id) >= 8 and
                                                          t.fingerprint().startswith(req.task_id)):
                return t
        raise p.ProtocolError(p.VALIDATION_ERROR, f"reset.task_id: {req.task_id!r} is not one of the "
                                                  f"{len(self.tasks)} tasks served (GET /metadata lists them)")

    async def open(self, req: p.ResetRequest) -> tuple[Session, dict[str, Any]]:
        task = self.pick(req)
        if self._open >= self.cfg.max_sessions:
            self.metrics.refused.labels("capacity").inc()
            raise p.ProtocolError(p.CAPACITY_REACHED, f"{self._open} sessions open, serve.env.max_sessions is "
                                  f"{self.cfg.max_sessions}: retry later",
                                  active_sessions=self._open, max_sessions=self.cfg.max_sessions)
        s = Session(self, task, req.episode_id or f"serve-{uuid.uuid4().hex[:12]}")
        self.sessions[s.id] = s
        self._open += 1
        self.metrics.open.set(self._open)
        t0 = time.perf_counter()
        try:
            first = await s.start()
        except BaseException:
            await self.close(s, "error")
            raise
        s.touch()       # the client's silence counts from the reply, not from the sandbox's start
        self.metrics.latency.labels("reset").observe(time.perf_counter() - t0)
        return s, first

    def attach(self, s: Session, connection: object) -> object | None:
        """`connection` (a WebSocket) becomes the session's one driver; returns the connection it
        took the session over from (for the caller to close), if another held it. A step that
        connection started runs to its end: its reply is the session's `last`."""
        previous = s.owner if s.owner is not connection else None
        s.owner, s.detached_at = connection, None
        s.touch()
        return previous

    def detach(self, s: Session) -> None:
        """The session's connection went away: it waits disconnect_grace_s for the client."""
        s.owner, s.detached_at = None, time.monotonic()

    def _free(self, s: Session, driver: object | None) -> None:
        """Refuses a driver while another drives `s`: turns of two clients never interleave."""
        if s.owner is not None and s.owner is not driver:
            raise p.ProtocolError(p.SESSION_BUSY, f"session {s.id} is attached to a WebSocket connection: "
                                                  "step over that connection (or reconnect with ?session_id=)")
        if s.busy.locked():
            raise p.ProtocolError(p.SESSION_BUSY, f"session {s.id}: a step is already running; retry once "
                                                  "it has been answered")

    async def step(self, s: Session, action: p.StepAction, driver: object | None = None) -> dict[str, Any]:
        """A step of `s` by `driver` (its WebSocket connection; None: an HTTP request)."""
        self._free(s, driver)
        async with s.busy:
            s.touch()
            t0 = time.perf_counter()
            try:
                return await s.step(action)
            finally:
                s.touch()
                self.metrics.latency.labels("step").observe(time.perf_counter() - t0)

    def get(self, session_id: Any, field: str = "session_id") -> Session:
        """The open session `session_id` names; `field` names where it came from in errors. A missing
        or non-string id is a field error (422), an unknown one UNKNOWN_SESSION (404)."""
        if not isinstance(session_id, str) or not session_id:
            raise p.ProtocolError(p.VALIDATION_ERROR, f"{field}: a session id (a string, the observation's "
                                                      "session_id after reset) is required")
        s = self.sessions.get(session_id)
        if s is None:
            raise p.ProtocolError(p.UNKNOWN_SESSION, f"{field}: no open session {session_id!r} (closed, reaped "
                                                     "or never opened)")
        return s

    def episode_over(self, s: Session) -> None:
        self._open -= 1
        self.metrics.open.set(self._open)

    def judged(self, traj: Trajectory) -> None:
        self.metrics.verify.observe(traj.times.get("verify", 0.0))
        self.metrics.verdicts.labels(str(traj.verdict)).inc()

    async def close(self, s: Session, reason: str) -> None:
        if self.sessions.pop(s.id, None) is None:
            return
        s.closed_reason = reason
        if not s.done:
            s.done = True
            self.episode_over(s)
        # Counted once (the pop above), by how the episode ended when it ended on its own (judged:
        # done; failed: error), whoever closes the session afterwards; else by what cut it short.
        self.metrics.closed.labels(s.ended or reason).inc()
        await s.close()

    # -- reaping -------------------------------------------------------------------------------
    def reap_due(self, now: float) -> list[tuple[Session, str]]:
        due = []
        for s in self.sessions.values():
            if s.busy.locked() or not (s.done or s.turns.waiting):
                continue    # the server's work (a reset, a step, a verification) is bounded by the episode's limits
            if s.detached_at is not None and now - s.detached_at >= self.cfg.disconnect_grace_s:
                due.append((s, "disconnected"))
            elif now - s.last_activity >= self.cfg.idle_timeout_s:
                due.append((s, "idle"))
        return due

    async def _reap_forever(self) -> None:
        period = min(1.0, max(0.05, min(self.cfg.idle_timeout_s, self.cfg.disconnect_grace_s or 1.0) / 4))
        while True:
            await asyncio.sleep(period)
            for s, reason in self.reap_due(time.monotonic()):
                await self.close(s, reason)
