"""RoPE: the variants of HF `rope_parameters` / `rope_scaling` (parsing and inverse
frequencies) and the rotation itself (`rope_tables`, `rope`).

Why host-side numpy: the scaled frequencies depend only on the (static, hashable) config, so they
are computed once when a forward is traced and enter the graph as a constant. The formulas mirror
transformers' `modeling_rope_utils` (fp32, same operation order) so logits match it.

Implemented: "default", "linear", "yarn" (the long-context recipe Qwen3 documents) and "llama3"
(Llama 3.1+ frequency smoothing). "dynamic"
and "longrope" change the frequencies with the length of each call, which a fixed KV cache cannot
follow; they and the other types raise NotImplementedError instead of silently changing logits.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

SUPPORTED = ("default", "linear", "yarn", "llama3")
_KEYS = {  # keys kept per type (others in the HF dict do not change the frequencies)
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "mscale", "mscale_all_dim",
             "beta_fast", "beta_slow", "truncate"),
}
_LAYER_TYPES = ("full_attention", "sliding_attention")


def parse_hf_rope(hf: Mapping[str, Any], source: str = "config.json") -> tuple[float, tuple]:
    """HF config dict -> (rope_theta, rope_scaling) with transformers' precedence.

    transformers >= 5 keeps everything in `rope_parameters`; 4.x configs carry `rope_theta` and
    `rope_scaling` at top level (`rope_scaling` wins when both are set; theta defaults to 1e4).
    rope_scaling is a sorted tuple of (key, value) pairs; () means plain RoPE.
    """
    params = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"{source}: rope parameters must be a JSON object, got {params!r}")
    nested = [k for k in params if k in _LAYER_TYPES]
    if nested:  # per-layer-type RoPE: fine only when every layer type uses the same one
        entries = [params[k] for k in nested if params[k] is not None]
        if any(e != entries[0] for e in entries[1:]):
            raise NotImplementedError(f"{source}: different RoPE per layer type ({params}) is not implemented")
        params = entries[0] if entries else {}
    theta = params.get("rope_theta", hf.get("rope_theta"))
    theta = 10_000.0 if theta is None else float(theta)
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0):
        raise NotImplementedError(f"{source}: partial_rotary_factor={partial} is not implemented (full RoPE only)")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in SUPPORTED:
        raise NotImplementedError(
            f"{source}: rope_type={kind!r} is not implemented (supported: {', '.join(SUPPORTED)}); "
            f"loading it as plain RoPE would silently change the logits")
    if kind == "default":
        return theta, ()
    kw = {k: params[k] for k in _KEYS[kind] if params.get(k) is not None}
    if kind == "linear" and "factor" not in kw:
        raise ValueError(f"{source}: rope_type 'linear' needs a 'factor'")
    if kind == "yarn":
        # transformers: a top-level original_max_position_embeddings wins, else max_position_embeddings.
        omax = hf.get("original_max_position_embeddings") or kw.get("original_max_position_embeddings")
        kw["original_max_position_embeddings"] = int(omax or hf.get("max_position_embeddings", 32768))
        if "factor" not in kw:
            kw["factor"] = hf.get("max_position_embeddings", 32768) / kw["original_max_position_embeddings"]
    return theta, normalize_scaling({"rope_type": kind, **kw})


def normalize_scaling(scaling) -> tuple:
    """dict, list of pairs (a JSON round trip of the tuple) or tuple -> sorted hashable tuple."""
    if not scaling:
        return ()
    items = scaling.items() if isinstance(scaling, Mapping) else scaling
    out = tuple(sorted((str(k), v) for k, v in items))
    kind = dict(out).get("rope_type", "default")
    if kind not in SUPPORTED:
        raise NotImplementedError(f"rope_scaling rope_type={kind!r} is not implemented (supported: {SUPPORTED})")
    need = {"linear": ("factor",), "yarn": ("factor", "original_max_position_embeddings"),
            "llama3": _KEYS["llama3"]}.get(kind, ())
    missing = [k for k in need if dict(out).get(k) is None]
    if missing:
        raise ValueError(f"rope_scaling {dict(out)} lacks {missing}")
    return () if kind == "default" else out


def rope_frequencies(rope_scaling: tuple, theta: float, head_dim: int) -> tuple[Optional[np.ndarray], float]:
    """(inv_freq [head_dim/2] float32, or None for plain RoPE; factor on cos/sin)."""
    s = dict(rope_scaling)
    kind = s.get("rope_type", "default")
    if kind == "default":
        return None, 1.0
    d = head_dim
    pos_freqs = np.float32(theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))
    if kind == "linear":
        return (np.float32(1.0) / pos_freqs) / np.float32(s["factor"]), 1.0
    if kind == "llama3":
        return _llama3(np.float32(1.0) / pos_freqs, s), 1.0
    # yarn
    factor, omax = s["factor"], s["original_max_position_embeddings"]

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = s.get("attention_factor")
    if attn is None:
        if s.get("mscale") and s.get("mscale_all_dim"):
            attn = mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
        else:
            attn = mscale(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def corr_dim(rotations):
        return (d * math.log(omax / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrap = np.float32(1) - ramp
    inv = (np.float32(1) / (np.float32(factor) * pos_freqs)) * (1 - extrap) + (np.float32(1) / pos_freqs) * extrap
    return inv.astype(np.float32), float(attn)


def _llama3(inv_freq: np.ndarray, s: Mapping[str, Any]) -> np.ndarray:
    """Llama 3.1's smoothing (transformers `_compute_llama3_parameters`): long wavelengths are
    divided by `factor`, short ones kept, the band between interpolated."""
    factor, low, high = np.float32(s["factor"]), np.float32(s["low_freq_factor"]), np.float32(s["high_freq_factor"])
    old_len = np.float32(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(positions: jax.Array, d: int, theta: float, inv_freq=None, scale: float = 1.0
                ) -> tuple[jax.Array, jax.Array]:
    """cos, sin [..., d/2] of `rope` at positions [...] (YaRN's factor applied)."""
    if inv_freq is None:
        inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))  # [d/2]
    ang = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos, sin


def rope(x: jax.Array, positions: jax.Array, theta: float, inv_freq=None, scale: float = 1.0) -> jax.Array:
    """Rotary embedding, HF `rotate_half` layout. x [b, t, n, d], positions [b, t].

    inv_freq [d/2] and scale (YaRN's factor on cos/sin) come from `Qwen3Config.rope_frequencies`
    for scaled RoPE types; None means plain RoPE with base `theta`."""
    d = x.shape[-1]
    cos, sin = rope_tables(positions, d, theta, inv_freq, scale)  # [b, t, d/2]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., : d // 2], x32[..., d // 2:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)
