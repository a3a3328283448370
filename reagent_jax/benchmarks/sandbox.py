"""Sandbox throughput: how many trivial cells per second the host can start, run and clean up."""

from __future__ import annotations

import concurrent.futures
import time

from reagent_jax.agent.sandbox.runner import SandboxConfig, resolve_isolation, run_python


def sandbox_calls_per_second(n: int = 20, concurrency: int = 1, config: SandboxConfig | None = None,
                             code: str = "print(sum(range(1000)))") -> dict:
    """Run `n` cells with `concurrency` threads; returns calls/s, latency percentiles, isolation mode."""
    config = config or SandboxConfig()
    isolation = resolve_isolation(config)  # probe outside the timed region
    latencies: list[float] = []
    failures = 0
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for result in pool.map(lambda _: run_python(code, config), range(n)):
            latencies.append(result.elapsed_s)
            failures += not result.ok
    wall = time.perf_counter() - start
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else 0.0  # noqa: E731
    return {"calls": n, "concurrency": concurrency, "isolation": isolation, "failures": failures,
            "calls_per_s": n / wall if wall > 0 else 0.0, "latency_p50_s": pick(0.5), "latency_p95_s": pick(0.95)}
