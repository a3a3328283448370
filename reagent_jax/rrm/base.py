"""What every Agent-RRM judge offers, so trainers need not care where the judge runs.

Why a protocol: the reward step calls `judge.judge_many(requests)` and gets one `Judgement` per
trajectory, in order, whether the judge is a remote endpoint (`rrm.remote.RemoteJudge`) or the
local JAX model behind the rollout engine. A judge never raises for one bad reply or one failed
request: it returns a Judgement with the fallback score and a status saying what happened.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from reagent_jax.rrm.parser import DEFAULT_FALLBACK_SCORE, Judgement, JudgementStatus


@dataclasses.dataclass(frozen=True)
class JudgeRequest:
    """One trajectory to judge. `tools`: the tool specs (or names) the agent had, shown to the judge.
    `record`: the question's dataset record (with its reference answer), for the judges that grade
    against a reference (the synthetic world's rule annotator); a model judge never sees it."""

    question: str
    trajectory: Sequence[Mapping[str, Any]]
    tools: Sequence[Any] | None = None
    record: Mapping[str, Any] | None = None


JudgeInput = JudgeRequest | tuple | Mapping[str, Any]


def as_request(item: JudgeInput, index: int = 0) -> JudgeRequest:
    """A JudgeRequest from a JudgeRequest, a (question, trajectory[, tools]) tuple or a dict with
    "question" and "trajectory" (or "messages"); ValueError naming the item otherwise."""
    if isinstance(item, JudgeRequest):
        request = item
    elif isinstance(item, tuple) and len(item) in (2, 3):
        request = JudgeRequest(*item)
    elif isinstance(item, Mapping):
        trajectory = item.get("trajectory", item.get("messages"))
        request = JudgeRequest(item.get("question"), trajectory, item.get("tools"), item.get("record"))  # type: ignore[arg-type]
    else:
        raise ValueError(f"judge item {index}: expected JudgeRequest, (question, trajectory) or a dict, "
                         f"got {type(item).__name__}")
    if not isinstance(request.question, str) or not request.question.strip():
        raise ValueError(f"judge item {index}: question must be a non-empty string, got {request.question!r:.100}")
    if isinstance(request.trajectory, (str, bytes)) or not isinstance(request.trajectory, Sequence):
        raise ValueError(f"judge item {index}: trajectory must be a list of chat messages, "
                         f"got {type(request.trajectory).__name__}")
    return request


class JudgeFailure(str, enum.Enum):
    """Statuses of judgements that never reached the parser (not parse outcomes)."""

    ENDPOINT_ERROR = "endpoint_error"  # the request failed for good: score = fallback
    PROMPT_TOO_LONG = "prompt_too_long"  # the judge prompt does not fit the judge's context: fallback
    NO_REPLY = "no_reply"  # the judge's engine returned no result for the item: fallback

    def __str__(self) -> str:
        return self.value


# Use the parser's own member if `JudgementStatus` gains one, so stats stay in one vocabulary.
ENDPOINT_ERROR = getattr(JudgementStatus, "ENDPOINT_ERROR", JudgeFailure.ENDPOINT_ERROR)


def failed_judgement(fallback_score: float = DEFAULT_FALLBACK_SCORE, status: Any = ENDPOINT_ERROR) -> Judgement:
    """The Judgement a judge returns when it got no reply to parse."""
    return Judgement(think="", critique="", score=float(fallback_score), status=status, issues=(status,))


@runtime_checkable
class Judge(Protocol):
    def judge_many(self, items: Sequence[JudgeInput]) -> list[Judgement]:
        """One Judgement per item, in order; never raises for a single failed item. Items come
        in any `JudgeInput` form (the trainer sends `JudgeRequest`s): read them with `as_request`."""
        ...


def judge_one(judge: Judge, question: str, trajectory: Sequence[Mapping[str, Any]]) -> Judgement:
    return judge.judge_many([JudgeRequest(question, trajectory)])[0]
