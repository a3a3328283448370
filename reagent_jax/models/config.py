"""Qwen3 model configuration: one frozen dataclass, built from / written to HF `config.json`.

Why a dataclass and not the HF object: it is hashable, so it can be a static argument of
`jax.jit`, and it carries the JAX-side knobs (dtypes, scan, remat) next to the shape.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional

import jax.numpy as jnp
import numpy as np

from reagent_jax.kernels.attention import ATTENTION_IMPLS
from reagent_jax.models.rope import normalize_scaling, parse_hf_rope, rope_frequencies, rope_tables

REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")
MODEL_TYPES = ("qwen3", "qwen2", "llama")


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
    # Non-default RoPE: sorted (key, value) pairs of HF `rope_parameters` (a dict is accepted),
    # () for plain RoPE; see models/rope.py. After the older fields so positional use still works.
    rope_scaling: tuple = ()
    # JAX-side knobs (not part of the HF config).
    param_dtype: str = "float32"
    compute_dtype: str = "bfloat16"
    scan_layers: bool = True
    remat_policy: str = "none"
    # The attention kernels: "auto" | "xla" | "splash" | "cudnn" (kernels/attention.py).
    attention: str = "auto"
    # Where a MoE variant would plug in: `mlp_type` selects the feed-forward block.
    mlp_type: str = "dense"
    # The family (HF `model_type`): "qwen3" (q/k RMSNorm), "qwen2" (q/k/v biases), "llama"
    # (neither; `attention_bias` adds q/k/v/o biases, as transformers' LlamaAttention does).
    model_type: str = "qwen3"
    attention_bias: bool = False

    def __post_init__(self):
        object.__setattr__(self, "rope_scaling", normalize_scaling(self.rope_scaling))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"remat_policy={self.remat_policy!r}; choose one of {REMAT_POLICIES}")
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention={self.attention!r}; choose one of {ATTENTION_IMPLS}")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type={self.model_type!r}; choose one of {MODEL_TYPES}")
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
    def qk_norm(self) -> bool:
        """Per-head RMSNorm on q and k (Qwen3)."""
        return self.model_type == "qwen3"

    @property
    def qkv_bias(self) -> bool:
        return self.model_type == "qwen2" or (self.model_type == "llama" and self.attention_bias)

    @property
    def o_bias(self) -> bool:
        return self.model_type == "llama" and self.attention_bias

    @property
    def num_groups(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_heads // self.num_kv_heads

    def rope_frequencies(self) -> tuple[Optional[np.ndarray], float]:
        """(inv_freq or None for plain RoPE, cos/sin factor) of this config's RoPE type."""
        return rope_frequencies(self.rope_scaling, self.rope_theta, self.head_dim)

    def rope_tables(self, positions):
        """cos, sin [..., head_dim/2] of this config's RoPE at positions [...] (what a fused
        kernel applies itself, `kernels.cpu.decode`)."""
        inv_freq, scale = self.rope_frequencies()
        return rope_tables(positions, self.head_dim, self.rope_theta, inv_freq, scale)

    def replace(self, **kw) -> "Qwen3Config":
        return dataclasses.replace(self, **kw)

    def num_params(self) -> int:
        e, f, v, l = self.hidden_size, self.intermediate_size, self.vocab_size, self.num_layers
        h, k, d = self.num_heads, self.num_kv_heads, self.head_dim
        per_layer = e * d * (h + 2 * k) + h * d * e + 3 * e * f + 2 * e
        per_layer += 2 * d * self.qk_norm + (h + 2 * k) * d * self.qkv_bias + e * self.o_bias
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
    def from_hf_dict(cls, hf: dict[str, Any], source: str = "config.json", **overrides) -> "Qwen3Config":
        """HF `config.json` dict -> config. `source` names the file in error messages.

        Absent keys take transformers' Qwen3Config defaults (head_dim 128, rope_theta 1e4, untied),
        so a config means here what it means to transformers. What this model does not implement
        (biases, sliding windows, other RoPE types, MoE) raises naming the key, instead of loading
        weights that would give different logits.
        """
        mt = hf.get("model_type", "qwen3")
        if mt not in _FAMILIES:
            hint = " (Mixture-of-Experts is not implemented)" if "moe" in str(mt) else ""
            raise ValueError(f"{source}: model_type={mt!r}; supported: {', '.join(_FAMILIES)}{hint}")
        family = _FAMILIES[mt]
        archs = hf.get("architectures") or []
        if any(a not in family["architectures"] for a in archs):
            raise ValueError(f"{source}: architectures={archs}; only a causal LM ({family['architectures'][0]}) "
                             "is supported")
        if hf.get("quantization_config"):
            method = (hf["quantization_config"] or {}).get("quant_method", "?")
            raise NotImplementedError(f"{source}: quantized checkpoint (quant_method={method!r}) is not supported")
        if hf.get("hidden_act", "silu") != "silu":
            raise NotImplementedError(f"{source}: hidden_act={hf['hidden_act']!r}; only 'silu' (SwiGLU) is implemented")
        if hf.get("attention_bias") and mt == "qwen3":
            raise NotImplementedError(f"{source}: attention_bias=true (q/k/v/o projection biases) is not implemented")
        if hf.get("mlp_bias"):
            raise NotImplementedError(f"{source}: mlp_bias=true is not implemented")
        if (hf.get("pretraining_tp") or 1) != 1:
            raise NotImplementedError(f"{source}: pretraining_tp={hf['pretraining_tp']} is not implemented")
        layers = hf.get("num_hidden_layers", 32)
        _check_layer_types(hf, layers, source)
        theta, scaling = parse_hf_rope(hf, source)
        heads, hidden = hf.get("num_attention_heads", 32), hf.get("hidden_size", 4096)
        d = family["defaults"]
        kw = dict(
            vocab_size=hf.get("vocab_size", d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=hf.get("intermediate_size", d["intermediate_size"]),
            num_layers=layers,
            num_heads=heads,
            # absent -> transformers' class default; null -> derived, as transformers does
            num_kv_heads=hf.get("num_key_value_heads", d["num_kv_heads"]) or heads,
            head_dim=hf.get("head_dim", d["head_dim"]) or hidden // heads,
            rope_theta=theta,
            rope_scaling=scaling,
            rms_norm_eps=float(hf.get("rms_norm_eps", d["rms_norm_eps"])),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=hf.get("max_position_embeddings", d["max_position_embeddings"]),
            model_type=mt,
            attention_bias=bool(hf.get("attention_bias", False)) and mt == "llama",
        )
        kw.update(overrides)
        try:
            return cls(**kw)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    @classmethod
    def from_hf_json(cls, path: str, **overrides) -> "Qwen3Config":
        """`config.json` (or a directory holding one) -> config."""
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no HF config at {path} (expected a checkpoint directory with config.json)")
        with open(path) as f:
            try:
                hf = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} is not valid JSON: {e}") from None
        return cls.from_hf_dict(hf, source=path, **overrides)

    def to_hf_dict(self) -> dict[str, Any]:
        """HF `config.json` dict, readable by transformers 4.x (rope_theta/rope_scaling) and 5.x
        (rope_parameters)."""
        scaling = dict(self.rope_scaling) or None
        out = {
            "architectures": [_FAMILIES[self.model_type]["architectures"][0]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rope_scaling": scaling,
            "rope_parameters": {"rope_type": "default", **(scaling or {}), "rope_theta": self.rope_theta},
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "torch_dtype": "float32" if self.param_dtype == "float32" else str(self.param_dtype),
        }
        if self.model_type == "llama":
            out.update(mlp_bias=False, pretraining_tp=1)
        else:
            out.update(use_sliding_window=False, sliding_window=None, max_window_layers=self.num_layers,
                       layer_types=["full_attention"] * self.num_layers)
        if self.model_type == "qwen3":
            out.update(bos_token_id=151643, eos_token_id=151645)
        return out


# transformers' class defaults per family (what an absent config.json key means)
_FAMILIES = {
    "qwen3": {"architectures": ("Qwen3ForCausalLM", "Qwen3Model"),
              "defaults": dict(vocab_size=151936, intermediate_size=22016, num_kv_heads=32, head_dim=128,
                               rms_norm_eps=1e-6, max_position_embeddings=32768)},
    "qwen2": {"architectures": ("Qwen2ForCausalLM", "Qwen2Model"),
              "defaults": dict(vocab_size=151936, intermediate_size=22016, num_kv_heads=32, head_dim=None,
                               rms_norm_eps=1e-6, max_position_embeddings=32768)},
    "llama": {"architectures": ("LlamaForCausalLM", "LlamaModel"),
              "defaults": dict(vocab_size=32000, intermediate_size=11008, num_kv_heads=None, head_dim=None,
                               rms_norm_eps=1e-6, max_position_embeddings=2048)},
}
_FULL, _SLIDING = ("full_attention", "attention"), "sliding_attention"


def _check_layer_types(hf: dict[str, Any], layers: int, source: str) -> None:
    """Raises unless every layer is full causal attention, read as transformers does: the window
    only applies with use_sliding_window, to layer_types' sliding layers (by default the layers
    from max_window_layers on)."""
    window = hf.get("sliding_window") if hf.get("use_sliding_window", False) else None
    types = hf.get("layer_types")
    if types is None:
        first = hf.get("max_window_layers", 28)
        types = [_SLIDING if window is not None and i >= first else _FULL[0] for i in range(layers)]
    unknown = sorted(set(types) - {*_FULL, _SLIDING})
    if unknown:
        raise NotImplementedError(f"{source}: layer_types {unknown} are not implemented (full attention only)")
    if len(types) != layers:
        raise ValueError(f"{source}: {len(types)} layer_types for num_hidden_layers={layers}")
    sliding = [i for i, t in enumerate(types) if t == _SLIDING]
    if sliding and window is not None:
        raise NotImplementedError(f"{source}: sliding-window attention (use_sliding_window=true, "
                                  f"sliding_window={window}, layers {sliding}) is not implemented")
