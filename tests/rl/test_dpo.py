"""DPO-family losses against NumPy references of TRL's formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax.rl.dpo import DPO_LOSS_TYPES, dpo_loss


def log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def np_dpo(pc, pr, rc, rr, loss_type, beta, ls, len_c=None, len_r=None):
    pc, pr, rc, rr = (np.asarray(x, np.float64) for x in (pc, pr, rc, rr))
    h = (pc - rc) - (pr - rr)
    if loss_type == "sigmoid":
        return -(1 - ls) * log_sigmoid(beta * h) - ls * log_sigmoid(-beta * h)
    if loss_type == "robust":
        return (-(1 - ls) * log_sigmoid(beta * h) + ls * log_sigmoid(-beta * h)) / (1 - 2 * ls)
    if loss_type == "ipo":
        avg = (pc - rc) / np.maximum(len_c, 1) - (pr - rr) / np.maximum(len_r, 1)
        return (avg - 1 / (2 * beta)) ** 2
    return np.maximum(0.0, 1 - beta * h)


def make_pairs(seed=0, b=6):
    rng = np.random.default_rng(seed)
    len_c = rng.integers(5, 40, size=b).astype(np.float32)
    len_r = rng.integers(5, 40, size=b).astype(np.float32)
    pc = (-len_c * rng.uniform(0.5, 2.0, b)).astype(np.float32)
    pr = (-len_r * rng.uniform(0.5, 2.0, b)).astype(np.float32)
    rc = (pc + rng.normal(0, 3, b)).astype(np.float32)
    rr = (pr + rng.normal(0, 3, b)).astype(np.float32)
    return pc, pr, rc, rr, len_c, len_r


@pytest.mark.parametrize("loss_type", DPO_LOSS_TYPES)
@pytest.mark.parametrize("ls", [0.0, 0.2])
def test_losses_match_reference(loss_type, ls):
    pc, pr, rc, rr, len_c, len_r = make_pairs()
    beta = 0.1 if loss_type != "ipo" else 0.5
    fn = jax.jit(
        lambda *a: dpo_loss(
            *a[:4], loss_type=loss_type, beta=beta, label_smoothing=ls, chosen_lengths=a[4], rejected_lengths=a[5]
        )
    )
    out = fn(pc, pr, rc, rr, len_c, len_r)
    expected = np_dpo(pc, pr, rc, rr, loss_type, beta, ls, len_c, len_r)
    np.testing.assert_allclose(out.losses, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.loss, expected.mean(), rtol=1e-5)


def test_label_smoothing_changes_sigmoid_and_robust_differently():
    pc, pr, rc, rr, *_ = make_pairs(1)
    plain = dpo_loss(pc, pr, rc, rr).losses
    cdpo = dpo_loss(pc, pr, rc, rr, label_smoothing=0.1).losses
    robust = dpo_loss(pc, pr, rc, rr, loss_type="robust", label_smoothing=0.1).losses
    robust0 = dpo_loss(pc, pr, rc, rr, loss_type="robust", label_smoothing=0.0).losses
    np.testing.assert_allclose(robust0, plain, rtol=1e-6)  # ls = 0: both reduce to standard DPO
    assert not np.allclose(cdpo, plain) and not np.allclose(robust, cdpo)
    # at h = 0 (policy == reference) every sigmoid-type loss is log 2 (robust: log 2 exactly too)
    z = np.zeros(3, np.float32)
    np.testing.assert_allclose(dpo_loss(z, z, z, z, label_smoothing=0.3).losses, np.log(2), rtol=1e-6)
    robust_at_zero = dpo_loss(z, z, z, z, loss_type="robust", label_smoothing=0.3).losses
    np.testing.assert_allclose(robust_at_zero, np.log(2), rtol=1e-6)


def test_ipo_uses_token_averaged_logratios():
    # same per-token log-ratio, twice the length: IPO (length-normalised) is unchanged, sigmoid is not
    pc = np.array([-10.0], np.float32)
    pr = np.array([-20.0], np.float32)
    ref_c, ref_r = pc - 2.0, pr + 1.0
    one = dpo_loss(pc, pr, ref_c, ref_r, loss_type="ipo", beta=0.5, chosen_lengths=[10], rejected_lengths=[20])
    two = dpo_loss(
        2 * pc, 2 * pr, 2 * ref_c, 2 * ref_r, loss_type="ipo", beta=0.5, chosen_lengths=[20], rejected_lengths=[40]
    )
    np.testing.assert_allclose(one.loss, two.loss, rtol=1e-6)
    np.testing.assert_allclose(one.loss, (2.0 / 10 - (-1.0) / 20 - 1.0) ** 2, rtol=1e-6)


def test_metrics_gradient_and_nll():
    pc, pr, rc, rr, len_c, len_r = make_pairs(2)
    beta = 0.1
    out = dpo_loss(pc, pr, rc, rr, beta=beta, chosen_lengths=len_c)
    cr, rj = beta * (pc - rc), beta * (pr - rr)
    expected = {
        "rewards/chosen": cr.mean(),
        "rewards/rejected": rj.mean(),
        "rewards/margins": (cr - rj).mean(),
        "rewards/accuracies": (cr > rj).mean(),
        "logps/chosen": pc.mean(),
        "logps/rejected": pr.mean(),
    }
    for key, value in expected.items():
        np.testing.assert_allclose(out.metrics[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
    np.testing.assert_allclose(out.chosen_nll, -pc.sum() / len_c.sum(), rtol=1e-6)
    np.testing.assert_allclose(dpo_loss(pc, pr, rc, rr).chosen_nll, -pc.mean(), rtol=1e-6)
    # d loss / d pc = -beta * sigmoid(-beta h) / B for standard DPO
    grad = jax.grad(lambda x: dpo_loss(x, pr, rc, rr, beta=beta).loss)(jnp.asarray(pc))
    h = (pc - rc) - (pr - rr)
    np.testing.assert_allclose(grad, -beta / (1 + np.exp(beta * h)) / len(pc), rtol=1e-5)


def test_pair_mask_and_micro_batch_sum():
    pc, pr, rc, rr, len_c, len_r = make_pairs(3, b=6)
    mask = np.array([1, 1, 0, 1, 1, 1], bool)
    pc_bad = pc.copy()
    pc_bad[2] = np.nan  # padding pair with garbage
    full = dpo_loss(pc_bad, pr, rc, rr, pair_mask=mask)
    keep = mask.astype(bool)
    expected = np_dpo(pc[keep], pr[keep], rc[keep], rr[keep], "sigmoid", 0.1, 0.0)
    np.testing.assert_allclose(full.loss, expected.mean(), rtol=1e-5)
    assert np.isfinite(float(full.chosen_nll)) and float(full.losses[2]) == 0.0
    np.testing.assert_allclose(full.metrics["logps/chosen"], pc[keep].mean(), rtol=1e-6)
    parts = [
        dpo_loss(pc_bad[s], pr[s], rc[s], rr[s], pair_mask=mask[s], global_num_pairs=keep.sum()).loss
        for s in (slice(0, 2), slice(2, 3), slice(3, 6))
    ]
    np.testing.assert_allclose(sum(parts), full.loss, rtol=1e-6)
    grad = jax.grad(lambda x: dpo_loss(x, pr, rc, rr, pair_mask=mask).loss)(jnp.asarray(pc_bad))
    assert np.all(np.isfinite(grad)) and float(grad[2]) == 0.0


def test_bad_arguments():
    pc, pr, rc, rr, *_ = make_pairs()
    with pytest.raises(ValueError, match="unknown DPO loss_type"):
        dpo_loss(pc, pr, rc, rr, loss_type="kto")
    with pytest.raises(ValueError, match="chosen_lengths and rejected_lengths"):
        dpo_loss(pc, pr, rc, rr, loss_type="ipo")
    with pytest.raises(ValueError, match="0 <= label_smoothing < 0.5"):
        dpo_loss(pc, pr, rc, rr, loss_type="robust", label_smoothing=0.5)
    with pytest.raises(ValueError, match="beta must be > 0"):
        dpo_loss(pc, pr, rc, rr, beta=0.0)
    with pytest.raises(ValueError, match="one shape"):
        dpo_loss(pc, pr[:3], rc, rr)
