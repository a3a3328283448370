"""Reward functions by name, for single-turn GRPO (`trainers.completions`, `pipelines/grpo.py`):
each maps (completion text, dataset record) -> float. Configs name them (`rewards="answer,boxed"`);
register your own with `@REWARD_FNS.register("name")`, or hand callables to `pipelines.grpo.run`.
"""
from __future__ import annotations

from typing import Callable, Mapping

from reagent_jax.registry import Registry
from reagent_jax.rewards.dispatch import score_answer
from reagent_jax.rewards.extraction import find_last_boxed

RewardFn = Callable[[str, Mapping], float]
REWARD_FNS: Registry[RewardFn] = Registry("reward function")


@REWARD_FNS.register("answer")
def answer_reward(text: str, record: Mapping) -> float:
    """The rule reward of the papers: the completion's final answer against the record's
    "answer" (one or a list), by its "data_source" (`score_answer`: EM, else F1 if >= 0.3; math
    equivalence for math sources)."""
    answers = record["answer"] if isinstance(record["answer"], (list, tuple)) else [record["answer"]]
    return float(score_answer(text, list(answers), record.get("data_source")))


@REWARD_FNS.register("boxed")
def boxed_reward(text: str, record: Mapping) -> float:
    """Format: 1 when the completion ends with a well-formed \\boxed{...} answer, else 0."""
    return 1.0 if find_last_boxed(text).text is not None else 0.0
