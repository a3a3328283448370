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

Strictness, also on purpose (a tool or the renderer would otherwise get something it cannot use):
NaN/Infinity, duplicate keys, integers too long for Python, nesting too deep for the decoder and
lone surrogates (`"\\ud800"`) are errors, not exceptions; a name must be usable verbatim inside the
template's `{"name": "..."}` (no quotes, backslashes, control characters, surrounding spaces).
Hostile text is handled in linear time: tags are located in one regex pass.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FORMAT_HINT = 'Write {"name": ..., "arguments": {...}} inside <tool_call></tool_call>'
_TAG = re.compile(re.escape(OPEN) + "|" + re.escape(CLOSE))
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
INVALID_UNICODE = "invalid_unicode"


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


class _Invalid(ValueError):
    """JSON the stdlib decoder would accept (or crash on) but a tool call must not contain."""

    def __init__(self, msg: str, token: str | None = None):
        super().__init__(msg)
        self.msg, self.token = msg, token


def _parse_int(digits: str) -> int:
    try:
        return int(digits)
    except ValueError:  # longer than sys.get_int_max_str_digits()
        raise _Invalid(f"a number with {len(digits)} digits is too long", digits) from None


def _reject_constant(name: str) -> Any:
    raise _Invalid(f"{name} is not valid JSON; use a number, a string or null", name)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _Invalid(f"duplicate key {_show(dup)}")
    return obj


_DECODER = json.JSONDecoder(strict=False, object_pairs_hook=_object, parse_int=_parse_int,
                            parse_constant=_reject_constant)


def _decode(s: str) -> Any:
    """`s` as JSON, or `ValueError` whose message says what is wrong and where in `s`."""
    try:
        return _DECODER.decode(s)
    except json.JSONDecodeError as e:
        where = f"at char {e.pos} (near {_excerpt(s, e.pos)!r})"
        raise ValueError(f"invalid JSON {where}: {e.msg}") from None
    except _Invalid as e:
        pos = s.find(e.token) if e.token else -1
        where = f" at char {pos} (near {_excerpt(s, pos)!r})" if pos >= 0 else ""
        raise ValueError(f"invalid JSON{where}: {e.msg}") from None
    except RecursionError:
        raise ValueError("invalid JSON: nested too deeply") from None


def _show(v: Any) -> str:
    """`v` as JSON for a message; \\u-escaped when it holds lone surrogates (messages go back
    to the model and must tokenize)."""
    out = json.dumps(v, ensure_ascii=False)
    try:
        out.encode("utf-8")
    except UnicodeEncodeError:
        out = json.dumps(v)
    return out


def _surrogate_at(value: Any, path: str) -> str | None:
    """Where a lone surrogate hides in decoded JSON (`"\\ud800"` is valid JSON but not text)."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, dict):
            for k, item in v.items():
                stack += [(f"a key of {path}", k), (f"{path}[{_show(k)}]", item)]
        elif isinstance(v, list):
            stack += [(f"{path}[{i}]", item) for i, item in enumerate(v)]
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                return f"{path} holds a lone surrogate {v[e.start]!r} at char {e.start}"
    return None


def _name_problem(name: str) -> str | None:
    if name != name.strip():
        return "has leading or trailing whitespace"
    bad = next((c for c in name if c in '"\\' or ord(c) < 0x20 or 0xD800 <= ord(c) < 0xE000), None)
    if bad is not None:
        return f"contains {bad!r}"
    return None


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
        obj = _decode(s)
    except ValueError as e:
        return MALFORMED_JSON, f"tool call {n}: {e}. {_FORMAT_HINT}"
    if not isinstance(obj, dict):
        return NOT_AN_OBJECT, (f"tool call {n}: expected a JSON object, got a {_type_name(obj)}. "
                               f"{_FORMAT_HINT}")
    if "name" not in obj:
        return MISSING_NAME, (f'tool call {n}: missing "name". '
                              'Write {"name": "<tool name>", "arguments": {...}}')
    name = obj["name"]
    if not isinstance(name, str) or not name.strip():
        return INVALID_NAME, (f'tool call {n}: "name" must be a non-empty string, '
                              f"got {_show(name)}")
    problem = _name_problem(name)
    if problem:
        return INVALID_NAME, (f'tool call {n}: "name" must be a plain function name, got '
                              f"{_show(name)}, which {problem}")
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
        try:
            args = _decode(args.strip())
        except ValueError as e:
            return ARGUMENTS_NOT_OBJECT, (f'tool call {n} ({name}): "arguments" is a string that '
                                          f"is not JSON ({e}); give the arguments as a JSON object "
                                          "{...}")
    if not isinstance(args, dict):
        return ARGUMENTS_NOT_OBJECT, (f'tool call {n} ({name}): "arguments" must be a JSON object '
                                      f'{{"param": value, ...}}, got a {_type_name(args)}')
    where = _surrogate_at(args, "arguments")
    if where:
        return INVALID_UNICODE, (f"tool call {n} ({name}): {where}, which is not text; write the "
                                 "character itself or drop it")
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
    if isinstance(tool_names, str):  # `in` would match substrings: "sea" in "search"
        raise TypeError("parse_tool_calls: tool_names must be a collection of names, not a string")
    items: list[ToolCall | ToolCallError] = []
    start = _answer_start(text, skip_reasoning)
    tags = [(m.start(), m.group()) for m in _TAG.finditer(text, start)]
    for k, (at, tag) in enumerate(tags):
        n = len(items) + 1
        nxt = tags[k + 1] if k + 1 < len(tags) else None
        if tag == CLOSE:
            if k > 0 and tags[k - 1][1] == OPEN:
                continue  # closes the call handled at the open tag
            end = at + len(CLOSE)
            items.append(ToolCallError(UNEXPECTED_CLOSE_TAG,
                                       f"tool call {n}: {CLOSE} without a matching {OPEN}; "
                                       f"start each call with {OPEN}", text[at:end], at, end, n))
        elif nxt is None or nxt[1] == OPEN:
            end = nxt[0] if nxt else len(text)
            items.append(ToolCallError(UNCLOSED_TAG,
                                       f"tool call {n}: {OPEN} is never closed; end each call with "
                                       f"{CLOSE}. {_FORMAT_HINT}", text[at:end], at, end, n))
        else:
            end = nxt[0] + len(CLOSE)
            first, second = _parse_body(text[at + len(OPEN):nxt[0]], n, tool_names)
            if isinstance(second, dict):
                items.append(ToolCall(first, second, text[at:end], at, end, n))
            else:
                items.append(ToolCallError(first, second, text[at:end], at, end, n))
    return items


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
