"""EvalPlanner: plan-then-execute judge prompts, output parser and pairwise accuracy helpers.

    from reagent_jax import evalplanner as ep
    msgs = ep.judge_messages(instruction, response_a, response_b)
    e = ep.parse_evaluation(text)              # e.plan, e.execution, e.verdict, e.status
    ep.verdict_score(e, correct="A")           # 1.0 / 0.0 / 0.5 (no single verdict)
"""

from reagent_jax.evalplanner.parser import (
    Evaluation,
    VerdictStatus,
    pairwise_accuracy,
    parse_evaluation,
    parse_plan,
    position_consistent_accuracy,
    strip_thinking,
    verdict_score,
)
from reagent_jax.evalplanner.prompts import (
    EXEC_END,
    EXEC_START,
    FINAL_VERDICT,
    PLAN_END,
    PLAN_START,
    VERDICTS,
    execution_messages,
    format_execution_output,
    format_judge_output,
    judge_messages,
    plan_messages,
    verdict_only_messages,
)

_LAZY = {  # engine-backed parts load on first use (they import jax and the rollout engine)
    "EngineJudge": "judge", "JudgeConfig": "judge", "Chain": "judge", "PairItem": "judge",
    "Triple": "pairs", "sample_chains": "pairs", "build_preference_data": "pairs",
    "evaluate_pairs": "evaluate", "PairwiseJudgeReward": "reward",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f"reagent_jax.evalplanner.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'reagent_jax.evalplanner' has no attribute {name!r}")


__all__ = [*_LAZY,
    "EXEC_END", "EXEC_START", "FINAL_VERDICT", "PLAN_END", "PLAN_START", "VERDICTS", "Evaluation", "VerdictStatus",
    "execution_messages", "format_execution_output", "format_judge_output", "judge_messages", "pairwise_accuracy",
    "parse_evaluation", "parse_plan", "plan_messages", "position_consistent_accuracy", "strip_thinking",
    "verdict_only_messages", "verdict_score",
]
