"""The Ray engine: sandbox hosts as Ray actors, episodes placed on them by resources, results streamed back.

One `RolloutWorker` actor per eligible node (a node with a CPU, or with the
custom resource `ray.host_resource`), pinned there with a hard node-affinity.
The worker owns that node's execution slots (its CPUs, or
`capacity.execution_slots`) and a share of each endpoint's inference permits
(the endpoint's limit divided by the number of workers at creation), and runs
the injected runner exactly as the local engine does, with the same
`EpisodeContext`.

The scheduler itself stays in the driver: queue, dedup, retries, breakers,
admission and the journal are the local ones. An attempt is one streaming
actor call; the worker yields stage changes and capacity observations as they
happen and the result (or a typed failure) last. When a node dies, the calls
on its worker fail with Ray's actor-death errors, which classify as
`WorkerLost` (infrastructure: retried elsewhere after backoff) — and since a
dead actor returns nothing, an episode is never counted twice. New nodes get a
worker within `ray.reconcile_s`.

The runner is sent to each worker with Ray's pickling (cloudpickle), so it
must be picklable; state it builds lazily (a sandbox runtime, an HTTP client)
is built on the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tryloop.scheduler.capacity import SharedCapacity
from tryloop.scheduler.config import TimeoutConfig
from tryloop.scheduler.context import EpisodeContext
from tryloop.scheduler.engine import Attempt, EngineEnv, Runner
from tryloop.scheduler.failures import EpisodeFailure, FailureInfo, WorkerLost, classify
from tryloop.scheduler.request import EpisodeRequest, EpisodeState

# How often a worker flushes capacity observations of a long, quiet episode back to the driver.
_FLUSH_S = 1.0


class _Buffer:
    """Worker-side `CapacityObserver`: keeps observations until an episode's stream carries them."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, ...]] = []

    def on_inference(self, endpoint: str, latency_s: float, wait_s: float, healthy: bool | None) -> None:
        self.items.append(("inference", endpoint, latency_s, wait_s, healthy))

    def on_execution(self, host: str, busy_s: float, wait_s: float) -> None:
        self.items.append(("execution", host, busy_s, wait_s))

    def take(self) -> list[tuple[Any, ...]]:
        items, self.items = self.items, []
        return items


class RolloutWorker:
    """Runs episodes on one sandbox host. Created by `RayEngine` as a Ray actor (not used directly)."""

    def __init__(self, runner: Runner[Any], host: str, slots: int, inference_limits: dict[str, int],
                 default_inference_limit: int, inference_timeout_s: float | None):
        self._runner = runner
        self._host = host
        self._buffer = _Buffer()
        self._slots = slots
        self._limits = inference_limits
        self._default_limit = default_inference_limit
        self._inference_timeout_s = inference_timeout_s
        self._capacity: SharedCapacity | None = None
        self._tasks: dict[tuple[str, int], asyncio.Task[Any]] = {}

    def _shared(self) -> SharedCapacity:
        # Built on first use, inside the actor's event loop.
        if self._capacity is None:
            loop = asyncio.get_running_loop()
            self._capacity = SharedCapacity(
                inference_limit=lambda e: self._limits.get(e, self._default_limit),
                execution_slots={self._host: self._slots}, clock=loop.time, observer=self._buffer,
                inference_timeout_s=self._inference_timeout_s)
        return self._capacity

    def info(self) -> dict[str, Any]:
        import os

        import ray

        return {"host": self._host, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "slots": self._slots}

    def cancel(self, episode_id: str, attempt: int) -> bool:
        task = self._tasks.get((episode_id, attempt))
        if task is None:
            return False
        task.cancel()
        return True

    async def run(self, request: dict[str, Any], attempt: int, timeouts: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        shared = self._shared()
        loop = asyncio.get_running_loop()
        req = EpisodeRequest.from_dict(request)
        tcfg = TimeoutConfig.model_validate(timeouts)
        stages: asyncio.Queue[EpisodeState] = asyncio.Queue()
        ctx: EpisodeContext | None = None

        def on_running() -> None:
            if ctx is not None:
                ctx.stage(EpisodeState.RUNNING)

        ctx = EpisodeContext(req, attempt, self._host, shared.bind(self._host, on_running), tcfg,
                             None if tcfg.episode_s is None else loop.time() + tcfg.episode_s, stages.put_nowait,
                             loop.time)
        key = (req.id, attempt)
        task = asyncio.ensure_future(self._runner(req, ctx))
        self._tasks[key] = task
        try:
            while not task.done():
                getter = asyncio.ensure_future(stages.get())
                await asyncio.wait({task, getter}, timeout=_FLUSH_S, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield {"stage": getter.result().value, "obs": self._buffer.take()}
                else:
                    getter.cancel()
                    obs = self._buffer.take()
                    if obs:
                        yield {"obs": obs}
            while not stages.empty():
                yield {"stage": stages.get_nowait().value}
            try:
                result = task.result()
            except asyncio.CancelledError:
                return
            except Exception as exc:
                yield {"failure": classify(exc, host=self._host).info().to_dict(), "obs": self._buffer.take()}
                return
            yield {"result": result, "obs": self._buffer.take()}
        finally:
            self._tasks.pop(key, None)
            if not task.done():
                task.cancel()


@dataclass
class _Host:
    name: str
    node_id: str
    actor: Any
    slots: int
    seated: int = 0
    alive: bool = True
    busy_s: float = 0.0
    since: float = 0.0


class RayEngine:
    """Same API and config as `LocalEngine`; attempts run in `RolloutWorker` actors on Ray nodes."""

    name = "ray"

    def __init__(self) -> None:
        self._env: EngineEnv | None = None
        self._runner: Runner[Any] | None = None
        self._hosts: dict[str, _Host] = {}
        self._dead_nodes: set[str] = set()
        self._worker_cls: Any = None
        self._reconciler: asyncio.Task[None] | None = None
        self._we_started_ray = False
        self.workers_started = 0

    async def start(self, runner: Runner[Any], env: EngineEnv) -> None:
        import ray

        cfg = env.config.ray
        if not ray.is_initialized():
            ray.init(address=cfg.address, namespace=cfg.namespace, log_to_driver=False, include_dashboard=False)
            self._we_started_ray = True
        self._env, self._runner = env, runner
        self._worker_cls = ray.remote(RolloutWorker)
        await self._reconcile()
        self._reconciler = asyncio.create_task(self._reconcile_loop(), name="tryloop-ray-reconcile")

    async def _reconcile_loop(self) -> None:
        assert self._env is not None
        while True:
            await asyncio.sleep(self._env.config.ray.reconcile_s)
            try:
                await self._reconcile()
            except Exception:  # the GCS may be briefly unreachable while a node dies; try again later
                continue

    async def _reconcile(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        assert self._env is not None
        env = self._env
        cfg = env.config
        nodes = await asyncio.to_thread(ray.nodes)
        alive = {n["NodeID"]: n for n in nodes if n.get("Alive")}
        changed = False
        for host in self._hosts.values():
            if host.alive and host.node_id not in alive:
                host.alive = False
                self._dead_nodes.add(host.node_id)
                changed = True
        known = {h.node_id for h in self._hosts.values() if h.alive}
        eligible = [n for nid, n in alive.items() if nid not in known and nid not in self._dead_nodes
                    and self._eligible(n["Resources"])]
        n_hosts = max(1, len(known) + len(eligible))
        for node in eligible:
            nid = node["NodeID"]
            slots = cfg.capacity.execution_slots or max(1, int(node["Resources"].get("CPU", 1)))
            limits = {e: math.ceil(n / n_hosts) for e, n in cfg.capacity.endpoint_limits.items()}
            actor = self._worker_cls.options(
                num_cpus=0, max_restarts=0, max_concurrency=cfg.ray.episodes_per_host + 8,
                namespace=cfg.ray.namespace,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=nid, soft=False),
            ).remote(self._runner, f"ray-{nid[:12]}", slots, limits,
                     math.ceil(cfg.capacity.inference_per_endpoint / n_hosts), cfg.timeouts.inference_s)
            name = f"ray-{nid[:12]}"
            old = self._hosts.get(name)       # a worker that crashed on a live node is replaced
            self._hosts[name] = _Host(name, nid, actor, slots, seated=old.seated if old else 0, since=env.clock())
            self.workers_started += 1
            changed = True
        if changed:
            env.wake()

    def _eligible(self, resources: Mapping[str, float]) -> bool:
        assert self._env is not None
        wanted = self._env.config.ray.host_resource
        return resources.get(wanted, 0) > 0 if wanted else resources.get("CPU", 0) >= 1

    def hosts(self) -> Mapping[str, int]:
        return {h.name: h.slots for h in self._hosts.values() if h.alive}

    def place(self, usable: Callable[[str], bool]) -> str | None:
        assert self._env is not None
        cap = self._env.config.ray.episodes_per_host
        best: _Host | None = None
        for h in self._hosts.values():
            if h.alive and h.seated < cap and usable(h.name) and (
                    best is None or h.seated / h.slots < best.seated / best.slots):
                best = h
        if best is None:
            return None
        best.seated += 1
        return best.name

    def release(self, host: str) -> None:
        self._hosts[host].seated -= 1

    async def run(self, attempt: Attempt) -> Any:
        assert self._env is not None
        host = self._hosts[attempt.host]
        if not host.alive:
            raise WorkerLost(f"worker on node {host.node_id} is gone", host=host.name)
        observer = self._env.observer
        stream = host.actor.run.options(num_returns="streaming").remote(
            attempt.request.to_dict(), attempt.number, attempt.timeouts.model_dump())
        try:
            async for ref in stream:
                event = await ref
                for obs in event.get("obs", ()):
                    if obs[0] == "inference":
                        observer.on_inference(*obs[1:])
                    else:
                        observer.on_execution(*obs[1:])
                        host.busy_s += obs[2]
                if "stage" in event:
                    attempt.on_stage(EpisodeState(event["stage"]))
                if "result" in event:
                    return event["result"]
                if "failure" in event:
                    raise EpisodeFailure.from_info(FailureInfo.from_dict(event["failure"]))
        except asyncio.CancelledError:
            if host.alive:
                host.actor.cancel.remote(attempt.request.id, attempt.number)
            raise
        except EpisodeFailure:
            raise
        except Exception as exc:
            failure = classify(exc, host=host.name)
            if isinstance(failure, WorkerLost):
                host.alive = False          # its actor is dead (max_restarts=0): stop placing work there
                self._env.wake()
            raise failure from exc
        raise WorkerLost(f"worker {host.name} ended the stream without a result", host=host.name)

    def capacity_snapshot(self) -> dict[str, dict[str, dict[str, float]]]:
        now = self._env.clock() if self._env else 0.0
        execution = {}
        for h in self._hosts.values():
            span = max(now - h.since, 1e-9)
            execution[h.name] = {"limit": h.slots, "in_use": h.seated, "waiting": 0, "alive": h.alive,
                                 "busy_share": round(min(1.0, h.busy_s / (span * h.slots)), 4)}
        return {"inference": {}, "execution": execution}

    async def close(self) -> None:
        import ray

        if self._reconciler is not None:
            self._reconciler.cancel()
            await asyncio.gather(self._reconciler, return_exceptions=True)
        for h in self._hosts.values():
            if h.alive:
                with contextlib.suppress(Exception):   # already dead with its node
                    ray.kill(h.actor)
        self._hosts.clear()
        if self._we_started_ray:
            ray.shutdown()
