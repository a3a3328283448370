"""Benchmark plumbing: dtype selection reaches both sides (the timings themselves are not tested)."""
import jax.numpy as jnp
import pytest
import torch

from reagent_jax import models
from reagent_jax.metrics import perf
from reagent_jax.benchmarks import forward as bench


def test_bench_dtype_is_checked_and_reaches_torch():
    with pytest.raises(ValueError, match="float16"):
        perf.check_bench_dtype("float16")
    a = torch.ones(4, 4)
    with perf.torch_compute("bfloat16"):
        assert (a @ a).dtype == torch.bfloat16
    with perf.torch_compute("float32"):
        assert (a @ a).dtype == torch.float32
    assert perf.matmul_peak_flops(n=64, dtype=jnp.bfloat16, iters=1) > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_bench_runs_both_sides_in_the_dtype(dtype):
    out = bench.run(models.preset("tiny"), batch=1, seq_len=16, iters=1, dtype=dtype)
    assert out["dtype"] == dtype
    for key in ("jax_forward_tokens_per_s", "torch_forward_tokens_per_s", "forward_speedup_vs_torch",
                "fwd_bwd_speedup_vs_torch"):
        assert out[key] > 0
