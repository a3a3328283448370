"""Parse Qwen3/Hermes tool calls out of assistant text, with errors an agent can act on.

Format (what the Qwen3 template teaches and renders):
    <tool_call>
    {"name": "search", "arguments": {"query": "..."}}
    </tool_call>
several per turn. Every `<tool_call>` block (and every stray `</tool_call>`) yields one item, in
order: a `ToolCall`, or a `ToolCallError` whose `kind` says what was wrong and whose `message` tells
the agent how to fix it, e.g.
    tool call 2: invalid JSON at char 17 (near '"a" "b"}'): Expecting ',' delimiter.
    Write {"name": ..., "arguments": {...}} inside <tool_call></tool_call>
so the rollout can return the message as the tool response instead of failing the trajectory.

Leniency, on purpose: arguments given as a JSON *string* holding an object are accepted (some
models double-encode), and raw control characters inside JSON strings are accepted (models often
write multi-line code with literal newlines in "code"). Text inside `<think>...</think>` is not
searched for calls: only what follows the last `</think>` is the turn's answer, as in Qwen3's
reasoning/tool parsers.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FORMAT_HINT = 'Write {"name": ..., "arguments": {...}} inside <tool_call></tool_call>'
_DECODER = json.JSONDecoder(strict=False)
_TRAILING_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")

# Error kinds.
EMPTY = "empty"
MALFORMED_JSON = "malformed_json"
NOT_AN_OBJECT = "not_an_object"
MISSING_NAME = "missing_name"
INVALID_NAME = "invalid_name"
UNKNOWN_FIELDS = "unknown_fields"
MISSING_ARGUMENTS = "missing_arguments"
ARGUMENTS_NOT_OBJECT = "arguments_not_object"
UNKNOWN_TOOL = "unknown_tool"
UNCLOSED_TAG = "unclosed_tag"
UNEXPECTED_CLOSE_TAG = "unexpected_close_tag"


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call. `raw` is `text[start:end]`, tags included."""

    name: str
    arguments: dict[str, Any]
    raw: str
    start: int
    end: int
    index: int  # 1-based position among the items parse_tool_calls returned
    ok: bool = field(default=True, init=False)

    def as_message_tool_call(self) -> dict[str, Any]:
        """OpenAI-style entry for an assistant message's `tool_calls`."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolCallError:
    """A call the agent got wrong: `kind` (one of the constants above) and a fix-it `message`."""

    kind: str
    message: str
    raw: str
    start: int
    end: int
    index: int
    ok: bool = field(default=False, init=False)


def _answer_start(text: str, skip_reasoning: bool) -> int:
    if skip_reasoning and "</think>" in text:
        return text.rindex("</think>") + len("</think>")
    return 0


def _excerpt(s: str, pos: int, width: int = 12) -> str:
    return s[max(0, pos - width // 2):pos + width]


def _json_error(s: str, e: json.JSONDecodeError) -> str:
    return f"invalid JSON at char {e.pos} (near {_excerpt(s, e.pos)!r}): {e.msg}"


def _type_name(v: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null",
            int: "number", float: "number"}.get(type(v), type(v).__name__)


def _parse_body(body: str, n: int, tool_names: Collection[str] | None
                ) -> tuple[str, dict[str, Any]] | tuple[str, str]:
    """(name, arguments) or (error kind, message) for the text between the tags."""
    s = body.strip()
    if not s:
        return EMPTY, f"tool call {n}: empty <tool_call></tool_call>. {_FORMAT_HINT}"
    try:
        obj = _DECODER.decode(s)
    except json.JSONDecodeError as e:
        return MALFORMED_JSON, f"tool call {n}: {_json_error(s, e)}. {_FORMAT_HINT}"
    if not isinstance(obj, dict):
        return NOT_AN_OBJECT, (f"tool call {n}: expected a JSON object, got a {_type_name(obj)}. "
                               f"{_FORMAT_HINT}")
    if "name" not in obj:
        return MISSING_NAME, (f'tool call {n}: missing "name". '
                              'Write {"name": "<tool name>", "arguments": {...}}')
    name = obj["name"]
    if not isinstance(name, str) or not name.strip():
        return INVALID_NAME, (f'tool call {n}: "name" must be a non-empty string, '
                              f"got {json.dumps(name, ensure_ascii=False)}")
    unknown = sorted(set(obj) - {"name", "arguments"})
    if unknown:
        hint = (' (put the parameters under "arguments")'
                if "arguments" not in obj and {"parameters", "args", "params", "input"} & set(unknown)
                else "")
        return UNKNOWN_FIELDS, (f"tool call {n} ({name}): unknown field(s) "
                                f"{', '.join(json.dumps(k) for k in unknown)}{hint}; a call has "
                                f'exactly "name" and "arguments"')
    if "arguments" not in obj:
        return MISSING_ARGUMENTS, (f'tool call {n} ({name}): missing "arguments". Write '
                                   f'{{"name": "{name}", "arguments": {{...}}}}; use {{}} for none')
    args = obj["arguments"]
    if isinstance(args, str):
        args_text = args.strip()
        try:
            args = _DECODER.decode(args_text)
        except json.JSONDecodeError as e:
            return ARGUMENTS_NOT_OBJECT, (f'tool call {n} ({name}): "arguments" is a string that is '
                                          f"not JSON ({_json_error(args_text, e)}); "
                                          "give the arguments as a JSON object {...}")
    if not isinstance(args, dict):
        return ARGUMENTS_NOT_OBJECT, (f'tool call {n} ({name}): "arguments" must be a JSON object '
                                      f'{{"param": value, ...}}, got a {_type_name(args)}')
    if tool_names is not None and name not in tool_names:
        return UNKNOWN_TOOL, (f"tool call {n}: unknown tool {json.dumps(name)}; available tools: "
                              f"{', '.join(sorted(tool_names)) or '(none)'}")
    return name, args


def parse_tool_calls(text: str, tool_names: Collection[str] | None = None, *,
                     skip_reasoning: bool = True) -> list[ToolCall | ToolCallError]:
    """Every tool-call block of `text`, parsed or explained, in order of appearance.

    `tool_names`: if given, a call to any other name is an `unknown_tool` error.
    `skip_reasoning`: only look after the last `</think>` (offsets still index `text`).
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_tool_calls: text must be a string, got {type(text).__name__}")
    items: list[ToolCall | ToolCallError] = []
    pos = _answer_start(text, skip_reasoning)
    while True:
        op, cl = text.find(OPEN, pos), text.find(CLOSE, pos)
        if op < 0 and cl < 0:
            return items
        n = len(items) + 1
        if cl >= 0 and (op < 0 or cl < op):  # a close tag with nothing open
            end = cl + len(CLOSE)
            items.append(ToolCallError(UNEXPECTED_CLOSE_TAG,
                                       f"tool call {n}: {CLOSE} without a matching {OPEN}; "
                                       f"start each call with {OPEN}", text[cl:end], cl, end, n))
            pos = end
            continue
        body_start = op + len(OPEN)
        next_open = text.find(OPEN, body_start)
        close = text.find(CLOSE, body_start)
        if close < 0 or (0 <= next_open < close):
            end = next_open if next_open >= 0 else len(text)
            items.append(ToolCallError(UNCLOSED_TAG,
                                       f"tool call {n}: {OPEN} is never closed; end each call with "
                                       f"{CLOSE}. {_FORMAT_HINT}", text[op:end], op, end, n))
            pos = end
            continue
        end = close + len(CLOSE)
        first, second = _parse_body(text[body_start:close], n, tool_names)
        if isinstance(second, dict):
            items.append(ToolCall(first, second, text[op:end], op, end, n))
        else:
            items.append(ToolCallError(first, second, text[op:end], op, end, n))
        pos = end


def _drop_trailing_stop(text: str) -> str:
    for stop in _TRAILING_STOP_TOKENS:
        if text.endswith(stop):
            return text[: -len(stop)]
    return text


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, answer) of an assistant output, split at the last `</think>` like the template.

    Without `</think>` the whole text is the answer. A trailing `<|im_end|>` is dropped.
    """
    text = _drop_trailing_stop(text)
    if "</think>" not in text:
        return "", text
    reasoning = text.split("</think>")[0].split("<think>")[-1].strip("\n")
    return reasoning, text.split("</think>")[-1].lstrip("\n")


def content_without_tool_calls(text: str) -> str:
    """The answer text of an assistant output: no reasoning, no tool-call blocks (good or bad)."""
    pieces, pos = [], _answer_start(text, True)
    for item in parse_tool_calls(text):
        pieces.append(text[pos:item.start])
        pos = item.end
    pieces.append(text[pos:])
    return _drop_trailing_stop("".join(pieces).rstrip()).strip()


def assistant_message_from_text(text: str, tool_names: Collection[str] | None = None
                                ) -> tuple[dict[str, Any], list[ToolCallError]]:
    """An OpenAI-style assistant message from generated text, and the calls that failed to parse.

    Error offsets index `text`. `render(..., mode="train")` of the message reproduces canonical
    output (`<think>\\nR\\n</think>\\n\\nC\\n<tool_call>\\n{"name": .., "arguments": ..}\\n</tool_call>`).
    """
    items = parse_tool_calls(text, tool_names)
    message: dict[str, Any] = {"role": "assistant", "content": content_without_tool_calls(text)}
    if "</think>" in text:
        message["reasoning_content"] = split_reasoning(text)[0]
    calls = [c.as_message_tool_call() for c in items if isinstance(c, ToolCall)]
    if calls:
        message["tool_calls"] = calls
    return message, [e for e in items if isinstance(e, ToolCallError)]
