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
from reagent_jax.rrm.base import JudgeFailure, as_request, failed_judgement
from reagent_jax.rrm.parser import Judgement, JudgementStats, JudgementStatus
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
        return self.score_groups_and_count(groups)[0]

    def score_groups_and_count(self, groups: Sequence[tuple[str, Sequence[Trajectory], Trajectory | None]]
                               ) -> tuple[list[list[float]], list[list[int]]]:
        """`score_groups`, and per trajectory how many of its comparisons were decided (a verdict,
        or two identical texts)."""
        jobs, items = [], []  # jobs: (group, i, j, i_first)
        texts = []
        decided: dict[tuple[int, int], int] = {}  # (group, trajectory) -> comparisons with a verdict or a tie
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
                if a == b:  # a tie without asking: decided all the same
                    for k in (i, j):
                        decided[(g, k)] = decided.get((g, k), 0) + 1
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
            if ch.verdict in ("A", "B"):
                for k in (i, j):
                    decided[(g, k)] = decided.get((g, k), 0) + 1
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
        return scores, [[decided.get((g, i), 0) for i in range(len(t))] for g, (t, _) in enumerate(texts)]

    def score_group(self, question: str, trajectories_messages: Sequence[Trajectory],
                    reference: Trajectory | None = None) -> list[float]:
        """One score in [0, 1] per trajectory of the group (its win rate); see the module docstring."""
        return self.score_groups([(question, trajectories_messages, reference)])[0]


class PairwiseRRM:
    """A pairwise judge behind the Agent-RRM interface (`rrm.base.Judge.judge_many`), so Reagent-R
    can use an EvalPlanner judge as its model reward. The items of one call that share a question
    form a group (a GRPO group) scored by `PairwiseJudgeReward`; each Judgement's score is the
    trajectory's win rate and its critique is empty (a pairwise judge writes none, so Reagent-C
    and -U retries get the generic prompt). An item none of whose comparisons was decided is a
    NO_REPLY failure with score 0.5 (counted in `stats`), never a silent tie; a question asked
    once has nothing to be compared with and scores 0.5 (OK)."""

    def __init__(self, reward: PairwiseJudgeReward):
        self.reward, self.stats = reward, JudgementStats()

    def judge_many(self, items: Sequence[Any]) -> list[Judgement]:
        requests = [as_request(item, i) for i, item in enumerate(items)]
        by_question: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            by_question.setdefault(r.question, []).append(i)
        groups = [(q, [requests[i].trajectory for i in idx], None) for q, idx in by_question.items()]
        scores, counts = self.reward.score_groups_and_count(groups)
        out: list[Judgement] = [None] * len(requests)  # type: ignore[list-item]
        for idx, group_scores, decided in zip(by_question.values(), scores, counts):
            for i, score, n in zip(idx, group_scores, decided):
                out[i] = (Judgement(think="", critique="", score=float(score), status=JudgementStatus.OK)
                          if n or len(idx) == 1 else failed_judgement(0.5, JudgeFailure.NO_REPLY))
        self.stats.update(out)
        return out
