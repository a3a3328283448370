"""A small task-specific byte-level BPE tokenizer with the Qwen3 control tokens.

On one CPU a 151,936-row embedding and softmax dominate a tiny model's step time, so the
quickstart trains its own few-hundred-token vocabulary on the task's texts. It uses the same
pipeline as Qwen3 (NFC, Qwen2 regex split, byte-level alphabet, so any text encodes and decodes
exactly) and the same 26 control tokens as single tokens at ids 0..25, and it is the same object
type, so rendering, masks, parsing and the rollout engine work unchanged with either tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, pre_tokenizers, trainers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

from reagent_jax.chat import vocab

_BYTE_ALPHABET = pre_tokenizers.ByteLevel.alphabet()  # 256 printable stand-ins for the bytes
MIN_COMPACT_VOCAB = len(vocab.QWEN3_ADDED_TOKENS) + len(_BYTE_ALPHABET)  # 282: no merges at all


def build_compact_tokenizer(texts: Iterable[str], vocab_size: int = 1024,
                            min_frequency: int = 2, max_digits: int = 1) -> PreTrainedTokenizerFast:
    """Train byte-level BPE on `texts`; ids 0..25 are the Qwen3 control tokens, in Qwen3's order.

    `vocab_size` counts everything (control tokens + 256 bytes + merges); the result may be
    smaller when the texts do not support that many merges of `min_frequency` occurrences.
    Deterministic for the same texts and settings. `max_digits` > 1 lets a number of up to that
    many digits become one token (Qwen3 splits digits one by one): a tiny model copies a value
    from a tool response into its answer far more reliably as one token than as four.
    """
    if isinstance(texts, str):
        raise TypeError("build_compact_tokenizer: texts must be an iterable of strings, "
                        "not one string")
    texts = list(texts)
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise TypeError(f"build_compact_tokenizer: texts[{bad[0]}] is "
                        f"{type(texts[bad[0]]).__name__}, expected str")
    if vocab_size < MIN_COMPACT_VOCAB:
        raise ValueError(f"build_compact_tokenizer: vocab_size={vocab_size} is below "
                         f"{MIN_COMPACT_VOCAB} (26 control tokens + 256 byte tokens)")
    control = [t for t, _, _ in vocab.QWEN3_ADDED_TOKENS]
    tk = Tokenizer(BPE(fuse_unk=False, byte_fallback=False))
    vocab.set_qwen2_byte_level_pipeline(tk, max_digits)
    # Control tokens are registered before training so the trainer never merges across them
    # and so they take ids 0..25.
    vocab.add_qwen3_added_tokens(tk)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=control,
        initial_alphabet=_BYTE_ALPHABET,
        show_progress=False,
    )
    tk.train_from_iterator(texts, trainer=trainer)
    vocab.add_qwen3_added_tokens(tk)  # restore Qwen3's special flags (the trainer marks all special)
    for i, token in enumerate(control):
        if tk.token_to_id(token) != i:
            raise AssertionError(f"compact tokenizer: {token} got id {tk.token_to_id(token)}, "
                                 f"expected {i}")
    return vocab.wrap_as_transformers(tk)
