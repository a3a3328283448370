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

import math
from typing import Optional

import jax
import numpy as np
from jax.sharding import Mesh

from reagent_jax.parallel.mesh import mesh_platform
from reagent_jax.parallel.rules import DEFAULT_RULES, Rules, logical_to_spec

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


def heads_per_device(shape: tuple[int, ...], mesh: Optional[Mesh], rules: Rules = DEFAULT_RULES) -> int:
    """KV heads each device holds of a cache (or page pool) of this global shape."""
    heads = shape[order(mesh).index("k")]
    if mesh is None:
        return heads
    split = logical_to_spec(cache_axes(mesh), shape, mesh, rules)[order(mesh).index("k")]
    names = () if split is None else (split,) if isinstance(split, str) else split
    return heads // math.prod(mesh.shape[a] for a in names)


def positions_minor(dtype, local_heads: int, platform: str) -> bool:
    """True where XLA:TPU keeps a [.., S, K, D] cache of `dtype` with `local_heads` KV heads
    per chip positions second-minor in memory (see the module note)."""
    return platform == "tpu" and np.dtype(dtype).itemsize * local_heads < 4


def is_positions_minor(cache: jax.Array, mesh: Optional[Mesh], rules: Rules = DEFAULT_RULES) -> bool:
    """Whether this cache (or page pool; global shape) lies positions-minor in memory on
    `mesh`, so that its readers address the `swap_heads_positions` view of it."""
    return order(mesh) == "lnskd" and positions_minor(cache.dtype, heads_per_device(cache.shape, mesh, rules),
                                                      mesh_platform(mesh))


def swap_heads_positions(cache: jax.Array) -> jax.Array:
    """[L, N, S, K, D] <-> [L, N, K, S, D]: of a positions-minor cache, the view of its memory
    layout (XLA makes the transpose a bitcast)."""
    return cache.transpose(0, 1, 3, 2, 4)


def memory_view(cache: jax.Array, mesh: Optional[Mesh], rules: Rules = DEFAULT_RULES):
    """(view, its axis order): how readers index `cache` (or a page pool): through
    `swap_heads_positions` ("lnksd") where it lies positions-minor, else as it is (`order`).
    The view is its own inverse."""
    if is_positions_minor(cache, mesh, rules):
        return swap_heads_positions, HEADS_MAJOR
    return (lambda c: c), order(mesh)


def write_new(cache: jax.Array, new: jax.Array, rows: jax.Array, t_idx: jax.Array,
              mesh: Optional[Mesh], local_heads: Optional[int] = None) -> jax.Array:
    """cache [l, n, k, S, d] (CPU) or [l, n, S, k, d] (`order`) with new [l, b, t, k, d]
    written at rows [b] x t_idx [b, t]. local_heads: the KV heads per device (default: all of
    the cache's, as inside shard_map).

    On accelerators one scatter per layer: a single scatter of all layers ([b, t, l, k, d]
    windows) made XLA:TPU keep the cache in a layers-minor layout for it and copy the whole
    cache to the layer scan's layers-major layout and back in every decode step (two
    cache-sized copies per step, measured with launch/compile_check.py). On CPU the single
    scatter is ~15% faster for a bench-256 prefill, so it stays there."""
    if order(mesh) == "lnksd":  # CPU
        # cache[:, rows[b], :, t_idx[b, t]] is [b, t, l, k, d] (NumPy rules for split indices)
        return cache.at[:, rows[:, None], :, t_idx].set(new.transpose(1, 2, 0, 3, 4).astype(cache.dtype), mode="drop")
    local_heads = cache.shape[3] if local_heads is None else local_heads
    if positions_minor(cache.dtype, local_heads, mesh_platform(mesh)):
        return _write_per_head(cache, new, rows, t_idx, local_heads)
    for layer in range(cache.shape[0]):  # cache[layer, rows[b], t_idx[b, t]] is [b, t, k, d]
        cache = cache.at[layer, rows[:, None], t_idx].set(new[layer].astype(cache.dtype), mode="drop")
    return cache


def _write_per_head(cache: jax.Array, new: jax.Array, rows: jax.Array, t_idx: jax.Array, local_heads: int):
    """A positions-minor cache: one scatter of [d] rows per layer and per head of a device (a
    token's [k, d] window made XLA:TPU hold the cache heads-minor for the scatter and relay it
    out around it). The heads axis is split [devices, local] so that the head index falls on
    the device-local part (indexing the split axis itself moved the new K/V between chips)."""
    l, n, s, k, d = cache.shape
    split = cache.reshape(l, n, s, k // local_heads, local_heads, d)
    new = new.reshape(new.shape[:3] + (k // local_heads, local_heads, d))
    for layer in range(l):
        for h in range(local_heads):  # split[layer, rows[b], t_idx[b, t], :, h] is [b, t, devices, d]
            split = split.at[layer, rows[:, None], t_idx, :, h].set(new[layer, :, :, :, h].astype(cache.dtype),
                                                                   mode="drop")
    return split.reshape(cache.shape)
