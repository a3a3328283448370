"""Environments for the agent: the synthetic quickstart world and its expert / flawed trajectories,
and expert trajectories from worked solutions (GSM8K calculator annotations)."""

from reagent_jax.agent.envs.annotated import SOLVER_SYSTEM_PROMPT, annotated_trajectory

from reagent_jax.agent.envs.expert import (
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
)
from reagent_jax.agent.envs.synthetic import (
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
    "format_search_results", "labelled_trajectories", "make_world", "message_texts", "run_python",
]
