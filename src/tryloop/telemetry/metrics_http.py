"""Serving a run's Prometheus metrics over HTTP while it goes.

One registry per run collects the warm pools' and the scheduler's metrics (and the train run's own
gauges); with `telemetry.metrics_port` set, prometheus_client's HTTP server exposes it at
`http://<metrics_host>:<port>/metrics` for as long as the run lives, so a Prometheus scraper or
`curl` can watch it. Port 0 takes a free port (the one bound is reported).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, start_http_server
from pydantic import Field

from tryloop._model import _Model


class TelemetryConfig(_Model):
    metrics_port: int | None = Field(None, ge=0, le=65535, description="serve the run's Prometheus metrics "
                                     "on this port at /metrics while it runs (0: any free port; null: not served)")
    metrics_host: str = Field("127.0.0.1", description="address the metrics server binds (0.0.0.0: every "
                                                       "interface)")


@dataclass
class MetricsEndpoint:
    registry: CollectorRegistry
    url: str | None = None     # where /metrics is served; None when not served


@contextlib.contextmanager
def serve_metrics(cfg: TelemetryConfig) -> Iterator[MetricsEndpoint]:
    """A fresh registry, served over HTTP inside the block when `cfg.metrics_port` is set."""
    registry = CollectorRegistry()
    if cfg.metrics_port is None:
        yield MetricsEndpoint(registry)
        return
    try:
        server, thread = start_http_server(cfg.metrics_port, addr=cfg.metrics_host, registry=registry)
    except OSError as e:
        from tryloop.errors import ConfigError

        raise ConfigError(f"telemetry.metrics_port: cannot serve metrics on {cfg.metrics_host}:"
                          f"{cfg.metrics_port}: {e}") from None
    host, port = server.server_address[:2]
    try:
        yield MetricsEndpoint(registry, f"http://{host}:{port}/metrics")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
