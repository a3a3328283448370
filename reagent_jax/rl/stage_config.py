"""The typed hyper-parameters of the training stages: SFT, GRPO and DPO blocks of a config.

A pipeline turns `config.sft` / `config.grpo` / `config.dpo` (and the RRM and judge blocks, which
share these shapes) into these frozen dataclasses before its first stage, so a bad value fails
before any work, and the trainers read typed attributes with one default each. Allowed names
come from the registries (`rl/__init__.py`), so a loss a user registers is accepted at once.
"""
from __future__ import annotations

import dataclasses

from reagent_jax.rl.advantages import ADVANTAGES
from reagent_jax.rl.aggregation import AGG_MODES
from reagent_jax.rl.dpo import DPO_LOSS_TYPES
from reagent_jax.rl.kl import KL_ESTIMATORS
from reagent_jax.rl.policy_loss import POLICY_LOSSES
from reagent_jax.typed_config import Block, Problem, at_least, in_range, one_of

# Where GRPO's old (behaviour) logprobs come from: the engine's, computed while sampling with the
# same definition as the trainer's, or the trainer's own pass at the start of each step.
OLD_LOGPROBS = ("rollout", "recompute")


@dataclasses.dataclass(frozen=True)
class BatchStageConfig(Block):
    """A stage that steps over fixed-size batches of rows (SFT, DPO)."""
    steps: int
    batch_size: int
    learning_rate: float
    micro_batches: int = 1  # the batch is split to bound activation memory; gradients accumulate
    warmup_steps: int = 0
    max_len: int = 1024     # rows are cut to this many tokens

    def problems(self) -> list[Problem]:
        found = at_least(self, steps=0, batch_size=1, micro_batches=1, learning_rate=0.0, warmup_steps=0,
                         max_len=2)
        if not found and self.batch_size % self.micro_batches:
            found.append(("micro_batches", f"batch_size={self.batch_size} is not divisible by "
                                           f"{self.micro_batches} micro-batches"))
        return found


@dataclasses.dataclass(frozen=True)
class SFTConfig(BatchStageConfig):
    """config.sft / config.rrm_sft. The last three fields choose the agent pipeline's demonstrations."""
    context_loss_weight: float = 0.0  # also model tool responses and the prompt (random-init models)
    by_hand_fraction: float = 0.0     # expert demonstrations that compute in their text, not with python
    num_examples: int = 0             # demonstrations of the first N training questions; 0: all
    critique_fraction: float = 0.0    # this share of the questions also gets an attempt-critique-retry demo

    def problems(self) -> list[Problem]:
        return (super().problems() + at_least(self, context_loss_weight=0.0, num_examples=0)
                + in_range(self, "by_hand_fraction", 0.0, 1.0) + in_range(self, "critique_fraction", 0.0, 1.0))


@dataclasses.dataclass(frozen=True)
class DPOConfig(BatchStageConfig):
    """config.dpo: one DPO stage per round (EvalPlanner's iterative DPO)."""
    beta: float = 0.1
    loss_type: str = "sigmoid"  # a DPO_LOSS_TYPES name
    label_smoothing: float = 0.0
    nll_coef: float = 0.0       # + nll of the chosen completion (RPO-style)
    rounds: int = 2

    def problems(self) -> list[Problem]:
        return (super().problems() + one_of(self, "loss_type", list(DPO_LOSS_TYPES))
                + at_least(self, beta=0.0, nll_coef=0.0, rounds=1) + in_range(self, "label_smoothing", 0.0, 0.5))


@dataclasses.dataclass(frozen=True)
class GRPOConfig(Block):
    """config.grpo / config.rrm_grpo: one rollout of `questions_per_step` x `n` episodes per step,
    then `mini_batches` optimizer updates, each accumulated over `micro_batches`."""
    steps: int
    questions_per_step: int
    n: int                       # episodes per question: one advantage group
    learning_rate: float
    warmup_steps: int = 0
    micro_batches: int = 1
    mini_batches: int = 1
    max_grad_norm: float = 1.0
    advantage: str = "grpo"      # an ADVANTAGES name
    policy_loss: str = "vanilla"  # a POLICY_LOSSES name
    eps_low: float = 0.2
    eps_high: float = 0.28       # clip-higher (DAPO)
    dual_clip_c: float = 3.0
    loss_agg_mode: str = "token-mean"  # an AGG_MODES name
    beta: float = 0.0            # KL to the frozen reference; 0 never builds the reference
    kl_kind: str = "k3"          # a KL_ESTIMATORS name
    fused_head: bool = True      # logprobs without materialising [B, T, V] logits
    old_logprobs: str = "rollout"  # an OLD_LOGPROBS source
    drop_equal_reward_groups: bool = True  # groups without reward variance carry no signal
    mask_overlong: bool = False  # no loss on episodes cut by the length limit

    def problems(self) -> list[Problem]:
        found = at_least(self, steps=0, questions_per_step=1, n=1, micro_batches=1, mini_batches=1,
                         learning_rate=0.0, warmup_steps=0, max_grad_norm=0.0, eps_low=0.0, eps_high=0.0, beta=0.0)
        if not self.dual_clip_c > 1.0:
            found.append(("dual_clip_c", "must be > 1"))
        for field, registry in (("advantage", sorted(ADVANTAGES)), ("policy_loss", list(POLICY_LOSSES)),
                                ("loss_agg_mode", list(AGG_MODES)), ("kl_kind", list(KL_ESTIMATORS)),
                                ("old_logprobs", OLD_LOGPROBS)):
            found += one_of(self, field, registry)
        return found
