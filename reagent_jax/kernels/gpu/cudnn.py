"""cuDNN flash attention for the cache-free causal path (training, scoring, reference logprobs)
on NVIDIA GPUs: `jax.nn.dot_product_attention(implementation="cudnn")`, no [heads, T, T] scores
in HBM. Chosen by `kernels.attention.choose`.

cuDNN's fused kernel knows causal masks and per-row lengths, not arbitrary key masks, while the
project's rows may be padded on the left, the right or both (`models.forward` takes any
`attention_mask`). So each row's real tokens are first gathered to its front in their order
(a stable sort of the padding to the back): a causal mask over the compacted row then lets each
real query see exactly the real keys at or before it, as the XLA path's mask does, and the
outputs are gathered back to their places. Padding queries attend among the keys before them
(finite; their outputs carry no loss). A row without padding is gathered in place.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from reagent_jax.kernels.blocks import per_device_causal
from reagent_jax.parallel.rules import DEFAULT_RULES, Rules

DTYPES = ("bfloat16", "float16")  # what cuDNN's flash attention computes in
MAX_HEAD_DIM = 128


def supports(dtype, head_dim: int) -> Optional[str]:
    """None when cuDNN's flash attention takes this compute dtype and head dim, else why not."""
    if jnp.dtype(dtype).name not in DTYPES:
        return f"cuDNN flash attention computes in {'/'.join(DTYPES)}, not {jnp.dtype(dtype).name}"
    if head_dim % 8 or head_dim > MAX_HEAD_DIM:
        return (f"cuDNN flash attention needs a head dim that is a multiple of 8 and at most {MAX_HEAD_DIM}, "
                f"got {head_dim}")
    return None


def compacted_causal_attention(qg: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, scale: float,
                               implementation: str = "cudnn") -> jax.Array:
    """Causal attention of qg [b,t,k,g,d] over k, v [b,t,k,d] where key_valid [b,t], by one
    `jax.nn.dot_product_attention` call over rows compacted real-tokens-first -> [b,t,k,g,d].
    `implementation="xla"` runs the same gathers around XLA's attention (the CPU test of the
    compaction)."""
    b, t, nk, g, d = qg.shape
    order = jnp.argsort(~key_valid.astype(bool), axis=1, stable=True)  # [b, t]: real tokens first, in order
    back = jnp.argsort(order, axis=1)  # [b, t]: the inverse permutation
    take = lambda x, idx: jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)
    q = take(qg.reshape(b, t, nk * g, d), order)  # [b, t, n, d]; query head n = kv head n // g, as JAX's GQA
    out = jax.nn.dot_product_attention(q, take(k, order), take(v, order), scale=scale, is_causal=True,
                                       implementation=implementation)  # [b, t, n, d]
    return take(out, back).reshape(b, t, nk, g, d).astype(v.dtype)


def cudnn_attention(qg: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, scale: float,
                    mesh: Optional[Mesh] = None, rules: Rules = DEFAULT_RULES,
                    implementation: str = "cudnn") -> jax.Array:
    """`compacted_causal_attention` through cuDNN, sharded as the activations are: rows over the
    batch axes, KV heads over the tensor axis (shard_map; each GPU runs its own block)."""
    if mesh is None or mesh.size == 1:
        return compacted_causal_attention(qg, k, v, key_valid, scale, implementation)
    local = lambda q, k, v, valid: compacted_causal_attention(q, k, v, valid, scale, implementation)
    return per_device_causal(local, mesh, rules, qg, k, v, key_valid)
