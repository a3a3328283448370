"""Chat: tokenizers (real Qwen3 offline, compact, or a model's own), rendering with loss masks
through Qwen3's template or any model's jinja template, tool-call parsing.

    tok = chat.load_tokenizer(None)              # real Qwen3 tokenizer, built offline, disk-cached
    tok = chat.load_tokenizer("ckpt/")           # a model's own tokenizer + chat template
    r = chat.render(tok, messages, tools=None, add_generation_prompt=False)   # r.ids, r.loss_mask
    stop = chat.stop_token_ids(tok)              # where generation ends a turn
    calls = chat.parse_tool_calls(text)          # ToolCall or ToolCallError items
"""

from reagent_jax.chat.compact_tokenizer import build_compact_tokenizer
from reagent_jax.chat.qwen3_template import QWEN3_CHAT_TEMPLATE
from reagent_jax.chat.formats import (
    close_assistant_turn,
    end_of_turn_token,
    render,
    render_suffix,
    stop_token_ids,
    uses_qwen3_template,
)
from reagent_jax.chat.render import Rendered
from reagent_jax.chat.tokenizer import build_qwen3_tokenizer, load_tokenizer
from reagent_jax.chat.tool_calls import (
    ToolCall,
    ToolCallError,
    assistant_message_from_text,
    content_without_tool_calls,
    parse_tool_calls,
    split_reasoning,
)
from reagent_jax.chat.vocab import (
    EOS_TOKEN,
    PAD_TOKEN,
    QWEN3_MODEL_VOCAB_SIZE,
    QWEN3_SPECIAL_TOKEN_IDS,
)

__all__ = [
    "EOS_TOKEN",
    "PAD_TOKEN",
    "QWEN3_CHAT_TEMPLATE",
    "QWEN3_MODEL_VOCAB_SIZE",
    "QWEN3_SPECIAL_TOKEN_IDS",
    "Rendered",
    "ToolCall",
    "ToolCallError",
    "assistant_message_from_text",
    "build_compact_tokenizer",
    "build_qwen3_tokenizer",
    "close_assistant_turn",
    "content_without_tool_calls",
    "end_of_turn_token",
    "load_tokenizer",
    "parse_tool_calls",
    "render",
    "render_suffix",
    "split_reasoning",
    "stop_token_ids",
    "uses_qwen3_template",
]
