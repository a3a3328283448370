"""The order of a KV cache's axes, per backend.

CPU: [L, N, K, S, D] (layers, slots, kv heads, positions, head dim): a slot's head is one
contiguous [S, D] block, as the CPU kernels (`cpu_decode`) and the XLA:CPU attention read it.

Accelerators: [L, N, S, K, D]: one token's [K, D] is a dense (8, 128) TPU tile, so a decode
step writes whole tiles. In the CPU order XLA:TPU copied the whole cache into this order and
back in every decode call whenever a chip holds more than one KV head (Qwen3-0.6B on one v5e
chip: two 0.47 GB copies per call, launch/compile_check.py).
"""
from __future__ import annotations

from typing import Optional

from jax.sharding import Mesh

from reagent_jax.models.config import Qwen3Config
from reagent_jax.parallel.mesh import mesh_platform


def heads_major(mesh: Optional[Mesh]) -> bool:
    """True for the CPU order [L, N, K, S, D], False for the accelerator order [L, N, S, K, D]."""
    return mesh_platform(mesh) == "cpu"


def cache_axes(mesh: Optional[Mesh]) -> tuple[str, ...]:
    """Logical axis names of the cache on `mesh`'s devices."""
    if heads_major(mesh):
        return ("layers", "cache_batch", "kv_heads", "cache_len", "head_dim")
    return ("layers", "cache_batch", "cache_len", "kv_heads", "head_dim")


def cache_shape(cfg: Qwen3Config, num_slots: int, max_len: int, mesh: Optional[Mesh] = None) -> tuple[int, ...]:
    if heads_major(mesh):
        return (cfg.num_layers, num_slots, cfg.num_kv_heads, max_len, cfg.head_dim)
    return (cfg.num_layers, num_slots, max_len, cfg.num_kv_heads, cfg.head_dim)


def positions_axis(mesh: Optional[Mesh]) -> int:
    """The positions axis of the whole cache (3 or 2); one layer's slice has it one earlier."""
    return 3 if heads_major(mesh) else 2
