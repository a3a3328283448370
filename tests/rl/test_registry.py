"""The registries (reagent_jax/registry.py) and the registered policy losses against NumPy references.

Every entry of POLICY_LOSSES has a reference here (a test fails when one is registered without
it); the other registries' entries are checked against NumPy in test_rl_losses.py (KL estimators,
aggregation modes), test_rl_dpo.py and test_rl_advantages.py, and the completeness of each is
asserted below.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import rl
from reagent_jax.rl import ADVANTAGES, AGG_MODES, DPO_LOSS_TYPES, KL_ESTIMATORS, POLICY_LOSSES, Registry
from reagent_jax.rl.aggregation import aggregate_loss
from reagent_jax.pipelines.config_checks import ConfigError, check_train_config

B, T = 6, 7


def test_a_registry_maps_names_and_aliases_and_names_the_known_ones_on_a_miss():
    reg = Registry("widget")
    fn = reg.register("a", "alias_a")(lambda: 1)
    assert reg.get("alias_a") is fn and reg.canonical("alias_a") == "a" and set(reg) == {"a", "alias_a"}
    assert reg.register("a")(fn) is fn  # the same function again: fine
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register("a")(lambda: 2)
    with pytest.raises(ValueError, match=r"unknown widget 'b'; registered: \['a', 'alias_a'\]"):
        reg.get("b")
    reg.register("c", "alias_c", per_token=True)(lambda: 3)
    assert reg.traits("alias_c") == {"per_token": True} and reg.traits("a") == {}
    reg.register("c")(reg.get("c"))  # the same function again keeps its traits
    assert reg.traits("c") == {"per_token": True}
    for registry in (ADVANTAGES, AGG_MODES, DPO_LOSS_TYPES, KL_ESTIMATORS, POLICY_LOSSES):
        with pytest.raises(ValueError, match=f"unknown {registry.kind} 'nope'; registered"):
            registry.get("nope")


def test_the_config_check_reads_the_registries():
    """An entry a user registers is accepted by the config check at once; unknown names list the known ones."""
    import importlib.util
    import os
    spec = importlib.util.spec_from_file_location("q", os.path.join(os.path.dirname(__file__), "..", "..", "configs",
                                                                    "quickstart.py"))
    q = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(q)
    config = q.get_config()
    config.grpo.policy_loss = "my_test_loss"
    with pytest.raises(ConfigError, match="grpo.policy_loss.*use one of vanilla, ppo, gspo, cispo"):
        check_train_config(config, None)
    rl.register_policy_loss("my_test_loss")(rl.ppo_policy_loss)
    try:
        check_train_config(config, None)
    finally:
        POLICY_LOSSES._entries.pop("my_test_loss")  # leave the registry as the other tests expect it


def test_every_registry_entry_has_a_reference_test():
    assert {POLICY_LOSSES.canonical(n) for n in POLICY_LOSSES} == set(REFERENCES)
    assert {KL_ESTIMATORS.canonical(n) for n in KL_ESTIMATORS} == {"k1", "abs", "k2", "k3"}  # test_rl_losses
    assert set(AGG_MODES) == {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
                              "token-sum-norm"}  # test_rl_losses.np_aggregate
    assert set(DPO_LOSS_TYPES) == {"sigmoid", "robust", "ipo", "hinge"}  # test_rl_dpo
    assert set(ADVANTAGES) == {"grpo", "dr_grpo", "rloo"}  # test_rl_advantages


# ---- NumPy references: per-token loss value and d(loss_t)/d(logp_t) ------------------------------------
def np_vanilla(lp, old, adv, mask, eps_low, eps_high, c):
    r = np.exp(np.clip(lp - old, -20, 20))
    a = np.broadcast_to(adv[:, None], lp.shape)
    unclipped, clipped = -a * r, -a * np.clip(r, 1 - eps_low, 1 + eps_high)
    loss1 = np.maximum(unclipped, clipped)
    grad1 = np.where(clipped > unclipped, 0.0, -a * r)
    dual = (a < 0) & (loss1 > -a * c)
    loss = np.where(dual, -a * c, loss1)
    grad = np.where(dual, 0.0, grad1)
    return np.where(mask, loss, 0), np.where(mask, grad, 0)


def np_gspo(lp, old, adv, mask, eps_low, eps_high, c):
    m = mask.astype(np.float64)
    s = np.exp(((lp - old) * m).sum(-1) / np.maximum(m.sum(-1), 1))[:, None]  # [B, 1] sequence ratio
    a = np.broadcast_to(adv[:, None], lp.shape)
    unclipped, clipped = -a * s, -a * np.clip(s, 1 - eps_low, 1 + eps_high)
    loss = np.maximum(unclipped, clipped)
    grad = np.where(clipped > unclipped, 0.0, -a * s)  # d/dlogp_t of the token's copy of the sequence term
    return np.where(mask, loss, 0), np.where(mask, grad, 0)


def np_cispo(lp, old, adv, mask, eps_low, eps_high, c):
    w = np.clip(np.exp(lp - old), 1 - eps_low, 1 + eps_high)
    a = np.broadcast_to(adv[:, None], lp.shape)
    return np.where(mask, -a * w, 0), np.where(mask, -a * w, 0)


REFERENCES = {"vanilla": np_vanilla, "gspo": np_gspo, "cispo": np_cispo}


def batch(seed, spread=0.4):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2.0, 0.5, (B, T))
    lp = old + rng.normal(0.0, spread, (B, T))  # ratios on both sides of every clip bound
    adv = rng.normal(size=(B,))
    mask = rng.random((B, T)) > 0.25
    mask[-1] = False  # an all-padding row
    lp[~mask] = np.nan  # padding garbage must not reach the loss
    return lp.astype(np.float32), old.astype(np.float32), adv.astype(np.float32), mask


@pytest.mark.parametrize("name,clip", [("vanilla", (0.2, 0.28)), ("gspo", (3e-2, 4e-2)), ("cispo", (1.0, 0.28))])
@pytest.mark.parametrize("seed", [0, 1])
def test_policy_losses_and_gradients_equal_their_numpy_references(name, clip, seed):
    lp, old, adv, mask = batch(seed, spread=0.15 if name == "gspo" else 0.4)
    eps_low, eps_high = clip
    fn = POLICY_LOSSES.get(name)
    out = jax.jit(lambda x: fn(x, old, adv, mask, eps_low=eps_low, eps_high=eps_high, dual_clip_c=3.0))(lp)
    clean = np.where(mask, lp, old).astype(np.float64)
    want_loss, want_grad = REFERENCES[name](clean, old.astype(np.float64), adv.astype(np.float64), mask,
                                            eps_low, eps_high, 3.0)
    np.testing.assert_allclose(out.token_loss, want_loss, rtol=1e-5, atol=1e-6)
    grad = jax.grad(lambda x: jnp.sum(fn(x, old, adv, mask, eps_low=eps_low, eps_high=eps_high,
                                         dual_clip_c=3.0).token_loss))(lp)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)
    frac = float(out.metrics["pg_clipfrac"])
    assert 0.0 < frac < 1.0, f"{name}: the batch should exercise both clipped and unclipped tokens, got {frac}"
    np.testing.assert_allclose(out.metrics["ppo_kl"], np.mean((old - clean)[mask]), rtol=1e-5, atol=1e-7)


def test_gspo_token_with_sequence_mean_is_the_sequence_level_objective():
    """GSPO's objective is per sequence: mean_i max(-A s_i, -A clip(s_i)), s_i the geometric-mean
    ratio. Its per-token form aggregated with seq-mean-token-mean has that value and gradient."""
    lp, old, adv, mask = batch(3, spread=0.15)
    m = jnp.asarray(mask, jnp.float32)

    def sequence_objective(x):
        s = jnp.exp(jnp.sum(jnp.where(mask, x - old, 0.0), -1) / jnp.maximum(m.sum(-1), 1))  # [B]
        per_seq = jnp.maximum(-adv * s, -adv * jnp.clip(s, 1 - 3e-2, 1 + 4e-2))
        valid = m.sum(-1) > 0
        return jnp.sum(jnp.where(valid, per_seq, 0.0)) / jnp.sum(valid)

    def token_form(x):
        out = rl.gspo_policy_loss(x, old, adv, mask, eps_low=3e-2, eps_high=4e-2)
        return aggregate_loss(out.token_loss, mask, "seq-mean-token-mean")

    clean = jnp.where(mask, lp, old)
    clipfrac = float(rl.gspo_policy_loss(lp, old, adv, mask, eps_low=3e-2, eps_high=4e-2).metrics["pg_clipfrac"])
    assert 0.0 < clipfrac < 1.0  # some sequences clipped (no gradient), some not
    np.testing.assert_allclose(token_form(lp), sequence_objective(clean), rtol=1e-5)
    np.testing.assert_allclose(jax.grad(token_form)(lp), jnp.where(mask, jax.grad(sequence_objective)(clean), 0.0),
                               rtol=1e-5, atol=1e-7)
