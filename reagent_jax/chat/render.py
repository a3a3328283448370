"""Qwen3 chat rendering to token ids with an exact loss mask.

`render(tok, messages, ...)` reproduces the original Qwen3 chat template
(`trl/chat_templates/qwen3.jinja`, copied in `qwen3_template.py`) character for character, and
tokenizes it segment by segment so every token knows who wrote it: `loss_mask` is 1 exactly on the
tokens of an assistant turn (its `<think>` block, content, tool calls and closing `<|im_end|>`) and
0 on system, user and tool turns and on template tokens (`<|im_start|>assistant\\n`, the `\\n`
after `<|im_end|>`, the generation prompt).

Per-turn loss control (the OpenAI fine-tuning convention): an assistant message with `"weight": 0`
renders exactly the same text, but none of its tokens is trainable, and its tokens are left out of
`context_mask` too, so no loss ever reaches them. SFT demonstrations use it for a flawed first
attempt that a critique then corrects: the model sees the attempt but is never taught to make it.

Two rendering modes:

* `mode="original"` (default) is the Qwen3 template exactly, what the model sees at inference
  (HF, vLLM, SGLang). The template drops the `<think>` block of every assistant turn that comes
  before the last real user query, and of later turns whose reasoning is empty unless it is the
  last message. So appending a message can change how *earlier* turns render: a new user query
  strips the think blocks of all previous turns, and appending a tool result after an assistant
  turn with empty reasoning removes that turn's `<think>\\n\\n</think>\\n\\n`. Earlier ids then
  stop being a prefix of later ones, which breaks multi-turn training (the tokens the policy
  sampled are not the tokens it is trained on) and incremental rollouts.
* `mode="train"` differs from the template in exactly one place: every assistant turn is rendered
  the way the template renders the final turn, `<think>\\n{reasoning}\\n</think>\\n\\n{content}`
  (reasoning stripped of surrounding newlines, content of leading ones; an empty reasoning gives
  `<think>\\n\\n</think>\\n\\n`), whatever its position. This keeps each turn exactly as it was
  produced, and appending a complete turn (user, system, assistant, or a group of consecutive
  tool messages) leaves all earlier ids and mask values an exact prefix. It is trl's
  `qwen3_training.jinja` without the generation tags. For a conversation whose only assistant
  turn is the last message the two modes are identical.

`enable_thinking=False` adds the template's empty think block to the generation prompt; in both
modes it also marks an assistant turn's empty `<think>\\n\\n</think>\\n\\n` as template (mask 0),
because in non-thinking mode the prompt wrote it, not the model.

Segment-wise ids: each segment (template text, an assistant body, the generation prompt) is
encoded on its own and the ids are concatenated. Boundaries next to a control token
(`<|im_start|>`, `<|im_end|>`, `<think>`, ...) cannot change the result, because control tokens are
split out before the BPE pre-tokenizer runs. The one boundary inside plain text is
`<|im_start|>assistant\\n` | body (and `</think>\\n\\n` | content with `enable_thinking=False`).
There the Qwen2 regex would join the `\\n` with the body only when the body starts with optional
whitespace followed by a newline (`\\s*[\\r\\n]`): then `tok.encode(text)` makes one `\\n\\n`-style
token where the segment-wise ids have two. The segment-wise ids are the ones we use: they are what
the model sees when it generates (the prompt ends at `assistant\\n` and the model's tokens follow),
and only they give every token a single author. Elsewhere they equal `tok.encode(text)`.

Message content is inserted verbatim, like the template does: text that spells a control token
(e.g. a user writing `<|im_end|>`) is encoded as that control token, as `apply_chat_template` +
`encode` would. The tokenizer NFC-normalizes, so `decode(ids) == text` only for NFC text.

The oracle is the template as transformers (>= 5) renders it: keys whose value is None count as
absent, reasoning may come as `reasoning_content`, `thinking` or `reasoning` (vLLM's name), first
non-None wins, and numpy scalars serialise as Python numbers. Where the template would render
nonsense we raise ValueError/TypeError naming the message instead: non-string content (the
template silently drops it), unknown roles (silently dropped), tools that are not a list of dicts,
non-bool `enable_thinking` (`0` would mean thinking to the template), function names that break
the `{"name": "..."}` JSON, arguments that are not a JSON object, lone surrogates (untokenizable).
Lenient where the template errors: a missing `arguments` renders as `{}`, a None system prompt
as an empty one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from transformers import PreTrainedTokenizerBase

Message = Mapping[str, Any]
Mode = Literal["original", "train"]

_ROLES = ("system", "user", "assistant", "tool")
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")  # transformers' aliases, in order
_EMPTY_THINK = "<think>\n\n</think>\n\n"
_HIDDEN = 2  # segment kind of a weight-0 assistant turn (0/False: context, 1/True: trained)
_TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                 "You are provided with function signatures within <tools></tools> XML tags:\n"
                 "<tools>")
_TOOLS_INSTRUCTIONS = ("\n</tools>\n\nFor each function call, return a json object with function "
                       "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                       "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")


@dataclass(frozen=True)
class Rendered:
    """Token ids of a rendered conversation (or suffix) and who wrote each token."""

    ids: list[int]  # [T]
    loss_mask: list[int]  # [T], 1 on tokens an assistant turn produced (one not marked weight 0)
    text: str  # the rendered text (equals the Qwen3 template's output in mode="original")
    context_mask: list[int]  # [T], 1 on every other token except those of weight-0 assistant turns

    def __len__(self) -> int:
        return len(self.ids)


def _numpy_scalar(value: Any) -> Any:
    if isinstance(value, np.generic):  # transformers hands the template plain Python scalars
        return value.item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def tojson(value: Any) -> str:
    """The template's `tojson` as transformers defines it (non-ASCII kept, default separators)."""
    return json.dumps(value, ensure_ascii=False, default=_numpy_scalar)


def _tojson_at(value: Any, where: str) -> str:
    try:
        return tojson(value)
    except (TypeError, ValueError, RecursionError) as e:
        raise ValueError(f"{where} is not JSON-serialisable: {e}") from None


def check_unicode(text: str, where: str) -> None:
    """Lone surrogates are not text: the tokenizer would fail with an opaque TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{where}: lone surrogate {text[e.start]!r} at char {e.start} (near "
                         f"{text[max(0, e.start - 20):e.start + 20]!r}); text must be valid "
                         "Unicode") from None


def _where(i: int, msg: Message) -> str:
    return f"messages[{i}] (role {msg.get('role')!r})"


def _content(msg: Message, i: int) -> str:
    content = msg.get("content")
    if content is None:
        return ""
    if not isinstance(content, str):
        raise ValueError(f"{_where(i, msg)}: content must be a string or None, got "
                         f"{type(content).__name__} (multimodal content parts are not supported)")
    return content


def _reasoning_field(msg: Message) -> tuple[str, Any]:
    """(key, value) of the first non-None reasoning key, as transformers picks it."""
    return next(((k, msg[k]) for k in _REASONING_KEYS if msg.get(k) is not None),
                ("reasoning_content", None))


def _validate(messages: Sequence[Message]) -> None:
    if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of message dicts, got {type(messages).__name__}")
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise TypeError(f"messages[{i}] must be a dict, got {type(msg).__name__}")
        if msg.get("role") not in _ROLES:
            raise ValueError(f"messages[{i}]: role must be one of {_ROLES}, got {msg.get('role')!r}")
        check_unicode(_content(msg, i), f"{_where(i, msg)} content")
        key, rc = _reasoning_field(msg)
        if rc is not None and not isinstance(rc, str):
            raise ValueError(f"{_where(i, msg)}: {key} must be a string or None")
        if rc is not None:
            check_unicode(rc, f"{_where(i, msg)} {key}")
        _check_weight(msg, i)


def _check_weight(msg: Message, i: int) -> None:
    """`weight` (OpenAI fine-tuning convention): 0 or 1, on assistant turns only."""
    weight = msg.get("weight")
    if weight is None:
        return
    if msg["role"] != "assistant":
        raise ValueError(f"{_where(i, msg)}: weight applies to assistant turns only")
    if isinstance(weight, bool) or weight not in (0, 1):
        raise ValueError(f"{_where(i, msg)}: weight must be 0 (not trained) or 1, got {weight!r}")


def trained(msg: Message) -> bool:
    """Whether an assistant message's tokens are trained (`weight` absent, None or 1)."""
    return msg.get("weight") != 0


def _split_reasoning(msg: Message, content: str) -> tuple[str, str]:
    """(reasoning, content) the way the template derives them."""
    _, reasoning = _reasoning_field(msg)
    if isinstance(reasoning, str):
        return reasoning, content
    if "</think>" in content:
        reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        return reasoning, content.split("</think>")[-1].lstrip("\n")
    return "", content


# Checks only the shape of an arguments string (control characters in strings allowed, as the
# parser allows them; integers kept as text so no length limit applies).
_ARGS_CHECK = json.JSONDecoder(strict=False, parse_int=str)


def _tool_call_text(call: Any, where: str) -> str:
    """`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` for one call."""
    if not isinstance(call, Mapping):
        raise ValueError(f"{where}: expected a dict, got {type(call).__name__}")
    fn = call.get("function") or call  # {"type": "function", "function": {...}} or flat
    if not isinstance(fn, Mapping):
        raise ValueError(f"{where}: 'function' must be a dict, got {type(fn).__name__}")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: function name must be a non-empty string, got {name!r}")
    bad = next((c for c in name if c in '"\\' or ord(c) < 0x20), None)
    if bad is not None:  # the template writes the name verbatim inside "...": broken JSON
        raise ValueError(f"{where}: function name {name!r} contains {bad!r}, which the template "
                         "would write unescaped into the call's JSON")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:  # emitted verbatim (as the template does), but it must be a JSON object
            ok, why = isinstance(_ARGS_CHECK.decode(args), dict), "it is not an object"
        except json.JSONDecodeError as e:
            ok, why = False, f"{e.msg} at char {e.pos}"
        except RecursionError:
            ok, why = False, "it is nested too deeply to check"
        if not ok:
            raise ValueError(f"{where}: arguments string must hold a JSON object ({why}), "
                             f"got {args[:80]!r}")
        args_text = args
    elif isinstance(args, Mapping):
        args_text = _tojson_at(dict(args), f"{where}: arguments")
    else:
        raise ValueError(f"{where}: arguments must be a dict or a JSON string, "
                         f"got {type(args).__name__}")
    return '<tool_call>\n{"name": "' + name + '", "arguments": ' + args_text + "}\n</tool_call>"


def _last_query_index(messages: Sequence[Message]) -> int:
    """Index of the last user message that is a real query (not wrapped tool output)."""
    for index in range(len(messages) - 1, -1, -1):
        msg = messages[index]
        c = msg.get("content")
        if msg.get("role") == "user" and isinstance(c, str) and not (
                c.startswith("<tool_response>") and c.endswith("</tool_response>")):
            return index
    return len(messages) - 1


def _assistant_segments(msg: Message, i: int, with_think: bool,
                        enable_thinking: bool) -> list[tuple[str, bool]]:
    reasoning, content = _split_reasoning(msg, _content(msg, i))
    if with_think:
        think = "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n"
        shown = content.lstrip("\n")
    else:
        think, shown = "", content
    calls = msg.get("tool_calls") or []
    if not isinstance(calls, Sequence) or isinstance(calls, (str, Mapping)):
        raise ValueError(f"{_where(i, msg)}: tool_calls must be a list")
    tail = ""
    for j, call in enumerate(calls):
        if j > 0 or content:
            tail += "\n"
        tail += _tool_call_text(call, f"{_where(i, msg)}.tool_calls[{j}]")
    segments = [("<|im_start|>assistant\n", False)]
    if think == _EMPTY_THINK and not enable_thinking:
        segments.append((think, False))  # the non-thinking generation prompt wrote it
        think = ""
    segments += [(think + shown + tail + "<|im_end|>", True), ("\n", False)]
    if not trained(msg):  # the whole turn, template tokens too, is out of every loss
        segments = [(text, _HIDDEN) for text, _ in segments]
    return segments


def _message_segments(messages: Sequence[Message], *, mode: Mode, enable_thinking: bool,
                      starts_conversation: bool) -> list[tuple[str, bool]]:
    """Segments of every message; the leading system message belongs to the header instead."""
    last_query = _last_query_index(messages)
    segments: list[tuple[str, bool]] = []
    for i, msg in enumerate(messages):
        role, first, last = msg["role"], i == 0, i == len(messages) - 1
        content = _content(msg, i)
        if role == "user" or (role == "system" and not (first and starts_conversation)):
            segments.append((f"<|im_start|>{role}\n{content}<|im_end|>\n", False))
        elif role == "assistant":
            if mode == "train":
                with_think = True
            else:
                reasoning, _ = _split_reasoning(msg, content)
                with_think = i > last_query and (last or bool(reasoning))
            segments += _assistant_segments(msg, i, with_think, enable_thinking)
        elif role == "tool":
            opens = first or messages[i - 1]["role"] != "tool"
            closes = last or messages[i + 1]["role"] != "tool"
            segments.append((("<|im_start|>user" if opens else "")
                             + "\n<tool_response>\n" + content + "\n</tool_response>"
                             + ("<|im_end|>\n" if closes else ""), False))
    return segments


def _check_tools(tools: Any) -> None:
    """transformers rejects what is not a list of dicts; the template would print dict keys."""
    if tools is None:
        return
    if isinstance(tools, (str, Mapping)) or not isinstance(tools, Sequence):
        raise TypeError("tools must be a list of function schemas (dicts), "
                        f"got {type(tools).__name__}")
    for k, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            hint = " (use transformers.utils.get_json_schema)" if callable(tool) else ""
            raise TypeError(f"tools[{k}] must be a function schema (dict), "
                            f"got {type(tool).__name__}{hint}")


def tools_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The Qwen3 template's tool instructions (schemas as JSON lines, the `<tool_call>` format);
    other templates without tool support get the same text in their system prompt."""
    schemas = "".join("\n" + _tojson_at(tool, f"tools[{k}]") for k, tool in enumerate(tools))
    return _TOOLS_HEADER + schemas + _TOOLS_INSTRUCTIONS


def _header(messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None) -> str:
    has_system = bool(messages) and messages[0]["role"] == "system"
    if tools:
        text = "<|im_start|>system\n"
        if has_system:
            text += _content(messages[0], 0) + "\n\n"
        return text + tools_prompt(tools) + "<|im_end|>\n"
    if has_system:
        return "<|im_start|>system\n" + _content(messages[0], 0) + "<|im_end|>\n"
    return ""


def _generation_prompt(enable_thinking: bool) -> str:
    return "<|im_start|>assistant\n" + ("" if enable_thinking else _EMPTY_THINK)


def _tokenize(tok: PreTrainedTokenizerBase, segments: list[tuple[str, int]]) -> Rendered:
    """Segments are (text, kind): False/0 context, True/1 trained, _HIDDEN a weight-0 turn."""
    segments = [(text, kind) for text, kind in segments if text]
    for text, _ in segments:  # tools and tool-call arguments were not checked by _validate
        check_unicode(text, "rendered text (tools or tool-call arguments)")
    if not segments:
        return Rendered([], [], "", [])
    encoded = tok([text for text, _ in segments], add_special_tokens=False)["input_ids"]
    ids: list[int] = []
    mask: list[int] = []
    context: list[int] = []
    for seg_ids, (_, kind) in zip(encoded, segments):
        ids += seg_ids
        mask += [int(kind == 1)] * len(seg_ids)
        context += [int(kind == 0)] * len(seg_ids)
    return Rendered(ids, mask, "".join(text for text, _ in segments), context)


def _check_mode(mode: str, enable_thinking: Any) -> None:
    if mode not in ("original", "train"):
        raise ValueError(f"mode must be 'original' or 'train', got {mode!r}")
    if not isinstance(enable_thinking, bool):
        raise TypeError(f"enable_thinking must be True or False, got {enable_thinking!r} (the "
                        "template tests `is false`, so only False turns thinking off)")


def render(tok: PreTrainedTokenizerBase, messages: Sequence[Message],
           tools: Sequence[Mapping[str, Any]] | None = None,
           add_generation_prompt: bool = False, *, enable_thinking: bool = True,
           mode: Mode = "original") -> Rendered:
    """Render `messages` (OpenAI-style dicts) as Qwen3 chat ids with a loss mask.

    `tools`: OpenAI-style function schemas, listed in the system turn. Assistant `tool_calls`
    items are `{"type": "function", "function": {"name", "arguments"}}` or flat
    `{"name", "arguments"}`, arguments a dict or a JSON-object string (emitted verbatim).
    Reasoning comes from `reasoning_content` (or its aliases `thinking`, `reasoning`, as in
    transformers) or from `<think>...</think>` inside `content`.
    See the module docstring for `mode` and `enable_thinking`.
    """
    _check_mode(mode, enable_thinking)
    _check_tools(tools)
    _validate(messages)
    if not messages:
        raise ValueError("render: messages is empty")
    segments = [(_header(messages, tools), False)]
    segments += _message_segments(messages, mode=mode, enable_thinking=enable_thinking,
                                  starts_conversation=True)
    if add_generation_prompt:
        segments.append((_generation_prompt(enable_thinking), False))
    return _tokenize(tok, segments)


def render_suffix(tok: PreTrainedTokenizerBase, new_messages: Sequence[Message],
                  add_generation_prompt: bool = True, *,
                  enable_thinking: bool = True) -> Rendered:
    """The ids `render(..., mode="train")` adds when `new_messages` are appended to a conversation.

    `render(tok, prev + new, mode="train", add_generation_prompt=g)` equals
    `render(tok, prev, mode="train")` followed by `render_suffix(tok, new, g)`, for any `prev`
    that ends with a complete turn (mode="original" gives the same for `prev` without assistant
    turns, e.g. a first prompt). Consecutive tool messages form one user turn, so pass all the
    tool results of an assistant turn in one call (and never start `new` with a tool message when
    `prev` ended with one). A system message here renders as a system turn, not as the header.
    The rollout engine uses this to append tool results or critiques as tokens after a sampled
    turn (see `close_assistant_turn`) without re-rendering the history.
    """
    _check_mode("train", enable_thinking)
    _validate(new_messages)
    segments = _message_segments(new_messages, mode="train", enable_thinking=enable_thinking,
                                 starts_conversation=False)
    if add_generation_prompt:
        segments.append((_generation_prompt(enable_thinking), False))
    return _tokenize(tok, segments)


def close_assistant_turn(tok: PreTrainedTokenizerBase, sampled_ids: Sequence[int]) -> list[int]:
    """Template ids (mask 0) that complete a sampled assistant turn before the next turn.

    A turn the model finished with `<|im_end|>` only lacks the template's `\\n`; a truncated turn
    (stopped by a token budget) also gets its `<|im_end|>`, so the next turn is well-formed.
    """
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    newline = tok.encode("\n", add_special_tokens=False)
    if sampled_ids and sampled_ids[-1] == im_end:
        return list(newline)
    return [im_end] + list(newline)
