"""DPO-family preference losses on sequence log-probabilities (TRL's ``DPOTrainer`` semantics).

Inputs are per-pair *sums* of token logprobs over the completion ([B] each). With
``h = (pi_c - ref_c) - (pi_r - ref_r)`` (the implicit reward margin before beta):

  sigmoid  -(1 - ls) * log sig(beta h) - ls * log sig(-beta h)
           ls = label_smoothing; ls = 0 is standard DPO (TRL's "sigmoid"); ls > 0 is cDPO
           (conservative DPO, TRL < 1.0 applied it inside "sigmoid").
  robust   (-(1 - ls) * log sig(beta h) + ls * log sig(-beta h)) / (1 - 2 ls),   0 <= ls < 0.5
           (Chowdhury et al. 2024, unbiased under label-flip noise rate ls; TRL's "robust")
  ipo      (h_avg - 1 / (2 beta))**2, where h_avg uses log-ratios *divided by the completion's
           token count* (TRL's "ipo": the IPO authors' length-normalised form), so
           ``chosen_lengths`` and ``rejected_lengths`` are required.
  hinge    relu(1 - beta h)  (SLiC)

``chosen_nll`` is returned separately and never added: the caller weights it (RPO-style
``loss + alpha * chosen_nll``). It is the token-mean NLL of the chosen completions when
``chosen_lengths`` is given, else the mean per-sequence NLL.

The losses are registered in ``DPO_LOSS_TYPES`` (``reagent_jax/registry.py``); register more with
``@DPO_LOSS_TYPES.register("name")`` (a function of the two log-ratio vectors, see below).

``pair_mask`` [B] drops padding pairs from a fixed-shape batch. Losses are summed over the pairs
and divided by ``global_num_pairs`` (default: the valid pairs here), so micro-batch losses add up to
the full-batch loss, as in ``aggregate_loss``. Metrics (TRL's names) are means over valid pairs:
rewards/chosen = beta * (pi_c - ref_c), rewards/rejected, rewards/margins, rewards/accuracies
(chosen reward > rejected reward), logps/chosen, logps/rejected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from reagent_jax.registry import Registry

# (chosen log-ratios [B], rejected log-ratios [B], *, beta, label_smoothing, chosen_lengths,
#  rejected_lengths) -> per-pair losses [B]
DPO_LOSS_TYPES: Registry[Callable[..., jax.Array]] = Registry("DPO loss_type")


@DPO_LOSS_TYPES.register("sigmoid")
def sigmoid_loss(chosen, rejected, *, beta, label_smoothing, **_lengths):
    if not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"label_smoothing must lie in [0, 0.5], got {label_smoothing}")
    h, ls = chosen - rejected, label_smoothing
    return -(1.0 - ls) * jax.nn.log_sigmoid(beta * h) - ls * jax.nn.log_sigmoid(-beta * h)


@DPO_LOSS_TYPES.register("robust")
def robust_loss(chosen, rejected, *, beta, label_smoothing, **_lengths):
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"robust DPO needs 0 <= label_smoothing < 0.5, got {label_smoothing}")
    h, ls = chosen - rejected, label_smoothing
    return (-(1.0 - ls) * jax.nn.log_sigmoid(beta * h) + ls * jax.nn.log_sigmoid(-beta * h)) / (1.0 - 2.0 * ls)


@DPO_LOSS_TYPES.register("ipo")
def ipo_loss(chosen, rejected, *, beta, label_smoothing, chosen_lengths=None, rejected_lengths=None):
    if chosen_lengths is None or rejected_lengths is None:
        raise ValueError("ipo loss averages log-ratios over tokens: pass chosen_lengths and rejected_lengths")
    len_c = jnp.maximum(jnp.asarray(chosen_lengths, jnp.float32), 1.0)
    len_r = jnp.maximum(jnp.asarray(rejected_lengths, jnp.float32), 1.0)
    return jnp.square(chosen / len_c - rejected / len_r - 1.0 / (2.0 * beta))


@DPO_LOSS_TYPES.register("hinge")
def hinge_loss(chosen, rejected, *, beta, label_smoothing, **_lengths):
    return jax.nn.relu(1.0 - beta * (chosen - rejected))


class DPOOutput(NamedTuple):
    loss: jax.Array  # [] preference loss, normalised by the (global) number of pairs
    losses: jax.Array  # [B] per-pair loss, 0 for masked pairs
    chosen_nll: jax.Array  # [] NLL of the chosen completions (not included in ``loss``)
    metrics: dict[str, jax.Array]  # scalars, TRL names


def dpo_loss(
    policy_chosen_logps: jax.Array,  # [B] sum of token logprobs of the chosen completion
    policy_rejected_logps: jax.Array,  # [B]
    ref_chosen_logps: jax.Array,  # [B] same under the frozen reference model
    ref_rejected_logps: jax.Array,  # [B]
    *,
    loss_type: str = "sigmoid",
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    chosen_lengths: jax.Array | None = None,  # [B] completion token counts (needed by ipo)
    rejected_lengths: jax.Array | None = None,  # [B]
    pair_mask: jax.Array | None = None,  # [B] bool, False for padding pairs
    global_num_pairs: jax.Array | float | None = None,
) -> DPOOutput:
    """Preference loss of one (micro-)batch of pairs; see the module docstring."""
    pair_loss = DPO_LOSS_TYPES.get(loss_type)
    if isinstance(beta, (int, float)) and beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    pc, pr, rc, rr = (
        jnp.asarray(x, jnp.float32)
        for x in (policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    )
    if pc.ndim != 1 or not pc.shape == pr.shape == rc.shape == rr.shape:
        raise ValueError(f"the four logps must be [B] of one shape; got {pc.shape}, {pr.shape}, {rc.shape}, {rr.shape}")
    mask = jnp.ones(pc.shape, bool) if pair_mask is None else jnp.asarray(pair_mask).astype(bool)
    if mask.shape != pc.shape:
        raise ValueError(f"pair_mask must be [B]={pc.shape}, got {mask.shape}")
    # Sanitize padding pairs so NaN/inf there cannot reach the loss or its gradient.
    pc, pr, rc, rr = (jnp.where(mask, x, 0.0) for x in (pc, pr, rc, rr))

    chosen_logratios = pc - rc  # [B]
    rejected_logratios = pr - rr  # [B]
    losses = pair_loss(chosen_logratios, rejected_logratios, beta=beta, label_smoothing=label_smoothing,
                       chosen_lengths=chosen_lengths, rejected_lengths=rejected_lengths)  # [B]
    losses = jnp.where(mask, losses, 0.0)

    n_valid = jnp.sum(mask.astype(jnp.float32))
    denom = n_valid if global_num_pairs is None else jnp.asarray(global_num_pairs, jnp.float32)
    loss = jnp.sum(losses) / jnp.maximum(denom, 1.0)

    if chosen_lengths is not None:
        tokens = jnp.sum(jnp.where(mask, jnp.asarray(chosen_lengths, jnp.float32), 0.0))
        chosen_nll = -jnp.sum(pc) / jnp.maximum(tokens, 1.0)
    else:
        chosen_nll = -jnp.sum(pc) / jnp.maximum(n_valid, 1.0)

    def mean(x):
        return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(n_valid, 1.0)

    chosen_rewards = jax.lax.stop_gradient(beta * chosen_logratios)
    rejected_rewards = jax.lax.stop_gradient(beta * rejected_logratios)
    metrics = {
        "rewards/chosen": mean(chosen_rewards),
        "rewards/rejected": mean(rejected_rewards),
        "rewards/margins": mean(chosen_rewards - rejected_rewards),
        "rewards/accuracies": mean((chosen_rewards > rejected_rewards).astype(jnp.float32)),
        "logps/chosen": mean(jax.lax.stop_gradient(pc)),
        "logps/rejected": mean(jax.lax.stop_gradient(pr)),
    }
    return DPOOutput(loss=loss, losses=losses, chosen_nll=chosen_nll, metrics=metrics)
