"""Edge cases of the RL kernels against float64 NumPy references: extreme and non-finite rewards,
bfloat16 inputs, clip bounds, KL/entropy stability, DPO gradients, and batch-shape errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from reagent_jax import models
from reagent_jax.rl import objectives, train_step as ts
from reagent_jax.rl.advantages import ADVANTAGES, grpo_advantages
from reagent_jax.rl.aggregation import AGG_MODES, aggregate_loss
from reagent_jax.rl.dpo import dpo_loss
from reagent_jax.rl.kl import KL_ESTIMATORS, entropy_from_logits, kl_penalty
from reagent_jax.rl.policy_loss import ppo_policy_loss
from tests.rl.test_advantages import reference as np_advantages
from tests.rl.test_losses import np_aggregate, np_entropy, np_policy_loss

CFG = models.preset("tiny", compute_dtype="float32", num_layers=1)


# ---------------------------------------------------------------- advantages
@pytest.mark.parametrize("scale", [1e-30, 1e-3, 1.0, 1e6, 1e20, 1e30])
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_advantages_at_any_reward_scale(name, scale):
    base = np.array([0.0, 1.0, 0.3, 1.0, 0.5, -0.7, 0.2, 0.9], np.float64)
    rewards = (base * scale).astype(np.float32)
    group_ids = np.array([0, 0, 0, 1, 1, 2, 3, 3], np.int32)  # groups of 3, 2, 1 and 2
    out = ADVANTAGES[name](rewards, group_ids)
    r64 = rewards.astype(np.float64)
    np.testing.assert_allclose(out.advantages, np_advantages(name, r64, group_ids), rtol=1e-5, atol=1e-30 * scale)
    assert np.all(np.isfinite(out.advantages)) and np.all(np.isfinite(out.group_std))
    stds = [r64[:3].std(ddof=1), r64[3:5].std(ddof=1), 1.0, r64[6:].std(ddof=1)]
    np.testing.assert_allclose(out.group_std, np.array(stds)[group_ids], rtol=1e-5)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_reward_is_a_clear_error(bad):
    rewards = np.array([1.0, 0.0, 0.5, bad], np.float32)
    group_ids = np.array([0, 0, 1, 1], np.int32)
    with pytest.raises(ValueError, match=r"rewards must be finite.*rewards\[3\] = .*\(group 1\)"):
        grpo_advantages(rewards, group_ids)
    # an invalid (masked) sample may hold anything: it joins no group
    out = grpo_advantages(rewards, group_ids, np.array([True, True, True, False]))
    assert np.all(np.isfinite(out.advantages)) and float(out.advantages[3]) == 0.0


# ---------------------------------------------------------------- KL and entropy
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_kl_estimators_in_float32_for_small_and_large_gaps(dtype):
    logp = jnp.asarray([[-6.0, -3.0, -1.0, -2.0, -0.5, -4.0]], dtype)
    gap = jnp.asarray([[3e-2, 1e-2, -2e-2, 1e-4, 30.0, -30.0]], dtype)
    ref = (logp - gap).astype(dtype)
    d = np.asarray(logp, np.float64) - np.asarray(ref, np.float64)  # what the inputs really encode
    neg = np.clip(-d, -20, 20)
    expected = {"k1": d, "abs": np.abs(d), "k2": 0.5 * d**2, "k3": np.exp(neg) - neg - 1}
    for kind in ("k1", "abs", "k2", "k3"):
        got = kl_penalty(logp, ref, kind)
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(got, np.clip(expected[kind], -10, 10), rtol=1e-4, err_msg=kind)
    for kind in KL_ESTIMATORS:  # identical policies: exactly zero
        assert np.all(np.asarray(kl_penalty(logp, logp, kind)) == 0.0), kind


def test_k3_gradient_matches_analytic():
    logp = jnp.asarray([-2.0, -1.0, -3.0, -0.1], jnp.float32)
    ref = jnp.asarray([-2.5, -0.2, -3.0, -5.0], jnp.float32)
    grad = jax.grad(lambda x: jnp.sum(kl_penalty(x, ref, "k3", clamp=None)))(logp)
    d = np.asarray(logp, np.float64) - np.asarray(ref, np.float64)
    np.testing.assert_allclose(grad, 1.0 - np.exp(-d), rtol=1e-5, atol=1e-7)  # d/dlogp of exp(-d) + d - 1


@pytest.mark.parametrize("offset", [0.0, 1e3, 3e4])
def test_entropy_is_exact_for_large_logits(offset):
    rng = np.random.default_rng(3)
    logits = (rng.normal(size=(4, 64)) * 3 + offset).astype(np.float32)
    logits[1, :8] = -np.inf
    np.testing.assert_allclose(entropy_from_logits(logits), np_entropy(logits), rtol=1e-4, atol=2e-5)
    bf16 = jnp.asarray(logits, jnp.bfloat16)
    np.testing.assert_allclose(entropy_from_logits(bf16), np_entropy(np.asarray(bf16, np.float32)), rtol=1e-4,
                               atol=2e-5)


# ---------------------------------------------------------------- aggregation
@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (2, 40000)])
def test_aggregate_bfloat16_accumulates_in_float32(mode, shape):
    rng = np.random.default_rng(1)
    loss = jnp.asarray(rng.uniform(0.5, 1.5, size=shape), jnp.bfloat16)
    mask = rng.random(shape) > 0.3
    mask[0, 0] = True
    got = aggregate_loss(loss, mask, mode)
    values = np.asarray(loss, np.float64)
    expected = np_aggregate(values, mask, mode, mask.sum(), mask.any(-1).sum(), shape[1])
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert float(aggregate_loss(loss, np.zeros(shape, bool), mode)) == 0.0  # all-zero mask


def test_aggregate_rejects_non_positive_norm_length():
    with pytest.raises(ValueError, match="norm_length must be > 0"):
        aggregate_loss(jnp.ones((2, 3)), jnp.ones((2, 3)), "seq-mean-token-sum-norm", norm_length=0)


# ---------------------------------------------------------------- policy loss
@pytest.mark.parametrize("eps_low,eps_high,c", [(0.2, 0.2, None), (0.2, 0.28, 3.0), (0.1, 0.5, 1.5)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_policy_loss_at_and_beyond_the_clip_bounds(eps_low, eps_high, c, dtype):
    bounds = np.asarray([1 - eps_low, 1 + eps_high] + ([c] if c else []))
    ratios = np.concatenate([[0.01, 0.5, 1.0, 2.0, 10.0], bounds, bounds * 0.999, bounds * 1.001])
    lp = jnp.asarray(np.log(np.tile(ratios, (2, 1))), dtype)
    old = np.zeros(lp.shape, np.float32)
    adv = np.array([1.3, -0.7], np.float32)
    mask = np.ones(lp.shape, bool)
    kw = dict(eps_low=eps_low, eps_high=eps_high, dual_clip_c=c)
    out = ppo_policy_loss(lp, old, adv, mask, **kw)
    lp64 = np.asarray(lp, np.float64)
    ref, _ = np_policy_loss(lp64, old, adv, mask, eps_low, eps_high, c or np.inf)
    np.testing.assert_allclose(out.token_loss, ref, rtol=1e-5, atol=1e-6)
    # On a bound both terms tie and the clip metrics depend on rounding: compare them off the kinks.
    r = np.exp(lp64)
    off_kinks = np.all(np.abs(r[..., None] - bounds) > 1e-5 * r[..., None], axis=-1)
    assert off_kinks.sum() >= 10
    masked = ppo_policy_loss(lp, old, adv, off_kinks, **kw)
    _, metrics = np_policy_loss(lp64, old, adv, off_kinks, eps_low, eps_high, c or np.inf)
    for key, value in metrics.items():
        np.testing.assert_allclose(masked.metrics[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    # gradient off the kinks: -A * r where the unclipped term is active, else 0
    a = adv[:, None]
    active = np.where(a > 0, r < 1 + eps_high, (r > 1 - eps_low) & (r < (c or np.inf)))
    grad = jax.grad(lambda x: ppo_policy_loss(x, old, adv, mask, **kw).token_loss.sum())(lp.astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(grad)[off_kinks], np.where(active, -a * r, 0.0)[off_kinks], rtol=1e-4,
                               atol=1e-6)
    assert np.any(np.where(active, -a * r, 0.0)[off_kinks] != 0) and np.any(~active[off_kinks])


# ---------------------------------------------------------------- DPO
def np_dpo_grad(h, loss_type, beta, ls):
    """d loss / d h of one pair, h = chosen log-ratio minus rejected log-ratio."""
    sig = lambda x: 1.0 / (1.0 + np.exp(-x))
    if loss_type == "sigmoid":
        return -beta * ((1 - ls) * sig(-beta * h) - ls * sig(beta * h))
    if loss_type == "robust":
        return -beta * ((1 - ls) * sig(-beta * h) + ls * sig(beta * h)) / (1 - 2 * ls)
    return np.where(1 - beta * h > 0, -beta, 0.0)  # hinge


@pytest.mark.parametrize("loss_type", ["sigmoid", "robust", "hinge", "ipo"])
@pytest.mark.parametrize("beta,ls", [(0.1, 0.0), (0.5, 0.2)])
def test_dpo_gradients_reference_free_and_equal_pairs(loss_type, beta, ls):
    pc = np.array([-12.0, -30.0, -7.0, -20.0], np.float32)
    pr = np.array([-15.0, -10.0, -7.0, -21.0], np.float32)  # pair 2: chosen == rejected
    zeros = np.zeros(4, np.float32)  # reference-free: the reference log-probs are 0
    len_c = np.array([4.0, 10.0, 5.0, 8.0], np.float32)
    len_r = np.array([5.0, 4.0, 5.0, 8.0], np.float32)
    kw = dict(loss_type=loss_type, beta=beta, label_smoothing=ls, chosen_lengths=len_c, rejected_lengths=len_r)
    grad = jax.grad(lambda x: dpo_loss(x, pr, zeros, zeros, **kw).loss)(jnp.asarray(pc))
    if loss_type == "ipo":
        avg = pc / len_c - pr / len_r
        expected = 2 * (avg - 1 / (2 * beta)) / len_c / 4
        np.testing.assert_allclose(dpo_loss(pc, pr, zeros, zeros, **kw).losses[2], (1 / (2 * beta)) ** 2, rtol=1e-6)
    else:
        expected = np_dpo_grad(pc.astype(np.float64) - pr, loss_type, beta, ls) / 4
        at_zero = dpo_loss(pc, pr, zeros, zeros, **kw).losses[2]  # h = 0
        np.testing.assert_allclose(at_zero, 1.0 if loss_type == "hinge" else np.log(2), rtol=1e-6)
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-8)


# ---------------------------------------------------------------- batch shapes
def grpo_batch(b=4, t=6):
    rng = np.random.default_rng(0)
    return {"tokens": rng.integers(0, CFG.vocab_size, (b, t)), "attention_mask": np.ones((b, t), np.int32),
            "loss_mask": np.ones((b, t), np.int32), "old_logprobs": np.zeros((b, t), np.float32),
            "ref_logprobs": np.zeros((b, t), np.float32), "advantages": np.ones((b,), np.float32)}


def dpo_batch(p=2, t=6):
    b = grpo_batch(2 * p, t)
    return {k: b[k].reshape(p, 2, t) for k in ("tokens", "attention_mask", "loss_mask")} | {
        "ref_logps": np.zeros((p, 2), np.float32), "pair_mask": np.ones((p,), bool)}


BAD_BATCHES = [
    ("sft", lambda b: dict(b, loss_mask=b["loss_mask"][:1]), r"SFT batch\['loss_mask'\] has shape \[1, 6\]"),
    ("sft", lambda b: dict(b, loss_mask=b["loss_mask"][:, :1]), r"SFT batch\['loss_mask'\] has shape \[4, 1\]"),
    ("sft", lambda b: {k: v for k, v in b.items() if k != "attention_mask"}, r"lacks \['attention_mask'\]"),
    ("grpo", lambda b: dict(b, advantages=b["advantages"][:, None]), r"'advantages'.*expected \[B\] or \[B, T\]"),
    ("grpo", lambda b: dict(b, old_logprobs=b["old_logprobs"][:, 1:]), r"'old_logprobs'\] has shape \[4, 5\]"),
    ("grpo", lambda b: {k: v for k, v in b.items() if k != "ref_logprobs"}, r"GRPO batch lacks \['ref_logprobs'\]"),
    ("dpo", lambda b: dict(b, ref_logps=b["ref_logps"][:, :1]), r"'ref_logps'\] has shape \[2, 1\], expected \[P, 2\]"),
    ("dpo", lambda b: dict(b, pair_mask=np.ones(3, bool)), r"'pair_mask'\] has shape \[3\], expected \[P\] with P=2"),
]


@pytest.mark.parametrize("kind,corrupt,message", BAD_BATCHES, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_BATCHES)])
def test_objectives_name_the_bad_batch_key(kind, corrupt, message):
    obj, batch = {"sft": (objectives.SFTObjective(CFG), grpo_batch()),
                  "grpo": (objectives.GRPOObjective(CFG, beta=0.1), grpo_batch()),
                  "dpo": (objectives.DPOObjective(CFG), dpo_batch())}[kind]
    obj.counts(batch)  # the well-formed batch passes
    with pytest.raises(ValueError, match=message):
        obj.counts(corrupt(batch))
    # beta == 0 never reads ref_logprobs, so it may be absent
    objectives.GRPOObjective(CFG).counts({k: v for k, v in grpo_batch().items() if k != "ref_logprobs"})


class _LinearObjective:
    """A tiny objective (no model) for exercising the train step's batch handling."""

    def counts(self, batch):
        return {"n": jnp.asarray(batch["x"].shape[0], jnp.float32)}

    def loss(self, params, mb, counts):
        value = (jnp.sum(mb["x"] @ params["w"]) + jnp.sum(mb["y"])) / counts["n"]
        return value, {"value": value}


def test_train_step_rejects_mismatched_leading_sizes():
    opt = optax.sgd(0.1)
    params = {"w": jnp.ones((3,), jnp.float32)}
    good = {"x": np.ones((4, 3), np.float32), "y": np.ones((4,), np.float32)}
    step = ts.make_train_step(_LinearObjective(), opt, num_micro_batches=2)
    _, metrics = step(ts.init_state(params, opt), good)
    np.testing.assert_allclose(metrics["train/loss"], (4 * 3 + 4) / 4, rtol=1e-6)
    for bad in (dict(good, y=np.ones((2,), np.float32)), dict(good, y=np.float32(1.0))):
        with pytest.raises(ValueError, match="same leading"):
            ts.make_train_step(_LinearObjective(), opt)(ts.init_state(params, opt), bad)
    with pytest.raises(ValueError, match="not divisible by 3 micro-batches"):
        ts.make_train_step(_LinearObjective(), opt, num_micro_batches=3)(ts.init_state(params, opt), good)
