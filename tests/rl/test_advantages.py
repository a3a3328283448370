"""Group advantages against a loop-based NumPy reference written after verl's core_algos."""

from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import rl
from reagent_jax.rl.advantages import (
    ADVANTAGES,
    dr_grpo_advantages,
    get_advantage_fn,
    group_ids_from_keys,
    grpo_advantages,
    register_advantage,
    rloo_advantages,
)

EPS = 1e-6


def reference(name, rewards, group_ids, valid=None, eps=EPS):
    """verl's dict-of-lists algorithm, restricted to valid samples; zero-variance groups -> 0."""
    n = len(rewards)
    valid = np.ones(n, bool) if valid is None else np.asarray(valid, bool)
    members = defaultdict(list)
    for i in range(n):
        if valid[i]:
            members[int(group_ids[i])].append(float(rewards[i]))
    adv = np.zeros(n, np.float64)
    for i in range(n):
        if not valid[i]:
            continue
        scores = np.asarray(members[int(group_ids[i])])
        k = len(scores)
        if k >= 2 and scores.max() == scores.min():
            continue  # no signal: exactly zero
        if name == "rloo":
            adv[i] = rewards[i] if k == 1 else rewards[i] - (scores.sum() - rewards[i]) / (k - 1)
            continue
        mean, std = (0.0, 1.0) if k == 1 else (scores.mean(), scores.std(ddof=1))
        adv[i] = (rewards[i] - mean) / (std + eps) if name == "grpo" else rewards[i] - mean
    return adv


def random_case(rng, n, num_groups):
    group_ids = rng.integers(0, num_groups, size=n).astype(np.int32)
    rewards = rng.choice([0.0, 0.3, 1.0, 1.3], size=n).astype(np.float32)
    valid = rng.random(n) > 0.2
    return rewards, group_ids, valid


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_matches_reference_on_random_groupings(name):
    rng = np.random.default_rng(0)
    fn = jax.jit(get_advantage_fn(name))
    for _ in range(6):
        rewards, group_ids, valid = random_case(rng, 24, 7)
        out = fn(rewards, group_ids, valid)
        np.testing.assert_allclose(out.advantages, reference(name, rewards, group_ids, valid), rtol=1e-5, atol=1e-5)
        assert not np.any(np.asarray(out.advantages)[~valid])


def test_one_compilation_serves_every_grouping():
    traces = []

    def counted(rewards, group_ids, valid):
        traces.append(1)
        return grpo_advantages(rewards, group_ids, valid)

    fn = jax.jit(counted)
    rng = np.random.default_rng(1)
    for num_groups in (1, 3, 8, 16):
        rewards, group_ids, valid = random_case(rng, 16, num_groups)
        out = fn(rewards, group_ids, valid)
        np.testing.assert_allclose(out.advantages, reference("grpo", rewards, group_ids, valid), atol=1e-5)
    assert len(traces) == 1


def test_std_is_unbiased_like_torch_std():
    torch = pytest.importorskip("torch")
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 1.0], np.float32)
    out = grpo_advantages(rewards, np.zeros(5, np.int32))
    expected_std = float(torch.std(torch.tensor(rewards)))  # unbiased, as in verl's GRPO
    np.testing.assert_allclose(out.group_std, expected_std, rtol=1e-6)
    np.testing.assert_allclose(out.advantages, (rewards - rewards.mean()) / (expected_std + EPS), rtol=1e-5)


def test_reagent_u_pooled_group_of_unequal_sizes():
    # question 0: 4 initial + 4 refined trajectories pooled; question 1: 3 initial + 1 refined.
    keys = ["q0"] * 8 + ["q1"] * 4
    group_ids = group_ids_from_keys(keys)
    np.testing.assert_array_equal(group_ids, [0] * 8 + [1] * 4)
    rewards = np.array([0, 0, 1, 0, 1, 1, 1, 0, 0.2, 0.5, 0.9, 1.0], np.float32)
    out = grpo_advantages(rewards, group_ids)
    np.testing.assert_allclose(out.advantages, reference("grpo", rewards, group_ids), rtol=1e-5)
    np.testing.assert_array_equal(out.group_size, [8] * 8 + [4] * 4)
    # one normalisation per pooled group: advantages of each group sum to zero
    np.testing.assert_allclose([out.advantages[:8].sum(), out.advantages[8:].sum()], [0, 0], atol=1e-5)


@pytest.mark.parametrize("fn", [grpo_advantages, dr_grpo_advantages, rloo_advantages])
def test_equal_rewards_are_exact_zeros_and_flagged(fn):
    # 0.1 * 3 / 3 != 0.1 in float32; detection must not depend on the mean's rounding.
    rewards = np.array([0.1, 0.1, 0.1, 1.0, 0.0, 0.7, 0.7], np.float32)
    group_ids = np.array([0, 0, 0, 1, 1, 2, 2], np.int32)
    out = jax.jit(fn)(rewards, group_ids)
    assert np.all(np.asarray(out.advantages)[[0, 1, 2, 5, 6]] == 0.0)
    assert np.all(np.asarray(out.advantages)[[3, 4]] != 0.0)
    np.testing.assert_array_equal(out.zero_std, [True, True, True, False, False, True, True])
    assert int(out.num_zero_std_groups) == 2
    assert int(out.num_singleton_groups) == 0


def test_singleton_and_masked_groups_follow_verl():
    rewards = np.array([0.8, 1.0, 0.0, 0.5, 0.25], np.float32)
    group_ids = np.array([0, 1, 1, 2, 2], np.int32)
    valid = np.array([True, True, True, True, False])  # group 2 shrinks to one sample
    for name in ("grpo", "dr_grpo", "rloo"):
        out = ADVANTAGES[name](rewards, group_ids, valid)
        np.testing.assert_allclose(out.advantages, reference(name, rewards, group_ids, valid), rtol=1e-5)
        assert int(out.num_singleton_groups) == 2
        assert int(out.num_zero_std_groups) == 0
        np.testing.assert_array_equal(out.group_size, [1, 2, 2, 1, 0])
    # singleton: mean 0, std 1 -> GRPO advantage is r / (1 + eps)
    out = grpo_advantages(rewards, group_ids, valid)
    np.testing.assert_allclose(out.advantages[0], 0.8 / (1 + EPS), rtol=1e-6)


def test_all_invalid_gives_zeros_not_nan():
    out = jax.jit(grpo_advantages)(np.ones(4, np.float32), np.zeros(4, np.int32), np.zeros(4, bool))
    np.testing.assert_array_equal(out.advantages, np.zeros(4))
    assert int(out.num_zero_std_groups) == 0 and int(out.num_singleton_groups) == 0


def test_rloo_is_leave_one_out_baseline():
    rewards = np.array([1.0, 0.0, 0.5, 0.25], np.float32)
    out = rloo_advantages(rewards, np.zeros(4, np.int32))
    loo = np.array([rewards[i] - np.delete(rewards, i).mean() for i in range(4)])
    np.testing.assert_allclose(out.advantages, loo, rtol=1e-6)


def test_registry_and_bad_input_errors():
    assert get_advantage_fn("grpo") is grpo_advantages and rl.ADVANTAGES["rloo"] is rloo_advantages
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'.*grpo"):
        get_advantage_fn("ppo")
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(lambda *a, **k: None)
    with pytest.raises(ValueError, match=r"group_ids must lie in \[0, 3\)"):
        grpo_advantages(np.ones(3, np.float32), np.array([0, 1, 3], np.int32))
    with pytest.raises(ValueError, match="group_ids must be int"):
        grpo_advantages(np.ones(3, np.float32), np.array([0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="rewards must be"):
        grpo_advantages(np.ones((3, 2), np.float32), np.zeros(3, np.int32))
    # num_groups smaller than N is accepted and used as the static segment count
    out = jax.jit(grpo_advantages, static_argnames="num_groups")(
        jnp.array([1.0, 0.0, 1.0, 0.0]), jnp.array([0, 0, 1, 1]), num_groups=2
    )
    np.testing.assert_allclose(out.advantages, reference("grpo", [1, 0, 1, 0], [0, 0, 1, 1]), rtol=1e-5)
