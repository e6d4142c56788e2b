"""Prometheus metrics of the admin service (`GET /metrics`).

One registry per app (tests build many apps in one process). Labels are
bounded: the route TEMPLATE (`/v1/devices/{device_id}/recommendations`),
never the raw path, so no device id or user handle becomes a label; the
method; the status code.

  fedmask_admin_requests_total{method,route,status}
  fedmask_admin_request_duration_seconds{method,route}      histogram
  fedmask_admin_topk_requests_total{status}                 200, 404, 503, ...
  fedmask_admin_topk_duration_seconds                       histogram, as the admin service sees it
  fedmask_admin_topk_device_latency_seconds                 histogram, as the coordinator reports it
  fedmask_admin_event_streams                               open /v1/events streams
  fedmask_admin_refused_requests_total{reason}              body, busy, time (admin/request_gate.py), streams
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_TOPK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class AdminMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("fedmask_admin_requests", "HTTP requests answered, by route template and status",
                                ("method", "route", "status"), registry=self.registry)
        self.request_seconds = Histogram("fedmask_admin_request_duration_seconds",
                                         "Time to answer an HTTP request (to the first byte of a stream)",
                                         ("method", "route"), registry=self.registry)
        self.topk = Counter("fedmask_admin_topk_requests", "Top-k requests, by the HTTP status answered",
                            ("status",), registry=self.registry)
        self.topk_seconds = Histogram("fedmask_admin_topk_duration_seconds",
                                      "Top-k requests: time in the admin service, relay and device included",
                                      buckets=_TOPK_BUCKETS, registry=self.registry)
        self.topk_device_seconds = Histogram("fedmask_admin_topk_device_latency_seconds",
                                             "Top-k answers: the coordinator's request-to-answer latency",
                                             buckets=_TOPK_BUCKETS, registry=self.registry)
        self.event_streams = Gauge("fedmask_admin_event_streams", "Open /v1/events streams",
                                   registry=self.registry)
        self.refused = Counter("fedmask_admin_refused_requests", "Requests refused by the request limits "
                               "(body, busy, time) or the event-stream slots (streams), by reason",
                               ("reason",), registry=self.registry)


class MetricsMiddleware:
    """Pure ASGI middleware counting every HTTP request by route template."""

    def __init__(self, app: ASGIApp, metrics: AdminMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
                self._observe(scope, started)
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route: Any = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(scope.get("method", ""), template, str(status["code"])).inc()

    def _observe(self, scope: Scope, started: float) -> None:
        route: Any = scope.get("route")
        template = getattr(route, "path", None) or "unmatched"
        self.metrics.request_seconds.labels(scope.get("method", ""), template).observe(time.perf_counter() - started)
