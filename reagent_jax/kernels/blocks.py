"""Running a custom attention kernel on each device's block of a mesh: the accelerator kernels
(TPU splash, GPU cuDNN) see one device's rows and KV heads, laid out as the activations are."""
from __future__ import annotations

from typing import Callable

import jax
from jax.sharding import Mesh

from reagent_jax.parallel.rules import Rules, logical_to_spec


def per_device_causal(local: Callable, mesh: Mesh, rules: Rules, qg: jax.Array, k: jax.Array, v: jax.Array,
                      key_valid: jax.Array) -> jax.Array:
    """local(qg [b,t,k,g,d], k, v [b,t,k,d], key_valid [b,t]) -> [b,t,k,g,d] on each device's
    block: rows over the batch axes, KV heads over the tensor axis (shard_map)."""
    q_spec = logical_to_spec(("batch", None, "act_kv_heads", None, None), qg.shape, mesh, rules)
    kv_spec = logical_to_spec(("batch", None, "act_kv_heads", None), k.shape, mesh, rules)
    row_spec = logical_to_spec(("batch", None), key_valid.shape, mesh, rules)
    return jax.shard_map(local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, row_spec), out_specs=q_spec,
                         check_vma=False)(qg, k, v, key_valid)
