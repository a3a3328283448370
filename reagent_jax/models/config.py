"""Qwen3 model configuration: one frozen dataclass, built from / written to HF `config.json`.

Why a dataclass and not the HF object: it is hashable, so it can be a static argument of
`jax.jit`, and it carries the JAX-side knobs (dtypes, scan, remat) next to the shape.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax.numpy as jnp

REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """Shape and numerics of a dense Qwen3 decoder.

    `param_dtype` is the storage dtype of the weights; `compute_dtype` is the dtype of matmuls
    (fp32 params + bf16 compute is the training default). Norms, softmax and logits run in fp32.
    """
    vocab_size: int = 151936
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_layers: int = 28
    num_heads: int = 16
    num_kv_heads: int = 8
    head_dim: int = 128
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 40960
    # JAX-side knobs (not part of the HF config).
    param_dtype: str = "float32"
    compute_dtype: str = "bfloat16"
    scan_layers: bool = True
    remat_policy: str = "none"
    # Where a MoE variant would plug in: `mlp_type` selects the feed-forward block.
    mlp_type: str = "dense"

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"remat_policy={self.remat_policy!r}; choose one of {REMAT_POLICIES}")
        if self.mlp_type != "dense":
            raise NotImplementedError(f"mlp_type={self.mlp_type!r}: only 'dense' Qwen3 is implemented")
        for name in ("param_dtype", "compute_dtype"):
            jnp.dtype(getattr(self, name))  # raises on a bad name

    @property
    def jnp_param_dtype(self):
        return jnp.dtype(self.param_dtype)

    @property
    def jnp_dtype(self):
        return jnp.dtype(self.compute_dtype)

    @property
    def num_groups(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_heads // self.num_kv_heads

    def replace(self, **kw) -> "Qwen3Config":
        return dataclasses.replace(self, **kw)

    def num_params(self) -> int:
        e, f, v, l = self.hidden_size, self.intermediate_size, self.vocab_size, self.num_layers
        h, k, d = self.num_heads, self.num_kv_heads, self.head_dim
        per_layer = e * d * (h + 2 * k) + h * d * e + 3 * e * f + 2 * e + 2 * d
        return l * per_layer + v * e * (1 if self.tie_word_embeddings else 2) + e

    def flops_per_token(self, seq_len: int) -> float:
        """Forward matmul FLOPs per token (2 * multiply-adds), attention included."""
        e, f, v, l = self.hidden_size, self.intermediate_size, self.vocab_size, self.num_layers
        h, k, d = self.num_heads, self.num_kv_heads, self.head_dim
        dense = e * d * (h + 2 * k) + h * d * e + 3 * e * f
        attn = 2 * h * d * seq_len  # scores + weighted sum, averaged over causal positions ~ T/2 * 2
        return 2.0 * (l * (dense + attn / 2) + e * v)

    # ---- HF interop -------------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], **overrides) -> "Qwen3Config":
        mt = hf.get("model_type", "qwen3")
        if mt != "qwen3":
            raise ValueError(f"config.json has model_type={mt!r}; only dense 'qwen3' is supported")
        if hf.get("attention_bias", False):
            raise ValueError("attention_bias=True is not a Qwen3 shape; not supported")
        if hf.get("rope_scaling") not in (None, {}) and (hf.get("rope_scaling") or {}).get("rope_type", "default") != "default":
            raise ValueError(f"rope_scaling={hf['rope_scaling']} is not supported yet")
        heads = hf["num_attention_heads"]
        rope = hf.get("rope_theta")
        if rope is None:  # transformers >= 5 nests it in rope_parameters
            rope = (hf.get("rope_parameters") or {}).get("rope_theta", 1_000_000.0)
        kw = dict(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads", heads),
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rope_theta=float(rope),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            max_position_embeddings=hf.get("max_position_embeddings", 40960),
        )
        kw.update(overrides)
        return cls(**kw)

    @classmethod
    def from_hf_json(cls, path: str, **overrides) -> "Qwen3Config":
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path) as f:
            return cls.from_hf_dict(json.load(f), **overrides)

    def to_hf_dict(self) -> dict[str, Any]:
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "torch_dtype": "float32" if self.param_dtype == "float32" else str(self.param_dtype),
        }
