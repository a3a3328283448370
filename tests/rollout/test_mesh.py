"""The engine on 8 simulated CPU devices, on its own layout (weights tensor-parallel, slots over
data), gives the single-device tokens from weights sharded as the trainer (fsdp 4 x tensor 2)
shards them."""
import jax
import numpy as np

from reagent_jax import models, rollout
from tests.multidevice import run_with_devices

SETUP = """
import json, jax, numpy as np
from reagent_jax import models, rollout
cfg = models.preset("tiny", compute_dtype="float32")
params = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, models.init_params(cfg, jax.random.PRNGKey(0)))
prompts = [np.random.default_rng(i).integers(0, 512, n).tolist() for i, n in enumerate((5, 19, 40, 8, 12))]
KW = dict(num_slots=4, max_len=96, prefill_chunk=32, length_buckets=(32,), row_buckets=(4,), window_buckets=(32,),
          decode_steps=4)
sps = [rollout.SamplingParams(temperature=0.0, max_new_tokens=40),
       rollout.SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=40, seed=3)]
"""


def test_sharded_engine_matches_single_device():
    res = run_with_devices(SETUP + """
from reagent_jax import parallel
mesh = parallel.make_mesh(data=1, fsdp=4, tensor=2)
trainer_params = jax.device_put(params, models.param_shardings(cfg, mesh))
eng = rollout.Engine(cfg, trainer_params, mesh=mesh, **KW)
jax.tree.map(lambda x: x.delete(), trainer_params)  # as a donating train step would: the engine has its own copy
outs = [eng.generate(prompts, sp) for sp in sps]
k = eng._cache[0]
wq = eng._params["layers"]["attn"]["q"]
print(json.dumps({"engine_mesh": dict(eng.mesh.shape), "wq_spec": (list(wq.sharding.spec) + [None] * 4)[:4],
                  "embed_spec": (list(eng._params["embed"].sharding.spec) + [None] * 2)[:2],
"tokens": [[o.tokens for o in out] for out in outs],
                  "logprobs": [[o.logprobs for o in out] for out in outs],
                  "cache_spec": (list(k.sharding.spec) + [None] * 5)[:5], "cache_devices": len(k.sharding.device_set),
                  "compiles": eng.stats()["compiles"], "shapes": eng.stats()["kernel_shapes"]}))
""")
    scope = {}
    exec(SETUP, scope)
    eng = rollout.Engine(scope["cfg"], scope["params"], **scope["KW"])
    for i, sp in enumerate(scope["sps"]):
        outs = eng.generate(scope["prompts"], sp)
        assert res["tokens"][i] == [o.tokens for o in outs]
        for a, b in zip(res["logprobs"][i], outs):
            np.testing.assert_allclose(a, b.logprobs, atol=1e-4)
    # the engine's mesh: tensor = the 2 KV heads, slots over data = the other 4 devices
    assert res["engine_mesh"] == {"data": 4, "fsdp": 1, "tensor": 2}
    assert res["wq_spec"] == [None, None, "tensor", None]  # [L, E, H, D]: heads split, embed whole (no FSDP)
    assert res["embed_spec"] == ["tensor", None]  # vocabulary-parallel
    assert res["cache_spec"] == [None, "data", "tensor", None, None]  # [L, N, K, S, D]
    assert res["cache_devices"] == 8
    # prefill and decode at attention windows 32 and 96, each compiled once without (greedy run)
    # and once with (top-p run) the truncation code
    shapes = ["decode[4,w32]", "decode[4,w96]", "prefill[4x32,w32]", "prefill[4x32,w96]"]
    assert res["shapes"] == sorted(shapes + [s[:-1] + ",truncation]" for s in shapes])
    assert res["compiles"] == 8
