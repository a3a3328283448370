"""Prometheus metrics of a server (`GET /metrics`, text exposition format, as vLLM serves them).

Each app gets its own `CollectorRegistry` (no process-global state, so several servers or test
apps in one process never mix their numbers). HTTP-level series are recorded by the app as
requests finish; engine series are read from `engine.stats()` at scrape time, so they cost
nothing between scrapes:

  reagent_http_requests_total{endpoint, status}            counter
  reagent_http_request_duration_seconds{endpoint}          histogram (time to the full reply / end of stream)
  reagent_http_requests_in_flight                          gauge
  reagent_engine_requests_total{model}, _errors_total      counters: sessions started / failed
  reagent_engine_prompt_tokens_total{model}                counter: tokens written by prefill
  reagent_engine_generation_tokens_total{model}            counter: sampled tokens kept
  reagent_engine_sessions{model, state}                    gauge: waiting / prefill / decode / paused
  reagent_engine_free_slots{model}, _slot_utilisation      gauges
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_SESSION_STATES = ("waiting", "prefill", "decode", "paused")


class _EngineCollector:
    """Reads each service's engine counters when Prometheus scrapes."""

    def __init__(self, services: Sequence) -> None:
        self.services = list(services)

    def collect(self):
        counters = {
            "requests": CounterMetricFamily("reagent_engine_requests", "Engine sessions started", labels=["model"]),
            "errors": CounterMetricFamily("reagent_engine_errors", "Engine sessions that failed", labels=["model"]),
            "prefill_tokens": CounterMetricFamily("reagent_engine_prompt_tokens", "Prompt tokens prefilled",
                                                  labels=["model"]),
            "decode_tokens": CounterMetricFamily("reagent_engine_generation_tokens", "Sampled tokens kept",
                                                 labels=["model"]),
        }
        sessions = GaugeMetricFamily("reagent_engine_sessions", "Engine sessions by state", labels=["model", "state"])
        free = GaugeMetricFamily("reagent_engine_free_slots", "KV-cache slots free", labels=["model"])
        util = GaugeMetricFamily("reagent_engine_slot_utilisation",
                                 "Kept tokens per decoded slot-step since start", labels=["model"])
        for svc in self.services:
            stats = svc.engine.stats()
            for key, family in counters.items():
                family.add_metric([svc.name], float(stats.get(key, 0)))
            for state in _SESSION_STATES:
                sessions.add_metric([svc.name, state], float(stats.get(state, 0)))
            free.add_metric([svc.name], float(stats.get("free_slots", 0)))
            util.add_metric([svc.name], float(stats.get("utilisation", 0.0)))
        yield from counters.values()
        yield from (sessions, free, util)


class _InFlightCollector:
    def __init__(self, in_flight: Callable[[], int]) -> None:
        self.in_flight = in_flight

    def collect(self):
        gauge = GaugeMetricFamily("reagent_http_requests_in_flight", "Requests being served")
        gauge.add_metric([], float(self.in_flight()))
        yield gauge


ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models")


def endpoint_label(path: str) -> str:
    """A bounded label: the API route, `/v1/models/{id}` for a model card, else "other"."""
    if path in ENDPOINTS:
        return path
    return "/v1/models/{id}" if path.startswith("/v1/models/") else "other"


class ServerMetrics:
    """The registry of one app and the HTTP series it records."""

    def __init__(self, services: Sequence, in_flight: Callable[[], int]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("reagent_http_requests", "HTTP requests answered", ["endpoint", "status"],
                                registry=self.registry)
        self.latency = Histogram("reagent_http_request_duration_seconds", "Seconds to the full reply",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_EngineCollector(services))
        self.registry.register(_InFlightCollector(in_flight))

    def observe(self, path: str, status: int, seconds: float) -> None:
        endpoint = endpoint_label(path)
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class TimedRequests:
    """ASGI middleware: status and duration of every /v1 request, a stream timed to its end
    (Starlette's BaseHTTPMiddleware would stop the clock at the first byte)."""

    def __init__(self, app, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        status, start = 500, time.perf_counter()

        async def send_and_note(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.metrics.observe(scope["path"], status, time.perf_counter() - start)
