"""Chooses which replica gets the next request: least in-flight (default) or round robin.

Why: one annotator or judge model is often served by several replicas. Sending each request to the
replica with the fewest requests in flight keeps a slow replica from piling up work; round robin is
the predictable choice for tests and equal replicas. A retry prefers a replica other than the one
that just failed, so a dead replica costs one attempt, not all of them.
"""

from __future__ import annotations

import threading
from typing import Sequence

from reagent_jax.endpoints.config import BALANCE_STRATEGIES


class EndpointPool:
    """Thread-safe in-flight counts per URL; `acquire` picks a URL, `release` gives it back."""

    def __init__(self, urls: Sequence[str], strategy: str = "least_inflight") -> None:
        if not urls:
            raise ValueError("EndpointPool needs at least one URL")
        if strategy not in BALANCE_STRATEGIES:
            raise ValueError(f"unknown balance strategy {strategy!r}; expected one of {BALANCE_STRATEGIES}")
        self.urls = tuple(urls)
        self.strategy = strategy
        self._lock = threading.Lock()
        self._next = 0  # round-robin cursor (also breaks least-in-flight ties fairly)
        self._in_flight = [0] * len(self.urls)
        self._sent = [0] * len(self.urls)
        self._failed = [0] * len(self.urls)

    def acquire(self, avoid: str | None = None) -> str:
        """The URL for the next attempt (counted as in flight until `release`)."""
        with self._lock:
            n = len(self.urls)
            order = [(self._next + k) % n for k in range(n)]
            if avoid is not None and n > 1:
                order = [i for i in order if self.urls[i] != avoid] or order
            if self.strategy == "least_inflight":
                pick = min(order, key=lambda i: self._in_flight[i])  # min keeps the first of ties
            else:
                pick = order[0]
            self._next = (pick + 1) % n
            self._in_flight[pick] += 1
            self._sent[pick] += 1
            return self.urls[pick]

    def release(self, url: str, ok: bool = True) -> None:
        with self._lock:
            i = self.urls.index(url)
            self._in_flight[i] -= 1
            if not ok:
                self._failed[i] += 1

    def in_flight(self) -> dict[str, int]:
        with self._lock:
            return dict(zip(self.urls, self._in_flight))

    def stats(self) -> dict[str, dict[str, int]]:
        """Per URL: attempts sent, attempts failed, attempts in flight now."""
        with self._lock:
            return {u: {"sent": s, "failed": f, "in_flight": k}
                    for u, s, f, k in zip(self.urls, self._sent, self._failed, self._in_flight)}
