"""TPU splash attention (Pallas, `jax.experimental.pallas.ops.tpu.splash_attention`) for the
cache-free causal path (training, scoring, reference logprobs): flash-style, no [heads, T, T]
scores in HBM, causal blocks skipped by the kernel. Off TPU it runs in Pallas interpret mode
(slow; for correctness tests only). Chosen by `kernels.attention.choose`.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from reagent_jax.parallel.mesh import mesh_platform
from reagent_jax.kernels.blocks import per_device_causal
from reagent_jax.parallel.rules import DEFAULT_RULES, Rules

BLOCKS = (512, 256, 128)  # the largest that divides T is used


def _splash_kernel(length: int, groups: int, interpret: bool):
    """The MQA splash kernel for (length, query heads per KV head): q [g, T, d], k/v [T, d].
    Built inside each trace (as MaxText does): its block tables become that program's constants;
    a kernel cached across traces would carry one trace's values into another."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    block = next(b for b in BLOCKS if length % b == 0)
    sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    mask = sm.MultiHeadMask([sm.CausalMask((length, length))] * groups)
    return sk.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret), sk.SegmentIds


def splash_attention(qg: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, scale: float,
                     mesh: Optional[Mesh] = None, rules: Rules = DEFAULT_RULES) -> jax.Array:
    """Causal attention of qg [b,t,k,g,d] over k, v [b,t,k,d] where key_valid [b,t] (padding
    keys invisible to real queries) -> [b,t,k,g,d]. Padding queries attend among padding keys
    (finite; their outputs carry no loss). Sharded as the activations are: rows over the batch
    axes, KV heads over the tensor axis (shard_map; the kernel sees one device's block)."""
    b, t, nk, g, d = qg.shape
    interpret = mesh_platform(mesh) != "tpu"
    kernel, segment_ids = _splash_kernel(t, g, interpret)

    def local(qg, k, v, valid):  # one device's rows and KV heads
        seg = valid.astype(jnp.int32)  # [b, t]: 1 real, 0 padding

        def one_head(q_h, k_h, v_h, s):  # q_h [g, t, d]; k_h, v_h [t, d]; s [t]
            return kernel(q_h, k_h, v_h, segment_ids=segment_ids(q=s, kv=s))

        per_row = jax.vmap(one_head, in_axes=(0, 0, 0, None))  # over KV heads
        out = jax.vmap(per_row)((qg * scale).transpose(0, 2, 3, 1, 4), k.transpose(0, 2, 1, 3),
                                v.transpose(0, 2, 1, 3), seg)  # [b, k, g, t, d]
        return out.transpose(0, 3, 1, 2, 4).astype(v.dtype)

    if mesh is None:  # on a mesh (one device too) shard_map tells the kernel which TPU it lowers for
        return local(qg, k, v, key_valid)
    return per_device_causal(local, mesh, rules, qg, k, v, key_valid)
