"""What makes a tokenizer a Qwen3 tokenizer: special tokens, the Qwen2 pre-tokenizer, the HF wrapper.

Both the real Qwen3 tokenizer (`tokenizer.py`) and the small task-specific one
(`compact_tokenizer.py`) are assembled from these pieces, so the renderer, the parser and the
rollout engine see the same object type (`transformers.PreTrainedTokenizerFast`) and the same
control tokens either way; only the ids differ.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from reagent_jax.chat.qwen3_template import QWEN3_CHAT_TEMPLATE

# The Qwen2/Qwen3 pre-tokenizer split (single digits, unlike GPT-4's \p{N}{1,3}).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# (token, id in the real Qwen3 vocabulary, "special" flag as in Qwen3's tokenizer_config.json).
# The flag decides what `decode(..., skip_special_tokens=True)` drops: Qwen3 keeps <think>,
# <tool_call> and friends as ordinary added tokens so that they survive decoding.
QWEN3_ADDED_TOKENS: tuple[tuple[str, int, bool], ...] = (
    ("<|endoftext|>", 151643, True),
    ("<|im_start|>", 151644, True),
    ("<|im_end|>", 151645, True),
    ("<|object_ref_start|>", 151646, True),
    ("<|object_ref_end|>", 151647, True),
    ("<|box_start|>", 151648, True),
    ("<|box_end|>", 151649, True),
    ("<|quad_start|>", 151650, True),
    ("<|quad_end|>", 151651, True),
    ("<|vision_start|>", 151652, True),
    ("<|vision_end|>", 151653, True),
    ("<|vision_pad|>", 151654, True),
    ("<|image_pad|>", 151655, True),
    ("<|video_pad|>", 151656, True),
    ("<tool_call>", 151657, False),
    ("</tool_call>", 151658, False),
    ("<|fim_prefix|>", 151659, False),
    ("<|fim_middle|>", 151660, False),
    ("<|fim_suffix|>", 151661, False),
    ("<|fim_pad|>", 151662, False),
    ("<|repo_name|>", 151663, False),
    ("<|file_sep|>", 151664, False),
    ("<tool_response>", 151665, False),
    ("</tool_response>", 151666, False),
    ("<think>", 151667, False),
    ("</think>", 151668, False),
)
QWEN3_SPECIAL_TOKEN_IDS: dict[str, int] = {t: i for t, i, _ in QWEN3_ADDED_TOKENS}
QWEN3_BPE_RANKS = 151643  # ordinary (byte-level BPE) tokens, ids 0..151642
QWEN3_MODEL_VOCAB_SIZE = 151936  # embedding rows of every Qwen3 checkpoint (padded past 151669)

EOS_TOKEN = "<|im_end|>"  # a chat turn ends here; generation stops here
PAD_TOKEN = "<|endoftext|>"
# The tokens Qwen3's tokenizer_config lists as additional special tokens.
_EXTRA_SPECIAL = [t for t, _, special in QWEN3_ADDED_TOKENS if special and t != PAD_TOKEN]
# Tokens the chat renderer cannot work without.
CHAT_CONTROL_TOKENS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                       "</tool_call>", "<tool_response>", "</tool_response>")


def pretokenize_regex(max_digits: int = 1) -> str:
    """Qwen2's split; with max_digits > 1 a number of up to that many digits is one piece, so BPE
    can learn whole numbers as single tokens. The space before a number stays a piece of its own
    (as in Qwen2's split), so a value is the same token after a space, a bracket or a newline:
    copying "is 1557" into `\\boxed{1557}` or `print(1557 ...)` is then an identity copy, which
    a tiny model learns reliably, not a per-number mapping between two ids."""
    if max_digits == 1:
        return QWEN2_PRETOKENIZE_REGEX
    if max_digits < 1:
        raise ValueError(f"max_digits must be >= 1, got {max_digits}")
    return QWEN2_PRETOKENIZE_REGEX.replace(r"|\p{N}|", r"|\p{N}{1,%d}|" % max_digits, 1)


def set_qwen2_byte_level_pipeline(tk: Tokenizer, max_digits: int = 1) -> None:
    """NFC, Qwen2 regex split (see `pretokenize_regex`), byte-level mapping; decoding reverses it."""
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pretokenize_regex(max_digits)), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel()


def add_qwen3_added_tokens(tk: Tokenizer) -> None:
    """Register the Qwen3 control tokens (never split, never normalised) with their special flags.

    Tokens already in the model vocabulary keep their id; new ones get the next free ids in order.
    """
    tk.add_tokens([AddedToken(t, special=special, normalized=False)
                   for t, _, special in QWEN3_ADDED_TOKENS])


def wrap_as_transformers(tk: Tokenizer) -> PreTrainedTokenizerFast:
    """The `transformers` object everything else in reagent_jax takes as `tok`."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tk,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        extra_special_tokens=list(_EXTRA_SPECIAL),
        chat_template=QWEN3_CHAT_TEMPLATE,
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        errors="replace",
    )


def missing_chat_tokens(tok: PreTrainedTokenizerFast) -> list[str]:
    """Control tokens that `tok` would not encode as one token (empty for a usable tokenizer)."""
    missing = []
    for t in CHAT_CONTROL_TOKENS:
        ids = tok.encode(t, add_special_tokens=False)
        if len(ids) != 1 or tok.convert_ids_to_tokens(ids[0]) != t:
            missing.append(t)
    return missing
