"""Simulation mode: the real scheduler, a modelled inference service and modelled sandboxes, on virtual time.

For capacity planning at scales this machine cannot run (e.g. 64 GPUs and
10,000 concurrent episodes): the scheduler, its capacity and admission control
run unchanged on a `VirtualTimeLoop`; only the GPUs and the sandboxes are models.

The inference model, per GPU (continuous batching, as vLLM / SGLang do it):
- decoding advances every sequence of the batch by one token per step, and a
  step takes `decode_base_s + decode_per_seq_s * batch` — so latency grows and
  throughput saturates with batch size;
- a request first prefills the part of its context not in the prefix cache,
  at `prefill_s_per_token`, and decoding pauses meanwhile;
- the KV cache holds `kv_tokens` tokens: running sequences first, then the
  contexts of idle episodes (least recently used evicted first). An episode
  whose context was evicted re-prefills all of it on its next turn; requests
  that do not fit wait;
- episodes stick to one GPU (prefix-cache-aware routing).
The sandbox model: `sandbox_slots` CPU slots (the scheduler's execution
capacity); provisioning, each tool call and the verifier hold a slot for a
lognormally distributed time.
The learner model (`simulate_training`): a training run of steps, each consuming a fixed number
of episodes, then updating for a modelled time and pushing weights, which stops every GPU for
the push and empties its prefix cache; synchronous (the next step's episodes start after the
push) or overlapped (they sample during the update, within a staleness bound; `LearnerConfig`).

    report = simulate(SimConfig(gpus=64, episodes=10_000), AdmissionConfig(adaptive=True))
    both = compare_training(SimConfig(gpus=64), LearnerConfig(update_s=120), AdmissionConfig())
"""

from __future__ import annotations

import asyncio
import heapq
import math
import random
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from tryloop._model import _Model
from tryloop.scheduler.admission import LoadSample
from tryloop.scheduler.config import (
    AdmissionConfig,
    BreakerConfig,
    CapacityConfig,
    RetryConfig,
    SchedulerConfig,
    TimeoutConfig,
)
from tryloop.scheduler.context import EpisodeContext
from tryloop.scheduler.core import Scheduler
from tryloop.scheduler.request import EpisodeRequest, EpisodeState
from tryloop.scheduler.vclock import run_virtual
from tryloop.telemetry.stats import nearest_rank
from tryloop.train.staleness import VersionGate


class SimConfig(_Model):
    """The modelled world: GPUs, sandboxes, and what an episode does."""

    gpus: int = Field(64, ge=1, description="GPUs behind the inference endpoint, one model replica each")
    decode_base_s: float = Field(0.012, gt=0, description="time of one decode step at batch size 1")
    decode_per_seq_s: float = Field(0.00015, ge=0, description="added to a decode step per sequence in the batch")
    prefill_s_per_token: float = Field(0.00004, ge=0, description="prefill time per uncached context token "
                                                                  "(decoding on that GPU pauses meanwhile)")
    kv_tokens: int = Field(400_000, ge=1, description="KV-cache capacity per GPU, in tokens")
    max_batch: int = Field(256, ge=1, description="sequences decoded together per GPU at most")
    sandbox_slots: int = Field(1024, ge=1, description="CPU slots for tools, provisioning and verification")
    episodes: int = Field(10_000, ge=1, description="episodes submitted at once")
    turns: tuple[int, int] = Field((4, 12), description="turns per episode, uniform in [lo, hi]")
    prompt_tokens: int = Field(2000, ge=1, description="context before the first turn")
    gen_tokens: float = Field(400, gt=0, description="mean tokens generated per turn (lognormal, sigma `gen_sigma`)")
    gen_sigma: float = Field(0.5, ge=0, description="spread of the tokens generated per turn (0: always `gen_tokens`, "
                                                    "as when every generation runs to max_new_tokens)")
    tool_output_tokens: float = Field(600, ge=0, description="mean tokens of tool output added per turn (lognormal)")
    tool_cpu_s: float = Field(2.0, gt=0, description="mean CPU seconds of one tool call (lognormal, sigma 0.8)")
    provision_s: float = Field(1.0, ge=0, description="CPU seconds to provision a sandbox (from a warm pool)")
    verify_cpu_s: float = Field(15.0, ge=0, description="mean CPU seconds of the verifier (lognormal, sigma 0.5)")
    seed: int = Field(0, description="seeds every draw; runs with the same config are identical")


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    # Parameterised by the mean, not the median: mean = exp(mu + sigma^2 / 2).
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


# ---- the inference model --------------------------------------------------------------------

@dataclass(eq=False)
class _Seq:
    episode: str
    kv: int                      # tokens it holds in KV while running (context + generation)
    prefill_s: float
    gen: int
    done: asyncio.Future[None]
    target: float = 0.0          # value of the GPU's per-sequence progress counter at which it finishes
    version: int = 0             # weights version of its first token (set when it starts decoding)


@dataclass(eq=False)
class _Gpu:
    index: int
    cfg: SimConfig
    loop: asyncio.AbstractEventLoop
    progress: float = 0.0        # tokens each running sequence has produced since the GPU started
    at: float = 0.0              # time `progress` and the integrals were last brought up to date
    running: list[tuple[float, int, _Seq]] = field(default_factory=list)   # heap by target
    prefilling: deque[_Seq] = field(default_factory=deque)
    prefill_left: float = 0.0    # seconds of the head prefill still to do
    waiting: deque[_Seq] = field(default_factory=deque)
    kv_running: int = 0
    cache: OrderedDict[str, int] = field(default_factory=OrderedDict)   # idle episode -> cached tokens
    kv_cached: int = 0
    episodes: int = 0            # episodes routed here (for routing)
    busy_s: float = 0.0
    prefill_s: float = 0.0
    recompute_s: float = 0.0     # prefill of context that had been cached and was evicted
    tokens: float = 0.0
    timer: asyncio.TimerHandle | None = None
    counter: int = 0
    version: int = 0             # weights version loaded (or being loaded: nothing decodes before paused_until)
    paused_until: float = 0.0    # a weight push: no prefill, no decoding before this
    paused_s: float = 0.0

    def step_s(self) -> float:
        return self.cfg.decode_base_s + self.cfg.decode_per_seq_s * len(self.running)

    def catch_up(self, now: float) -> None:
        dt = now - max(self.at, self.paused_until)     # a pause makes no progress
        if dt <= 0:
            return
        if self.prefilling:
            used = min(dt, self.prefill_left)
            self.prefill_left -= used
            self.busy_s += used
            self.prefill_s += used
        elif self.running:
            step = self.step_s()
            self.progress += dt / step
            self.busy_s += dt
            self.tokens += len(self.running) * dt / step
        self.at = now

    def submit(self, seq: _Seq) -> None:
        self.catch_up(self.loop.time())
        self.waiting.append(seq)
        self._admit()
        self._schedule()

    def _admit(self) -> None:
        cap = self.cfg.kv_tokens
        while self.waiting:
            seq = self.waiting[0]
            if len(self.running) + len(self.prefilling) >= self.cfg.max_batch:
                return
            while self.kv_running + self.kv_cached + seq.kv > cap and self.cache:
                _, tokens = self.cache.popitem(last=False)       # evict the least recently used context
                self.kv_cached -= tokens
            if self.kv_running + seq.kv > cap and (self.running or self.prefilling):
                return
            self.waiting.popleft()
            self.kv_running += seq.kv
            if not self.prefilling:
                self.prefill_left = seq.prefill_s
            self.prefilling.append(seq)

    def pause(self, seconds: float, version: int) -> None:
        """A weight push: the GPU stops for `seconds` (sequences in flight keep their KV and resume
        after it, their later tokens from the new weights); the prefix cache is emptied, since its
        KV was computed with the old weights, so an idle episode's next turn prefills everything."""
        now = self.loop.time()
        self.catch_up(now)
        self.paused_until = now + seconds
        self.paused_s += seconds
        self.version = version     # every token decoded from now on comes after the push
        self.cache.clear()
        self.kv_cached = 0
        self._schedule()

    def _schedule(self) -> None:
        now = max(self.loop.time(), self.paused_until)
        if self.prefilling:
            at = now + self.prefill_left
        elif self.running:
            at = now + max(0.0, self.running[0][0] - self.progress) * self.step_s()
        else:
            return
        if self.timer is not None:
            if self.timer.when() <= at:
                return          # an earlier wake-up is pending; it catches up and reschedules
            self.timer.cancel()
        self.timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        self.catch_up(self.loop.time())
        if self.prefilling and self.prefill_left <= 1e-12:
            seq = self.prefilling.popleft()
            seq.target = self.progress + seq.gen
            seq.version = self.version
            self.counter += 1
            heapq.heappush(self.running, (seq.target, self.counter, seq))
            if self.prefilling:
                self.prefill_left = self.prefilling[0].prefill_s
        while self.running and self.running[0][0] <= self.progress + 1e-9:
            _, _, seq = heapq.heappop(self.running)
            self.kv_running -= seq.kv
            self.cache[seq.episode] = seq.kv                 # its context stays cached while the episode is idle
            self.cache.move_to_end(seq.episode)
            self.kv_cached += seq.kv
            if not seq.done.done():
                seq.done.set_result(None)
        self._admit()
        self._schedule()

    def forget(self, episode: str) -> None:
        tokens = self.cache.pop(episode, None)
        if tokens is not None:
            self.kv_cached -= tokens


class ModelledInference:
    """N GPUs behind one endpoint; `generate` returns when the modelled generation finishes."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self._gpus: list[_Gpu] = []
        self._route: dict[str, _Gpu] = {}
        self._started = 0.0
        self.requests = 0
        self.recompute_tokens = 0

    def _ensure(self) -> None:
        if not self._gpus:
            loop = asyncio.get_running_loop()
            self._started = loop.time()
            self._gpus = [_Gpu(i, self.cfg, loop, at=self._started) for i in range(self.cfg.gpus)]

    async def generate(self, episode: str, context_tokens: int, new_tokens: int, gen_tokens: int) -> int:
        """Generate `gen_tokens` after a context of `context_tokens`, of which the last `new_tokens`
        were added since the episode's previous request (the rest may be in the prefix cache).
        Returns the weights version of the first generated token (the oldest of the generation)."""
        self._ensure()
        gpu = self._route.get(episode)
        if gpu is None:
            gpu = min(self._gpus, key=lambda g: g.episodes)
            gpu.episodes += 1
            self._route[episode] = gpu
        cached = gpu.cache.pop(episode, None)
        if cached is not None:
            gpu.kv_cached -= cached
            uncached = new_tokens
        else:
            uncached = context_tokens
            if context_tokens > new_tokens:
                self.recompute_tokens += context_tokens - new_tokens
                gpu.recompute_s += (context_tokens - new_tokens) * self.cfg.prefill_s_per_token
        fut = asyncio.get_running_loop().create_future()
        seq = _Seq(episode, context_tokens + gen_tokens, uncached * self.cfg.prefill_s_per_token, gen_tokens, fut)
        self.requests += 1
        gpu.submit(seq)
        try:
            await fut
        finally:
            if not fut.done():        # cancelled: drop it wherever it is
                gpu.catch_up(gpu.loop.time())
                _drop(gpu, seq)
        return seq.version

    def push(self, seconds: float, version: int) -> None:
        """Load weights `version` on every GPU: each pauses for `seconds` (see `_Gpu.pause`)."""
        self._ensure()
        for g in self._gpus:
            g.pause(seconds, version)

    def end_episode(self, episode: str) -> None:
        gpu = self._route.pop(episode, None)
        if gpu is not None:
            gpu.forget(episode)
            gpu.episodes -= 1

    def load(self) -> LoadSample:
        self._ensure()
        cap = self.cfg.kv_tokens * len(self._gpus)
        return LoadSample(kv_usage=sum(g.kv_running for g in self._gpus) / cap,
                          queue_depth=sum(len(g.waiting) for g in self._gpus),
                          running=sum(len(g.running) + len(g.prefilling) for g in self._gpus))

    def report(self, now: float) -> dict[str, float]:
        self._ensure()
        span = now - self._started
        for g in self._gpus:
            g.catch_up(now)
        n = len(self._gpus)
        busy = sum(g.busy_s for g in self._gpus)
        peak_step = self.cfg.decode_base_s + self.cfg.decode_per_seq_s * self.cfg.max_batch
        peak_tps = self.cfg.max_batch / peak_step * n
        tokens = sum(g.tokens for g in self._gpus)
        return {
            "gpu_idle_share": round(1 - busy / (span * n), 4) if span > 0 else 0.0,
            "gpu_paused_share": round(sum(g.paused_s for g in self._gpus) / (span * n), 4) if span > 0 else 0.0,
            "gpu_prefill_share": round(sum(g.prefill_s for g in self._gpus) / (span * n), 4) if span > 0 else 0.0,
            "gpu_recompute_share": round(sum(g.recompute_s for g in self._gpus) / (span * n), 4) if span > 0 else 0.0,
            "decode_tokens_per_s": round(tokens / span, 1) if span > 0 else 0.0,
            "decode_share_of_peak": round(tokens / span / peak_tps, 4) if span > 0 else 0.0,
            "requests": self.requests,
        }


def _drop(gpu: _Gpu, seq: _Seq) -> None:
    if seq in gpu.waiting:
        gpu.waiting.remove(seq)
        return
    if seq in gpu.prefilling:
        head = gpu.prefilling[0] is seq
        gpu.prefilling.remove(seq)
        gpu.kv_running -= seq.kv
        if head:
            gpu.prefill_left = gpu.prefilling[0].prefill_s if gpu.prefilling else 0.0
    else:
        for i, (_, _, s) in enumerate(gpu.running):
            if s is seq:
                gpu.running.pop(i)
                heapq.heapify(gpu.running)
                gpu.kv_running -= seq.kv
                break
    gpu._admit()
    gpu._schedule()


class FixedLatencyInference:
    """A scripted policy server: every generation takes `latency_s` (no batching model)."""

    def __init__(self, latency_s: float):
        self.latency_s = latency_s
        self.requests = 0

    async def generate(self, episode: str, context_tokens: int, new_tokens: int, gen_tokens: int) -> int:
        self.requests += 1
        await asyncio.sleep(self.latency_s)
        return 0

    def end_episode(self, episode: str) -> None:
        pass


class SimProbe:
    """The modelled service's load, as a `LoadProbe` (what scraping vLLM's /metrics would give)."""

    def __init__(self, service: ModelledInference):
        self._service = service

    async def sample(self) -> LoadSample:
        return self._service.load()


# ---- the modelled episode -------------------------------------------------------------------

class ModelledEpisode:
    """A scripted policy in a modelled environment: the runner used by simulation and benchmarks.

    Turns, token counts and CPU costs are drawn from `cfg` with a seed derived from the episode
    id, so a rerun of an episode does the same work. Sleeps stand in for the work; on a
    `VirtualTimeLoop` they cost no real time. Picklable (for the Ray engine) as long as
    `inference` is.
    """

    def __init__(self, cfg: SimConfig, inference: ModelledInference | FixedLatencyInference):
        self.cfg = cfg
        self.inference = inference

    async def __call__(self, request: EpisodeRequest, ctx: EpisodeContext) -> dict[str, Any]:
        cfg = self.cfg
        rng = random.Random(f"{cfg.seed}:{request.id}")
        turns = rng.randint(*cfg.turns)
        async with ctx.capacity.execution():
            await asyncio.sleep(cfg.provision_s)
        ctx.stage(EpisodeState.RUNNING)
        context, new = cfg.prompt_tokens, cfg.prompt_tokens
        generated = 0
        oldest: int | None = None       # weights version of the episode's oldest token
        try:
            for _ in range(turns):
                async with ctx.turn():
                    gen = max(1, round(_lognormal(rng, cfg.gen_tokens, cfg.gen_sigma)))
                    async with ctx.capacity.inference(request.endpoint):
                        version = await self.inference.generate(request.id, context, new, gen)
                    oldest = version if oldest is None else min(oldest, version)
                    generated += gen
                    async with ctx.capacity.execution():
                        await asyncio.sleep(_lognormal(rng, cfg.tool_cpu_s, 0.8))
                    new = gen + (round(_lognormal(rng, cfg.tool_output_tokens, 0.5)) if cfg.tool_output_tokens else 0)
                    context += new
            async with ctx.verification(), ctx.capacity.execution():
                await asyncio.sleep(_lognormal(rng, cfg.verify_cpu_s, 0.5) if cfg.verify_cpu_s else 0)
        finally:
            self.inference.end_episode(request.id)
        return {"turns": turns, "generated_tokens": generated, "weights_version": oldest}


# ---- running a simulation ---------------------------------------------------------------------

def sim_scheduler_config(cfg: SimConfig, admission: AdmissionConfig) -> SchedulerConfig:
    """A scheduler config fitted to the modelled world: one host with `sandbox_slots` slots,
    inference permits that never bind before the GPUs do, no retries needed."""
    return SchedulerConfig(
        max_queued=max(cfg.episodes, 1),
        local_hosts={"sim": cfg.sandbox_slots},
        capacity=CapacityConfig(inference_per_endpoint=cfg.gpus * cfg.max_batch * 4),
        timeouts=TimeoutConfig(turn_s=None, episode_s=None, verification_s=None, inference_s=None),
        retry=RetryConfig(max_retries=0, verifier_retries=0),
        breakers=BreakerConfig(),
        admission=admission,
        seed=cfg.seed,
    )


async def _simulate(cfg: SimConfig, admission: AdmissionConfig) -> dict[str, Any]:
    service = ModelledInference(cfg)
    sched = Scheduler(ModelledEpisode(cfg, service), sim_scheduler_config(cfg, admission),
                      probes={"default": SimProbe(service)})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    peak = 0
    limits: list[int] = []
    window: dict[str, float] = {}

    def shares(now: float) -> dict[str, float]:
        gpu = service.report(now)
        busy = sched.engine.capacity_snapshot()["execution"]["sim"]["busy_share"]
        return {"gpu_idle_share": gpu["gpu_idle_share"], "gpu_recompute_share": gpu["gpu_recompute_share"],
                "gpu_unproductive_share": round(gpu["gpu_idle_share"] + gpu["gpu_recompute_share"], 4),
                "sandbox_idle_share": round(1 - busy, 4)}

    async def watch() -> None:
        nonlocal peak
        while True:
            await asyncio.sleep(1.0)
            peak = max(peak, sched.in_flight)
            limits.append(sched.admission.limit)
            if not window and sched.open <= cfg.episodes // 10:
                # The drain at the end of a finite batch idles everything whatever the policy;
                # shares up to 90% done describe the steady state.
                window.update(at_s=round(loop.time() - t0, 1), **shares(loop.time()))

    async with sched:
        await sched.submit_many(EpisodeRequest(f"ep-{i}", f"task-{i % 500}", sample_index=i)
                                for i in range(cfg.episodes))
        watcher = asyncio.create_task(watch())
        await sched.drain()
        watcher.cancel()
        now = loop.time()
        summary = sched.summary()
    makespan = now - t0
    reg = sched.metrics.registry
    calls = reg.get_sample_value("tryloop_scheduler_inference_seconds_count", {"endpoint": "default"}) or 0
    latency = (reg.get_sample_value("tryloop_scheduler_inference_seconds_sum", {"endpoint": "default"}) or 0) / max(calls, 1)
    episode_s = summary["stage_seconds"].get("running", {})
    return {
        "adaptive": admission.adaptive,
        "initial_limit": admission.initial,
        "makespan_s": round(makespan, 1),
        "episodes_done": summary["finished"].get("done", 0),
        "episodes_per_hour": round(cfg.episodes / makespan * 3600, 1) if makespan > 0 else 0.0,
        **service.report(now),
        **shares(now),
        "until_90pct_done": window,
        "peak_concurrent_episodes": peak,
        "admission_limit": {"min": min(limits, default=admission.initial), "max": max(limits, default=admission.initial),
                            "final": sched.admission.limit, "changes": summary["admission"]["changes"]},
        "inference_latency_mean_s": round(latency, 3),
        "episode_running_s_p50": episode_s.get("p50"),
        "queued_s_p50": summary["stage_seconds"].get("queued", {}).get("p50"),
    }


def simulate(cfg: SimConfig, admission: AdmissionConfig) -> dict[str, Any]:
    """Run one simulation on virtual time; returns GPU and sandbox idle shares, throughput,
    and how admission behaved, plus the real seconds the simulation took."""
    t = time.perf_counter()
    out = run_virtual(_simulate(cfg, admission))
    out["wall_s"] = round(time.perf_counter() - t, 2)
    return out


# ---- the learner: a training run, synchronous or overlapped -----------------------------------

class LearnerConfig(_Model):
    """A training run on the modelled world: what each step consumes and what its update and push cost.

    Staleness as `tryloop train` counts it: the initial weights are version 0, step s's push makes
    version s + 1, step s trains from version s, and an episode's staleness is s minus the version of
    its oldest token. Overlapped, an episode more than `max_staleness` behind is dropped when it comes
    back and sampled again, after the rest of its round, once the step's weights (version
    s - max_staleness) are out.

    Where it differs from `tryloop train`: `ahead` above 1 (the real loop starts one step's rollout
    at a time); the push stops every GPU for `push_s`, as reloading weights into vLLM or SGLang does,
    while tryloop's own engine takes new weights between two decode steps and keeps sampling during
    the rest of a push; no curriculum, refills, evaluations or resume; every episode succeeds.
    """

    steps: int = Field(8, ge=1, description="training steps")
    tasks_per_step: int = Field(8, ge=1)
    group_size: int = Field(8, ge=1, description="episodes per task; a step consumes tasks_per_step * group_size")
    update_s: float = Field(30.0, ge=0, description="time of one update (forward, backward, optimizer step)")
    update_s_per_token: float = Field(0.0, ge=0, description="added to the update per generated token it trains on")
    update_s_by_step: tuple[float, ...] = Field((), description="measured update times, replayed step by step "
                                                                "(cycled); replace update_s and update_s_per_token")
    push_s: float = Field(5.0, ge=0, description="weight push: every sampling GPU stops this long, and its prefix "
                                                 "cache is emptied")
    checkpoint_s: float = Field(0.0, ge=0, description="learner time after the push before the next step "
                                                       "(checkpoint, metrics)")
    overlap: bool = Field(False, description="sample the next steps' episodes while this step updates")
    max_staleness: int = Field(1, ge=0, description="overlapped: versions an episode may be behind its step")
    ahead: int = Field(1, ge=1, description="overlapped: steps whose rollout runs while this one updates "
                                            "(tryloop train: 1, so staleness never exceeds 1)")

    @property
    def episodes_per_step(self) -> int:
        return self.tasks_per_step * self.group_size

    def update_time(self, step: int, tokens: int) -> float:
        if self.update_s_by_step:
            return self.update_s_by_step[step % len(self.update_s_by_step)]
        return self.update_s + self.update_s_per_token * tokens


def _pct(xs: list[float], q: float) -> float | None:
    # Nearest rank, as `tryloop bench train` takes it from the real run.
    return round(nearest_rank(xs, q * 100), 3) if xs else None


async def _train(cfg: SimConfig, learner: LearnerConfig, admission: AdmissionConfig) -> dict[str, Any]:
    service = ModelledInference(cfg)
    per_step = learner.episodes_per_step
    in_flight_steps = 1 + (learner.ahead if learner.overlap else 0)
    sched_cfg = sim_scheduler_config(cfg, admission).model_copy(update={"max_queued": per_step * in_flight_steps})
    sched = Scheduler(ModelledEpisode(cfg, service), sched_cfg, probes={"default": SimProbe(service)})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    gate = VersionGate(learner.max_staleness)   # tryloop train's rule, pushes as the learner makes them
    consumed: set[tuple[int, int]] = set()     # (step, episode of the step) trained on
    staleness: dict[int, int] = {}
    dropped = 0
    runs = 0

    async def collect(step: int) -> tuple[list[dict[str, Any]], float]:
        """The step's episodes, in rounds as tryloop train runs them: the whole round comes back,
        then the too-stale ones are sampled again once the step's weights are out."""
        nonlocal dropped, runs
        started = loop.time()
        todo = list(range(per_step))
        out: list[dict[str, Any]] = []
        attempt = 0
        while todo:
            # A resampled episode gets an id of its own (the scheduler runs an id once), so it
            # also draws other work: a new sample of the same task.
            ids = {i: f"s{step}-e{i}-r{attempt}" for i in todo}
            await sched.submit_many(EpisodeRequest(ids[i], f"task-{step}-{i // learner.group_size}") for i in todo)
            runs += len(todo)
            again = []
            for i in todo:
                o = await sched.wait(ids[i])
                sched.forget(ids[i])
                if not o.ok:
                    raise RuntimeError(f"simulated episode {ids[i]} ended {o.state}: {o.failure}")
                st = step - o.result["weights_version"]
                if learner.overlap and not gate.accepts(st):
                    dropped += 1          # never trained on; sampled again below
                    again.append(i)
                    continue
                if not learner.overlap and st != 0:
                    raise RuntimeError(f"synchronous episode {ids[i]} is {st} versions behind: a simulator bug")
                if (step, i) in consumed:
                    raise RuntimeError(f"episode {ids[i]} consumed twice: a simulator bug")
                consumed.add((step, i))
                staleness[st] = staleness.get(st, 0) + 1
                out.append(o.result)
            if again:     # once this step's weights are out, nothing sampled after is stale
                await gate.settled(step)
            todo, attempt = again, attempt + 1
        return out, loop.time() - started

    ends: list[float] = []
    waits: list[float] = []
    updates: list[float] = []
    rollouts: list[float] = []
    pending: dict[int, asyncio.Task[tuple[list[dict[str, Any]], float]]] = {}
    limits: list[int] = []

    async def watch() -> None:
        while True:
            await asyncio.sleep(1.0)
            if sched.in_flight:
                limits.append(sched.admission.limit)

    async with sched:
        watcher = asyncio.create_task(watch())
        for step in range(learner.steps):
            t_step = loop.time()
            task = pending.pop(step, None)
            episodes, rollout_s = await task if task is not None else await collect(step)
            waits.append(loop.time() - t_step)
            rollouts.append(rollout_s)
            if learner.overlap:     # the next steps sample while this one updates
                for nxt in range(step + 1, min(step + 1 + learner.ahead, learner.steps)):
                    if nxt not in pending:
                        pending[nxt] = asyncio.create_task(collect(nxt))
                await asyncio.sleep(0)    # let them submit their episodes before the update
            update_s = learner.update_time(step, sum(e["generated_tokens"] for e in episodes))
            updates.append(update_s)
            await asyncio.sleep(update_s)
            # The push: every GPU stops while it loads version step + 1; episodes in flight resume
            # after it, and whatever they decode from then on is of the new weights.
            service.push(learner.push_s, step + 1)
            await asyncio.sleep(learner.push_s)
            gate.push(step + 1)
            await asyncio.sleep(learner.checkpoint_s)
            ends.append(loop.time())
        watcher.cancel()
        now = loop.time()
        admission_changes = sched.summary()["admission"]["changes"]
    makespan = now - t0
    gpu = service.report(now)
    intervals = [b - a for a, b in zip(ends, ends[1:], strict=False)]   # step 0 has nothing to overlap with
    hist = dict(sorted(staleness.items()))
    n = sum(hist.values())
    return {
        "mode": "overlapped" if learner.overlap else "synchronous",
        "max_staleness": learner.max_staleness if learner.overlap else 0,
        "ahead": learner.ahead if learner.overlap else 0,
        "steps": learner.steps,
        "episodes_per_step": per_step,
        "makespan_s": round(makespan, 1),
        "step_interval_s": {"p50": _pct(intervals, 0.5), "p90": _pct(intervals, 0.9),
                            "mean": round(sum(intervals) / len(intervals), 3) if intervals else None},
        "learner_wait_s": {"p50": _pct(waits[1:], 0.5), "p90": _pct(waits[1:], 0.9)},
        "learner_idle_share": round(sum(waits) / makespan, 4) if makespan > 0 else 0.0,
        "rollout_wall_s": {"p50": _pct(rollouts[1:], 0.5), "p90": _pct(rollouts[1:], 0.9),
                           "mean": round(sum(rollouts[1:]) / len(rollouts[1:]), 3) if rollouts[1:] else None},
        "update_s_mean": round(sum(updates) / len(updates), 3),
        "gpu_busy_share": round(1 - gpu["gpu_idle_share"], 4),
        "gpu_paused_share": gpu["gpu_paused_share"],
        "gpu_recompute_share": gpu["gpu_recompute_share"],
        "decode_share_of_peak": gpu["decode_share_of_peak"],
        "staleness": {"histogram": {str(k): v for k, v in hist.items()}, "max": max(hist, default=0),
                      "mean": round(sum(k * v for k, v in hist.items()) / n, 4) if n else 0.0},
        "stale_dropped": dropped,
        "admission_limit": {"min": min(limits, default=admission.initial), "max": max(limits, default=admission.initial),
                            "mean": round(sum(limits) / len(limits), 1) if limits else admission.initial,
                            "changes": admission_changes},
        "episodes_consumed": len(consumed),
        "episodes_run": runs,
    }


def simulate_training(cfg: SimConfig, learner: LearnerConfig, admission: AdmissionConfig) -> dict[str, Any]:
    """Run one training run on virtual time: the learner's steps (update, then a push that pauses
    every GPU) against the modelled GPUs and sandboxes, synchronous or overlapped per `learner`.
    Returns makespan, step intervals, the learner's wait, GPU shares and staleness."""
    t = time.perf_counter()
    out = run_virtual(_train(cfg, learner, admission))
    out["wall_s"] = round(time.perf_counter() - t, 2)
    return out


def compare_training(cfg: SimConfig, learner: LearnerConfig, admission: AdmissionConfig) -> dict[str, Any]:
    """The same workload and seed, synchronous and overlapped (with `learner`'s staleness bound),
    side by side; `speedup` is the synchronous makespan over the overlapped one."""
    sync = simulate_training(cfg, learner.model_copy(update={"overlap": False}), admission)
    over = simulate_training(cfg, learner.model_copy(update={"overlap": True}), admission)
    p50 = sync["step_interval_s"]["p50"], over["step_interval_s"]["p50"]
    return {"synchronous": sync, "overlapped": over,
            "ratios": {"makespan": round(over["makespan_s"] / sync["makespan_s"], 4),
                       "step_interval_p50": round(p50[1] / p50[0], 4) if p50[0] and p50[1] else None,
                       "speedup": round(sync["makespan_s"] / over["makespan_s"], 4)}}
