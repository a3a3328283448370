"""The engine's own layout: its mesh over the trainer's devices, its rules, its weight copy."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import models, parallel
from reagent_jax.parallel.rules import logical_to_spec
from reagent_jax.rollout import layout


def test_tensor_parallel_follows_the_kv_heads():
    cfg = models.preset("tiny")
    assert layout.default_tensor_parallel(cfg.replace(num_kv_heads=8, num_heads=32), 8) == 8
    assert layout.default_tensor_parallel(cfg.replace(num_kv_heads=8, num_heads=32), 16) == 8  # rest is data
    assert layout.default_tensor_parallel(cfg.replace(num_kv_heads=3, num_heads=9), 8) == 1
    assert layout.default_tensor_parallel(cfg.replace(num_kv_heads=2, num_heads=4), 6) == 2


def test_engine_mesh_keeps_the_device_order_and_checks_tensor():
    cfg = models.preset("tiny")
    mesh = parallel.make_mesh(data=1, fsdp=1, tensor=1)
    emesh = layout.engine_mesh(mesh, cfg)
    assert dict(emesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1}
    assert list(emesh.devices.flat) == list(mesh.devices.flat)
    assert layout.engine_mesh(None, cfg) is None
    with pytest.raises(ValueError, match="tensor_parallel=3 must divide the 1 devices"):
        layout.engine_mesh(mesh, cfg, tensor=3)


def test_num_slots_is_the_runs_total_over_the_processes():
    """Each process's engine holds an equal share, so one config means the same KV cache per
    chip on one host or several; a total that does not split is refused, naming the split."""
    device = lambda p: types.SimpleNamespace(process_index=p)
    two_hosts = types.SimpleNamespace(devices=np.array([[device(0), device(0), device(1), device(1)]], object))
    one_host = types.SimpleNamespace(devices=np.array([device(0)] * 4, object))
    assert layout.slots_per_process(64, two_hosts) == 32
    assert layout.slots_per_process(64, one_host) == layout.slots_per_process(64, None) == 64
    with pytest.raises(ValueError, match="num_slots=5 must be a multiple of the mesh's 2 processes"):
        layout.slots_per_process(5, two_hosts)


def test_engine_rules_split_weights_by_heads_and_never_by_embed():
    """Rules alone (mesh sizes are what the spec keeps): weights tensor-parallel, no FSDP axis."""
    rules = layout.ENGINE_RULES
    assert logical_to_spec(("embed", "q_heads", "head_dim"), rules=rules) == jax.sharding.PartitionSpec(None, "tensor", None)
    assert logical_to_spec(("mlp", "embed"), rules=rules) == jax.sharding.PartitionSpec("tensor", None)
    assert logical_to_spec(("cache_batch",), rules=rules) == jax.sharding.PartitionSpec("data")
    assert logical_to_spec(("vocab", "embed"), rules=rules) == jax.sharding.PartitionSpec("tensor", None)


def test_weight_sync_copies_in_the_compute_dtype():
    cfg = models.preset("tiny", compute_dtype="bfloat16")
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    sync = layout.WeightSync(cfg, None, params)
    copy = sync(params)
    assert {x.dtype for x in jax.tree.leaves(copy)} == {jnp.dtype(jnp.bfloat16)}
    np.testing.assert_array_equal(np.asarray(copy["embed"], np.float32),
                                  np.asarray(params["embed"].astype(jnp.bfloat16), np.float32))
    jax.tree.map(lambda x: x.delete(), params)
    assert not any(x.is_deleted() for x in jax.tree.leaves(copy))  # never an alias
    with pytest.raises(ValueError, match="deleted or donated"):
        sync(params)
