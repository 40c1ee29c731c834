"""Scheduling episodes: queues, priorities, retries, timeouts, breakers, dedup, journal, admission control.

    from tryloop.scheduler import EpisodeRequest, Scheduler, SchedulerConfig

    async def run(request, ctx):               # the episode, injected
        async with ctx.turn():
            async with ctx.capacity.inference(request.endpoint):
                ...                            # generate
            async with ctx.capacity.execution():
                ...                            # run a tool
        async with ctx.verification():
            ...
        return result

    async with Scheduler(run, SchedulerConfig()) as sched:
        await sched.submit_many(requests)
        async for outcome in sched.results():
            ...

Engines: `LocalEngine` (asyncio, default) and `RayEngine` (`engine: ray`), same API.
Simulation with virtual time: `tryloop.scheduler.sim`.
"""

from tryloop.scheduler.admission import AdmissionController, LoadProbe, LoadSample, MetricsProbe
from tryloop.scheduler.breaker import BreakerState, CircuitBreaker
from tryloop.scheduler.config import (
    AdmissionConfig,
    BreakerConfig,
    CapacityConfig,
    RayConfig,
    RetryConfig,
    SchedulerConfig,
    TimeoutConfig,
)
from tryloop.scheduler.context import EpisodeContext
from tryloop.scheduler.core import (
    JSON_RESULTS,
    QueueFull,
    ResultCodec,
    Scheduler,
    SchedulerClosed,
    SchedulerError,
)
from tryloop.scheduler.engine import Engine, LocalEngine, Runner
from tryloop.scheduler.failures import (
    EndpointOpen,
    EpisodeFailure,
    EpisodeTimeout,
    FailureInfo,
    FailureKind,
    InferenceUnavailable,
    InfrastructureFailure,
    PolicyFailure,
    SandboxFailure,
    TaskFailure,
    TaskQuarantined,
    TurnTimeout,
    UnclassifiedFailure,
    VerificationTimeout,
    VerifierFailure,
    WorkerLost,
    classify,
)
from tryloop.scheduler.journal import JournalError
from tryloop.scheduler.request import (
    EpisodeOutcome,
    EpisodeRequest,
    EpisodeState,
    EpisodeStatus,
    Transition,
)

__all__ = [
    "AdmissionConfig", "AdmissionController", "BreakerConfig", "BreakerState", "CapacityConfig", "CircuitBreaker",
    "EndpointOpen", "Engine", "EpisodeContext", "EpisodeFailure", "EpisodeOutcome", "EpisodeRequest",
    "EpisodeState", "EpisodeStatus", "EpisodeTimeout", "FailureInfo", "FailureKind", "InferenceUnavailable",
    "InfrastructureFailure", "JSON_RESULTS", "JournalError", "LoadProbe", "LoadSample", "LocalEngine", "MetricsProbe",
    "PolicyFailure", "QueueFull", "RayConfig", "ResultCodec", "RetryConfig", "Runner", "SandboxFailure",
    "Scheduler", "SchedulerClosed", "SchedulerConfig", "SchedulerError", "TaskFailure", "TaskQuarantined",
    "TimeoutConfig", "Transition", "TurnTimeout", "UnclassifiedFailure", "VerificationTimeout", "VerifierFailure",
    "WorkerLost", "classify",
]
