"""Orbax params snapshots and the HF <-> Orbax converter script."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from reagent_jax import checkpoint, models
from tests.conftest import hf_logits

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_convert_hf_to_orbax_and_back(hf_qwen3, tmp_path):
    path, hf = hf_qwen3(tie_word_embeddings=True)
    orbax_dir, hf_dir = tmp_path / "orbax", tmp_path / "hf_out"
    for direction, src, dst in (("hf_to_orbax", path, orbax_dir), ("orbax_to_hf", orbax_dir, hf_dir)):
        out = subprocess.run([sys.executable, os.path.join(REPO, "launch/convert.py"), f"--direction={direction}",
                              f"--src={src}", f"--dst={dst}"], capture_output=True, text=True, cwd=REPO)
        assert out.returncode == 0, out.stderr[-2000:]
    cfg, params = checkpoint.load_params(str(orbax_dir))
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 7))
    np.testing.assert_allclose(np.asarray(models.forward(cfg, params, tokens)), hf_logits(hf, tokens), atol=1e-4)
    from transformers import Qwen3ForCausalLM
    np.testing.assert_allclose(hf_logits(Qwen3ForCausalLM.from_pretrained(str(hf_dir)), tokens),
                               hf_logits(hf, tokens), atol=1e-5)


def test_load_params_rejects_non_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a reagent_jax params checkpoint"):
        checkpoint.load_params(str(tmp_path))


def test_train_checkpointer_keeps_last_n_and_restores(tmp_path):
    ck = checkpoint.TrainCheckpointer(str(tmp_path / "ck"), keep=2)
    state = {"w": jax.numpy.arange(6.0).reshape(2, 3), "step": jax.numpy.int32(0)}
    for step in range(1, 4):
        ck.save(step, {"w": state["w"] * step, "step": jax.numpy.int32(step)}, {"data_pos": step * 10})
    assert ck.all_steps() == [2, 3]
    restored, meta = ck.restore(state)
    assert meta == {"data_pos": 30} and int(restored["step"]) == 3
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(state["w"]) * 3)
    with pytest.raises(FileNotFoundError):
        checkpoint.TrainCheckpointer(str(tmp_path / "none")).restore(state)


_SAVE_ON_8 = """
import json, jax, numpy as np
from reagent_jax import checkpoint, models, parallel
from reagent_jax.rl import train_step as ts
from reagent_jax.models.functional import param_shapes, param_shardings
mesh = parallel.mesh_from_preset("cpu8")
cfg = models.preset("tiny")
params = models.init_params(cfg, jax.random.PRNGKey(3), mesh=mesh)
checkpoint.save_params("{d}/params", cfg, params)
opt = ts.make_optimizer(ts.OptimizerConfig())
sh = ts.state_shardings(param_shardings(cfg, mesh), opt, mesh, param_shapes(cfg))
state = ts.init_state(params, opt, sh)
ck = checkpoint.TrainCheckpointer("{d}/ckpt")
ck.save(1, state, {{"step": 1}})
assert len(params["layers"]["attn"]["q"].sharding.device_set) == 8
np.savez("{d}/ref.npz", **{{jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(params)}})
print(json.dumps({{"ok": 1}}))
"""

_RESTORE = """
import json, jax, numpy as np
from reagent_jax import checkpoint, models, parallel
from reagent_jax.rl import train_step as ts
from reagent_jax.models.functional import param_shapes, param_shardings
mesh = None if jax.device_count() == 1 else parallel.make_mesh(1, -1, 1)
ref = np.load("{d}/ref.npz")
cfg, params = checkpoint.load_params("{d}/params", mesh=mesh)
same = all(np.array_equal(np.asarray(x), ref[jax.tree_util.keystr(p)])
           for p, x in jax.tree_util.tree_leaves_with_path(params))
opt = ts.make_optimizer(ts.OptimizerConfig())
sh = None if mesh is None else ts.state_shardings(param_shardings(cfg, mesh), opt, mesh, param_shapes(cfg))
template = ts.init_state(models.init_params(cfg, jax.random.PRNGKey(0), mesh=mesh), opt, sh)
state, _ = checkpoint.TrainCheckpointer("{d}/ckpt").restore(template)
state_same = all(np.array_equal(np.asarray(x), ref[jax.tree_util.keystr(p)])
                 for p, x in jax.tree_util.tree_leaves_with_path(state.params))
devices = len(state.params["layers"]["attn"]["q"].sharding.device_set)
print(json.dumps({{"params": same, "state": state_same, "devices": devices}}))
"""


@pytest.mark.parametrize("n", [1, 2])
def test_checkpoint_written_on_8_devices_restores_on_fewer(tmp_path, n):
    """Train on a pod, evaluate / serve / export on fewer chips: params and train state saved on
    8 (simulated) devices restore on 1 and 2 with identical values, on the new devices."""
    from tests.multidevice import run_with_devices
    d = str(tmp_path)
    run_with_devices(_SAVE_ON_8.format(d=d), n=8)
    res = run_with_devices(_RESTORE.format(d=d), n=n)
    assert res == {"params": True, "state": True, "devices": n}
