"""Generated text -> OpenAI response pieces: message, tool_calls, finish reason, stream deltas.

What the model writes (Qwen3): `<think>\\nreasoning\\n</think>\\n\\nanswer` and, when it calls
tools, `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks. The reply carries
the reasoning in `reasoning_content` (as vLLM's qwen3 reasoning parser does; off with
reasoning_parser=False), the answer without the calls in `content`, and each well-formed call in
`tool_calls` with its arguments as a JSON string and finish_reason "tool_calls". A malformed call
block is left in `content` as written, so the client sees what went wrong. A stop string ends the
text before it (OpenAI semantics); special tokens (<|im_end|>, ...) are not part of the text.

Streaming sends the same text in pieces: `ChoiceStream.update(text_so_far, final)` returns the
new part of reasoning and content. Text that may still change is held back: a trailing partial
stop string or partial UTF-8 character, trailing whitespace, and everything from `<tool_call>`
on (calls are sent whole, in the final chunk). The pieces then add up to the non-streamed reply.
"""
from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any, Optional, Sequence

from reagent_jax.chat import ToolCall, parse_tool_calls, split_reasoning

THINK_OPEN, THINK_CLOSE, CALL_OPEN = "<think>", "</think>", "<tool_call>"


@dataclasses.dataclass(frozen=True)
class ParsedOutput:
    reasoning: Optional[str]  # None: the output had no think block (or the parser is off)
    content: str
    tool_calls: tuple[ToolCall, ...] = ()


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """The text before the first occurrence of any stop string."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


def hold_partial_stop(text: str, stops: Sequence[str]) -> str:
    """Drops a tail that could be the start of a stop string (it may complete later)."""
    for k in range(min(len(text), max((len(s) for s in stops), default=0)), 0, -1):
        if any(s.startswith(text[-k:]) for s in stops):
            return text[:-k]
    return text


def _split(text: str, reasoning_parser: bool, final: bool) -> tuple[Optional[str], str]:
    if not reasoning_parser:
        return None, text
    if THINK_CLOSE in text:
        return split_reasoning(text)
    head = text.lstrip()
    if head.startswith(THINK_OPEN):  # still thinking (or cut off while thinking)
        body = head[len(THINK_OPEN):]
        return (body.strip("\n") if final else body.lstrip("\n").rstrip("\n")), ""
    return None, text


def _without_calls(answer: str, calls: Sequence[ToolCall]) -> str:
    pieces, pos = [], 0
    for c in calls:
        pieces.append(answer[pos:c.start])
        pos = c.end
    pieces.append(answer[pos:])
    return "".join(pieces)


def parse_output(text: str, *, tools_enabled: bool, reasoning_parser: bool = True) -> ParsedOutput:
    """The final reply of one choice (text already cut at stop strings)."""
    reasoning, answer = _split(text, reasoning_parser, final=True)
    calls: tuple[ToolCall, ...] = ()
    if tools_enabled and CALL_OPEN in answer:
        calls = tuple(c for c in parse_tool_calls(answer, skip_reasoning=False) if isinstance(c, ToolCall))
        answer = _without_calls(answer, calls)
    return ParsedOutput(reasoning, answer.strip(), calls)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def openai_tool_calls(calls: Sequence[ToolCall], *, stream: bool = False) -> list[dict[str, Any]]:
    """OpenAI `tool_calls` entries (arguments as a JSON string); stream=True adds each `index`."""
    out = []
    for i, c in enumerate(calls):
        item = {"id": new_call_id(), "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
        out.append({"index": i, **item} if stream else item)
    return out


def chat_message(parsed: ParsedOutput) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning is not None:
        msg["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        msg["tool_calls"] = openai_tool_calls(parsed.tool_calls)
        msg["content"] = parsed.content or None  # OpenAI sends null content with tool calls
    return msg


def finish_reason(engine_reason: str, has_tool_calls: bool = False) -> str:
    """Engine finish reason -> OpenAI's ("stop", "length", "tool_calls")."""
    if has_tool_calls:
        return "tool_calls"
    return "length" if engine_reason == "length" else "stop"


def chat_logprobs(token_texts: Sequence[str], logprobs: Sequence[float],
                  top: Optional[Sequence[Sequence[tuple[str, float]]]] = None) -> dict[str, Any]:
    """OpenAI's `logprobs` of a choice: each sampled token's logprob and, when `top` is given, its
    position's alternatives as (text, logprob) pairs, best first."""
    def entry(t: str, lp: float) -> dict[str, Any]:
        return {"token": t, "logprob": float(lp), "bytes": list(t.encode("utf-8"))}
    return {"content": [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in (top[j] if top else ())]}
                        for j, (t, lp) in enumerate(zip(token_texts, logprobs))]}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class ChoiceStream:
    """Incremental deltas of one streamed choice (see the module docstring)."""

    def __init__(self, *, stops: Sequence[str] = (), tools_enabled: bool = False, reasoning_parser: bool = True,
                 raw: bool = False):
        """raw=True (text completions): the text as generated, only cut at stop strings."""
        self.stops, self.tools_enabled, self.reasoning_parser = tuple(stops), tools_enabled, reasoning_parser
        self.raw = raw
        self.sent_reasoning, self.sent_content = "", ""
        self.parsed: Optional[ParsedOutput] = None

    def update(self, text: str, final: bool = False) -> dict[str, str]:
        """New `reasoning_content` / `content` since the last call, given the whole text so far
        (not yet cut at stop strings). With final=True the choice is complete: `self.parsed`
        then holds the full reply (tool calls included)."""
        text = cut_at_stop(text, self.stops)
        if self.raw:
            reasoning, content = None, text if final else hold_partial_stop(text.rstrip("\ufffd"), self.stops)
        elif final:
            self.parsed = parse_output(text, tools_enabled=self.tools_enabled, reasoning_parser=self.reasoning_parser)
            reasoning, content = self.parsed.reasoning, self.parsed.content
        else:
            text = hold_partial_stop(text.rstrip("\ufffd"), self.stops)
            reasoning, answer = _split(text, self.reasoning_parser, final=False)
            if self.tools_enabled:
                answer = answer.split(CALL_OPEN, 1)[0]
            content = answer.strip()
        delta: dict[str, str] = {}
        if reasoning and reasoning.startswith(self.sent_reasoning) and len(reasoning) > len(self.sent_reasoning):
            delta["reasoning_content"] = reasoning[len(self.sent_reasoning):]
            self.sent_reasoning = reasoning
        if content and content.startswith(self.sent_content) and len(content) > len(self.sent_content):
            delta["content"] = content[len(self.sent_content):]
            self.sent_content = content
        return delta
