"""Policy loss, KL estimators, entropy and loss aggregation against NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax.registry import Registry
from reagent_jax.rl.aggregation import AGG_MODES, aggregate_loss, loss_counts, masked_mean, token_weights
from reagent_jax.rl.kl import entropy_from_logits, kl_penalty, kl_term, needs_reference_model
from reagent_jax.rl.policy_loss import ppo_policy_loss

B, T = 5, 7


def make_batch(seed=0):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2.0, 1.0, size=(B, T)).astype(np.float32)
    new = (old + rng.normal(0.0, 0.5, size=(B, T))).astype(np.float32)  # ratios well outside [0.8, 1.2]
    new[0, 0] = old[0, 0] + 30.0  # beyond the log-ratio clamp
    new[1, 1] = old[1, 1] + 2.0  # ratio 7.4 > dual-clip c with A < 0
    mask = rng.random((B, T)) > 0.3
    mask[2] = False  # an all-masked row
    mask[1, :3] = True
    adv = rng.normal(0.0, 1.0, size=(B,)).astype(np.float32)
    adv[0], adv[1] = 1.5, -2.0
    return new, old, adv, mask


# ---------------------------------------------------------------- policy loss
def np_policy_loss(new, old, adv, mask, eps_low, eps_high, c, clamp=20.0):
    """verl compute_policy_loss_vanilla, elementwise, in float64."""
    adv = np.broadcast_to(adv[:, None], new.shape) if adv.ndim == 1 else adv
    neg_kl = np.clip(new.astype(np.float64) - old, -clamp, clamp)
    ratio = np.exp(neg_kl)
    l1 = -adv * ratio
    l2 = -adv * np.clip(ratio, 1 - eps_low, 1 + eps_high)
    clip1 = np.maximum(l1, l2)
    l3 = -adv * c
    clip2 = np.minimum(l3, clip1)
    losses = np.where(adv < 0, clip2, clip1)

    def mmean(x):
        return (x * mask).sum() / max(mask.sum(), 1)

    metrics = {
        "pg_clipfrac": mmean((l2 > l1).astype(float)),
        "pg_clipfrac_lower": mmean(((clip1 > l3) & (adv < 0)).astype(float)),
        "ppo_kl": mmean(-neg_kl),
    }
    return np.where(mask, losses, 0.0), metrics


@pytest.mark.parametrize("token_level_adv", [False, True])
def test_policy_loss_matches_verl_reference(token_level_adv):
    new, old, adv, mask = make_batch()
    if token_level_adv:
        adv = np.random.default_rng(3).normal(size=(B, T)).astype(np.float32)
    fn = jax.jit(lambda *a: ppo_policy_loss(*a, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0))
    out = fn(new, old, adv, mask)
    ref_loss, ref_metrics = np_policy_loss(new, old, adv, mask, 0.2, 0.28, 3.0)
    np.testing.assert_allclose(out.token_loss, ref_loss, rtol=1e-5, atol=1e-6)
    for key, value in ref_metrics.items():
        np.testing.assert_allclose(out.metrics[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    assert 0 < float(out.metrics["pg_clipfrac"]) < 1
    if not token_level_adv:
        assert float(out.metrics["pg_clipfrac_lower"]) > 0  # row 1 has A < 0 and large ratios


def test_policy_loss_dual_clip_bounds_negative_advantages():
    old = np.zeros((1, 3), np.float32)
    new = np.log(np.array([[10.0, 2.0, 0.5]], np.float32))  # ratios 10, 2, 0.5
    out = ppo_policy_loss(new, old, np.array([-1.0]), np.ones((1, 3), bool), dual_clip_c=3.0)
    # ratio 10: unclipped -A*r = 10 is capped at -A*c = 3; ratio 2: 2; ratio 0.5: max(0.5, 0.8) = 0.8
    np.testing.assert_allclose(out.token_loss, [[3.0, 2.0, 0.8]], rtol=1e-6)
    np.testing.assert_allclose(out.metrics["pg_clipfrac_lower"], 1 / 3, rtol=1e-6)
    no_dual = ppo_policy_loss(new, old, np.array([-1.0]), np.ones((1, 3), bool), dual_clip_c=None)
    np.testing.assert_allclose(no_dual.token_loss, [[10.0, 2.0, 0.8]], rtol=1e-6)
    # clip-higher: positive advantage, ratio 2 is clipped at 1 + eps_high
    pos = ppo_policy_loss(new, old, np.array([1.0]), np.ones((1, 3), bool), eps_low=0.2, eps_high=0.28)
    np.testing.assert_allclose(pos.token_loss, [[-1.28, -1.28, -0.5]], rtol=1e-6)


def test_policy_loss_masked_garbage_does_not_leak_into_loss_or_grad():
    new, old, adv, mask = make_batch()
    new = np.where(mask, new, np.nan).astype(np.float32)
    old = np.where(mask, old, np.inf).astype(np.float32)

    def total(lp):
        return aggregate_loss(ppo_policy_loss(lp, old, adv, mask).token_loss, mask)

    value, grad = jax.value_and_grad(total)(jnp.asarray(new))
    assert np.isfinite(float(value))
    assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[~mask] == 0)


def test_policy_loss_rejects_bad_arguments():
    new, old, adv, mask = make_batch()
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        ppo_policy_loss(new, old, adv, mask, dual_clip_c=1.0)
    with pytest.raises(ValueError, match="advantages must be"):
        ppo_policy_loss(new, old, np.zeros((B, T + 1)), mask)
    with pytest.raises(ValueError, match="share shape"):
        ppo_policy_loss(new, old[:, :3], adv, mask)


# ---------------------------------------------------------------- KL
def test_kl_estimators_match_reference():
    rng = np.random.default_rng(5)
    logp = rng.normal(-2, 1, size=(3, 6)).astype(np.float32)
    ref = (logp + rng.normal(0, 2, size=(3, 6))).astype(np.float32)
    ref[0, 0] = logp[0, 0] + 40.0  # k3 would overflow without the inner clamp
    d = logp.astype(np.float64) - ref
    neg = np.clip(-d, -20, 20)
    expected = {
        "k1": np.clip(d, -10, 10),
        "abs": np.clip(np.abs(d), -10, 10),
        "k2": np.clip(0.5 * d**2, -10, 10),
        "k3": np.clip(np.exp(neg) - neg - 1, -10, 10),
    }
    for kind, value in expected.items():
        np.testing.assert_allclose(kl_penalty(logp, ref, kind), value, rtol=1e-5, atol=1e-6, err_msg=kind)
    np.testing.assert_allclose(kl_penalty(logp, ref, "low_var_kl"), expected["k3"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(kl_penalty(logp, ref, "k2", clamp=None), 0.5 * d**2, rtol=1e-5)
    k3 = np.asarray(kl_penalty(logp, ref, "k3"))
    assert np.all(k3 >= 0) and k3[0, 0] == 10.0
    np.testing.assert_array_equal(kl_penalty(logp, logp, "k3"), np.zeros_like(logp))


def test_beta_zero_skips_reference():
    logp = jnp.ones((2, 3))
    assert not needs_reference_model(0.0) and needs_reference_model(0.001)
    np.testing.assert_array_equal(kl_term(logp, None, beta=0.0), np.zeros((2, 3)))
    np.testing.assert_array_equal(kl_penalty(logp, None), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="reference logprobs are needed"):
        kl_term(logp, None, beta=0.1)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(logp, logp, "k4")
    np.testing.assert_allclose(kl_term(logp, logp - 1.0, beta=0.5, kind="k1"), np.full((2, 3), 0.5))


# ---------------------------------------------------------------- entropy
def np_entropy(logits):
    z = logits.astype(np.float64)
    m = np.max(z, axis=-1, keepdims=True)
    p = np.exp(z - m)
    p /= p.sum(-1, keepdims=True)
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), axis=-1)


def test_entropy_from_logits_stable_and_chunked():
    rng = np.random.default_rng(7)
    logits = (rng.normal(size=(3, 5, 11)) * 4).astype(np.float32)
    logits[0, 0] *= 1000.0  # huge logits: naive softmax overflows
    logits[1, 1, :5] = -np.inf  # masked vocabulary entries
    expected = np_entropy(logits)
    np.testing.assert_allclose(entropy_from_logits(logits), expected, rtol=1e-4, atol=1e-5)
    chunked = jax.jit(lambda x: entropy_from_logits(x, chunk_size=4))(logits)  # 15 rows: uneven chunks
    np.testing.assert_allclose(chunked, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(entropy_from_logits(np.zeros((2, 8), np.float32)), np.full(2, np.log(8)), rtol=1e-6)
    grad = jax.grad(lambda x: jnp.sum(entropy_from_logits(x)))(jnp.asarray(logits))
    assert np.all(np.isfinite(grad))
    mask = np.array([[1, 1, 0, 0, 0], [0] * 5, [1] * 5], bool)
    np.testing.assert_allclose(
        masked_mean(entropy_from_logits(logits), mask), expected[mask].mean(), rtol=1e-4
    )
    assert float(masked_mean(jnp.ones((2, 2)), jnp.zeros((2, 2)))) == 0.0


# ---------------------------------------------------------------- aggregation
def np_aggregate(loss, mask, mode, num_tokens, num_seqs, norm_length):
    m = mask.astype(np.float64)
    seq_sum = (loss * m).sum(-1)
    if mode == "token-mean":
        return seq_sum.sum() / max(num_tokens, 1)
    if mode == "seq-mean-token-mean":
        return (seq_sum / np.maximum(m.sum(-1), 1)).sum() / max(num_seqs, 1)
    if mode == "seq-mean-token-sum":
        return seq_sum.sum() / max(num_seqs, 1)
    if mode == "token-sum-norm":  # verl's agg_loss("seq-mean-token-sum-norm"): / loss_scale_factor only
        return seq_sum.sum() / norm_length
    assert mode == "seq-mean-token-sum-norm", f"{mode}: registered without a NumPy reference here"
    return seq_sum.sum() / norm_length / max(num_seqs, 1)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_matches_reference(mode):
    _, _, _, mask = make_batch()
    loss = np.random.default_rng(9).normal(size=(B, T)).astype(np.float32)
    loss[~mask] = np.nan  # masked garbage
    counts = loss_counts(mask)
    assert float(counts.num_tokens) == mask.sum() and float(counts.num_seqs) == B - 1  # row 2 is empty
    got = jax.jit(lambda l, m: aggregate_loss(l, m, mode))(loss, mask)
    expected = np_aggregate(np.nan_to_num(loss), mask, mode, mask.sum(), B - 1, T)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    empty = aggregate_loss(jnp.ones((2, 3)), jnp.zeros((2, 3), bool), mode)
    assert float(empty) == 0.0
    with pytest.raises(ValueError, match="unknown loss aggregation mode"):
        aggregate_loss(loss, mask, "token-sum")


@pytest.mark.parametrize("mode", AGG_MODES)
def test_token_weights_reproduce_the_aggregate(mode):
    """Every built-in mode is linear: its per-token weights (the fused head's form of it) give the
    same value as the NumPy reference for any token losses, with global counts."""
    _, _, _, mask = make_batch()
    loss = np.random.default_rng(10).normal(size=(B, T)).astype(np.float32)
    counts = dict(global_num_tokens=50.0, global_num_seqs=9.0)
    weights = np.asarray(token_weights(mask, mode, **counts))
    assert np.all(weights[~mask] == 0)
    expected = np_aggregate(np.where(mask, loss, 0.0), mask, mode, 50.0, 9.0, T)
    np.testing.assert_allclose(np.sum(weights * loss), expected, rtol=1e-5)


def test_token_weights_refuse_a_mode_not_declared_linear(monkeypatch):
    from reagent_jax.rl import aggregation
    modes = Registry("loss aggregation mode")  # a private registry: the global one stays as it is
    modes.register("test-squared-mean")(lambda l, m, c, n: jnp.sum(jnp.where(m, l, 0.0) ** 2))
    monkeypatch.setattr(aggregation, "AGG_MODES", modes)
    with pytest.raises(ValueError, match="not registered linear=True"):
        token_weights(np.ones((2, 3), bool), "test-squared-mean")


def toy_logprobs(w, feats, tokens):
    """Linear 'language model': logits = feats @ w; logprob of the given tokens."""
    logits = feats @ w  # [b, T, V]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]  # [b, T]


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batch_accumulation_equals_full_batch(mode):
    rng = np.random.default_rng(11)
    n, t, d, v = 6, 5, 4, 9
    feats = rng.normal(size=(n, t, d)).astype(np.float32)
    tokens = rng.integers(0, v, size=(n, t)).astype(np.int32)
    w = jnp.asarray(rng.normal(size=(d, v)).astype(np.float32))
    old = np.asarray(toy_logprobs(w * 0.9, feats, tokens))
    ref = np.asarray(toy_logprobs(w * 1.1, feats, tokens))
    adv = rng.normal(size=(n,)).astype(np.float32)
    mask = rng.random((n, t)) > 0.35
    mask[3] = False  # an all-masked row inside one micro-batch
    counts = loss_counts(mask)  # global denominators, computed once on the full batch

    def loss_fn(w, bounds, use_global=True):
        sl = slice(*bounds)
        logp = toy_logprobs(w, feats[sl], tokens[sl])
        token_loss = ppo_policy_loss(logp, old[sl], adv[sl], mask[sl], eps_high=0.28).token_loss
        token_loss = token_loss + kl_term(logp, ref[sl], beta=0.05)
        if not use_global:
            return aggregate_loss(token_loss, mask[sl], mode)
        return aggregate_loss(
            token_loss, mask[sl], mode, global_num_tokens=counts.num_tokens, global_num_seqs=counts.num_seqs
        )

    grad_fn = jax.jit(jax.value_and_grad(loss_fn), static_argnums=(1, 2))
    micro = ((0, 2), (2, 5), (5, 6))  # uneven micro-batches
    full_loss, full_grad = grad_fn(w, (0, n))
    parts = [grad_fn(w, b) for b in micro]
    acc_loss = sum(p[0] for p in parts)
    acc_grad = sum(p[1] for p in parts)
    np.testing.assert_allclose(acc_loss, full_loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(acc_grad, full_grad, rtol=1e-4, atol=1e-6)
    assert float(jnp.abs(full_grad).sum()) > 0
    # without global counts each micro-batch normalises locally and the sum is wrong
    local = sum(loss_fn(w, b, use_global=False) for b in micro)
    if mode != "token-sum-norm":  # the one mode with no batch-dependent denominator
        assert abs(float(local) - float(full_loss)) > 1e-4
