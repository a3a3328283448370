"""Held-out accuracy of an agent policy: episodes through the agent loop, scored by the rule reward."""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from reagent_jax.rewards import score_trajectory


def evaluate_agent(loop, records: Sequence[dict], *, n: int = 1, greedy: bool = True, seed: int = 0) -> dict:
    """Runs n episodes per record; returns accuracy (mean score, avg@n), pass@n, speed and stats."""
    t0 = time.perf_counter()
    trajs = loop.run(list(records), n=n, greedy=greedy, seed=seed)
    wall = time.perf_counter() - t0
    scores = np.array([score_trajectory(t) for t in trajs], np.float32).reshape(len(records), n)
    gen = sum(t.response_length for t in trajs)
    return {
        "accuracy": float(scores.mean()),
        "pass_at_n": float((scores >= 1.0).any(axis=1).mean()),
        "question_scores": scores.mean(axis=1).tolist(),  # [records]: for paired comparisons
        "trajectory_scores": scores.reshape(-1).tolist(),  # [records * n], in `trajectories` order
        "num_questions": len(records),
        "num_turns": float(np.mean([t.num_turns for t in trajs])),
        "tool_calls": float(np.mean([t.tool_stats.calls for t in trajs])),
        "generated_tokens": int(gen),
        "tokens_per_s": gen / max(wall, 1e-9),
        "wall_s": wall,
        "trajectories": trajs,
    }
