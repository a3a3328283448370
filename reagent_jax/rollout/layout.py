"""The engine's own layout: its mesh, its rules table, and its copy of the weights.

Why not the trainer's: decode reads every weight once per step for a handful of tokens, so it is
bound by the bytes each chip reads. Under the trainer's FSDP sharding every step all-gathers
every layer (each chip reads and receives the whole model, 15 GB per step for Qwen3-8B on 8
chips); tensor-parallel weights are read where they lie (2 GB per chip) and only [slots, embed]
activations cross the links. So the engine reshapes the trainer's devices into
(data, fsdp=1, tensor) with `tensor` = the largest divisor of the device count that divides the
KV heads (each chip keeps whole heads of every slot's cache), slots over `data`, and holds
its own compute-dtype copy of the weights, made by one jitted cast + reshard
(`WeightSync`), never an alias of the trainer's (donated) buffers.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, SingleDeviceSharding

from reagent_jax.models.config import Qwen3Config
from reagent_jax.models.functional import param_shardings
from reagent_jax.parallel.hosts import process_groups
from reagent_jax.parallel.rules import DEFAULT_RULES, MESH_AXES, Rules

_ENGINE_OVERRIDES = {
    "batch": "data",            # slots (decode rows, prefill rows) over data only
    "logits_batch": "data",
    "logits_vocab": "tensor",   # the head / embedding split over the vocabulary, as the weight lies
    "embed": None,              # no FSDP: weights are read where they lie, never gathered
    "cache_batch": "data",
}
ENGINE_RULES: Rules = tuple((name, _ENGINE_OVERRIDES.get(name, axes)) for name, axes in DEFAULT_RULES)


def default_tensor_parallel(cfg: Qwen3Config, num_devices: int) -> int:
    """Largest divisor of num_devices that also divides the KV heads (and so the query heads)."""
    return max(t for t in range(1, num_devices + 1) if num_devices % t == 0 and cfg.num_kv_heads % t == 0)


def engine_meshes(mesh: Optional[Mesh], cfg: Qwen3Config,
                  tensor: Optional[int] = None) -> tuple[Optional[Mesh], Optional[Mesh]]:
    """(local, spanning): the engine's (data, fsdp=1, tensor) mesh over this process's devices
    of `mesh` in their order, and, on several processes, the same layout over all of them (each
    process's devices whole rows of it), through which the weights are resharded. One process:
    (mesh, None); no mesh: (None, None)."""
    if mesh is None:
        return None, None
    groups = process_groups(mesh.devices)  # [processes, devices per process]
    n = groups.shape[1]
    tensor = default_tensor_parallel(cfg, n) if tensor is None else int(tensor)
    if tensor < 1 or n % tensor:
        raise ValueError(f"engine tensor_parallel={tensor} must divide the {n} devices of the mesh"
                         + (" on each process" if len(groups) > 1 else ""))
    mine = next(row for row in groups if row[0].process_index == jax.process_index())
    local = Mesh(mine.reshape(n // tensor, 1, tensor), MESH_AXES)
    if len(groups) == 1:
        return local, None
    return local, Mesh(groups.reshape(len(groups) * n // tensor, 1, tensor), MESH_AXES)


def slots_per_process(num_slots: int, mesh: Optional[Mesh]) -> int:
    """This process's engine slots: `num_slots` is the run's total over the mesh's processes
    (each host's engine holds an equal share on its own chips), so a config means the same
    rollout batch and the same KV cache per chip on one host or several."""
    processes = 1 if mesh is None else len(process_groups(mesh.devices))
    if num_slots % processes:
        raise ValueError(f"num_slots={num_slots} must be a multiple of the mesh's {processes} processes "
                         f"(each process's engine holds num_slots / {processes} slots)")
    return num_slots // processes


def engine_mesh(mesh: Optional[Mesh], cfg: Qwen3Config, tensor: Optional[int] = None) -> Optional[Mesh]:
    """The engine's mesh on this process (see `engine_meshes`): the same devices in the same
    order on one process, so one jitted program takes trainer-sharded weights and returns
    engine-sharded ones. None stays None (one device)."""
    return engine_meshes(mesh, cfg, tensor)[0]


def engine_shardings(cfg: Qwen3Config, mesh: Optional[Mesh], params, rules: Rules = ENGINE_RULES):
    """Shardings of the engine's weights: its rules on its mesh, or the first device."""
    if mesh is None:
        return jax.tree.map(lambda _: SingleDeviceSharding(jax.local_devices()[0]), params)
    return param_shardings(cfg, mesh, rules)


def engine_dtype(cfg: Qwen3Config):
    """What the engine holds: the compute dtype (the model casts every weight to it anyway)."""
    return jnp.dtype(cfg.compute_dtype)


class WeightSync:
    """trainer params -> the engine's own copy: cast to the compute dtype (floating leaves) and
    resharded onto the engine's layout in one jitted program. Its outputs are fresh buffers,
    so donating or deleting the trainer's params never touches the engine's.

    spanning (several processes): the program reshards onto the engine layout over every
    process's devices (replicated over data, so each process ends with a whole tensor-parallel
    copy), and each process then keeps its own shards as arrays on its local mesh."""

    def __init__(self, cfg: Qwen3Config, mesh: Optional[Mesh], params, rules: Rules = ENGINE_RULES,
                 spanning: Optional[Mesh] = None):
        self.shardings = engine_shardings(cfg, mesh, params, rules)
        dtype = engine_dtype(cfg)
        cast = lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
        out = self.shardings if spanning is None else engine_shardings(cfg, spanning, params, rules)
        self._fn = jax.jit(lambda p: jax.tree.map(cast, p), out_shardings=out)
        self._spanning = spanning
        self._dtype = dtype

    def __call__(self, params):
        deleted = [jax.tree_util.keystr(path) for path, x in jax.tree_util.tree_leaves_with_path(params)
                   if isinstance(x, jax.Array) and x.is_deleted()]
        if deleted:
            raise ValueError(f"engine weights: {deleted[0]} (and {len(deleted) - 1} more) was deleted or donated "
                             "before the engine copied it; hand the engine the params the train step returned "
                             "(engine.update_params(state.params)) rather than the donated input state")
        out = self._fn(params)
        if self._spanning is None:
            return out
        local = lambda x, s: jax.make_array_from_single_device_arrays(
            x.shape, s, [shard.data for shard in x.addressable_shards])
        return jax.tree.map(local, out, self.shardings)
