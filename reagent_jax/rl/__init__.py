"""RL kernels: group advantages, policy / KL / DPO losses, loss aggregation (pure JAX).

Each kind of block has one registry (`reagent_jax/registry.py`): ADVANTAGES, POLICY_LOSSES, KL_ESTIMATORS,
AGG_MODES, DPO_LOSS_TYPES. Configs name an entry; register your own with `@REGISTRY.register(name)`."""

from reagent_jax.rl.advantages import (
    ADVANTAGES,
    GroupAdvantages,
    dr_grpo_advantages,
    get_advantage_fn,
    group_ids_from_keys,
    grpo_advantages,
    register_advantage,
    rloo_advantages,
)
from reagent_jax.rl.aggregation import (
    AGG_MODES,
    LossCounts,
    aggregate_loss,
    loss_counts,
    masked_mean,
    masked_sum,
    token_weights,
)
from reagent_jax.rl.dpo import DPO_LOSS_TYPES, DPOOutput, dpo_loss
from reagent_jax.rl.kl import KL_ESTIMATORS, entropy_from_logits, kl_penalty, kl_term, needs_reference_model
from reagent_jax.rl.policy_loss import (
    POLICY_LOSSES,
    PolicyLossOutput,
    cispo_policy_loss,
    gspo_policy_loss,
    ppo_policy_loss,
    register_policy_loss,
)
from reagent_jax.registry import Registry

__all__ = [
    "ADVANTAGES",
    "AGG_MODES",
    "DPO_LOSS_TYPES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "Registry",
    "DPOOutput",
    "GroupAdvantages",
    "LossCounts",
    "PolicyLossOutput",
    "aggregate_loss",
    "cispo_policy_loss",
    "dpo_loss",
    "dr_grpo_advantages",
    "entropy_from_logits",
    "get_advantage_fn",
    "group_ids_from_keys",
    "grpo_advantages",
    "gspo_policy_loss",
    "kl_penalty",
    "kl_term",
    "loss_counts",
    "masked_mean",
    "masked_sum",
    "token_weights",
    "needs_reference_model",
    "ppo_policy_loss",
    "register_advantage",
    "register_policy_loss",
    "rloo_advantages",
]
