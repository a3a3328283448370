"""Rule rewards: boxed-answer extraction, EM/F1, math equivalence, adaptive dispatch by source."""

from reagent_jax.rewards.dispatch import (
    MATH_SOURCES,
    QA_SOURCES,
    RewardResult,
    compute_reward,
    score_answer,
    score_trajectory,
    source_kind,
)
from reagent_jax.rewards.functions import REWARD_FNS, RewardFn, answer_reward, boxed_reward
from reagent_jax.rewards.extraction import (
    BoxedAnswer,
    drop_thinking,
    extract_boxed_answer,
    find_last_boxed,
    strip_latex_text,
)
from reagent_jax.rewards.math_equiv import (
    math_equal,
    math_equal_check,
    math_verify_check,
    math_verify_equal,
    strings_equivalent,
)
from reagent_jax.rewards.qa import (
    F1_THRESHOLD,
    em_f1_score,
    exact_match,
    normalize_answer,
    qa_score,
    token_f1,
    yes_no_score,
)

__all__ = [
    "REWARD_FNS",
    "RewardFn",
    "answer_reward",
    "boxed_reward",
    "F1_THRESHOLD",
    "MATH_SOURCES",
    "QA_SOURCES",
    "BoxedAnswer",
    "RewardResult",
    "compute_reward",
    "drop_thinking",
    "em_f1_score",
    "exact_match",
    "extract_boxed_answer",
    "find_last_boxed",
    "math_equal",
    "math_equal_check",
    "math_verify_check",
    "math_verify_equal",
    "normalize_answer",
    "qa_score",
    "score_answer",
    "score_trajectory",
    "source_kind",
    "strings_equivalent",
    "strip_latex_text",
    "token_f1",
    "yes_no_score",
]
