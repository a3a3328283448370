"""Load a tokenizer: a local HF tokenizer directory, or the real Qwen3 tokenizer built offline.

There is no model hub here, yet the real Qwen3 vocabulary is needed (checkpoints, benchmarks and
known encodings depend on its exact ids). Its byte-level BPE ranks ship inside the PyPI package
`dashscope` (`dashscope/resources/qwen.tiktoken`, 151,643 ranks). We convert them to HF
`tokenizers` BPE (vocab + merges), add the Qwen3 control tokens with their exact ids, wrap the
result as `transformers.PreTrainedTokenizerFast`, and cache it on disk, so that only the first call
on a machine pays the conversion (seconds); later ones just load `tokenizer.json` (~1 s).

tiktoken -> merges: tiktoken merges the adjacent pair whose concatenation has the lowest rank.
For every multi-byte token of rank r, running that procedure on the token's own bytes with only
ranks < r allowed stops at exactly two parts; those two parts are the token's one HF merge, and
listing merges in rank order makes HF's merge priorities equal tiktoken's ranks (151,387 merges,
one per non-byte token, the count of Qwen2's published merges.txt).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import warnings
from pathlib import Path

from tokenizers import Tokenizer
from tokenizers.models import BPE
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from reagent_jax.cache import build_once, cache_root
from reagent_jax.chat import vocab

_BUILD_VERSION = "1"  # bump when the built tokenizer changes, so stale caches are not reused


def qwen_tiktoken_path() -> Path:
    """Where dashscope ships the Qwen BPE ranks."""
    try:
        import dashscope
    except ImportError as e:  # pragma: no cover - dashscope is a pinned requirement
        raise ImportError("load_tokenizer(None) needs the PyPI package `dashscope`, which ships "
                          "the Qwen BPE vocabulary (pip install dashscope)") from e
    path = Path(dashscope.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"dashscope is installed but {path} is missing; reinstall dashscope")
    return path


def read_tiktoken_ranks(path: str | os.PathLike) -> dict[bytes, int]:
    """`base64(token) rank` per line -> {token bytes: rank}; checks ranks are 0..n-1."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token_b64, rank = line.split()
                ranks[base64.b64decode(token_b64)] = int(rank)
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: expected '<base64 token> <rank>', "
                                 f"got {line[:80]!r}") from e
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: ranks are not a permutation of 0..{len(ranks) - 1}")
    return ranks


def _split_by_lower_ranks(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """tiktoken's BPE on `token`, using only merges whose result ranks below `max_rank`."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while True:
        best_i, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best_i, best_rank = i, rank
        if best_i < 0:
            return parts
        parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]


def tiktoken_to_bpe(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """tiktoken ranks -> (HF byte-level vocab, merges in priority order)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_to_char = bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(byte_to_char[x] for x in b)

    vocab_map = {to_str(tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) == 1:
            continue
        parts = _split_by_lower_ranks(ranks, tok, rank)
        if len(parts) != 2:  # unreachable token: no merge produces it (none in Qwen's file)
            continue
        merges.append((to_str(parts[0]), to_str(parts[1])))
    return vocab_map, merges


def build_qwen3_tokenizer(tiktoken_path: str | os.PathLike | None = None) -> PreTrainedTokenizerFast:
    """Build the real Qwen3 tokenizer from the tiktoken ranks (no cache, no network)."""
    ranks = read_tiktoken_ranks(tiktoken_path or qwen_tiktoken_path())
    if len(ranks) != vocab.QWEN3_BPE_RANKS:
        raise ValueError(f"expected {vocab.QWEN3_BPE_RANKS} Qwen BPE ranks, found {len(ranks)}")
    vocab_map, merges = tiktoken_to_bpe(ranks)
    tk = Tokenizer(BPE(vocab=vocab_map, merges=merges, fuse_unk=False, byte_fallback=False))
    vocab.set_qwen2_byte_level_pipeline(tk)
    vocab.add_qwen3_added_tokens(tk)
    for token, expected_id, _ in vocab.QWEN3_ADDED_TOKENS:
        if tk.token_to_id(token) != expected_id:  # guards the id contract every checkpoint uses
            raise AssertionError(f"{token} got id {tk.token_to_id(token)}, expected {expected_id}")
    return vocab.wrap_as_transformers(tk)


def _cache_dir_for(tiktoken_path: Path) -> Path:
    digest = hashlib.sha256(tiktoken_path.read_bytes()).hexdigest()[:16]
    return cache_root() / f"qwen3_tokenizer-v{_BUILD_VERSION}-{digest}"


def _load_dir(path: Path) -> PreTrainedTokenizerFast:
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def load_qwen3_tokenizer() -> PreTrainedTokenizerFast:
    """The real Qwen3 tokenizer, from the disk cache (built and cached on first use)."""
    src = qwen_tiktoken_path()
    cached = _cache_dir_for(src)
    if (cached / "tokenizer.json").is_file():
        try:
            return _load_dir(cached)
        except Exception as e:  # a damaged cache must not break the caller: rebuild it
            warnings.warn(f"ignoring unreadable tokenizer cache {cached}: {e}")
            shutil.rmtree(cached, ignore_errors=True)
    tok = build_qwen3_tokenizer(src)
    try:
        build_once(cached, lambda tmp: tok.save_pretrained(str(tmp)))
    except OSError as e:
        warnings.warn(f"could not cache the Qwen3 tokenizer under {cached.parent}: {e}; "
                      "set REAGENT_JAX_CACHE to a writable directory to make later loads fast",
                      stacklevel=2)
    return tok


def load_tokenizer(path: str | os.PathLike | None = None) -> PreTrainedTokenizerFast:
    """`None`: the real Qwen3 tokenizer, offline. A path: a local HF tokenizer directory.

    The directory may be a Qwen3 checkpoint, a `save_pretrained` of a tokenizer from this module,
    one from `build_compact_tokenizer`, or any model's tokenizer with its own chat template
    (SmolLM2, Llama 3, Qwen2.5, ...): `chat.render` then renders that template. A tokenizer
    with no chat template must encode the Qwen3 control tokens (`<|im_start|>`, `<|im_end|>`,
    `<think>`, `<tool_call>`, ...) as single tokens, since it is then rendered as Qwen3.
    """
    if path is None:
        return load_qwen3_tokenizer()
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"load_tokenizer: {p} is not a directory (expected a local HF "
                                "tokenizer directory with tokenizer.json, or None for Qwen3)")
    if not any((p / f).is_file() for f in ("tokenizer.json", "vocab.json", "tokenizer.model")):
        raise FileNotFoundError(f"load_tokenizer: {p} has no tokenizer.json / vocab.json / "
                                "tokenizer.model; is it a tokenizer directory?")
    try:
        tok = _load_dir(p)
    except Exception as e:
        raise ValueError(f"load_tokenizer: transformers could not load {p}: {e}") from e
    if getattr(tok, "chat_template", None):
        return tok
    missing = vocab.missing_chat_tokens(tok)
    if missing:
        raise ValueError(f"load_tokenizer: {p} has no chat template and does not encode {missing} "
                         "as single tokens; give it the model's chat template "
                         "(chat_template.jinja) or use a Qwen3-style chat vocabulary")
    return tok
