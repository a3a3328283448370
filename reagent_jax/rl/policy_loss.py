"""PPO-style clipped policy-gradient loss per token (verl's ``compute_policy_loss_vanilla``).

    log_ratio = clip(logp - old_logp, -log_ratio_clamp, log_ratio_clamp)     # before exp
    ratio     = exp(log_ratio)
    loss1     = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high))  # clip-higher (DAPO)
    loss      = min(loss1, -A * c)  where A < 0                             # dual clip, c > 1
              = loss1               where A >= 0

Returns per-token losses (zero off the mask), to be reduced with ``aggregate_loss`` using global
counts, plus verl's metrics as masked means over this batch:
  pg_clipfrac        fraction of tokens where the clipped term is the active (larger) one
  pg_clipfrac_lower  fraction of tokens where the dual clip bound (A < 0) is active
  ppo_kl             mean(old_logp - logp), the approximate KL(old || new)
The metrics are means over this (micro-)batch; average them weighted by token counts to combine.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from reagent_jax.rl.aggregation import masked_mean


class PolicyLossOutput(NamedTuple):
    token_loss: jax.Array  # [B, T] float32, 0 where loss_mask is 0
    metrics: dict[str, jax.Array]  # scalars: pg_clipfrac, pg_clipfrac_lower, ppo_kl


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
    """Clipped surrogate loss per token; see the module docstring for the formula."""
    if logprobs.ndim != 2 or logprobs.shape != old_logprobs.shape or logprobs.shape != jnp.shape(loss_mask):
        raise ValueError(
            "logprobs, old_logprobs and loss_mask must share shape [B, T]; got "
            f"{logprobs.shape}, {old_logprobs.shape}, {jnp.shape(loss_mask)}"
        )
    if dual_clip_c is not None and not dual_clip_c > 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (or None to disable), got {dual_clip_c}")
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
    ratio = jnp.exp(log_ratio)
    adv = jnp.where(mask, advantages, 0.0)

    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss1 = jnp.maximum(unclipped, clipped)
    metrics = {"pg_clipfrac": masked_mean((clipped > unclipped).astype(jnp.float32), mask)}
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
