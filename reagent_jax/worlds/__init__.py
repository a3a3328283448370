"""The synthetic worlds and scripted experts: the agent quickstart's world of fictional entities
with its expert / flawed trajectories (synthetic.py, expert.py), expert trajectories from worked
solutions (annotated.py: GSM8K calculator annotations), the rule-based Agent-RRM annotator
(rrm_annotator.py), Reagent-C demonstrations of attempt, critique and retry (critique_demos.py)
and EvalPlanner's pairwise task with its scripted teacher (pairwise.py).
This package sits above `agent`, `rrm` and `evalplanner`, whose data it makes."""

from reagent_jax.worlds.annotated import SOLVER_SYSTEM_PROMPT, annotated_trajectory

from reagent_jax.worlds.expert import (
    FLAWS,
    MALFORMED_CALL_ERROR,
    LabelledTrajectory,
    RegistryTools,
    WorldTools,
    applicable_flaws,
    expert_trajectory,
    flawed_trajectory,
    format_search_results,
    labelled_trajectories,
    message_texts,
    run_python,
    world_texts,
)
from reagent_jax.worlds.synthetic import (
    DATA_SOURCE,
    Entity,
    Question,
    SyntheticWorld,
    Term,
    WorldConfig,
    apply_ops,
    make_world,
)

__all__ = [
    "SOLVER_SYSTEM_PROMPT", "annotated_trajectory",
    "DATA_SOURCE", "FLAWS", "MALFORMED_CALL_ERROR", "Entity", "LabelledTrajectory", "Question", "SyntheticWorld",
    "RegistryTools", "Term", "WorldConfig", "WorldTools", "applicable_flaws", "apply_ops", "expert_trajectory", "flawed_trajectory",
    "format_search_results", "labelled_trajectories", "make_world", "message_texts", "run_python", "world_texts",
]
