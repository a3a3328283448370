"""The one-call decode-step kernel (`kernels.cpu.decode`) against the model's own layers
(`forward_with_cache`), on shapes that exercise every tile and tail, and in the rollout engine."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import models, rollout
from reagent_jax.kernels.cpu import decode as cpu_decode
from reagent_jax.models.functional import forward_with_cache
from reagent_jax.models.qwen3 import Qwen3
from reagent_jax.rollout import kernels

_TINY = models.preset("tiny", compute_dtype="float32")
needs_kernel = pytest.mark.skipif(
    not cpu_decode.usable(_TINY, models.init_params(_TINY, jax.random.PRNGKey(0)),
                          (jnp.zeros((2, 1, 2, 4, 32)),) * 2, 1),
    reason="the decode kernel needs an AVX-512 CPU and a C++ compiler")

_YARN = tuple(sorted({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}.items()))


def _case(rows, window, **shape):
    cfg = _TINY.replace(**shape)
    params = jax.tree.map(lambda x: x * 3.0 if x.ndim >= 3 else x, models.init_params(cfg, jax.random.PRNGKey(rows)))
    rng = np.random.default_rng(rows + window)
    cache_shape = (cfg.num_layers, rows, cfg.num_kv_heads, window, cfg.head_dim)
    cache = tuple(jnp.asarray(rng.normal(size=cache_shape).astype(np.float32)) for _ in range(2))
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, rows), jnp.int32)
    positions = rng.integers(0, window, rows)
    positions[0], positions[-1] = 0, window  # the first token of a sequence; an inactive row (writes nothing)
    if rows > 2:
        positions[1] = window - 1  # the last cache position
    return cfg, params, cache, tokens, jnp.asarray(positions, jnp.int32)


def _ours(cfg, params, cache, tokens, positions):
    x = jnp.take(params["embed"], tokens, axis=0)
    h, cache = jax.jit(lambda c: cpu_decode.decode_layers(cfg, params, x, positions, c))(cache)
    return Qwen3(cfg).apply({"params": params}, h, method=Qwen3.final_hidden), cache


def _reference(cfg, params, cache, tokens, positions):
    h, cache = jax.jit(lambda c: forward_with_cache(cfg, params, tokens[:, None], c, positions, return_hidden=True))(cache)
    return h[:, 0], cache


@needs_kernel
@pytest.mark.parametrize("rows,window,shape", [
    (16, 64, {}),  # tiny: head_dim 32, GQA groups of 2
    (5, 40, dict(hidden_size=48, intermediate_size=80, num_layers=3)),  # 16-row tile tails, odd widths
    (19, 24, dict(num_heads=2, num_kv_heads=2, head_dim=16)),  # no GQA, one 16-wide vector per head
    (3, 130, dict(num_heads=4, num_kv_heads=1, head_dim=128, num_layers=1)),  # Qwen3's head_dim, MQA
    (7, 32, dict(rope_scaling=_YARN, rope_theta=2e5)),  # YaRN: cos / sin scaled
])
def test_decode_layers_match_the_model(rows, window, shape):
    cfg, params, cache, tokens, positions = _case(rows, window, **shape)
    assert cpu_decode.usable(cfg, params, cache, rows)
    ref_h, ref_cache = _reference(cfg, params, jax.tree.map(jnp.copy, cache), tokens, positions)
    h, new_cache = _ours(cfg, params, jax.tree.map(jnp.copy, cache), tokens, positions)
    live = np.asarray(positions) < window
    np.testing.assert_allclose(np.asarray(h)[live], np.asarray(ref_h)[live], atol=2e-5, rtol=1e-5)
    for got, want, old in zip(new_cache, ref_cache, cache):
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)  # new K/V written where the model writes them
        np.testing.assert_array_equal(np.asarray(got)[:, ~live], np.asarray(old)[:, ~live])  # inactive rows untouched


@needs_kernel
def test_usable_only_where_it_applies(monkeypatch):
    cfg, params, cache, _, _ = _case(4, 16)
    assert cpu_decode.usable(cfg, params, cache, 4)
    assert not cpu_decode.usable(cfg, params, cache, 3)  # one cache row per token row
    assert not cpu_decode.usable(cfg.replace(compute_dtype="bfloat16"), params, cache, 4)
    assert not cpu_decode.usable(cfg, params, tuple(c.astype(jnp.bfloat16) for c in cache), 4)
    assert not cpu_decode.usable(cfg, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params), cache, 4)
    assert not cpu_decode.usable(cfg.replace(hidden_size=40), params, cache, 4)  # not a multiple of 16
    assert not cpu_decode.usable(cfg.replace(head_dim=24), params, cache, 4)
    assert not cpu_decode.usable(cfg.replace(head_dim=272), params, cache, 4)  # more than 256

    class Mesh2:  # a 2-device mesh of this host's CPU
        size = 2
        devices = np.array(jax.devices()[:1] * 2)
    assert not cpu_decode.usable(cfg, params, cache, 4, mesh=Mesh2())
    monkeypatch.setenv("REAGENT_CPU_GEMM", "xla")
    assert not cpu_decode.usable(cfg, params, cache, 4)


@needs_kernel
def test_engine_decodes_through_the_kernel_and_matches_the_xla_path(monkeypatch):
    """The engine's decode step calls the kernel (one custom call, no layer scan); its greedy
    tokens and logprobs equal those of the XLA layers (REAGENT_CPU_GEMM=xla), sampled rows too."""
    cfg = _TINY
    params = jax.tree.map(lambda x: x * 3.0 if x.ndim >= 2 else x, models.init_params(cfg, jax.random.PRNGKey(0)))
    prompts = [np.random.default_rng(i).integers(0, cfg.vocab_size, n).tolist() for i, n in enumerate((5, 19, 40))]
    sps = [rollout.SamplingParams(temperature=0.0, max_new_tokens=30),
           rollout.SamplingParams(temperature=0.9, top_k=20, max_new_tokens=30, seed=5)]

    def run():
        eng = rollout.Engine(cfg, params, num_slots=4, max_len=96, prefill_chunk=32, decode_steps=4)
        return [[(o.tokens, o.logprobs) for o in eng.generate(prompts, sp)] for sp in sps]

    state = kernels.DecodeState(tokens=jnp.zeros(4, jnp.int32), lengths=jnp.zeros(4, jnp.int32),
                                active=jnp.ones(4, bool), remaining=jnp.ones(4, jnp.int32),
                                sampling=kernels.Sampling(jnp.zeros(4), jnp.ones(4), jnp.zeros(4, jnp.int32),
                                                          jnp.zeros(4, jnp.uint32)),
                                stop_ids=jnp.full((4, 1), -1, jnp.int32), exit_on_done=jnp.asarray(False))
    cache = kernels.init_cache(cfg, 4, 32)
    hlo = kernels.decode.lower(cfg, params, cache, state, num_steps=2, window=32).as_text()
    assert hlo.count("reagent_decode_layers") == 1
    ours = run()
    monkeypatch.setenv("REAGENT_CPU_GEMM", "xla")
    kernels.decode.clear_cache()  # retrace with the kernel off
    ref = run()
    hlo = kernels.decode.lower(cfg, params, cache, state, num_steps=2, window=32).as_text()
    assert "reagent_decode_layers" not in hlo
    kernels.decode.clear_cache()
    for a, b in zip(ours, ref):
        for (tok_a, lp_a), (tok_b, lp_b) in zip(a, b):
            assert tok_a == tok_b
            np.testing.assert_allclose(lp_a, lp_b, atol=1e-4)
