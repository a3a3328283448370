"""Configs build, and the paper-scale config's shardings resolve for Qwen3-8B on an 8-device mesh
(params + AdamW state, via jax.eval_shape: nothing is allocated)."""
import os

from ml_collections import config_flags  # noqa: F401  (the loader used by launch/train.py)

from tests.multidevice import run_with_devices

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "configs", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config()


def test_quickstart_and_paper_configs_build():
    q = _load("quickstart")
    assert q.stages == "sft,grpo" and q.grpo.n > 1
    p = _load("qwen3_8b_reagent_u")
    assert (p.grpo.questions_per_step, p.grpo.n, p.agent.temperature, p.agent.top_p) == (32, 8, 0.7, 0.95)
    assert p.agent.max_turns == 13 and p.eval.max_turns == 30 and p.grpo.learning_rate == 5e-7
    assert p.strategy == "reagent_u" and p.mesh == "gpu8"
    assert p.rollout.max_len == 16384 and p.model.remat_policy == "full"


def test_slice_variants_and_the_colab_config_build():
    import importlib.util
    import pytest
    spec = importlib.util.spec_from_file_location("paper", os.path.join(REPO, "configs", "qwen3_8b_reagent_u.py"))
    paper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(paper)
    for name in paper.VARIANTS:
        c = paper.get_config(name)
        assert c.grpo.questions_per_step == 32 and c.rollout.max_len == paper.VARIANTS[name]["max_len"]
    with pytest.raises(ValueError, match="unknown variant 'v7'"):
        paper.get_config("v7")
    colab = _load("colab_qwen3_0p6b")
    assert colab.model.preset == "qwen3-0.6b" and colab.mesh == "single" and colab.strategy == "grpo"


def test_paper_config_shardings_resolve_for_qwen3_8b():
    res = run_with_devices("""
        import json, os, jax, numpy as np
        from reagent_jax import models, parallel
        from reagent_jax.rl import train_step as ts
        from tests.test_configs import _load
        c = _load("qwen3_8b_reagent_u")
        cfg = models.preset(c.model.preset, param_dtype=c.model.param_dtype, compute_dtype=c.model.compute_dtype,
                            remat_policy=c.model.remat_policy)
        mesh = parallel.mesh_from_preset(c.mesh)
        opt = ts.make_optimizer(ts.OptimizerConfig(learning_rate=c.grpo.learning_rate))
        shapes = models.param_shapes(cfg)
        sh = ts.state_shardings(models.param_shardings(cfg, mesh), opt, mesh, shapes)
        state = jax.eval_shape(lambda p: ts.init_state(p, opt), shapes)
        per_device = 0
        for leaf, s in zip(jax.tree.leaves(state), jax.tree.leaves(sh)):
            shard = s.shard_shape(leaf.shape)
            per_device += int(np.prod(shard)) * leaf.dtype.itemsize
        total = sum(int(np.prod(l.shape)) * l.dtype.itemsize for l in jax.tree.leaves(state))
        print(json.dumps({"params": cfg.num_params(), "per_device_gb": per_device / 1e9, "total_gb": total / 1e9,
                          "embed": str(sh.params["embed"].spec), "q": str(sh.params["layers"]["attn"]["q"].spec)}))
    """)
    assert 8.0e9 < res["params"] < 8.4e9  # Qwen3-8B: 8.19B parameters
    assert abs(res["per_device_gb"] - res["total_gb"] / 8) < 0.01 * res["total_gb"]  # FSDP: evenly split
    assert "fsdp" in res["embed"] and "fsdp" in res["q"]
