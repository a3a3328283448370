"""TPU decode attention that follows each slot's length: a Pallas kernel over the stacked KV
cache [L, N, S, K, D] (`kv_layout`; read through its [L, N, K, S, D] view where XLA:TPU keeps
it positions-minor, `kv_layout.is_positions_minor`) that walks each slot's positions in blocks
and stops at that slot's own length (the block index is clamped there, so no block past it is
fetched): bytes per step = the live KV, where XLA attention reads every slot's whole window. Off
TPU it runs in interpret mode (tests only). Chosen by `kernels.attention.choose_decode`.
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh, PartitionSpec as P

from reagent_jax.kernels import kv_layout, kv_pages
from reagent_jax.parallel.mesh import mesh_platform
from reagent_jax.parallel.rules import DEFAULT_RULES, Rules, logical_to_spec

_DECODE_BLOCK_BYTES = 512 * 1024  # one K (or V) block of a slot's heads in VMEM, double-buffered x 2
_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)


def decode_block(length: int, heads: int, head_dim: int, itemsize: int) -> int:
    """Positions per kernel block: the largest power of two from 2048 down to 128 dividing the
    cache length whose [heads, block, head_dim] block fits `_DECODE_BLOCK_BYTES` and that cuts
    the length into at least 8 blocks (a slot reads up to one block past its length: at most
    1/8 of the window); the whole length when it is short or no such block divides it."""
    for block in (2048, 1024, 512, 256, 128):
        small = block * 8 <= length and heads * block * head_dim * itemsize <= _DECODE_BLOCK_BYTES
        if length % block == 0 and (block == 128 or small):
            return block
    return length


def _ragged_decode_kernel(lengths_ref, layer_ref, q_ref, k_new_ref, v_new_ref, k_ref, v_ref, o_ref, m_sc, l_sc,
                          acc_sc, *, block: int, positions_minor: bool):
    """Grid (slot i, block j). q [1, K, g, d] (scaled); k_new/v_new [1, K, 1, d] (the token's own
    key and value); k/v [1, 1, block, K, d] (the layer's positions j * block ...; positions_minor:
    [1, 1, K, block, d]); scratch m, l
    [K, g, 128] (lane-replicated), acc [K, g, d] fp32: an online softmax over the slot's blocks."""
    del layer_ref  # used by the index maps only
    i, j = pl.program_id(0), pl.program_id(1)
    heads, g = q_ref.shape[1], q_ref.shape[2]
    length = lengths_ref[i]
    f32 = jnp.float32
    head_of = lambda ref, h: ref[0, 0, h] if positions_minor else ref[0, 0, :, h, :]  # [block, d]

    @pl.when(j == 0)
    def _init():  # the token itself: weight exp(0) at its own score
        for h in range(heads):
            s_new = jnp.sum(q_ref[0, h].astype(f32) * k_new_ref[0, h].astype(f32), axis=-1, keepdims=True)  # [g, 1]
            m_sc[h] = jnp.broadcast_to(s_new, (g, 128))
            l_sc[h] = jnp.ones((g, 128), f32)
            acc_sc[h] = jnp.broadcast_to(v_new_ref[0, h].astype(f32), (g, acc_sc.shape[-1]))

    @pl.when(j * block < length)
    def _step():
        pos = j * block + jax.lax.broadcasted_iota(jnp.int32, (g, block), 1)
        for h in range(heads):
            k = head_of(k_ref, h).astype(q_ref.dtype)  # an fp8 cache computes in the query's dtype
            s = jax.lax.dot_general(q_ref[0, h], k, (((1,), (1,)), ((), ())),
                                    preferred_element_type=f32)  # [g, block]
            s = jnp.where(pos < length, s, _NEG)
            m_prev = m_sc[h][:, :1]
            m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))  # [g, 1]
            alpha, p = jnp.exp(m_prev - m_new), jnp.exp(s - m_new)
            l_sc[h] = jnp.broadcast_to(alpha * l_sc[h][:, :1] + p.sum(axis=-1, keepdims=True), (g, 128))
            m_sc[h] = jnp.broadcast_to(m_new, (g, 128))
            pv = jax.lax.dot_general(p.astype(q_ref.dtype), head_of(v_ref, h).astype(q_ref.dtype),
                                     (((1,), (0,)), ((), ())),
                                     preferred_element_type=f32)  # [g, d]
            acc_sc[h] = alpha * acc_sc[h] + pv

    @pl.when(j == pl.num_programs(1) - 1)
    def _finish():
        for h in range(heads):
            o_ref[0, h] = (acc_sc[h] / l_sc[h][:, :1]).astype(o_ref.dtype)


def _paged_decode_kernel(lengths_ref, layer_ref, pages_ref, *refs, **static):
    """The same kernel over a paged pool: block j of slot i is page pages[i, j] (index maps)."""
    del pages_ref
    _ragged_decode_kernel(lengths_ref, layer_ref, *refs, **static)


def _ragged_decode_local(q, ck, cv, layer, k_new, v_new, lengths, pages=None, *, positions_minor: bool,
                         interpret: bool):
    """One device: q [N, K, g, d] (scaled); ck, cv [L, N, S, K, d] (every layer: the kernel
    fetches layer `layer`'s blocks itself); k_new, v_new [N, K, 1, d]; lengths [N] (cached
    positions each slot attends to) -> [N, K, g, d]. pages [N, S / page] (this device's page
    ids): ck, cv are a paged pool [L, P, page, K, d] and a block is a page. positions_minor: the
    kernel reads the [L, N | P, K, S | page, d] view, the cache as XLA:TPU then lays it out."""
    n, heads, g, d = q.shape
    if positions_minor:  # a transpose that is a bitcast of the cache's memory layout (no copy)
        ck, cv = kv_layout.swap_heads_positions(ck), kv_layout.swap_heads_positions(cv)
    span = ck.shape[3 if positions_minor else 2]  # a slot's positions, or a page's
    if pages is None:
        length = span
        block = decode_block(length, heads, d, ck.dtype.itemsize)
    else:
        block, length = span, pages.shape[1] * span

    def cache_block(i, j, lengths, layer, *pages):  # past the slot's last live block: the same block again (no fetch)
        col = jnp.minimum(j, jnp.maximum((lengths[i] + block - 1) // block - 1, 0))
        if not pages:
            return (layer[0], i, 0, col, 0) if positions_minor else (layer[0], i, col, 0, 0)
        return layer[0], jnp.minimum(pages[0][i, col], ck.shape[1] - 1), 0, 0, 0  # an idle slot: any real page

    cache_spec = (1, 1, heads, block, d) if positions_minor else (1, 1, block, heads, d)
    row = lambda i, j, *scalars: (i, 0, 0, 0)
    scalars = (lengths, jnp.reshape(layer, (1,)).astype(jnp.int32)) + (() if pages is None else (pages,))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(scalars), grid=(n, length // block),
        in_specs=[pl.BlockSpec((1, heads, g, d), row), pl.BlockSpec((1, heads, 1, d), row),
                  pl.BlockSpec((1, heads, 1, d), row), pl.BlockSpec(cache_spec, cache_block),
                  pl.BlockSpec(cache_spec, cache_block)],
        out_specs=pl.BlockSpec((1, heads, g, d), row),
        scratch_shapes=[pltpu.VMEM((heads, g, 128), jnp.float32), pltpu.VMEM((heads, g, 128), jnp.float32),
                        pltpu.VMEM((heads, g, d), jnp.float32)])
    kernel = _ragged_decode_kernel if pages is None else _paged_decode_kernel
    return pl.pallas_call(
        functools.partial(kernel, block=block, positions_minor=positions_minor), grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, v_new.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret)(*scalars, q, k_new, v_new, ck, cv)


def ragged_decode(qg: jax.Array, ck: jax.Array, cv: jax.Array, layer: jax.Array, k: jax.Array, v: jax.Array,
                  write_index: jax.Array, scale: float, mesh: Optional[Mesh] = None,
                  rules: Rules = DEFAULT_RULES, pages: Optional[jax.Array] = None) -> jax.Array:
    """One new token per slot: qg [N,1,K,g,d] attends over its slot's cached positions
    < write_index[N] of layer `layer` of the caches ck, cv [L, N, S, K, d] (every layer: a
    custom call given one layer's slice would receive a copy of it) and over its
    own k, v [N,1,K,d] -> [N,1,K,g,d]. A write_index >= S (an idle slot) reads no cache.
    Sharded as the engine's cache is: slots over `cache_batch`, KV heads over `kv_heads`.
    pages [N, S / page]: ck, cv are a paged pool [L, P, page, K, d] (`kernels.kv_pages`), and
    each slot reads its own pages (of its own data shard)."""
    s = ck.shape[2] if pages is None else pages.shape[1] * ck.shape[2]
    lengths = jnp.where(write_index < s, write_index, 0).astype(jnp.int32)
    q = (qg[:, 0] * scale).astype(qg.dtype)  # [N, K, g, d]
    k_new, v_new = k[:, 0, :, None], v[:, 0, :, None]  # [N, K, 1, d]
    local = functools.partial(_ragged_decode_local, interpret=mesh_platform(mesh) != "tpu",
                              positions_minor=kv_layout.is_positions_minor(ck, mesh, rules))
    layer = jnp.asarray(layer, jnp.int32)
    if pages is not None:
        pages = jnp.asarray(pages, jnp.int32)
        axes, per = kv_pages.shard_axes(mesh, rules), ck.shape[1] // (1 if mesh is None else kv_pages.mesh_ways(mesh, rules))
        paged = local
        local = lambda q, ck, cv, layer, k_new, v_new, lengths, pages: paged(
            q, ck, cv, layer, k_new, v_new, lengths, kv_pages.local_ids(pages, per, axes))
    extra = () if pages is None else (pages,)
    if mesh is None:  # on a mesh (one device too) shard_map tells the kernel which TPU it lowers for
        out = local(q, ck, cv, layer, k_new, v_new, lengths, *extra)
    else:
        row_spec = logical_to_spec(("cache_batch", "kv_heads", None, None), q.shape, mesh, rules)
        cache_spec = logical_to_spec(("layers", "cache_batch", "cache_len", "kv_heads", "head_dim"), ck.shape, mesh,
                                     rules)
        len_spec = logical_to_spec(("cache_batch",), lengths.shape, mesh, rules)
        table_spec = () if pages is None else (P(*len_spec, None),)
        out = jax.shard_map(local, mesh=mesh,
                            in_specs=(row_spec, cache_spec, cache_spec, P(), row_spec, row_spec, len_spec) + table_spec,
                            out_specs=row_spec, check_vma=False)(q, ck, cv, layer, k_new, v_new, lengths, *extra)
    return out[:, None]
