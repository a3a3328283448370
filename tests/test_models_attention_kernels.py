"""The attention kernel seam (models/attention_kernels.py): TPU splash attention, run here in
Pallas interpret mode, equals the XLA causal attention (forward and gradient, padding, GQA, fp32
and bf16), inside the model and sharded over a mesh; the choice follows the mesh's devices."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import models
from reagent_jax.models import attention_kernels
from reagent_jax.models.qwen3 import attention_mask, causal_attention


def qkv(b=2, t=256, nk=2, g=3, d=64, seed=0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    qg, k, v = (jnp.asarray(rng.normal(size=s), dtype) for s in ((b, t, nk, g, d), (b, t, nk, d), (b, t, nk, d)))
    valid = np.ones((b, t), bool)
    valid[1, t - 57:] = False  # right padding
    valid[0, :9] = False  # left padding
    return qg, k, v, jnp.asarray(valid)


def xla_attention(qg, k, v, valid):
    t = qg.shape[1]
    mask = attention_mask(jnp.broadcast_to(jnp.arange(t), valid.shape), valid)
    return causal_attention(qg, k, v, mask, qg.shape[-1] ** -0.5)


def splash(qg, k, v, valid):
    return attention_kernels.splash_attention(qg, k, v, valid, qg.shape[-1] ** -0.5)


def grads(fn, qg, k, v, valid):
    """Gradients of a fixed random projection of the real queries' outputs (padding carries no loss)."""
    real = valid[:, :, None, None, None]
    w = jnp.asarray(np.random.default_rng(1).normal(size=qg.shape), jnp.float32)
    loss = lambda q, k, v: jnp.sum(jnp.where(real, fn(q, k, v, valid).astype(jnp.float32) * w, 0.0))
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(qg, k, v)


def test_splash_equals_xla_attention_forward_and_gradient_fp32():
    qg, k, v, valid = qkv()
    real = valid[:, :, None, None, None]
    np.testing.assert_allclose(jnp.where(real, jax.jit(splash)(qg, k, v, valid), 0),
                               jnp.where(real, jax.jit(xla_attention)(qg, k, v, valid), 0), atol=1e-5)
    for a, b in zip(grads(splash, qg, k, v, valid), grads(xla_attention, qg, k, v, valid)):
        np.testing.assert_allclose(a, b, atol=1e-5 * max(float(jnp.abs(b).max()), 1.0))


def test_splash_in_bf16_is_as_close_to_fp32_attention_as_the_xla_path():
    """bf16 inputs: each path's error against fp32 attention of the same (bf16) values; the kernel
    stays within 2e-3 on average and no worse than the XLA path at its largest."""
    qg, k, v, valid = qkv(dtype=jnp.bfloat16)
    real = valid[:, :, None, None, None]
    up = [x.astype(jnp.float32) for x in (qg, k, v)]
    ref = xla_attention(*up, valid)
    err = {name: jnp.where(real, jnp.abs(jax.jit(fn)(qg, k, v, valid).astype(jnp.float32) - ref), 0.0)
           for name, fn in (("splash", splash), ("xla", xla_attention))}
    assert float(err["splash"].sum() / (real.sum() * qg.shape[2] * qg.shape[3] * qg.shape[4])) < 2e-3
    assert float(err["splash"].max()) <= 1.1 * float(err["xla"].max())
    ref_g = grads(xla_attention, *up, valid)
    for name_grads in zip(grads(splash, qg, k, v, valid), grads(xla_attention, qg, k, v, valid), ref_g):
        g_splash, g_xla, g_ref = (np.asarray(x, np.float32) for x in name_grads)
        scale = np.abs(g_ref).max()
        assert np.abs(g_splash - g_ref).mean() < 2e-3 * scale
        assert np.abs(g_splash - g_ref).max() <= 1.1 * np.abs(g_xla - g_ref).max() + 1e-3 * scale


def test_the_kernel_follows_the_mesh_devices_and_refuses_lengths_it_cannot_block():
    assert attention_kernels.choose("auto", None, 256) == "xla"  # a CPU device: never the TPU kernel
    assert attention_kernels.choose("splash", None, 256) == "splash"  # asked for: interpret mode off TPU
    with pytest.raises(ValueError, match="multiple of 128, got 200"):
        attention_kernels.choose("splash", None, 200)
    with pytest.raises(ValueError, match="attention='flash'; choose one of"):
        models.preset("tiny", attention="flash")


def test_model_logprobs_with_splash_equal_xla():
    cfg = models.preset("tiny", compute_dtype="float32", vocab_size=256)
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    rng = np.random.default_rng(2)
    tokens = jnp.asarray(rng.integers(0, 256, (2, 128)), jnp.int32)
    attn = jnp.asarray(np.arange(128)[None, :] < np.array([[128], [90]]))
    lp = {impl: models.token_logprobs(cfg.replace(attention=impl), params, tokens, attn) for impl in ("xla", "splash")}
    np.testing.assert_allclose(np.where(attn, lp["splash"], 0), np.where(attn, lp["xla"], 0), atol=1e-5)


def test_splash_sharded_over_rows_and_kv_heads_equals_one_device():
    from tests.multidevice import run_with_devices
    out = run_with_devices("""
        import json
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from reagent_jax.models import attention_kernels
        from tests.test_models_attention_kernels import qkv
        qg, k, v, valid = qkv(b=4, nk=2)
        mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 1, 2), ("data", "fsdp", "tensor"))
        put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))
        args = (put(qg, P("data", None, "tensor")), put(k, P("data", None, "tensor")), put(v, P("data", None, "tensor")),
                put(valid, P("data")))
        f = jax.jit(lambda *a: attention_kernels.splash_attention(*a, 0.125, mesh))
        sharded = f(*args)
        one = attention_kernels.splash_attention(qg, k, v, valid, 0.125)
        print(json.dumps({"err": float(jnp.max(jnp.abs(sharded - one))), "spec": str(sharded.sharding.spec)}))
    """, n=4)
    assert out["err"] < 1e-6 and "data" in out["spec"] and "tensor" in out["spec"]
