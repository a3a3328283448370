"""Model FLOPs from the shapes against a hand count and against XLA's own count of one forward."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import models
from reagent_jax.models import flops


def test_dense_and_projection_flops_are_the_matmuls():
    cfg = models.preset("tiny")  # hidden 64, mlp 128, 2 layers, 4 q / 2 kv heads of 32, vocab 512
    per_layer = 64 * 32 * 4 + 2 * 64 * 32 * 2 + 4 * 32 * 64 + 3 * 64 * 128  # q, k+v, o, gate+up+down
    assert flops.dense_flops_per_token(cfg) == 2 * 2 * per_layer
    assert flops.projection_flops(cfg) == 2 * 64 * 512
    assert flops.attention_flops_per_token(cfg, 10) == 4 * 2 * 4 * 32 * 10


def test_train_flops_counts_each_rows_real_tokens():
    cfg = models.preset("tiny")
    full = np.ones((3, 16), np.int32)
    assert flops.train_flops(cfg, full) == pytest.approx(3 * flops.sequence_flops(cfg, 3, 16))
    ragged = full.copy()
    ragged[1, 8:] = 0
    expect = 3 * (2 * flops.sequence_flops(cfg, 1, 16) + flops.sequence_flops(cfg, 1, 8))
    assert flops.train_flops(cfg, ragged) == pytest.approx(expect)
    assert flops.train_flops(cfg, full.reshape(3, 1, 16)) == flops.train_flops(cfg, full)  # DPO's [P, 2, T]


def test_forward_flops_match_xlas_count_of_the_matmuls(monkeypatch):
    """XLA counts every dot of an unrolled forward (XLA's own GEMMs: custom calls are not counted);
    ours ignores elementwise work, so it may be lower, never higher."""
    monkeypatch.setenv("REAGENT_CPU_GEMM", "xla")
    cfg = models.preset("tiny", compute_dtype="float32", scan_layers=False)
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    tokens = jnp.zeros((2, 128), jnp.int32)
    compiled = jax.jit(lambda p, t: models.forward(cfg, p, t)).lower(params, tokens).compile()
    xla = compiled.cost_analysis()
    xla = xla[0] if isinstance(xla, list) else xla
    ours = flops.sequence_flops(cfg, 2, 128)
    assert 0.8 * xla["flops"] <= ours <= 1.02 * xla["flops"], (ours, xla["flops"])
