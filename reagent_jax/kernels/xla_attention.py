"""Attention through XLA (every backend; the CPU path): masks, the cache-free causal attention
of training and scoring (in causal query blocks), and attention over the KV cache for prefill
and decode.

Einsum letters: b batch, t query time, s key time, k kv heads, g q heads per kv head, d head dim.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from reagent_jax.kernels import kv_layout
from reagent_jax.kernels.matmul import f32_einsum, mm
from reagent_jax.parallel.mesh import mesh_platform

_NEG = -1e30  # finite "minus infinity": fully masked (padding) rows stay finite

# How one-token decode reads a layer of the cache, per platform (`cached_attention`):
#   einsum  scores and values as batched dots
#   values  dot scores, multiply-reduce values (the CPU's: measured faster there)
#   reduce  multiply-reduce for both: the layer's window is read where it lies inside a reduction
#           fusion. The candidate for GPUs, where XLA copies each layer's window out of the stacked
#           cache for the dots (BENCHMARKS.md, "On an NVIDIA H200"); not measured there yet, so
#           not the default (launch/bench.py --mode=decode_kernel --decode_forms=einsum,reduce)
DECODE_FORMS = {"cpu": "values", "gpu": "einsum", "tpu": "einsum"}
LONG_ATTENTION = 2048  # longer sequences recompute attention probabilities per query block (see causal_attention)


def attention_mask(q_index: jax.Array, key_valid: jax.Array) -> jax.Array:
    """[b, t, s] boolean: key s visible to query t (causal by absolute index, valid keys only).

    q_index [b, t] is the absolute index of each query; key_valid [b, s].
    """
    s_idx = jnp.arange(key_valid.shape[1])
    return (s_idx[None, None, :] <= q_index[:, :, None]) & key_valid[:, None, :].astype(bool)


def causal_blocks(t: int, min_block: int = 128, max_blocks: int = 8, max_block: int = 512) -> list[tuple[int, int]]:
    """Static query blocks [start, end) for causal attention: block i only needs keys < end_i,
    so splitting T queries into n blocks computes (n + 1) / 2n of the full score matrix. Up to
    `max_blocks` blocks, more when a block would exceed `max_block` queries: a block's scores
    are [heads, block, T] fp32, 4.3 GB per layer for one 16k-token Qwen3-8B row in 2048-query
    blocks, the largest buffer of the long-context train step."""
    n = max(1, min(max(max_blocks, -(-t // max_block)), t // min_block))
    ends = [-(-t * (i + 1) // n) for i in range(n)]
    return list(zip([0] + ends[:-1], ends))


def causal_attention(qg: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                     mesh: Optional[Mesh] = None) -> jax.Array:
    """Softmax attention without a cache. qg [b,t,k,g,d]; k, v [b,s=t,k,d]; mask [b,t,s] must be
    causal (key s > query t never visible; `attention_mask` builds such masks). Returns
    [b,t,k,g,d]. mesh: where it runs (for `f32_einsum`).

    Why not one einsum: on XLA:CPU the straightforward form ran at ~30 GFLOP/s. Here queries go
    in causal blocks that skip keys past the block's end, the g query heads of a kv head are
    folded into one matmul dimension (bigger GEMMs, no transposes inside the einsums), and the
    softmax is normalised after the PV product ([.., d] divides instead of [.., s]): ~2.3x
    faster forward and ~2x faster backward at T=512. Fully masked rows (padding queries) average
    the values of their block's keys, finite like before.
    """
    b, t, nk, g, d = qg.shape
    dt = v.dtype
    kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [b, k, s, d]

    def block(q_blk, kt, vt, m):  # q_blk [b,k,(g tq),d]; kt, vt [b,k,s,d]; m [b,tq,s]
        tq, s = m.shape[1], m.shape[2]
        scores = f32_einsum("bkmd,bksd->bkms", q_blk, kt, mesh) * scale
        scores = jnp.where(m[:, None, None], scores.reshape(b, nk, g, tq, s), _NEG)
        e = jnp.exp(scores - jax.lax.stop_gradient(scores.max(axis=-1, keepdims=True)))  # [b,k,g,tq,s]
        z = e.sum(axis=-1)  # [b,k,g,tq]
        o = mm("bkms,bksd->bkmd", e.reshape(b, nk, g * tq, s).astype(dt), vt, mesh)
        return o.reshape(b, nk, g, tq, d) / z[..., None].astype(dt)

    # Long sequences: recompute each block's probabilities in its own backward pass instead of
    # keeping every block's [heads, block, keys] fp32 probabilities of the layer alive until then
    # (~17 GB for one 16k-token Qwen3-8B row), the memory use of flash attention without a kernel.
    if t > LONG_ATTENTION:
        block = jax.checkpoint(block)
    outs = []
    for start, end in causal_blocks(t):
        q_blk = qg[:, start:end].transpose(0, 2, 3, 1, 4).reshape(b, nk, g * (end - start), d)  # [b,k,(g t),d]
        o = block(q_blk, kt[:, :, :end], vt[:, :, :end], mask[:, start:end, :end])
        outs.append(o.transpose(0, 3, 1, 2, 4))  # [b,tq,k,g,d]
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


def decode_step_scores(qg: jax.Array, ck: jax.Array) -> jax.Array:
    """Scores of one new token per row against the cached keys, as a multiply-reduce over d:
    qg [b,1,k,g,d], ck [b,k,s,d] -> [b,k,g,1,s] in fp32."""
    f32 = jnp.float32
    return (qg[:, 0, :, :, None, :].astype(f32) * ck[:, :, None].astype(f32)).sum(-1)[:, :, :, None, :]


def decode_step_values(p_old: jax.Array, cv: jax.Array, p_new: jax.Array, v: jax.Array) -> jax.Array:
    """Attention output of one new token per row: weights p_old [b,k,g,1,s] over the cached
    values cv [b,k,s,d] plus p_new [b,k,g,1,1] over the token's own value v [b,1,k,d] ->
    [b,1,k,g,d] in v's dtype (fp32 accumulation).

    Why not the einsums of the multi-token path: with one query these are [g, s] x [s, d]
    mat-vecs; as a multiply-reduce over s the cache is read once where it lies (decode step at
    bench-256 with a 4k vocabulary: 4.4 -> 3.9 ms, measured when the cache was [b,s,k,d] and the
    GEMM needed a transposed copy of it)."""
    f32 = jnp.float32
    out = (p_old[:, :, :, 0, :, None].astype(f32) * cv[:, :, None].astype(f32)).sum(3)  # [b,k,g,s,1]*[b,k,1,s,d]
    out = out + p_new[:, :, :, 0, 0, None].astype(f32) * v[:, 0, :, None].astype(f32)
    return out[:, None].astype(v.dtype)


def cached_attention(qg: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, cache_k: jax.Array,
                     cache_v: jax.Array, layer: jax.Array, write_index: jax.Array, slot_ids: Optional[jax.Array],
                     scale: float, dtype, mesh: Optional[Mesh] = None) -> jax.Array:
    """Attention of this call's tokens qg [b,t,k,g,d] (their own k, v [b,t,k,d], causal `mask`
    [b,t,t]) over layer `layer` of the cache (k and v, [L, ...] in `kv_layout.order`) plus
    themselves: row b sees cache row slot_ids[b] (default b) below write_index[b]. Matmuls in
    `dtype`. -> [b,t,k,g,d].

    A two-part softmax over (cached positions < write_index) and (new tokens, causal): the cache
    is only read here; the new K/V are scattered once after the layer loop
    (`kv_layout.write_new`), so a step never copies the cache."""
    dt = dtype
    t = qg.shape[1]
    view, view_order = kv_layout.memory_view(cache_k, mesh)  # read as the cache lies in memory
    cache_k, cache_v, order = view(cache_k), view(cache_v), view_order[1:]  # e.g. "nksd" (CPU)
    ck, cv = (jax.lax.dynamic_index_in_dim(c, layer, 0, keepdims=False) for c in (cache_k, cache_v))
    kv = order.replace("n", "b")
    if slot_ids is not None:
        rows = (slice(None),) * order.index("n") + (slot_ids,)
        ck, cv = ck[rows], cv[rows]  # b rows for n
    ck, cv = ck.astype(dt), cv.astype(dt)
    form = DECODE_FORMS.get(mesh_platform(mesh), "einsum") if t == 1 else "einsum"
    heads_major = lambda c: c.transpose([kv.index(a) for a in "bksd"])  # a view: fused into the reduction
    old_valid = jnp.arange(ck.shape[kv.index("s")])[None, :] < write_index[:, None]  # [b, S]
    if form == "reduce":
        s_old = decode_step_scores(qg, heads_major(ck)) * scale
    else:
        s_old = f32_einsum(f"btkgd,{kv}->bkgts", qg, ck, mesh) * scale
    s_old = jnp.where(old_valid[:, None, None, None, :], s_old, _NEG)
    s_new = f32_einsum("btkgd,bukd->bkgtu", qg, k, mesh) * scale
    s_new = jnp.where(mask[:, None, None], s_new, _NEG)
    m = jnp.maximum(s_old.max(-1), s_new.max(-1))[..., None]
    e_old, e_new = jnp.exp(s_old - m), jnp.exp(s_new - m)
    z = e_old.sum(-1, keepdims=True) + e_new.sum(-1, keepdims=True)
    if form in ("values", "reduce"):
        return decode_step_values(e_old / z, heads_major(cv), e_new / z, v)
    return (mm(f"bkgts,{kv}->btkgd", (e_old / z).astype(dt), cv, mesh)
            + mm("bkgtu,bukd->btkgd", (e_new / z).astype(dt), v, mesh))
