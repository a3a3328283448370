"""Agent-RRM served by a remote OpenAI-compatible endpoint (a vLLM/SGLang replica set or an API).

Why: during agent GRPO the reward model often runs on other machines than the policy. This judge
builds the same prompt as the local judge (`rrm.build_rrm_messages`), reads replies with the same
parser (`rrm.parse_judgement`) and keeps training going when the endpoint fails: that trajectory
gets the fallback score and status `endpoint_error`, counted in `stats`.

    judge = RemoteJudge(EndpointConfig(base_urls=("http://rrm:8000/v1",), model="agent-rrm"))
    judgements = judge.judge_many([(question, trajectory_messages), ...])   # list[Judgement], in order

Reasoning models served with a reasoning parser return their thinking in `reasoning_content`; when
the reply itself has no think block, that thinking becomes the `<think>` block before parsing.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from typing import Any, Iterator, Mapping, Sequence

from reagent_jax.endpoints import ChatClient, Completion, EndpointConfig, EndpointError
from reagent_jax.rrm.base import ENDPOINT_ERROR, JudgeInput, JudgeRequest, as_request, failed_judgement
from reagent_jax.rrm.parser import DEFAULT_FALLBACK_SCORE, Judgement, JudgementStats, parse_judgement
from reagent_jax.rrm.prompt import DEFAULT_MAX_TOOL_CHARS, build_rrm_messages

_THINK_TAG = re.compile(r"<\s*/?\s*think\s*>", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class RemoteReply:
    """A judgement with what produced it: the reply text parsed, or the error that replaced it."""

    judgement: Judgement
    text: str  # the text given to the parser ("" when the request failed)
    completion: Completion | None = None
    error: EndpointError | None = None


def reply_text(completion: Completion, use_reasoning_content: bool = True) -> str:
    """The reply as the parser should see it (server-side reasoning folded back into <think>)."""
    text = completion.text
    reasoning = (completion.reasoning_content or "").strip()
    if use_reasoning_content and reasoning and not _THINK_TAG.search(text):
        return f"<think>\n{reasoning}\n</think>\n{text}"
    return text


class RemoteJudge:
    """Implements `rrm.base.Judge` over a `ChatClient`; thread-safe."""

    def __init__(
        self,
        config: EndpointConfig,
        multi_dim: bool = False,
        *,
        with_confidence: bool = False,
        tools: Sequence[Any] | None = None,
        max_tool_chars: int = DEFAULT_MAX_TOOL_CHARS,
        fallback_score: float = DEFAULT_FALLBACK_SCORE,
        use_reasoning_content: bool = True,
        client: ChatClient | None = None,
    ) -> None:
        if not 0.0 <= fallback_score <= 1.0:
            raise ValueError(f"fallback_score must be in [0, 1], got {fallback_score}")
        self.config = config
        self.multi_dim = multi_dim
        self.with_confidence = with_confidence
        self.tools = tools
        self.max_tool_chars = max_tool_chars
        self.fallback_score = fallback_score
        self.use_reasoning_content = use_reasoning_content
        self._owns_client = client is None
        self.client = client if client is not None else ChatClient(config)
        self.stats = JudgementStats()
        self._lock = threading.Lock()

    def messages_for(self, request: JudgeRequest) -> list[dict[str, str]]:
        tools = request.tools if request.tools is not None else self.tools
        return build_rrm_messages(request.question, request.trajectory, tools=tools,
                                  max_tool_chars=self.max_tool_chars, multi_dim=self.multi_dim,
                                  with_confidence=self.with_confidence)

    def _prepare(self, items: Sequence[JudgeInput]) -> list[list[dict[str, str]]]:
        """Prompts for every item, or ValueError naming the first bad one (before any request)."""
        prompts = []
        for i, item in enumerate(items):
            request = as_request(item, i)
            try:
                prompts.append(self.messages_for(request))
            except ValueError as exc:
                raise ValueError(f"judge item {i}: {exc}") from None
        return prompts

    def _reply(self, result: Completion | EndpointError) -> RemoteReply:
        if isinstance(result, EndpointError):
            return RemoteReply(failed_judgement(self.fallback_score), "", None, result)
        text = reply_text(result, self.use_reasoning_content)
        return RemoteReply(parse_judgement(text, fallback_score=self.fallback_score), text, result, None)

    def _record(self, replies: Sequence[RemoteReply]) -> None:
        with self._lock:
            self.stats.update(r.judgement for r in replies)

    def iter_judge(self, items: Sequence[JudgeInput], **params: Any) -> Iterator[tuple[int, RemoteReply]]:
        """(index, reply) as requests finish; for callers that save results as they come.

        Every item is yielded exactly once: an item the client never answered (a client that stops
        early) gets an endpoint_error reply; a repeated or out-of-range index from it is ignored."""
        prompts = self._prepare(items)
        pending = set(range(len(prompts)))
        for i, result in self.client.iter_complete(prompts, **params):
            if i not in pending:
                continue
            pending.discard(i)
            reply = self._reply(result)
            self._record([reply])
            yield i, reply
        for i in sorted(pending):
            reply = self._reply(EndpointError("the endpoint client returned no result for this item", kind="internal"))
            self._record([reply])
            yield i, reply

    def judge_many_detailed(self, items: Sequence[JudgeInput], **params: Any) -> list[RemoteReply]:
        replies: list[RemoteReply | None] = [None] * len(items)
        for i, reply in self.iter_judge(items, **params):
            replies[i] = reply
        return replies  # type: ignore[return-value]  # every slot is filled

    def judge_many(self, items: Sequence[JudgeInput]) -> list[Judgement]:
        """One Judgement per item, in order; failed requests give the fallback score."""
        return [r.judgement for r in self.judge_many_detailed(items)]

    def judge(self, question: str, trajectory_messages: Sequence[Mapping[str, Any]],
              tools: Sequence[Any] | None = None) -> Judgement:
        return self.judge_many([JudgeRequest(question, trajectory_messages, tools)])[0]

    def stats_dict(self, prefix: str = "rrm/") -> dict[str, float]:
        """Parse-status counts and fractions (incl. endpoint_error) plus the client's retry counts."""
        with self._lock:
            out = self.stats.as_dict(prefix)
            key = ENDPOINT_ERROR.value
            errors = self.stats.counts[key]
            out[f"{prefix}count/{key}"] = float(errors)
            out[f"{prefix}frac/{key}"] = errors / self.stats.total if self.stats.total else 0.0
        client = self.client.stats()
        out[f"{prefix}endpoint/retries"] = float(client["retries"])
        out[f"{prefix}endpoint/attempts"] = float(client["attempts"])
        return out

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> "RemoteJudge":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
