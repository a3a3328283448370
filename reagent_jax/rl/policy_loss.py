"""Per-token policy-gradient losses, registered in ``POLICY_LOSSES`` (verl's ``register_policy_loss``).

Every loss takes (logprobs, old_logprobs, advantages, loss_mask, *, eps_low, eps_high,
dual_clip_c, log_ratio_clamp) and returns per-token losses (zero off the mask), to be reduced with
``aggregate_loss`` using global counts, plus verl's metrics as masked means over this batch. With
``r = exp(clip(logp - old_logp, +-log_ratio_clamp))`` and ``A`` the advantage:

  vanilla (ppo)  PPO clip (verl's ``compute_policy_loss_vanilla``) with clip-higher (DAPO) and dual clip:
                   loss1 = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))
                   loss  = min(loss1, -A * c) where A < 0 (dual clip, c > 1), loss1 where A >= 0
  gspo           GSPO (Qwen team, "Group Sequence Policy Optimization"): one importance ratio per
                 sequence, s = exp(mean_t(logp - old_logp)), clipped as PPO clips r; per token
                 s_t = sg(s) * exp(logp_t - sg(logp_t)) (GSPO-token: the value s, the gradient
                 s * grad logp_t). The paper's clip ranges are ~1e-3 (eps_low 3e-4, eps_high 4e-4)
                 and its aggregation seq-mean-token-mean; no dual clip.
  cispo          CISPO (MiniMax-M1): the importance weight is clipped and detached, never the
                 token's gradient: loss = -A * sg(clip(r, 1 - eps_low, 1 + eps_high)) * r / sg(r)
                 (value -A * clip(r), gradient -A * clip(r) * grad logp). MiniMax clips only from
                 above (a large eps_low).

Traits: ``per_token=True`` declares that each token's loss depends on that token's inputs only
(vanilla, cispo; not gspo): the trainer may then take the output head's gradient chunk by chunk in
the forward pass (`models.token_loss_and_logprobs`). Register your own loss with it only if true.

Metrics: pg_clipfrac (tokens whose ratio the clip bounds), pg_clipfrac_lower (tokens where the
dual clip bound is active, vanilla only), ppo_kl = mean(old_logp - logp), the approximate
KL(old || new). They are means over this (micro-)batch; average them weighted by token counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from reagent_jax.rl.aggregation import masked_mean
from reagent_jax.registry import Registry


class PolicyLossOutput(NamedTuple):
    token_loss: jax.Array  # [B, T] float32, 0 where loss_mask is 0
    metrics: dict[str, jax.Array]  # scalars: pg_clipfrac, pg_clipfrac_lower, ppo_kl


PolicyLossFn = Callable[..., PolicyLossOutput]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register  # @register_policy_loss("name")


def _prepare(logprobs, old_logprobs, advantages, loss_mask, eps_low, eps_high, log_ratio_clamp):
    """Shape checks; (mask [B, T] bool, log-ratio [B, T] clamped and 0 off the mask, advantages [B, T])."""
    if logprobs.ndim != 2 or logprobs.shape != old_logprobs.shape or logprobs.shape != jnp.shape(loss_mask):
        raise ValueError(
            "logprobs, old_logprobs and loss_mask must share shape [B, T]; got "
            f"{logprobs.shape}, {old_logprobs.shape}, {jnp.shape(loss_mask)}"
        )
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    advantages = jnp.asarray(advantages, jnp.float32)
    if advantages.ndim == 1:
        if advantages.shape[0] != logprobs.shape[0]:
            raise ValueError(f"advantages [B] has B={advantages.shape[0]}, logprobs has B={logprobs.shape[0]}")
        advantages = jnp.broadcast_to(advantages[:, None], logprobs.shape)  # [B, T]
    elif advantages.shape != logprobs.shape:
        raise ValueError(f"advantages must be [B] or [B, T]={logprobs.shape}, got {advantages.shape}")
    mask = jnp.asarray(loss_mask).astype(bool)  # [B, T]
    # Zero the log-ratio off the mask first so padding garbage (NaN/inf) cannot reach exp or grads.
    log_ratio = jnp.where(mask, logprobs.astype(jnp.float32) - old_logprobs.astype(jnp.float32), 0.0)
    log_ratio = jnp.clip(log_ratio, -log_ratio_clamp, log_ratio_clamp)
    return mask, log_ratio, jnp.where(mask, advantages, 0.0)


def _clipped_surrogate(ratio, adv, eps_low, eps_high):
    """max(-A * ratio, -A * clip(ratio)) and where the clipped term is the active one."""
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return jnp.maximum(unclipped, clipped), clipped > unclipped


@register_policy_loss("vanilla", "ppo", per_token=True)
def ppo_policy_loss(
    logprobs: jax.Array,  # [B, T] logprobs of the sampled tokens under the policy being trained
    old_logprobs: jax.Array,  # [B, T] logprobs under the policy that sampled them (no gradient)
    advantages: jax.Array,  # [B] sequence-level or [B, T] token-level
    loss_mask: jax.Array,  # [B, T] 1 on tokens the policy sampled
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip_c: float | None = 3.0,
    log_ratio_clamp: float = 20.0,
) -> PolicyLossOutput:
    """PPO's clipped surrogate per token; see the module docstring for the formula."""
    if dual_clip_c is not None and not dual_clip_c > 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (or None to disable), got {dual_clip_c}")
    mask, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, loss_mask, eps_low, eps_high,
                                    log_ratio_clamp)
    loss1, was_clipped = _clipped_surrogate(jnp.exp(log_ratio), adv, eps_low, eps_high)
    metrics = {"pg_clipfrac": masked_mean(was_clipped.astype(jnp.float32), mask)}
    if dual_clip_c is not None:
        bound = -adv * dual_clip_c
        loss = jnp.where(adv < 0, jnp.minimum(loss1, bound), loss1)
        lower = jnp.logical_and(loss1 > bound, adv < 0)
        metrics["pg_clipfrac_lower"] = masked_mean(lower.astype(jnp.float32), mask)
    else:
        loss = loss1
        metrics["pg_clipfrac_lower"] = jnp.zeros((), jnp.float32)
    metrics["ppo_kl"] = masked_mean(-log_ratio, mask)
    return PolicyLossOutput(token_loss=jnp.where(mask, loss, 0.0), metrics=metrics)


@register_policy_loss("gspo")
def gspo_policy_loss(logprobs, old_logprobs, advantages, loss_mask, *, eps_low: float = 3e-4,
                     eps_high: float = 4e-4, dual_clip_c: float | None = None,
                     log_ratio_clamp: float = 10.0) -> PolicyLossOutput:
    """GSPO-token: the sequence's importance ratio on every token (module docstring). `dual_clip_c`
    is accepted for a common signature and ignored (GSPO has none)."""
    mask, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, loss_mask, eps_low, eps_high,
                                    log_ratio_clamp)
    lengths = jnp.maximum(jnp.sum(mask.astype(jnp.float32), axis=-1, keepdims=True), 1.0)  # [B, 1]
    seq_log_ratio = jnp.sum(log_ratio, axis=-1, keepdims=True) / lengths  # [B, 1], mean over the sequence
    lp = jnp.where(mask, logprobs.astype(jnp.float32), 0.0)
    token_log_ratio = jax.lax.stop_gradient(seq_log_ratio) + lp - jax.lax.stop_gradient(lp)  # [B, T]
    ratio = jnp.exp(jnp.minimum(token_log_ratio, log_ratio_clamp))
    loss, was_clipped = _clipped_surrogate(ratio, adv, eps_low, eps_high)
    metrics = {"pg_clipfrac": masked_mean(was_clipped.astype(jnp.float32), mask),
               "pg_clipfrac_lower": jnp.zeros((), jnp.float32), "ppo_kl": masked_mean(-log_ratio, mask)}
    return PolicyLossOutput(token_loss=jnp.where(mask, loss, 0.0), metrics=metrics)


@register_policy_loss("cispo", per_token=True)
def cispo_policy_loss(logprobs, old_logprobs, advantages, loss_mask, *, eps_low: float = 1.0,
                      eps_high: float = 0.28, dual_clip_c: float | None = None,
                      log_ratio_clamp: float = 20.0) -> PolicyLossOutput:
    """CISPO: a clipped, detached importance weight on every token's log-likelihood gradient
    (module docstring). `dual_clip_c` is accepted for a common signature and ignored."""
    mask, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, loss_mask, eps_low, eps_high,
                                    log_ratio_clamp)
    ratio = jnp.exp(log_ratio)
    weight = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high))
    unit = jnp.exp(log_ratio - jax.lax.stop_gradient(log_ratio))  # value 1, gradient grad logp
    loss = -adv * weight * unit
    clipped = jnp.logical_or(ratio < 1.0 - eps_low, ratio > 1.0 + eps_high)
    metrics = {"pg_clipfrac": masked_mean(clipped.astype(jnp.float32), mask),
               "pg_clipfrac_lower": jnp.zeros((), jnp.float32), "ppo_kl": masked_mean(-log_ratio, mask)}
    return PolicyLossOutput(token_loss=jnp.where(mask, loss, 0.0), metrics=metrics)
