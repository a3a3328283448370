"""Agent-RRM: the reasoning reward model's prompt, output parser, judges and the Reagent
strategies (the rule-based annotators live in `worlds.rrm_annotator` and `worlds.gsm8k_annotator`).

    from reagent_jax import rrm
    messages = rrm.build_rrm_messages(question, trajectory_messages, tools=None)
    j = rrm.parse_judgement(text)          # j.think, j.critique, j.score, j.status
    turn = rrm.build_refinement_message(j.critique)   # Reagent-C second attempt
"""

from reagent_jax.rrm.parser import (
    DEFAULT_FALLBACK_SCORE,
    Judgement,
    JudgementStats,
    JudgementStatus,
    parse_judgement,
    parse_number,
)
from reagent_jax.rrm.prompt import (
    RRM_SYSTEM_PROMPT,
    SUB_SCORE_NAMES,
    build_refinement_message,
    build_rrm_messages,
    render_judgement,
    render_trajectory,
    rrm_system_prompt,
    truncate_middle,
)

__all__ = [
    "DEFAULT_FALLBACK_SCORE", "Judgement", "JudgementStats", "JudgementStatus", "RRM_SYSTEM_PROMPT", "SUB_SCORE_NAMES",
    "build_refinement_message", "build_rrm_messages", "parse_judgement", "parse_number",
    "render_judgement", "render_trajectory", "rrm_system_prompt", "truncate_middle",
]

