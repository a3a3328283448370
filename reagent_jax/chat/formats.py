"""One entry point for rendering, whatever the model's chat template.

A tokenizer whose template is Qwen3's (the ones `load_tokenizer(None)` and
`build_compact_tokenizer` make, real Qwen3 checkpoints) goes to the Python Qwen3 renderer
(`render.py`: exact template, documented training variant, segment-wise ids). Any other template
(SmolLM2's ChatML, Llama 3, Qwen2.5, ...) goes to `jinja_render.py`, which renders the model's
own jinja as transformers does. Callers (agent loop, trainers, judges, server) only use the
functions here, so a new model needs no change outside its tokenizer directory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from reagent_jax.chat import jinja_render
from reagent_jax.chat import render as qwen3_render
from reagent_jax.chat.qwen3_template import QWEN3_CHAT_TEMPLATE
from reagent_jax.chat.render import Message, Mode, Rendered
from reagent_jax.chat.vocab import EOS_TOKEN, missing_chat_tokens


def uses_qwen3_template(tok: PreTrainedTokenizerBase) -> bool:
    """Qwen3's template, or no template on a tokenizer with the Qwen3 control tokens."""
    template = jinja_render.chat_template(tok)
    if template is None:
        return not missing_chat_tokens(tok)
    return template.strip() == QWEN3_CHAT_TEMPLATE.strip()


def render(tok: PreTrainedTokenizerBase, messages: Sequence[Message],
           tools: Sequence[Mapping[str, Any]] | None = None,
           add_generation_prompt: bool = False, *, enable_thinking: bool = True,
           mode: Mode = "original") -> Rendered:
    """`messages` (OpenAI-style dicts) -> ids, loss mask (1 on assistant-written tokens) and text.

    mode="original": the template exactly as inference servers render it; mode="train": a
    rendering where appending a turn never changes earlier ids (Qwen3: its think blocks kept;
    other templates: the template itself, which must be prefix-preserving). See `render.py` and
    `jinja_render.py` for the details of each.
    """
    qwen3_render._check_mode(mode, enable_thinking)
    if uses_qwen3_template(tok):
        return qwen3_render.render(tok, messages, tools, add_generation_prompt,
                                   enable_thinking=enable_thinking, mode=mode)
    return jinja_render.render(tok, messages, tools, add_generation_prompt,
                               enable_thinking=enable_thinking, mode=mode)


def render_suffix(tok: PreTrainedTokenizerBase, new_messages: Sequence[Message],
                  add_generation_prompt: bool = True, *, enable_thinking: bool = True) -> Rendered:
    """The ids `render(..., mode="train")` adds when `new_messages` follow a complete turn."""
    if uses_qwen3_template(tok):
        return qwen3_render.render_suffix(tok, new_messages, add_generation_prompt,
                                          enable_thinking=enable_thinking)
    return jinja_render.render_suffix(tok, new_messages, add_generation_prompt,
                                      enable_thinking=enable_thinking)


def close_assistant_turn(tok: PreTrainedTokenizerBase, sampled_ids: Sequence[int]) -> list[int]:
    """Template ids (mask 0) that complete a sampled assistant turn before the next turn."""
    if uses_qwen3_template(tok):
        return qwen3_render.close_assistant_turn(tok, sampled_ids)
    return jinja_render.close_assistant_turn(tok, sampled_ids)


def end_of_turn_token(tok: PreTrainedTokenizerBase) -> str:
    """The token that ends an assistant turn (generation stops there): `<|im_end|>` for Qwen3
    and ChatML, `<|eot_id|>` for Llama 3, read off the template otherwise."""
    if uses_qwen3_template(tok):
        return EOS_TOKEN
    return jinja_render.turn_grammar(tok).end_of_turn


def stop_token_ids(tok: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """Ids generation stops at: the end-of-turn token, then the tokenizer's EOS if different."""
    ids = [tok.convert_tokens_to_ids(end_of_turn_token(tok))]
    if tok.eos_token_id is not None and tok.eos_token_id not in ids:
        ids.append(tok.eos_token_id)
    return tuple(ids)
