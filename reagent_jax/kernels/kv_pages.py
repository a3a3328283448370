"""A paged KV cache: the cache as a pool of fixed-size pages shared by every slot, and a block
table [N, max_len / page] per call saying which page holds each slot's positions
[j * page, (j + 1) * page). A pool array has the contiguous cache's axis order
(`kv_layout.order`) with the slots axis holding pages and the positions axis one page, so
`kv_layout.cache_shape(cfg, num_pages, page_size)` is its shape.

Why: a contiguous cache reserves max_len positions for every slot, so memory follows
slots x max_len whatever the sequences' lengths; with pages it follows the tokens the host
reserved (`rollout.pages`), and a pool the size of 32 full slots can hold 64 half-length ones.

Page ids in a table are global ids into the pool; an unassigned entry holds `num_pages` (out of
range: reads give zeros, writes are dropped). Where the pool's pages are split over the data
axis (a mesh whose data axis splits the slots), a slot only ever holds pages of its own data
shard (`rollout.pages` allocates them so), and decode reads them on that shard alone.

Readers: XLA paths gather the slots' first `window` positions into a contiguous window
(`gather`), run the contiguous code on it, and write the window's pages back (`scatter`); the
TPU decode kernel reads the pages where they lie (`tpu.ragged_decode`).
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from reagent_jax.kernels import kv_layout
from reagent_jax.parallel.rules import DEFAULT_RULES, Rules, logical_to_spec


def data_shards(mesh: Optional[Mesh], rules: Rules, num_slots: int, num_pages: int) -> int:
    """How many data shards split both the slots and the pool's pages (1: the mesh splits
    neither). Both must divide evenly: a slot reads pages of its own shard only."""
    ways = 1 if mesh is None else mesh_ways(mesh, rules)
    if num_slots % ways or num_pages % ways:
        raise ValueError(f"a paged KV cache on this mesh splits slots and pages over {ways} data shards: "
                         f"num_slots={num_slots} and kv_pages={num_pages} must both be multiples of {ways}")
    return ways


def mesh_ways(mesh: Mesh, rules: Rules) -> int:
    """Devices the `cache_batch` axis (slots, pages) is split over on `mesh`."""
    axes = shard_axes(mesh, rules)
    ways = 1
    for a in axes or ():
        ways *= mesh.shape[a]
    return ways


def shard_axes(mesh: Optional[Mesh], rules: Rules):
    """The mesh axes `cache_batch` maps to (a name, a tuple of names, or None)."""
    if mesh is None:
        return None
    big = int(np.prod(list(mesh.shape.values())))
    spec = logical_to_spec(("cache_batch",), (big,), mesh, rules)[0]
    return None if spec is None else (spec if isinstance(spec, tuple) else (spec,))


def page_size_of(pool: jax.Array, mesh: Optional[Mesh]) -> int:
    return pool.shape[kv_layout.positions_axis(mesh)]


def _gather_local(pool: jax.Array, table: jax.Array, heads_major: bool) -> jax.Array:
    """pool [L, P, page, K, D] (or [L, P, K, page, D]), table [B, n] -> [L, B, n*page, K, D] (or
    [L, B, K, n*page, D]); out-of-range ids read zeros."""
    g = pool.at[:, table].get(mode="fill", fill_value=0)  # [L, B, n, page, K, D] or [L, B, n, K, page, D]
    if heads_major:
        g = jnp.moveaxis(g, 3, 2)  # [L, B, K, n, page, D]
        return g.reshape(g.shape[:3] + (-1, g.shape[-1]))
    return g.reshape(g.shape[:2] + (-1,) + g.shape[4:])


def _scatter_local(pool: jax.Array, window: jax.Array, table: jax.Array, heads_major: bool) -> jax.Array:
    """The inverse of `_gather_local`: the window's pages written to `table`'s ids (out-of-range
    ids dropped; a page id appears at most once in a table, so writes never collide)."""
    n = table.shape[1]
    page = pool.shape[3] if heads_major else pool.shape[2]
    if heads_major:
        pages = window.reshape(window.shape[:3] + (n, page, window.shape[-1]))  # [L, B, K, n, page, D]
        pages = jnp.moveaxis(pages, 3, 2)  # [L, B, n, K, page, D]
    else:
        pages = window.reshape(window.shape[:2] + (n, page) + window.shape[3:])  # [L, B, n, page, K, D]
    return pool.at[:, table].set(pages.astype(pool.dtype), mode="drop")


def local_ids(table: jax.Array, pages_per_shard: int, axes) -> jax.Array:
    """Inside a shard_map over the `cache_batch` mesh axes `axes`: global page ids -> this
    shard's (ids of other shards, and the empty id, out of range)."""
    if not axes:
        return table
    lo = jax.lax.axis_index(axes) * pages_per_shard
    return jnp.where((table >= lo) & (table < lo + pages_per_shard), table - lo, pages_per_shard)


def _per_shard(fn, mesh: Optional[Mesh], rules: Rules, pool: jax.Array, table: jax.Array, *arrays,
               axes_of: Optional[tuple] = None):
    """Runs fn(pool, table, *arrays) on each data shard with shard-local page ids, when the
    slots and pages are split over data; otherwise on the whole arrays. axes_of: each array's
    logical axes (default: the pool's, as for windows)."""
    shards = data_shards(mesh, rules, table.shape[0], pool.shape[1])
    if shards == 1:
        return fn(pool, table, *arrays)
    axes = shard_axes(mesh, rules)
    pool_spec = logical_to_spec(kv_layout.cache_axes(mesh), pool.shape, mesh, rules)
    table_spec = P(axes, None)
    per = pool.shape[1] // shards
    local = lambda p, t, *a: fn(p, local_ids(t, per, axes), *a)
    specs = tuple(pool_spec if axes_of is None else logical_to_spec(names, a.shape, mesh, rules)
                  for a, names in zip(arrays, axes_of or [None] * len(arrays)))
    return jax.shard_map(local, mesh=mesh, in_specs=(pool_spec, table_spec) + specs, out_specs=pool_spec,
                         check_vma=False)(pool, table, *arrays)


def gather(pool: jax.Array, table: jax.Array, mesh: Optional[Mesh] = None, rules: Rules = DEFAULT_RULES,
           *, per_shard: bool = True) -> jax.Array:
    """The contiguous window [L, B, W, K, D] (in `kv_layout.order`) of the B = table rows, W =
    table columns x page. per_shard: row i of the table is slot i, so each data shard gathers
    its own slots from its own pages (decode); False: rows of any slots (prefill), gathered
    across shards by XLA."""
    view, view_order = kv_layout.memory_view(pool, mesh, rules)
    local = lambda p, t: view(_gather_local(view(p), t, view_order == kv_layout.HEADS_MAJOR))
    return local(pool, table) if not per_shard else _per_shard(local, mesh, rules, pool, table)


def scatter(pool: jax.Array, window: jax.Array, table: jax.Array, mesh: Optional[Mesh] = None,
            rules: Rules = DEFAULT_RULES, *, per_shard: bool = True) -> jax.Array:
    """Writes a `gather`ed window back into the pool's pages (the pool is donated by the caller)."""
    view, view_order = kv_layout.memory_view(pool, mesh, rules)
    local = lambda p, t, w: view(_scatter_local(view(p), view(w), t, view_order == kv_layout.HEADS_MAJOR))
    return local(pool, table, window) if not per_shard else _per_shard(local, mesh, rules, pool, table, window)


def write_tokens(pool: jax.Array, new: jax.Array, table: jax.Array, positions: jax.Array,
                 mesh: Optional[Mesh] = None, rules: Rules = DEFAULT_RULES) -> jax.Array:
    """Decode's write: new [L, N, 1, K, D] (one token per slot, slot i = table row i) into the
    pool at each slot's `positions` [N]. Split over data, each shard writes its own slots into
    its own pages: with global ids XLA cannot see that a slot's page is on its shard, and
    all-gathered every step's new K/V (and the indices) over data before the scatter."""
    page, heads = page_size_of(pool, mesh), kv_layout.heads_per_device(pool.shape, mesh, rules)

    def write(p, t, kv, pos):
        rows, offset = write_slots(t, pos, page)
        return kv_layout.write_new(p, kv, rows, offset[:, None], mesh, heads)

    new_axes = ("layers", "cache_batch", "cache_len", "kv_heads", "head_dim")  # [L, N, 1, K, D]
    return _per_shard(write, mesh, rules, pool, table, new, positions, axes_of=(new_axes, ("cache_batch",)))


def write_slots(table: jax.Array, positions: jax.Array, page_size: int) -> tuple[jax.Array, jax.Array]:
    """Where one new token per slot lands: positions [N] -> (page ids [N], offsets [N]); a
    position past the table (an idle slot) gets the out-of-range page id."""
    col = positions // page_size
    num_cols = table.shape[1]
    page = jnp.take_along_axis(table, jnp.clip(col, 0, num_cols - 1)[:, None], axis=1)[:, 0]
    empty = jnp.iinfo(jnp.int32).max
    return jnp.where(col < num_cols, page, empty).astype(jnp.int32), (positions % page_size).astype(jnp.int32)
