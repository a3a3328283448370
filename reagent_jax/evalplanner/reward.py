"""An EvalPlanner judge as a reward model: pairwise verdicts on a GRPO group -> per-trajectory scores.

Why: a pairwise judge cannot score one trajectory alone, but a GRPO group has several answers to
the same question, and advantages only need scores that rank them. Two modes:

  round_robin  every pair (i, j) of the group is judged; score_i = i's win rate over its
               comparisons (a tie or a judgement without a single verdict counts 0.5).
  reference    each trajectory is judged against one reference trajectory (e.g. an expert
               solution); score_i = its win rate against the reference.

With both_orders (default) each comparison is judged with either trajectory shown first and the
two verdicts are averaged, which cancels the judge's position bias. Two identical texts are a tie
without asking the judge. Scores lie in [0, 1], like the Agent-RRM score, so the Reagent
strategies can use `score_group` wherever they use the RRM ("plan-then-judge" trajectory mode).

    rm = PairwiseJudgeReward(EngineJudge(engine, tok), mode="round_robin")
    scores = rm.score_group(question, [traj_messages_1, traj_messages_2, ...])
"""
from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

from reagent_jax.evalplanner.judge import PairItem
from reagent_jax.rrm.prompt import render_trajectory


MODES = ("round_robin", "reference")
Trajectory = str | Sequence[Mapping[str, Any]]


def trajectory_text(question: str, trajectory: Trajectory, max_tool_chars: int = 3000) -> str:
    """A trajectory as the judge reads it (the Agent-RRM rendering); a string is used as is."""
    if isinstance(trajectory, str):
        return trajectory
    return render_trajectory(trajectory, question=question, max_tool_chars=max_tool_chars)


class PairwiseJudgeReward:
    """See the module docstring. `judge` has `judge(items, seed, greedy) -> [Chain]` (EngineJudge)."""

    def __init__(self, judge, *, mode: str = "round_robin", both_orders: bool = True, greedy: bool = True,
                 seed: int = 0, max_tool_chars: int = 3000):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}; expected one of {MODES}")
        self.judge, self.mode, self.both_orders = judge, mode, both_orders
        self.greedy, self.seed, self.max_tool_chars = greedy, seed, max_tool_chars

    def _comparisons(self, n: int) -> list[tuple[int, int]]:
        """(i, j) index pairs; j == -1 is the reference."""
        if self.mode == "reference":
            return [(i, -1) for i in range(n)]
        return list(itertools.combinations(range(n), 2))

    def score_groups(self, groups: Sequence[tuple[str, Sequence[Trajectory], Trajectory | None]]) -> list[list[float]]:
        """Scores of several groups with one batched judge call: items (question, trajectories, reference)."""
        jobs, items = [], []  # jobs: (group, i, j, i_first)
        texts = []
        for g, (question, trajectories, reference) in enumerate(groups):
            if not isinstance(question, str) or not question.strip():
                raise ValueError(f"group {g}: question must be a non-empty string")
            if self.mode == "reference" and reference is None:
                raise ValueError(f"group {g}: mode='reference' needs a reference trajectory")
            t = [trajectory_text(question, x, self.max_tool_chars) for x in trajectories]
            ref = trajectory_text(question, reference, self.max_tool_chars) if reference is not None else None
            texts.append((t, ref))
            for i, j in self._comparisons(len(t)):
                a, b = t[i], (ref if j == -1 else t[j])
                if a == b:
                    continue
                for i_first in ((True, False) if self.both_orders else (True,)):
                    jobs.append((g, i, j, i_first))
                    items.append(PairItem(question, a, b) if i_first else PairItem(question, b, a))
        chains = list(self.judge.judge(items, seed=self.seed, greedy=self.greedy)) if items else []
        if len(chains) != len(items):  # a missing judgement must not turn into a silent tie
            raise ValueError(f"PairwiseJudgeReward: the judge returned {len(chains)} judgements for {len(items)} "
                             "comparisons")
        outcome: dict[tuple[int, int, int], list[float]] = {}
        for (g, i, j, i_first), ch in zip(jobs, chains):
            win = 0.5 if ch.verdict not in ("A", "B") else float((ch.verdict == "A") == i_first)
            outcome.setdefault((g, i, j), []).append(win)  # i's result against j
        scores = []
        for g, (t, _) in enumerate(texts):
            if len(t) == 0:
                scores.append([])
                continue
            results: list[list[float]] = [[] for _ in t]
            for i, j in self._comparisons(len(t)):
                wins = outcome.get((g, i, j))
                w = sum(wins) / len(wins) if wins else 0.5  # identical texts: a tie
                results[i].append(w)
                if j >= 0:
                    results[j].append(1.0 - w)
            scores.append([sum(r) / len(r) if r else 0.5 for r in results])
        return scores

    def score_group(self, question: str, trajectories_messages: Sequence[Trajectory],
                    reference: Trajectory | None = None) -> list[float]:
        """One score in [0, 1] per trajectory of the group (its win rate); see the module docstring."""
        return self.score_groups([(question, trajectories_messages, reference)])[0]
