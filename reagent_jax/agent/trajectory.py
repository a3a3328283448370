"""The record of one agent episode, token-exact: what the trainer, the rewards and the judges read.

`tokens` is the exact id sequence the engine held (prompt, sampled turns, appended tool
responses and template glue). `loss_mask` is 1 only on tokens the policy sampled; `logprobs`
holds the sampler's logprob there (0 elsewhere), aligned with `tokens` like
`models.token_logprobs`. `messages` is the same conversation as chat messages (for logging,
the Agent-RRM prompt and SFT export); it is never re-tokenised for training.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

FINISH = ("answer", "max_turns", "length", "no_answer", "error")


@dataclasses.dataclass
class ToolStats:
    calls: int = 0
    failures: int = 0
    parse_errors: int = 0
    seconds: float = 0.0
    by_tool: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Trajectory:
    question: dict[str, Any]                 # the dataset record (question, answer list, data_source, id)
    messages: list[dict[str, Any]]           # system?/user prompt + assistant/tool turns
    tokens: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_len: int                          # tokens before the first sampled token
    turn_spans: list[tuple[int, int]]        # [start, end) of each sampled assistant turn in tokens
    finish_reason: str = "answer"
    final_text: str = ""                     # the last assistant message's text
    tool_stats: ToolStats = dataclasses.field(default_factory=ToolStats)
    sample_index: int = 0                    # which of the n samples of this question
    attempt: int = 1                         # 1 = initial, 2 = critique-refined (Reagent-C/U)
    critique: Optional[str] = None
    error: Optional[str] = None
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def failed(cls, question: dict[str, Any], error: str, *, messages: Sequence[dict] = (), sample_index: int = 0,
               attempt: int = 1) -> "Trajectory":
        """An episode that ended before sampling a token (finish_reason "error", scored wrong)."""
        return cls(question=question, messages=list(messages), tokens=[], loss_mask=[], logprobs=[], prompt_len=0,
                   turn_spans=[], finish_reason="error", sample_index=sample_index, attempt=attempt, error=error)

    @property
    def num_turns(self) -> int:
        return len(self.turn_spans)

    @property
    def response_length(self) -> int:
        return int(sum(self.loss_mask))

    def to_json(self, decode=None) -> dict[str, Any]:
        """A JSON-serialisable summary (tokens omitted unless asked via decode)."""
        out = {
            "id": self.question.get("id"), "question": self.question.get("question"),
            "answer": self.question.get("answer"), "messages": self.messages, "finish_reason": self.finish_reason,
            "final_text": self.final_text, "num_turns": self.num_turns, "response_length": self.response_length,
            "tool_calls": self.tool_stats.calls, "tool_failures": self.tool_stats.failures,
            "tool_parse_errors": self.tool_stats.parse_errors, "tool_seconds": round(self.tool_stats.seconds, 4),
            "sample_index": self.sample_index, "attempt": self.attempt, "critique": self.critique,
            "error": self.error, **self.extras,
        }
        if decode is not None:
            out["text"] = decode(self.tokens)
        return out
