"""Blocked causal attention (the no-cache path) against a plain NumPy softmax attention."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax.kernels.xla_attention import attention_mask, causal_attention, causal_blocks, decode_step_values


def numpy_attention(qg, k, v, mask, scale):
    s = np.einsum("btkgd,bskd->bkgts", qg, k) * scale
    s = np.where(mask[:, None, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bkgts,bskd->btkgd", p, v)


def test_causal_blocks_cover_the_sequence():
    for t in (1, 100, 128, 300, 512, 1000, 5000, 16384):
        blocks = causal_blocks(t)
        assert blocks[0][0] == 0 and blocks[-1][1] == t and len(blocks) <= max(8, -(-t // 512))
        assert len(blocks) <= 8 or max(b - a for a, b in blocks) <= 512  # long rows: blocks of <= 512 queries
        assert all(a < b for a, b in blocks) and all(b == c for (_, b), (c, _) in zip(blocks, blocks[1:]))


@pytest.mark.parametrize("t,g", [(64, 2), (300, 1), (1000, 3), (2100, 1)])  # 2100: recomputed blocks
def test_matches_numpy_with_padding_and_gradients(t, g):
    b, nk, d = 2, 2, 16
    rng = np.random.default_rng(t)
    qg, k, v = (rng.normal(size=s).astype(np.float32) for s in ((b, t, nk, g, d), (b, t, nk, d), (b, t, nk, d)))
    valid = np.ones((b, t), bool)
    valid[1, : t // 3] = False  # left padding in row 1
    mask = np.asarray(attention_mask(jnp.broadcast_to(jnp.arange(t), (b, t)), jnp.asarray(valid)))
    out = np.asarray(jax.jit(causal_attention, static_argnums=4)(qg, k, v, mask, d ** -0.5))
    real = valid[:, :, None, None, None] & np.ones_like(out, bool)  # padding queries see no key
    ref = numpy_attention(qg, k, v, mask | ~valid[:, :, None], d ** -0.5)  # keep padded rows finite in the oracle
    np.testing.assert_allclose(out[real], ref[real], atol=2e-5)
    assert np.isfinite(out).all()
    # Gradients through the blocked form equal those of the plain form (real queries only).
    w = jnp.asarray(real, jnp.float32) * jnp.asarray(rng.normal(size=out.shape), jnp.float32)

    def plain(q_, k_, v_):
        s = jnp.einsum("btkgd,bskd->bkgts", q_, k_) * d ** -0.5
        p = jax.nn.softmax(jnp.where(mask[:, None, None], s, -1e30), axis=-1)
        return jnp.sum(jnp.einsum("bkgts,bskd->btkgd", p, v_) * w)

    blocked = lambda q_, k_, v_: jnp.sum(causal_attention(q_, k_, v_, mask, d ** -0.5) * w)
    for a, r in zip(jax.grad(blocked, (0, 1, 2))(qg, k, v), jax.grad(plain, (0, 1, 2))(qg, k, v)):
        np.testing.assert_allclose(a, r, atol=5e-5)


@pytest.mark.parametrize("dtype,atol", [(np.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_decode_step_values_match_numpy(dtype, atol):
    """The one-query (decode) value mixing equals the plain einsum over cache + new token."""
    b, s, nk, g, d = 3, 40, 2, 3, 16
    rng = np.random.default_rng(1)
    w = rng.random((b, nk, g, 1, s + 1)).astype(np.float32)
    w /= w.sum(-1, keepdims=True)
    cv, v = rng.normal(size=(b, nk, s, d)), rng.normal(size=(b, 1, nk, d))  # cache [b, k, s, d]
    ref = np.einsum("bkgts,bksd->btkgd", w[..., :s], cv) + np.einsum("bkgtu,bukd->btkgd", w[..., s:], v)
    out = decode_step_values(jnp.asarray(w[..., :s]), jnp.asarray(cv, dtype), jnp.asarray(w[..., s:]),
                             jnp.asarray(v, dtype))
    assert out.shape == (b, 1, nk, g, d) and out.dtype == jnp.dtype(dtype)
    np.testing.assert_allclose(np.asarray(out, np.float32), ref, atol=atol)


@pytest.mark.parametrize("order", ["lnksd", "lnskd"])
@pytest.mark.parametrize("form", ["values", "reduce"])
def test_every_decode_form_equals_the_einsums_in_both_cache_orders(form, order, monkeypatch):
    """One-token decode over a 2-layer cache at mixed write indices: the multiply-reduce forms
    (`DECODE_FORMS`) give the batched dots' attention within fp32 rounding, in either axis order."""
    from reagent_jax.kernels import kv_layout, xla_attention
    n, s, nk, g, d = 4, 48, 2, 3, 16
    rng = np.random.default_rng(2)
    sizes = {"l": 2, "n": n, "k": nk, "s": s, "d": d}
    cache = [jnp.asarray(rng.normal(size=[sizes[a] for a in order]), jnp.float32) for _ in range(2)]
    qg, k, v = (jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in ((n, 1, nk, g, d), (n, 1, nk, d),
                                                                               (n, 1, nk, d)))
    write, mask = jnp.asarray([0, 7, 30, 47], jnp.int32), jnp.ones((n, 1, 1), bool)
    monkeypatch.setattr(kv_layout, "order", lambda mesh: order)
    out = {}
    for f in ("einsum", form):
        monkeypatch.setitem(xla_attention.DECODE_FORMS, "cpu", f)
        out[f] = xla_attention.cached_attention(qg, k, v, mask, *cache, jnp.int32(1), write, None, 0.25, jnp.float32)
    np.testing.assert_allclose(out[form], out["einsum"], atol=1e-5)
