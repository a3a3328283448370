"""Measuring speed honestly on shared machines: timers with medians, the machine's own peak matmul
FLOP/s and memory bandwidth (the denominators of MFU and roofline fractions), memory readings.
"""
from __future__ import annotations

import functools
import statistics
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from reagent_jax.parallel.chips import chip_spec


def block(x):
    return jax.tree.map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, x)


def time_calls(fn: Callable[[], object], iters: int = 5, warmup: int = 1) -> list[float]:
    """Wall seconds of `iters` calls of fn (results blocked on), after `warmup` calls."""
    for _ in range(warmup):
        block(fn())
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        block(fn())
        out.append(time.perf_counter() - t0)
    return out


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def matmul_peak_flops(n: Optional[int] = None, dtype=jnp.float32, iters: int = 5) -> float:
    """Median FLOP/s of an [n, n] x [n, n] matmul on the default device, accumulating in fp32
    (XLA:CPU's bf16 matmul with a bf16 output is ~5x slower than with an fp32 one). n defaults
    to 2048 on a CPU and 8192 on an accelerator, where a 2048 product is too short to time
    past its launch."""
    n = n or (2048 if jax.devices()[0].platform == "cpu" else 8192)
    a, b = (jax.random.normal(jax.random.PRNGKey(i), (n, n), dtype) for i in (0, 1))  # random: zeros run faster
    f = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    return 2.0 * n ** 3 / median(time_calls(lambda: f(a, b), iters=iters, warmup=2))


def memory_bandwidth(mb: Optional[int] = None, iters: int = 5) -> float:
    """Median bytes/s of a device-side read+write pass over `mb` MiB (x * 2 + 1); 256 MiB on a
    CPU, 4 GiB on an accelerator (many times its caches)."""
    mb = mb or (256 if jax.devices()[0].platform == "cpu" else 4096)
    n = mb * 1024 * 1024 // 4
    x = jnp.ones((n,), jnp.float32)
    f = jax.jit(lambda v: v * 2.0 + 1.0)
    return 2.0 * n * 4 / median(time_calls(lambda: f(x), iters=iters, warmup=2))


@functools.lru_cache(maxsize=1)
def _measured_peak() -> float:
    return matmul_peak_flops(n=1024, iters=3)


def peak_flops(devices) -> float:
    """Peak FLOP/s of these devices together: the chip table (`parallel.chips`, overridable with
    REAGENT_PEAK_TFLOPS), else (a CPU) the matmul peak measured once per process."""
    devices = list(devices)
    spec = chip_spec(devices[0])
    if spec is not None and spec.peak_tflops:
        return spec.peak_tflops * 1e12 * len(devices)
    return _measured_peak() * (1 if devices[0].platform == "cpu" else len(devices))


def peak_memory_bytes() -> int:
    """Peak device memory where the backend reports it, else this process's max RSS."""
    try:
        stats = jax.devices()[0].memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            return int(stats["peak_bytes_in_use"])
    except Exception:  # CPU backends report nothing
        pass
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def datasheet_peak_flops() -> Optional[float]:
    """The first device's dense bf16 peak from the chip table (`parallel.chips`), None off it."""
    spec = chip_spec(jax.devices()[0])
    return spec.peak_tflops * 1e12 if spec is not None and spec.peak_tflops else None


def set_torch_threads() -> None:
    """Give torch the same cores JAX uses, so side-by-side numbers are fair."""
    import os
    import torch
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))


BENCH_DTYPES = ("float32", "bfloat16")


def check_bench_dtype(dtype: str) -> str:
    if dtype not in BENCH_DTYPES:
        raise ValueError(f"benchmark dtype {dtype!r} is not one of {BENCH_DTYPES}")
    return dtype


def torch_compute(dtype: str):
    """Context for the torch baselines: fp32, or bf16 autocast over fp32 weights (what our
    `param_dtype=float32, compute_dtype=bfloat16` does)."""
    import contextlib
    import torch
    if check_bench_dtype(dtype) == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type="cpu", dtype=torch.bfloat16)


def as_np(x) -> np.ndarray:
    return np.asarray(jax.device_get(x))
