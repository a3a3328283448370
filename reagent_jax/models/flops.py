"""Model FLOPs counted from the shapes (2 per multiply-add): the numerator of MFU and of the
compile check's roofline. XLA's `cost_analysis()` counts a loop body once, so it cannot serve.

Training counts 3x the forward (forward + backward); rematerialised forwards are hardware
FLOPs, not model FLOPs, and are left out (MFU, not HFU).
"""
from __future__ import annotations

import numpy as np

from reagent_jax.models.config import Qwen3Config


def dense_flops_per_token(cfg: Qwen3Config) -> float:
    """q/k/v/o projections and the SwiGLU MLP of every layer, one token."""
    e, f, l, h, k, d = (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads,
                        cfg.num_kv_heads, cfg.head_dim)
    return 2.0 * l * (e * d * (h + 2 * k) + h * d * e + 3 * e * f)


def attention_flops_per_token(cfg: Qwen3Config, keys: float) -> float:
    """Scores + weighted values of one query over `keys` positions, every layer."""
    return 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * keys


def projection_flops(cfg: Qwen3Config) -> float:
    """The output projection of one position."""
    return 2.0 * cfg.hidden_size * cfg.vocab_size


def sequence_flops(cfg: Qwen3Config, rows: int, length: int) -> float:
    """Forward FLOPs of `rows` causal sequences of `length` tokens with logits everywhere."""
    return rows * length * (dense_flops_per_token(cfg) + attention_flops_per_token(cfg, length / 2)
                            + projection_flops(cfg))


def train_flops(cfg: Qwen3Config, attention_mask) -> float:
    """Model FLOPs of one training pass (forward + backward) over a batch's real tokens:
    attention_mask [..., T] (1 = real token), each row causal over its own length."""
    lengths = np.asarray(attention_mask).reshape(-1, np.shape(attention_mask)[-1]).sum(-1).astype(np.float64)
    per_token = dense_flops_per_token(cfg) + projection_flops(cfg)
    attn = attention_flops_per_token(cfg, 1.0) / 2  # x length^2: each query sees half the row on average
    return 3.0 * float(np.sum(lengths * per_token + attn * lengths ** 2))
