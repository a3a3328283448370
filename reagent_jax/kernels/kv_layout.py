"""The order of a KV cache's axes, per backend: a string over l (layers), n (slots), k (kv
heads), s (positions), d (head dim), from which every reader of the cache derives its indexing;
and how a call's new K/V are written into it (`write_new`).

CPU `lnksd`: a slot's head is one contiguous [S, D] block, as the CPU kernels (`cpu.decode`)
and the XLA:CPU attention read it.

GPU and TPU `lnskd`: one token's [K, D] is one dense tile, so a decode step's scatter of the
new K/V writes whole tiles. In the CPU order XLA:TPU copied the whole cache into this order and
back in every decode call whenever a chip holds more than one KV head (Qwen3-0.6B on one v5e
chip: two 0.47 GB copies per call, launch/compile_check.py). TPU's ragged decode kernel
(`tpu.ragged_decode`) reads this order too: in the heads-major [L, K, N, S, D]
order (the layout of JAX's paged attention kernels) XLA:TPU kept the cache in this order for
the scatter and copied it for the kernel in every step (4 x 9.7 GB per call at 8B).
"""
from __future__ import annotations

from typing import Optional

import jax
from jax.sharding import Mesh

from reagent_jax.parallel.mesh import mesh_platform

HEADS_MAJOR = "lnksd"  # the order the CPU kernels read, whatever the table below says
ORDERS = {"cpu": HEADS_MAJOR, "gpu": "lnskd", "tpu": "lnskd"}
_LOGICAL = {"l": "layers", "n": "cache_batch", "k": "kv_heads", "s": "cache_len", "d": "head_dim"}


def order(mesh: Optional[Mesh]) -> str:
    """The cache's axis order on `mesh`'s devices (other platforms: the GPU order)."""
    return ORDERS.get(mesh_platform(mesh), ORDERS["gpu"])


def heads_major(mesh: Optional[Mesh]) -> bool:
    """True when the cache is in the order the CPU kernels read (a benchmark may set another
    order for CPU in `ORDERS`: the kernels must then step aside, not read it wrongly)."""
    return order(mesh) == HEADS_MAJOR


def layer_order(mesh: Optional[Mesh]) -> str:
    """One layer's slice of the cache, e.g. "nksd"."""
    return order(mesh)[1:]


def cache_axes(mesh: Optional[Mesh]) -> tuple[str, ...]:
    """Logical axis names of the cache on `mesh`'s devices."""
    return tuple(_LOGICAL[a] for a in order(mesh))


def cache_shape(cfg, num_slots: int, max_len: int, mesh: Optional[Mesh] = None) -> tuple[int, ...]:
    sizes = {"l": cfg.num_layers, "n": num_slots, "k": cfg.num_kv_heads, "s": max_len, "d": cfg.head_dim}
    return tuple(sizes[a] for a in order(mesh))


def positions_axis(mesh: Optional[Mesh]) -> int:
    """The positions axis of the whole cache; one layer's slice has it one earlier."""
    return order(mesh).index("s")


def slots_axis(mesh: Optional[Mesh]) -> int:
    """The slots axis of the whole cache; one layer's slice has it one earlier."""
    return order(mesh).index("n")


def write_new(cache: jax.Array, new: jax.Array, rows: jax.Array, t_idx: jax.Array,
              mesh: Optional[Mesh]) -> jax.Array:
    """cache [l, n, k, S, d] (CPU) or [l, n, S, k, d] (`order`) with new [l, b, t, k, d]
    written at rows [b] x t_idx [b, t].

    On accelerators one scatter per layer: a single scatter of all layers ([b, t, l, k, d]
    windows) made XLA:TPU keep the cache in a layers-minor layout for it and copy the whole
    cache to the layer scan's layers-major layout and back in every decode step (two
    cache-sized copies per step, measured with launch/compile_check.py). On CPU the single
    scatter is ~15% faster for a bench-256 prefill, so it stays there."""
    if order(mesh) == "lnksd":  # CPU
        # cache[:, rows[b], :, t_idx[b, t]] is [b, t, l, k, d] (NumPy rules for split indices)
        return cache.at[:, rows[:, None], :, t_idx].set(new.transpose(1, 2, 0, 3, 4).astype(cache.dtype), mode="drop")
    for layer in range(cache.shape[0]):  # cache[layer, rows[b], t_idx[b, t]] is [b, t, k, d]
        cache = cache.at[layer, rows[:, None], t_idx].set(new[layer].astype(cache.dtype), mode="drop")
    return cache
