"""Fused kernels a backend may have for a whole piece of a step, asked for by the engine: where
the mesh's devices have none, the answer is None and the caller runs the model's own layers."""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from reagent_jax.kernels.cpu import decode as cpu_decode


def decode_layers(cfg, params, tokens: jax.Array, write_index: jax.Array, cache, mesh: Optional[Mesh] = None
                  ) -> Optional[tuple[jax.Array, tuple[jax.Array, jax.Array]]]:
    """Every decoder layer of one decode step in one kernel: tokens [N] (one per cache row) written
    at write_index [N] -> (hidden states before the final norm [N, E], cache), or None where no
    fused kernel fits (only fp32 on one AVX-512 CPU device has one: `cpu.decode`). cfg: the
    model's `Qwen3Config`."""
    if not cpu_decode.usable(cfg, params, cache, tokens.shape[0], mesh):
        return None
    x = jnp.take(params["embed"], tokens, axis=0)
    return cpu_decode.decode_layers(cfg, params, x, write_index, cache)
