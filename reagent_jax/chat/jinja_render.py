"""Any model's own chat template (jinja, as transformers renders it) to ids with a loss mask.

The text is `tok.apply_chat_template(..., tokenize=False)`, so ids equal transformers'
`apply_chat_template(..., tokenize=True)` exactly (the whole text is tokenized once). Who wrote
each token comes from rendering growing prefixes of the conversation: message k's text is
`render(messages[:k+1])` minus `render(messages[:k])`, and an assistant turn's trainable part is
what follows `render(messages[:k], add_generation_prompt=True)` up to and including the template's
end-of-turn token (e.g. `<|im_end|>`, `<|eot_id|>`); the template text after it (`\\n`) is mask 0.
A token is trainable when its characters overlap a trainable span (transformers' own rule for
`return_assistant_tokens_mask`). A weight-0 assistant turn (see `render.py`) is one span from the
end of the previous message to its own end, out of both the loss mask and the context mask.

That needs a template that is *prefix-preserving*: appending a message never changes how earlier
ones render. Most are (ChatML, SmolLM2, Llama 3, Qwen2.5). One that is not (e.g. one that drops
earlier reasoning, as Qwen3's does) raises ValueError naming the first message it rewrites in
mode="train"; mode="original" still returns the template's exact ids, with a mask only on the
turns it could place. Qwen3's own template has a Python renderer with a documented training
variant (`render.py`).

Tools: a template that renders `tools` and `tool_calls` as `<tool_call>{json}</tool_call>` (Qwen2.5,
Hermes) gets them as they are. Any other (SmolLM2's ChatML has no tools; Llama 3.x writes calls as
bare JSON the parser does not read) gets the `<tool_call>{json}</tool_call>` text convention:
the tool schemas and instructions in the system prompt (Qwen3's wording), each call appended to
the assistant's content as in Qwen3, and a run of tool results as one user turn of
`<tool_response>` blocks.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from reagent_jax.chat import render as qwen3_render
from reagent_jax.chat.render import Message, Rendered
from reagent_jax.chat.tool_calls import ToolCall, parse_tool_calls

_PROBE = "reagent-jax-probe"
_DUMMY_HISTORY = ({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"})


def chat_template(tok: PreTrainedTokenizerBase) -> str | None:
    """The tokenizer's default chat template (a named set's "default"), or None."""
    template = getattr(tok, "chat_template", None)
    if isinstance(template, Mapping):
        template = template.get("default")
    return template if isinstance(template, str) and template.strip() else None


def supports_tools(template: str) -> bool:
    """Whether the template mentions `tools` and assistant `tool_calls` at all."""
    return "tool_calls" in template and "tools" in template.replace("tool_calls", "")


_NATIVE: "weakref.WeakKeyDictionary[Any, tuple[str, bool]]" = weakref.WeakKeyDictionary()


def native_tool_calls(tok: PreTrainedTokenizerBase) -> bool:
    """Whether the template renders tools and tool calls itself *in the format the parser reads*
    (`<tool_call>{"name": .., "arguments": ..}</tool_call>`, as Qwen2.5's and Hermes' do). A
    template that writes calls another way (Llama 3.x: bare `{"name": .., "parameters": ..}`
    JSON) gets the text convention instead, so what the model is trained on and what the agent
    parses back are the same format."""
    template = chat_template(tok)
    cached = _NATIVE.get(tok)
    if cached is not None and cached[0] == template:
        return cached[1]
    native = False
    if template is not None and supports_tools(template):
        schema = {"type": "function", "function": {"name": _PROBE, "description": "d", "parameters": {
            "type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}
        call = {"type": "function", "function": {"name": _PROBE, "arguments": {"x": "y"}}}
        try:
            text = _apply(tok, [{"role": "user", "content": "q"},
                                {"role": "assistant", "content": "", "tool_calls": [call]}], [schema])
            native = any(isinstance(c, ToolCall) and c.name == _PROBE and c.arguments == {"x": "y"}
                         for c in parse_tool_calls(text))
        except Exception:  # a template that cannot render the probe: the text convention works everywhere
            native = False
    _NATIVE[tok] = (template, native)
    return native


@dataclass(frozen=True)
class TurnGrammar:
    """How the template frames an assistant turn: the token that ends it (where generation
    stops) and the template text written after that token before the next turn."""

    end_of_turn: str  # a special token, e.g. "<|im_end|>"
    after_turn: str  # e.g. "\n"


_GRAMMARS: "weakref.WeakKeyDictionary[Any, tuple[str, TurnGrammar]]" = weakref.WeakKeyDictionary()


def _apply(tok, messages, tools=None, add_generation_prompt=False, **kwargs) -> str:
    return tok.apply_chat_template(list(messages), tools=tools or None, tokenize=False,
                                   add_generation_prompt=add_generation_prompt, **kwargs)


def turn_grammar(tok: PreTrainedTokenizerBase) -> TurnGrammar:
    """Read the end-of-turn token off the template by rendering a probe turn (cached per tokenizer)."""
    template = chat_template(tok)
    if template is None:
        raise ValueError("the tokenizer has no chat template (tokenizer_config.json 'chat_template' "
                         "or chat_template.jinja); reagent_jax renders conversations with it")
    cached = _GRAMMARS.get(tok)
    if cached is not None and cached[0] == template:
        return cached[1]
    prompt = [{"role": "user", "content": "q"}]
    prefix = _apply(tok, prompt, add_generation_prompt=True)
    full = _apply(tok, prompt + [{"role": "assistant", "content": _PROBE}])
    if not full.startswith(prefix) or _PROBE not in full[len(prefix):]:
        raise ValueError("the chat template's generation prompt is not the start of its assistant "
                         f"turn ({prefix[-40:]!r} vs {full[len(prefix) - 40:len(prefix) + 40]!r}); "
                         "reagent_jax cannot tell where the model's tokens begin")
    after = full[full.index(_PROBE, len(prefix)) + len(_PROBE):]
    specials = sorted((t.content for t in tok.added_tokens_decoder.values()), key=len, reverse=True)
    for start in range(len(after)):
        token = next((t for t in specials if after.startswith(t, start)), None)
        if token is not None:
            grammar = TurnGrammar(token, after[start + len(token):])
            break
    else:
        raise ValueError(f"the chat template ends an assistant turn with {after!r}, which holds no "
                         "special token for generation to stop at")
    _GRAMMARS[tok] = (template, grammar)
    return grammar


def end_of_turn_id(tok: PreTrainedTokenizerBase) -> int:
    return tok.convert_tokens_to_ids(turn_grammar(tok).end_of_turn)


def _assistant_text(msg: Message, i: int) -> str:
    """An assistant turn under the text convention: reasoning, content, then its tool calls."""
    reasoning, content = qwen3_render._split_reasoning(msg, qwen3_render._content(msg, i))
    text = (f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n" + content.lstrip("\n")
            if reasoning else content)
    calls = msg.get("tool_calls") or []
    if not isinstance(calls, Sequence) or isinstance(calls, (str, Mapping)):
        raise ValueError(f"messages[{i}] (role 'assistant'): tool_calls must be a list")
    for j, call in enumerate(calls):
        sep = "\n" if (j > 0 or text) else ""
        text += sep + qwen3_render._tool_call_text(call, f"messages[{i}].tool_calls[{j}]")
    return text


def text_convention(messages: Sequence[Message],
                    tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, str]]:
    """Messages a template without tool support can render (see the module docstring)."""
    out: list[dict[str, str]] = []
    rest = list(messages)
    if tools:
        prompt = qwen3_render.tools_prompt(tools)
        if rest and rest[0]["role"] == "system":
            prompt = qwen3_render._content(rest.pop(0), 0) + "\n\n" + prompt
        out.append({"role": "system", "content": prompt})
    offset = len(messages) - len(rest)
    for k, msg in enumerate(rest):
        i = k + offset
        if msg["role"] == "assistant":
            out.append({"role": "assistant", "content": _assistant_text(msg, i),
                        **({"weight": msg["weight"]} if msg.get("weight") is not None else {})})
        elif msg["role"] == "tool":
            block = "<tool_response>\n" + qwen3_render._content(msg, i) + "\n</tool_response>"
            if k > 0 and rest[k - 1]["role"] == "tool":
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
        else:
            out.append({"role": msg["role"], "content": qwen3_render._content(msg, i)})
    return out


def _template_messages(tok, messages, tools):
    """(messages, tools) as the template gets them (see the module docstring on tools)."""
    if native_tool_calls(tok):
        msgs = [{k: ("" if k == "content" and v is None else v) for k, v in m.items()}
                for m in messages]
        return msgs, tools
    return text_convention(messages, tools), None


def _spans(tok, msgs, tools, kwargs, strict: bool) -> list[tuple[int, int, bool]]:
    """Character spans (start, end, trained) of the assistant turns in the full rendering: a
    trained turn's trainable text, or the whole text of a weight-0 turn (out of every loss)."""
    end = turn_grammar(tok).end_of_turn
    spans, prev = [], ""
    for k in range(1, len(msgs) + 1):
        text = _apply(tok, msgs[:k], tools, **kwargs)
        if not text.startswith(prev):
            if strict:
                raise ValueError(f"the chat template is not prefix-preserving: adding message {k - 1} "
                                 f"(role {msgs[k - 1]['role']!r}) changes how earlier messages "
                                 "render, so sampled tokens would differ from trained ones; use a "
                                 "training variant of the template (see reagent_jax.chat docs)")
            return spans
        if msgs[k - 1]["role"] == "assistant" and not qwen3_render.trained(msgs[k - 1]):
            spans.append((len(prev), len(text), False))
        elif msgs[k - 1]["role"] == "assistant":
            try:
                head = _apply(tok, msgs[:k - 1], tools, add_generation_prompt=True, **kwargs)
            except Exception:  # noqa: BLE001 - a template that cannot render an empty history
                head = prev
            if not (head.startswith(prev) and text.startswith(head)):
                head = prev
            stop = text.rfind(end, len(head))
            spans.append((len(head), stop + len(end) if stop >= 0 else len(text), True))
        prev = text
    return spans


def _tokenize(tok, text: str, spans: Sequence[tuple[int, int, bool]]) -> Rendered:
    qwen3_render.check_unicode(text, "rendered text")
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    mask, context = [], []
    for b_tok, e_tok in enc["offset_mapping"]:
        hits = [kept for s, e, kept in spans if s < e_tok and b_tok < e]
        mask.append(int(any(hits)))
        context.append(int(not hits))
    return Rendered(list(enc["input_ids"]), mask, text, context)


def render(tok: PreTrainedTokenizerBase, messages: Sequence[Message],
           tools: Sequence[Mapping[str, Any]] | None = None, add_generation_prompt: bool = False,
           *, enable_thinking: bool = True, mode: str = "original") -> Rendered:
    """`chat.render` for a tokenizer with its own (non-Qwen3) template; see the module docstring."""
    qwen3_render._check_tools(tools)
    qwen3_render._validate(messages)
    if not messages:
        raise ValueError("render: messages is empty")
    msgs, native_tools = _template_messages(tok, messages, tools)
    kwargs = {"enable_thinking": enable_thinking}
    text = _apply(tok, msgs, native_tools, add_generation_prompt=add_generation_prompt, **kwargs)
    spans = _spans(tok, msgs, native_tools, kwargs, strict=(mode == "train"))
    return _tokenize(tok, text, spans)


def render_suffix(tok: PreTrainedTokenizerBase, new_messages: Sequence[Message],
                  add_generation_prompt: bool = True, *, enable_thinking: bool = True) -> Rendered:
    """What the template adds for `new_messages` after a closed assistant turn: rendered after a
    stand-in history (a user turn and an assistant turn) and cut off it."""
    qwen3_render._validate(new_messages)
    history = list(_DUMMY_HISTORY)
    msgs, _ = _template_messages(tok, history + list(new_messages), None)
    kwargs = {"enable_thinking": enable_thinking}
    before = _apply(tok, msgs[:len(history)], **kwargs)
    text = _apply(tok, msgs, add_generation_prompt=add_generation_prompt, **kwargs)
    if not text.startswith(before):
        raise ValueError("the chat template renders earlier turns differently once messages "
                         "are appended; it cannot continue a conversation token by token")
    suffix = text[len(before):]
    spans = [(s - len(before), e - len(before), kept)
             for s, e, kept in _spans(tok, msgs, None, kwargs, strict=True) if s >= len(before)]
    return _tokenize(tok, suffix, spans)


def close_assistant_turn(tok: PreTrainedTokenizerBase, sampled_ids: Sequence[int]) -> list[int]:
    """Template ids after a sampled turn: its end-of-turn token if the sample lacks it, then the
    template's text between turns."""
    grammar = turn_grammar(tok)
    end_id = end_of_turn_id(tok)
    head = [] if sampled_ids and sampled_ids[-1] == end_id else [end_id]
    after = tok.encode(grammar.after_turn, add_special_tokens=False) if grammar.after_turn else []
    return head + list(after)
