"""The attention kernel seam (kernels/attention.py): TPU splash attention, run here in
Pallas interpret mode, equals the XLA causal attention (forward and gradient, padding, GQA, fp32
and bf16), inside the model and sharded over a mesh; the choice follows the mesh's devices."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import models
from reagent_jax.kernels import attention
from reagent_jax.kernels.tpu import ragged_decode, splash as splash_kernel
from reagent_jax.kernels.xla_attention import attention_mask, causal_attention


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
    return splash_kernel.splash_attention(qg, k, v, valid, qg.shape[-1] ** -0.5)


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
    assert attention.choose("auto", None, 256, jnp.bfloat16, 64) == "xla"  # a CPU device: never the TPU kernel
    assert attention.choose("splash", None, 256, jnp.bfloat16, 64) == "splash"  # asked for: interpret mode off TPU
    with pytest.raises(ValueError, match="multiple of 128, got 200"):
        attention.choose("splash", None, 200, jnp.bfloat16, 64)
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


SHARDED_KERNELS = {  # kernel(qg, k, v, valid, scale, mesh); None: one device
    "splash": "lambda *a, mesh=None: splash_kernel.splash_attention(*a, mesh)",
    # cuDNN's shard_map and its row compaction, around XLA's attention (no GPU here)
    "cudnn": "lambda *a, mesh=None: cudnn.cudnn_attention(*a, mesh, implementation='xla')",
}


@pytest.mark.parametrize("kernel", sorted(SHARDED_KERNELS))
def test_kernel_sharded_over_rows_and_kv_heads_equals_one_device(kernel):
    from tests.multidevice import run_with_devices
    out = run_with_devices(f"""
        import json
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from reagent_jax.kernels.gpu import cudnn
        from reagent_jax.kernels.tpu import splash as splash_kernel
        from tests.kernels.test_attention import qkv
        kernel = {SHARDED_KERNELS[kernel]}
        qg, k, v, valid = qkv(b=4, nk=2)
        mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 1, 2), ("data", "fsdp", "tensor"))
        put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))
        args = (put(qg, P("data", None, "tensor")), put(k, P("data", None, "tensor")), put(v, P("data", None, "tensor")),
                put(valid, P("data")))
        sharded = jax.jit(lambda *a: kernel(*a, 0.125, mesh=mesh))(*args)
        one = kernel(qg, k, v, valid, 0.125)
        print(json.dumps({{"err": float(jnp.max(jnp.abs(sharded - one))), "spec": str(sharded.sharding.spec)}}))
    """, n=4)
    assert out["err"] < 1e-6 and "data" in out["spec"] and "tensor" in out["spec"]


# ---- ragged decode ----------------------------------------------------------------------------

LAYER = 1  # of 3: the kernel reads the layer it is given out of the whole cache


def decode_inputs(n=5, nk=2, g=2, s=384, d=16, dtype=jnp.float32, seed=3):
    """One decode step's q [n,1,k,g,d], a 3-layer cache [3,n,s,k,d] in the TPU order, the
    tokens' own k, v [n,1,k,d], and mixed write indices: empty, one block, partial blocks,
    full, idle."""
    rng = np.random.default_rng(seed)
    arr = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)
    write = jnp.asarray([0, 128, 200, s - 1, s][:n], jnp.int32)  # s: an idle slot (reads no cache)
    return arr(n, 1, nk, g, d), arr(3, n, s, nk, d), arr(3, n, s, nk, d), arr(n, 1, nk, d), arr(n, 1, nk, d), write


def ragged(qg, ck, cv, k, v, write, scale, *mesh):
    return ragged_decode.ragged_decode(qg, ck, cv, jnp.int32(LAYER), k, v, write, scale, *mesh)


def ragged_reference(qg, ck, cv, k, v, write, scale):
    """NumPy: each slot's softmax over its cached positions < write (of layer LAYER) plus its
    own token."""
    qg, ck, cv, k, v = (np.asarray(x, np.float64) for x in (qg, ck, cv, k, v))
    ck, cv = ck[LAYER], cv[LAYER]
    n, _, nk, g, d = qg.shape
    out = np.zeros((n, 1, nk, g, d))
    for i in range(n):
        live = int(write[i]) if write[i] < ck.shape[1] else 0  # ck [n, s, k, d]
        for h in range(nk):
            keys = np.concatenate([ck[i, :live, h], k[i, :, h]])  # [live + 1, d]
            vals = np.concatenate([cv[i, :live, h], v[i, :, h]])
            s = qg[i, 0, h] @ keys.T * scale  # [g, live + 1]
            p = np.exp(s - s.max(-1, keepdims=True))
            out[i, 0, h] = (p / p.sum(-1, keepdims=True)) @ vals
    return out


def test_ragged_decode_equals_the_reference_for_mixed_lengths_fp32():
    """Three 128-position blocks: slots stop after 0, 1, 2 and 3 blocks; an idle slot sees only
    its own token; GQA (2 query heads per KV head)."""
    args = decode_inputs()
    assert ragged_decode.decode_block(384, 2, 16, 4) == 128
    assert ragged_decode.decode_block(2048, 1, 128, 2) == 256  # at least 8 blocks: a slot over-reads < 1/8
    assert ragged_decode.decode_block(16384, 2, 128, 2) == 1024  # the 512 KiB VMEM block bound
    out = ragged(*args, 0.25)
    np.testing.assert_allclose(np.asarray(out), ragged_reference(*args, 0.25), atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_paged_ragged_decode_reads_the_same_positions_through_a_block_table(dtype):
    """The same cache cut into pages of 128 and shuffled into a pool (plus pages nobody holds):
    through the block table the kernel gives the contiguous kernel's output, fp32 and bf16."""
    qg, ck, cv, k, v, write = (x.astype(dtype) if x.dtype == jnp.float32 else x for x in decode_inputs())
    n, s, page = ck.shape[1], ck.shape[2], 128
    cols = s // page
    rng = np.random.default_rng(0)
    pool_ids = rng.permutation(n * cols + 3)[: n * cols].reshape(n, cols)  # slot i's page j -> a pool page
    to_pool = lambda c: jnp.zeros((3, n * cols + 3, page) + c.shape[3:], c.dtype).at[:, pool_ids.reshape(-1)].set(
        c.reshape(3, n * cols, page, *c.shape[3:]))
    table = jnp.asarray(pool_ids, jnp.int32).at[0, 1:].set(n * cols + 3)  # slot 0 (empty) holds one page
    paged = ragged_decode.ragged_decode(qg, to_pool(ck), to_pool(cv), jnp.int32(LAYER), k, v, write, 0.25,
                                        pages=table)
    np.testing.assert_array_equal(np.asarray(paged, np.float32), np.asarray(ragged(qg, ck, cv, k, v, write, 0.25),
                                                                              np.float32))


def test_ragged_decode_in_bf16_and_as_the_models_decode_attention():
    """bf16 within 2e-3 of exact attention; and the model's cached attention (the XLA einsums
    over the same cache) gives the same outputs as the kernel."""
    from reagent_jax.kernels import kv_layout
    args32 = decode_inputs()
    args16 = tuple(x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x for x in args32)
    ref = ragged_reference(*args16, 0.25)
    out16 = np.asarray(ragged(*args16, 0.25), np.float32)
    assert np.abs(out16 - ref).max() < 2e-3 * np.abs(ref).max() + 2e-2
    qg, ck, cv, k, v, write = args32
    mask = jnp.ones((qg.shape[0], 1, 1), bool)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kv_layout, "order", lambda mesh: "lnskd")
        xla = attention.cached_attention("xla", qg, k, v, mask, attention.LayerCache(ck, cv, jnp.int32(LAYER)), write,
                                         None, 0.25, jnp.float32)
    np.testing.assert_allclose(np.asarray(xla)[:-1], ragged_reference(*args32, 0.25)[:-1], atol=1e-5)  # not idle
    assert attention.choose_decode("auto", None) == "xla"  # a CPU device: never the TPU kernel
    with pytest.raises(ValueError, match="choose one of"):
        attention.choose_decode("flash", None)


def test_ragged_decode_sharded_over_slots_and_kv_heads_equals_one_device():
    from tests.multidevice import run_with_devices
    out = run_with_devices("""
        import json
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from reagent_jax.kernels.tpu import ragged_decode, splash as splash_kernel
        from reagent_jax.rollout.layout import ENGINE_RULES
        from tests.kernels.test_attention import decode_inputs, ragged
        qg, ck, cv, k, v, write = decode_inputs(n=4)
        mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 1, 2), ("data", "fsdp", "tensor"))
        put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))
        rows, cache = P("data", None, "tensor"), P(None, "data", None, "tensor")
        args = (put(qg, rows), put(ck, cache), put(cv, cache), put(k, rows), put(v, rows), put(write, P("data")))
        f = jax.jit(lambda *a: ragged(*a, 0.25, mesh, ENGINE_RULES))
        sharded = f(*args)
        one = ragged(qg, ck, cv, k, v, write, 0.25)
        print(json.dumps({"err": float(jnp.max(jnp.abs(sharded - one)))}))
    """, n=4)
    assert out["err"] < 1e-6
