"""Group-relative outcome advantages (GRPO, Dr. GRPO, RLOO) over arbitrary groupings.

Groups are segment ids, not a fixed [num_prompts, n] grid: Reagent-U pools a question's initial
and critique-refined trajectories into one group, and filtering can leave groups of any size. A
jitted estimator therefore handles every grouping of a fixed number of samples ``N`` with one
compilation:

    rewards   float[N]   one scalar outcome reward per trajectory
    group_ids int[N]     dense ids in [0, num_groups); ``group_ids_from_keys`` makes them
    valid     bool[N]    optional; invalid samples (padding, dropped) join no group and get 0

Conventions (matching verl's ``compute_*_outcome_advantage``):
  * std is the *sample* (unbiased, ddof=1) standard deviation, as ``torch.std`` in verl's GRPO.
  * A group of one valid sample has mean 0 and std 1 (verl), so its advantage is its reward
    (divided by 1 + eps for GRPO). Such groups are counted in ``num_singleton_groups``.
  * A group of >= 2 samples whose rewards are all equal has no learning signal: detected exactly
    (max == min, immune to rounding in the mean), its advantages are exactly 0, and it is flagged
    in ``zero_std`` / counted in ``num_zero_std_groups``.
  * RLOO: A_i = r_i - mean_{j != i} r_j = (r_i - mean) * n / (n - 1).
  * Rewards of valid samples must be finite: called eagerly, a NaN/inf reward raises a ValueError
    naming the sample; under ``jit`` it cannot be checked and makes its group's advantages NaN.
  * Mean and std are computed without overflow or underflow for any finite rewards (deviations
    are rescaled by the group's largest one before squaring), so rewards of 1e20 or 1e-30 work.

Register more estimators with ``@register_advantage("name")``; look them up with
``get_advantage_fn(name)`` or ``ADVANTAGES[name]``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from reagent_jax.registry import Registry


class GroupAdvantages(NamedTuple):
    advantages: jax.Array  # [N] float32, 0 for invalid samples
    group_mean: jax.Array  # [N] float32, the baseline mean of each sample's group
    group_std: jax.Array  # [N] float32, unbiased std of each sample's group (1 for singletons)
    group_size: jax.Array  # [N] int32, valid samples in each sample's group (0 if invalid)
    zero_std: jax.Array  # [N] bool, sample's group has >= 2 valid samples, all equal
    num_zero_std_groups: jax.Array  # [] int32
    num_singleton_groups: jax.Array  # [] int32


AdvantageFn = Callable[..., GroupAdvantages]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")
register_advantage = ADVANTAGES.register  # @register_advantage("name")
get_advantage_fn = ADVANTAGES.get  # ValueError listing the known names for an unknown one


def group_ids_from_keys(keys: Sequence[Hashable]) -> np.ndarray:
    """Dense int32 group ids [N] from arbitrary keys (e.g. question uids), in first-seen order."""
    index: dict[Hashable, int] = {}
    return np.asarray([index.setdefault(k, len(index)) for k in keys], dtype=np.int32)


class _GroupStats(NamedTuple):
    rewards: jax.Array  # [N] float32, 0 where invalid
    valid: jax.Array  # [N] bool
    size: jax.Array  # [N] float32
    mean: jax.Array  # [N] float32 (0 for singletons)
    std: jax.Array  # [N] float32 unbiased (1 for singletons)
    zero_std: jax.Array  # [N] bool
    num_zero_std_groups: jax.Array
    num_singleton_groups: jax.Array


def _group_stats(rewards, group_ids, valid, num_groups) -> _GroupStats:
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be [N], got shape {rewards.shape}")
    n = rewards.shape[0]
    group_ids = jnp.asarray(group_ids)
    if group_ids.shape != (n,) or not jnp.issubdtype(group_ids.dtype, jnp.integer):
        raise ValueError(f"group_ids must be int[{n}], got {group_ids.dtype}{list(group_ids.shape)}")
    num_groups = n if num_groups is None else int(num_groups)
    if not isinstance(group_ids, jax.core.Tracer) and n:
        lo, hi = int(jnp.min(group_ids)), int(jnp.max(group_ids))
        if lo < 0 or hi >= num_groups:
            raise ValueError(
                f"group_ids must lie in [0, {num_groups}), got range [{lo}, {hi}]; "
                "use group_ids_from_keys() or pass num_groups"
            )
    valid = jnp.ones((n,), bool) if valid is None else jnp.asarray(valid).astype(bool)
    if valid.shape != (n,):
        raise ValueError(f"valid must be bool[{n}], got shape {valid.shape}")
    _check_finite(rewards, valid, group_ids)

    seg = dict(segment_ids=group_ids, num_segments=num_groups)
    r = jnp.where(valid, rewards, 0.0)
    w = valid.astype(jnp.float32)
    count = jax.ops.segment_sum(w, **seg)  # [G]
    # r / count summed, not sum(r) / count: partial sums stay within the rewards' range.
    mean_g = jax.ops.segment_sum(r / jnp.maximum(count, 1.0)[group_ids], **seg)  # [G]
    dev = jnp.where(valid, r - mean_g[group_ids], 0.0)
    # Square deviations relative to the group's largest one: dev**2 would overflow float32 for
    # |dev| > ~1e19 (std inf, advantages silently 0) and underflow to 0 for |dev| < ~1e-19.
    scale_g = jax.ops.segment_max(jnp.abs(dev), **seg)
    scale_g = jnp.where((count >= 2) & (scale_g > 0), scale_g, 1.0)  # [G]
    unit = dev / scale_g[group_ids]
    var_unit_g = jax.ops.segment_sum(unit * unit, **seg) / jnp.maximum(count - 1.0, 1.0)  # unbiased
    r_max = jax.ops.segment_max(jnp.where(valid, r, -jnp.inf), **seg)
    r_min = jax.ops.segment_min(jnp.where(valid, r, jnp.inf), **seg)
    multi = count >= 2  # [G]
    zero_g = multi & (r_max == r_min)
    single_g = count == 1

    size = count[group_ids]
    mean = jnp.where(size >= 2, mean_g[group_ids], 0.0)
    std = jnp.where(size >= 2, (scale_g * jnp.sqrt(var_unit_g))[group_ids], 1.0)
    return _GroupStats(
        rewards=r,
        valid=valid,
        size=size,
        mean=mean,
        std=std,
        zero_std=valid & zero_g[group_ids],
        num_zero_std_groups=jnp.sum(zero_g).astype(jnp.int32),
        num_singleton_groups=jnp.sum(single_g).astype(jnp.int32),
    )


def _check_finite(rewards: jax.Array, valid: jax.Array, group_ids: jax.Array) -> None:
    """ValueError naming the first valid sample with a NaN/inf reward (skipped under jit)."""
    if any(isinstance(x, jax.core.Tracer) for x in (rewards, valid, group_ids)):
        return
    bad = np.flatnonzero(np.asarray(valid) & ~np.isfinite(np.asarray(rewards)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"rewards must be finite; {bad.size} valid sample(s) are not, first rewards[{i}] = "
            f"{float(rewards[i])} (group {int(group_ids[i])}); fix the reward or mark the sample invalid"
        )


def _finish(stats: _GroupStats, adv: jax.Array) -> GroupAdvantages:
    adv = jnp.where(stats.valid & ~stats.zero_std, adv, 0.0)
    return GroupAdvantages(
        advantages=adv,
        group_mean=stats.mean,
        group_std=stats.std,
        group_size=jnp.where(stats.valid, stats.size, 0.0).astype(jnp.int32),
        zero_std=stats.zero_std,
        num_zero_std_groups=stats.num_zero_std_groups,
        num_singleton_groups=stats.num_singleton_groups,
    )


@register_advantage("grpo")
def grpo_advantages(
    rewards: jax.Array,  # [N]
    group_ids: jax.Array,  # [N] int
    valid: jax.Array | None = None,  # [N] bool
    *,
    num_groups: int | None = None,  # static; default N
    epsilon: float = 1e-6,
) -> GroupAdvantages:
    """GRPO: (r - group mean) / (unbiased group std + epsilon)."""
    s = _group_stats(rewards, group_ids, valid, num_groups)
    return _finish(s, (s.rewards - s.mean) / (s.std + epsilon))


@register_advantage("dr_grpo")
def dr_grpo_advantages(
    rewards: jax.Array,  # [N]
    group_ids: jax.Array,  # [N] int
    valid: jax.Array | None = None,  # [N] bool
    *,
    num_groups: int | None = None,
    epsilon: float = 1e-6,  # unused; accepted so every estimator shares one signature
) -> GroupAdvantages:
    """Dr. GRPO: r - group mean, no std normalisation (verl's norm_adv_by_std_in_grpo=False)."""
    del epsilon
    s = _group_stats(rewards, group_ids, valid, num_groups)
    return _finish(s, s.rewards - s.mean)


@register_advantage("rloo")
def rloo_advantages(
    rewards: jax.Array,  # [N]
    group_ids: jax.Array,  # [N] int
    valid: jax.Array | None = None,  # [N] bool
    *,
    num_groups: int | None = None,
    epsilon: float = 1e-6,  # unused
) -> GroupAdvantages:
    """RLOO: r_i minus the mean of the other samples of its group; singletons keep r_i."""
    del epsilon
    s = _group_stats(rewards, group_ids, valid, num_groups)
    scale = jnp.where(s.size >= 2, s.size / jnp.maximum(s.size - 1.0, 1.0), 1.0)
    return _finish(s, (s.rewards - s.mean) * scale)
