"""Named model shapes: the released dense Qwen3, Qwen2.5, Llama-3.2 and SmolLM2 sizes, and tiny
shapes for tests and the CPU quickstart.

The released shapes follow the published `config.json` files (Qwen/Qwen3-*B, Qwen/Qwen2.5-*B,
meta-llama/Llama-3.2-*B, HuggingFaceTB/SmolLM2-*); a preset gives random weights of that shape
(for the compile check and benchmarks), a checkpoint's own config.json wins when one is loaded.
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

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
_FAMILY_RELEASED = {
    #                hidden inter layers heads kv head_dim vocab  tied   extra
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 64, 151936, True, dict(model_type="qwen2", rope_theta=1e6)),
    "qwen2.5-1.5b": (1536, 8960, 28, 12, 2, 128, 151936, True, dict(model_type="qwen2", rope_theta=1e6)),
    "qwen2.5-3b": (2048, 11008, 36, 16, 2, 128, 151936, True, dict(model_type="qwen2", rope_theta=1e6)),
    "qwen2.5-7b": (3584, 18944, 28, 28, 4, 128, 152064, False, dict(model_type="qwen2", rope_theta=1e6)),
    "llama-3.2-1b": (2048, 8192, 16, 32, 8, 64, 128256, True, dict(
        model_type="llama", rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE, rms_norm_eps=1e-5,
        max_position_embeddings=131072)),
    "llama-3.2-3b": (3072, 8192, 28, 24, 8, 128, 128256, True, dict(
        model_type="llama", rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE, rms_norm_eps=1e-5,
        max_position_embeddings=131072)),
    "smollm2-135m": (576, 1536, 30, 9, 3, 64, 49152, True, dict(
        model_type="llama", rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192)),
    "smollm2-360m": (960, 2560, 32, 15, 5, 64, 49152, True, dict(
        model_type="llama", rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192)),
    "smollm2-1.7b": (2048, 8192, 24, 32, 32, 64, 49152, True, dict(
        model_type="llama", rope_theta=130000.0, rms_norm_eps=1e-5, max_position_embeddings=8192)),
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
    elif key in _FAMILY_RELEASED:
        e, f, l, h, k, d, v, tied, extra = _FAMILY_RELEASED[key]
        kw = dict(hidden_size=e, intermediate_size=f, num_layers=l, num_heads=h, num_kv_heads=k, head_dim=d,
                  vocab_size=v, tie_word_embeddings=tied, **{"max_position_embeddings": 32768, **extra})
    elif key in _TINY:
        kw = dict(_TINY[key])
    else:
        raise KeyError(f"unknown preset {name!r}; known: {preset_names()}")
    kw.update(overrides)
    return Qwen3Config(**kw)


def preset_names() -> list[str]:
    return sorted(_RELEASED) + sorted(_FAMILY_RELEASED) + sorted(_TINY)
