"""Scoring final answers for evaluation: the rule reward, or an LLM judge with the rule as fallback.

Every sample gets the rule score (`rewards.compute_reward`: math equivalence for math sources,
EM = 1 else F1 if >= 0.3 for QA; a float in [0, 1]) and a binary `correct`:
  * rule mode: correct = rule score >= `correct_threshold` (default 1.0: exact or equivalent
    answers only, so a partial F1 never counts as solved in pass@k);
  * judge mode: correct = the judge's yes/no (`eval.llm_judge.LLMAnswerJudge`, whose prompt asks
    for reasoning, the extracted final answer and a yes/no label). When the judge's request
    fails or its reply has no readable label, the rule decides (`method` = "rule_fallback").
A failure inside scoring marks that sample wrong (`method` = "error") and never stops a run.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional, Sequence

from reagent_jax import rewards
from reagent_jax.eval.llm_judge import GradeItem, LLMAnswerJudge

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ScoreItem:
    question: str
    answers: Sequence[str]
    response: str  # the final assistant text
    source: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class SampleScore:
    correct: bool
    score: float  # rule score in [0, 1]
    rule_correct: bool
    extracted: Optional[str]  # the answer the rule (or the judge) read from the response
    method: str  # "rule" | "llm" | "rule_fallback" | "none" | "error"
    judge: Optional[dict[str, Any]] = None  # the judge's reasoning, label status and reply

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class AnswerScorer:
    """Scores batches of final answers; `judge` None means rule-only."""

    def __init__(self, judge: Optional[LLMAnswerJudge] = None, *, correct_threshold: float = 1.0):
        if not 0.0 < correct_threshold <= 1.0:
            raise ValueError(f"correct_threshold={correct_threshold} must be in (0, 1]")
        self.judge, self.correct_threshold = judge, correct_threshold

    @property
    def mode(self) -> str:
        return "rule" if self.judge is None else "llm"

    def _rule(self, item: ScoreItem) -> tuple[float, Optional[str]]:
        r = rewards.compute_reward(item.response, list(item.answers), item.source)
        return float(r.correctness), r.answer

    def score_many(self, items: Sequence[ScoreItem]) -> list[SampleScore]:
        rule: list[Optional[tuple[float, Optional[str]]]] = []
        for item in items:
            try:
                rule.append(self._rule(item))
            except Exception as e:  # noqa: BLE001 - one odd response must not stop the run
                log.warning("rule scoring failed for %r: %s", item.question[:80], e)
                rule.append(None)
        grades: list[Any] = [None] * len(items)
        if self.judge is not None and items:
            try:
                grades = self.judge.grade_many([GradeItem(i.question, list(i.answers), i.response, i.source)
                                                for i in items])
            except Exception as e:  # noqa: BLE001 - the rule decides for this batch
                log.warning("the LLM judge failed on a batch of %d; using the rule: %s", len(items), e)
                grades = [RuntimeError(str(e))] * len(items)
            grades = list(grades)
            if len(grades) != len(items):  # a custom judge's bug: no answer may go unscored
                log.warning("the LLM judge returned %d grades for %d answers; using the rule", len(grades), len(items))
                grades = [RuntimeError(f"the judge returned {len(grades)} grades for {len(items)} answers")] * len(items)
        return [self._combine(r, g) for r, g in zip(rule, grades)]

    def _combine(self, rule, grade) -> SampleScore:
        if rule is None:
            return SampleScore(False, 0.0, False, None, "error")
        score, extracted = rule
        rule_correct = score >= self.correct_threshold
        if self.judge is None:
            return SampleScore(rule_correct, score, rule_correct, extracted, "rule")
        if isinstance(grade, Exception):
            return SampleScore(rule_correct, score, rule_correct, extracted, "rule_fallback",
                               {"status": "judge_exception", "reasoning": str(grade)})
        info = {"status": grade.status, "reasoning": grade.reasoning, "extracted": grade.extracted,
                "reply": grade.judge_text}
        if grade.method == "rule_fallback":  # the judge's own fallback (rule at 1.0)
            return SampleScore(rule_correct, score, rule_correct, extracted, "rule_fallback", info)
        return SampleScore(grade.correct is True, score, rule_correct, grade.extracted or extracted, grade.method, info)
