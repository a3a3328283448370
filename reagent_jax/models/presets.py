"""Named Qwen3 shapes: the released dense sizes and tiny shapes for tests and the CPU quickstart.

The released shapes follow the published `config.json` files of Qwen/Qwen3-*B.
"""
from __future__ import annotations

from reagent_jax.models.config import Qwen3Config

_RELEASED = {
    #               hidden  inter  layers heads kv  tied
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, True),
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, True),
    "qwen3-4b": (2560, 9728, 36, 32, 8, True),
    "qwen3-8b": (4096, 12288, 36, 32, 8, False),
    "qwen3-14b": (5120, 17408, 40, 40, 8, False),
    "qwen3-32b": (5120, 25600, 64, 64, 8, False),
}

_TINY = {
    # Tests: odd shapes on purpose (head_dim != hidden/heads, GQA groups of 2).
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                 num_kv_heads=2, head_dim=32, max_position_embeddings=2048),
    # Benchmarks: full Qwen3 vocabulary, small body.
    "bench-256": dict(vocab_size=151936, hidden_size=256, intermediate_size=768, num_layers=4,
                      num_heads=4, num_kv_heads=2, head_dim=64),
    "bench-512": dict(vocab_size=151936, hidden_size=512, intermediate_size=1536, num_layers=8,
                      num_heads=8, num_kv_heads=4, head_dim=64),
}


def preset(name: str, **overrides) -> Qwen3Config:
    """Returns the config of a named shape; keyword overrides win (e.g. compute_dtype="float32")."""
    key = name.lower()
    if key in _RELEASED:
        e, f, l, h, k, tied = _RELEASED[key]
        kw = dict(hidden_size=e, intermediate_size=f, num_layers=l, num_heads=h, num_kv_heads=k,
                  head_dim=128, tie_word_embeddings=tied, vocab_size=151936,
                  max_position_embeddings=40960, rope_theta=1_000_000.0)
    elif key in _TINY:
        kw = dict(_TINY[key])
    else:
        raise KeyError(f"unknown preset {name!r}; known: {sorted(_RELEASED) + sorted(_TINY)}")
    kw.update(overrides)
    return Qwen3Config(**kw)


def preset_names() -> list[str]:
    return sorted(_RELEASED) + sorted(_TINY)
