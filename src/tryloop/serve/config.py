"""`serve:` in the YAML file (pydantic only: tryloop.config imports it)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tryloop._model import _Model
from tryloop.agent.config import DEVICE_PATTERN, EpisodeLimits
from tryloop.eval.config import RunId


class ServeEnvConfig(_Model):
    """`serve.env`: the environment server. Every `tryloop serve env` flag sets one of these."""

    host: str = Field("127.0.0.1", description="address to bind (0.0.0.0: every interface)")
    port: int = Field(8000, ge=0, le=65535, description="port to bind (0: any free port, reported at start)")
    split: Literal["train", "eval", "all"] = Field("all", description="which tasks of the store are offered")
    source: str | None = Field(None, description="only tasks of this source (humaneval, mutation, ...)")
    max_sessions: int = Field(64, ge=1, description="episodes open at once; a reset beyond it is refused "
                                                    "(HTTP 503, WebSocket CAPACITY_REACHED)")
    pool_per_task: int = Field(1, ge=0, description="idle sandboxes kept warm per task")
    idle_timeout_s: float = Field(300.0, gt=0, description="an open episode with no message from its client "
                                                           "for this long is closed and its sandbox released")
    disconnect_grace_s: float = Field(30.0, ge=0, description="after a WebSocket client disconnects, its "
                                                              "episode waits this long for it to reconnect "
                                                              "(/ws?session_id=...) before it is closed")
    auth_token_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                                       description="environment variable holding the bearer token every "
                                                   "request but /health must carry; null: no auth")
    max_message_bytes: int = Field(1 << 20, ge=1024, description="largest HTTP body or WebSocket message "
                                                                 "accepted (larger: 413 / close 1009)")
    access_log: str | None = Field("-", description="structured access log, one JSON object per request or "
                                                    "WebSocket event: a file path, '-' for stderr, null: off")
    record: bool = Field(True, description="write each judged episode to the trajectory store "
                                           "(store.trajectories_url) before its done reply")
    run_id: RunId | None = Field(None, description="run id the recorded episodes are filed under; "
                                                   "null: serve-<start time>")
    limits: EpisodeLimits = Field(default_factory=lambda: EpisodeLimits(max_turns=30, wall_time_s=1800.0),
                                  description="per-episode limits: max_turns, wall_time_s (the session's time "
                                              "limit), shell_timeout_s, output_chars")


class ServeModelConfig(_Model):
    """`serve.model`: the local model's OpenAI-compatible server. Every `tryloop serve model` flag sets
    one of these."""

    model: str = Field("smollm2-135m", min_length=1, description="the model: the bundled smollm2-135m, a "
                                                                 "local checkpoint directory or a hub id")
    served_name: str | None = Field(None, min_length=1, description="the name clients ask for (the request's "
                                                                    "`model`); null: the model's name")
    host: str = Field("127.0.0.1", description="address to bind (0.0.0.0: every interface)")
    port: int = Field(8000, ge=0, le=65535, description="port to bind (0: any free port, reported at start)")
    device: str = Field("auto", pattern=DEVICE_PATTERN, description="auto | cpu | cuda | cuda:N")
    dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "float32", description="the engine's dtype; float32 gives the log-probabilities a float32 learner "
                               "recomputes, bfloat16 is faster (auto: bfloat16 where the device has fast bf16)")
    max_batch: int = Field(16, ge=1, description="sequences decoded together (continuous batching)")
    cpu_kernels: bool = Field(True, description="on a CPU: decode steps attend over the KV buffers directly "
                                                "(a C loop built with the host's compiler; without one, torch matmuls for "
                                                "bfloat16 models and transformers' own attention for float32 ones) and "
                                                "bfloat16 models multiply by weights packed once for oneDNN (bit-identical "
                                                "products); 1.65-1.86x faster bf16 decoding, 1.05-1.14x float32, at 1-32 "
                                                "sequences here; false: transformers' own attention and matmuls")
    threads: int | None = Field(None, ge=1, description="torch CPU threads; null: torch's default")
    logprobs_mode: Literal["raw", "processed"] = Field(
        "raw", description="raw: log-probabilities of the policy at temperature 1 (as vLLM's default); "
                           "processed: under the distribution sampled from (temperature, top-p)")
    default_max_tokens: int = Field(512, ge=1, description="tokens sampled when a request sets no max_tokens "
                                                           "(always capped by the context length)")
    max_body_bytes: int = Field(32 << 20, ge=1024, description="largest request body accepted (larger: 413)")
    weight_updates: bool = Field(False, description="accept new weights on POST /v1/weights (a trainer's "
                                                    "push after each update; authenticated like /v1 when "
                                                    "auth_token_env is set); off: 403")
    max_weights_bytes: int = Field(16 << 30, ge=1024, description="largest weights body POST /v1/weights "
                                                                  "accepts (safetensors bytes; larger: 413)")
    auth_token_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                                       description="environment variable holding the API key every /v1 "
                                                   "request must carry as a bearer token; null: no auth")
    access_log: str | None = Field("-", description="structured access log, one JSON object per request: a "
                                                    "file path, '-' for stderr, null: off")


class ServeDashboardConfig(_Model):
    """`serve.dashboard`: the live web page over runs. Every `tryloop dashboard` flag sets one of these
    (or, for --runs-dir, --trajectories and --tasks, the store it reads: store.runs_dir,
    store.trajectories_url, tasks.store_url)."""

    host: str = Field("127.0.0.1", description="address to bind (0.0.0.0: every interface)")
    port: int = Field(8265, ge=0, le=65535, description="port to bind (0: any free port, reported at start)")
    refresh_s: float = Field(2.0, gt=0, le=3600, description="how often the page asks for new data (seconds)")
    auth_token_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                                       description="environment variable holding the bearer token every API "
                                                   "request must carry (the page asks for it once); null: "
                                                   "no auth")
    access_log: str | None = Field(None, description="structured access log, one JSON object per request: a "
                                                     "file path, '-' for stderr, null: off")
    metrics_urls: list[str] = Field(default_factory=list,
                                    description="Prometheus /metrics endpoints shown as live sources (a `tryloop "
                                                "serve env` or `serve model`, a run's telemetry.metrics_port), "
                                                "scraped on every refresh")


class ServeConfig(_Model):
    """`serve:` in the YAML file."""

    env: ServeEnvConfig = Field(default_factory=ServeEnvConfig)
    model: ServeModelConfig = Field(default_factory=ServeModelConfig)
    dashboard: ServeDashboardConfig = Field(default_factory=ServeDashboardConfig)
