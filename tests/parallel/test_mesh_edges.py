"""Meshes whose axes do not divide the checkpoint's dimensions, and bad mesh specs.

Every mesh shape data x fsdp x tensor of 8 simulated CPU devices runs one checkpoint with odd
heads / kv heads / head_dim 24 / vocab 1000 or 1001 / hidden 36 or 40 / odd intermediate sizes,
tied or untied. Oracles (no single-device JAX run needed): transformers' logits, their NumPy
log-softmax, torch autograd gradients, a torch stepwise greedy decode, and a plain per-dimension
placement rule (a leaf dimension is split over its rule's mesh axis exactly when that axis has
size > 1 and divides it). Simulated devices need their own process: one per checkpoint, run
side by side, each looping over its three meshes.
"""
import concurrent.futures
import json
import os

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from reagent_jax import models, parallel
from tests.conftest import hf_logits, make_hf_qwen3
from tests.multidevice import run_with_devices

AXES = ("data", "fsdp", "tensor")
SHAPES = {
    "tied": (dict(num_attention_heads=3, num_key_value_heads=1, head_dim=24, vocab_size=1001, hidden_size=36,
                  intermediate_size=51, tie_word_embeddings=True), [(8, 1, 1), (1, 1, 8), (1, 4, 2)]),
    "untied": (dict(num_attention_heads=6, num_key_value_heads=3, head_dim=24, vocab_size=1000, hidden_size=40,
                    intermediate_size=98, tie_word_embeddings=False), [(1, 8, 1), (2, 2, 2), (2, 1, 4)]),
}
# The single mesh axis DEFAULT_RULES gives each parameter dimension (the placement oracle).
PARAM_RULE = {"vocab": "tensor", "embed": "fsdp", "mlp": "tensor", "q_heads": "tensor", "kv_heads": "tensor"}
N_NEW = 10  # greedy tokens per prompt
# 3 rows, one left-padded; 5 prompts on 3 engine slots (neither divides the data axis of 2 or 8)
PROMPT_LENS = (5, 13, 3, 9, 7)

PARITY = """
import json, jax, numpy as np
from reagent_jax import models, parallel, rollout
from reagent_jax.models.hf_io import hf_state_dict
res = {}
for name, (path, meshes) in CASES.items():
    ins = np.load(path + "/inputs.npz")
    toks, attn, weights = ins["tokens"], ins["attn"], ins["weights"]
    prompts = [ins[f"prompt{i}"].tolist() for i in range(len(PROMPT_LENS))]
    kw = dict(num_slots=3, max_len=32, prefill_chunk=16, length_buckets=(16,), row_buckets=(3,),
              window_buckets=(32,), decode_steps=4)
    for ms in meshes:
        mesh = parallel.make_mesh(*ms)
        cfg, p = models.load_hf_checkpoint(path, mesh=mesh)
        logits = models.forward(cfg, p, toks, attn, mesh=mesh)
        lp, vjp = jax.vjp(lambda q: models.token_logprobs(cfg, q, toks, attn, chunk_size=4, mesh=mesh), p)
        (grad,) = vjp(jax.numpy.asarray(weights))
        eng = rollout.Engine(cfg, p, mesh=mesh, **kw)
        outs = eng.generate(prompts, rollout.SamplingParams(temperature=0.0, max_new_tokens=N_NEW))
        arrays = {"logits": np.asarray(logits), "lp": np.asarray(lp),
                  "gen_tokens": np.array([o.tokens for o in outs]), "gen_lp": np.array([o.logprobs for o in outs])}
        arrays.update({"grad/" + k: v for k, v in hf_state_dict(cfg, grad).items()})
        key = name + "-" + "x".join(map(str, ms))
        np.savez(f"{OUT}/{key}.npz", **arrays)
        res[key] = {
            "placement": {"/".join(str(getattr(k, "key", k)) for k in kp):
                          {"shape": list(x.shape), "spec": (list(x.sharding.spec) + [None] * x.ndim)[:x.ndim],
                           "devices": len(x.sharding.device_set), "shard": list(x.addressable_shards[0].data.shape)}
                          for kp, x in jax.tree_util.tree_leaves_with_path(p)},
            "sharded_out": [len(a.sharding.device_set) for a in (logits, lp)],
            "finish": [o.finish_reason for o in outs], "cache_devices": len(eng._cache[0].sharding.device_set)}
if WITH_PRESETS:  # every preset on the 8 devices: its mesh shape, or the error it gives
    res["presets"] = {}
    for name in parallel.MESH_PRESETS:
        try:
            res["presets"][name] = list(parallel.mesh_from_preset(name).devices.shape)
        except ValueError as e:
            res["presets"][name] = str(e)
print(json.dumps(res))
"""


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _torch_oracle(model, toks, attn, weights, prompts):
    """transformers logits, per-token logprobs, d(sum weights * logprobs)/d(params) by HF name,
    and a stepwise greedy decode (tokens, logprobs, smallest top-2 margin)."""
    import torch
    pos = np.maximum(np.cumsum(attn, 1) - 1, 0)
    logits = hf_logits(model, toks, attention_mask=attn, position_ids=pos)
    model.zero_grad()
    out = model(torch.tensor(toks), attention_mask=torch.tensor(attn), position_ids=torch.tensor(pos)).logits
    lp = torch.log_softmax(out[:, :-1].double(), -1).gather(-1, torch.tensor(toks[:, 1:, None]))[..., 0]
    (lp * torch.tensor(weights[:, 1:])).sum().backward()
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    lp = np.concatenate([np.zeros((len(toks), 1)), lp.detach().numpy()], 1)
    with torch.no_grad():
        gen_t, gen_lp, margin = [], [], np.inf
        for prompt in prompts:
            ids, lps = list(prompt), []
            for _ in range(N_NEW):
                step = _log_softmax(model(torch.tensor([ids])).logits[0, -1].double().numpy())
                top2 = np.sort(step)[-2:]
                margin = min(margin, top2[1] - top2[0])
                ids.append(int(step.argmax()))
                lps.append(step.max())
            gen_t.append(ids[len(prompt):])
            gen_lp.append(lps)
    return dict(logits=logits, lp=lp, grads=grads, gen_tokens=np.array(gen_t), gen_lp=np.array(gen_lp),
                margin=margin)


def _key(name, ms):
    return f"{name}-{'x'.join(map(str, ms))}"  # as the subprocess names its results


def _expected_spec(names, shape, mesh_shape):
    sizes = dict(zip(AXES, mesh_shape))
    axes = [PARAM_RULE.get(n) for n in names]
    return [a if a is not None and sizes[a] > 1 and n % sizes[a] == 0 else None for a, n in zip(axes, shape)]


@pytest.fixture(scope="module")
def mesh_runs(tmp_path_factory):
    import torch
    tmp = tmp_path_factory.mktemp("mesh_edges")
    rng = np.random.default_rng(0)
    cases, oracles = {}, {}
    for i, (name, (shape, meshes)) in enumerate(SHAPES.items()):
        path, hf = make_hf_qwen3(tmp / name, seed=i, **shape)
        with torch.no_grad():  # weight matrices x4 (norm scales kept): peaked logits, wide greedy margins
            for p in hf.parameters():
                p.mul_(4.0 if p.dim() >= 2 else 1.0)
        hf.save_pretrained(path, safe_serialization=True)
        toks = rng.integers(0, shape["vocab_size"], (3, 11))
        attn = np.ones((3, 11), np.int64)
        attn[1, :4] = 0  # left padding
        # a logprob counts where its token and the one before are real (a padding query's output is
        # implementation-defined: the reference masks such rows differently)
        weights = (attn * np.concatenate([np.zeros((3, 1), np.int64), attn[:, :-1]], 1)).astype(np.float32)
        prompts = [rng.integers(0, shape["vocab_size"], n) for n in PROMPT_LENS]
        np.savez(os.path.join(path, "inputs.npz"), tokens=toks, attn=attn, weights=weights,
                 **{f"prompt{j}": p for j, p in enumerate(prompts)})
        cases[name] = (path, meshes)
        oracles[name] = _torch_oracle(hf, toks, attn, weights, prompts)
    head = f"OUT = {str(tmp)!r}\nN_NEW = {N_NEW}\nPROMPT_LENS = {PROMPT_LENS}\n"
    jobs = [head + f"CASES = {json.dumps({k: v})}\nWITH_PRESETS = {not i}\n" + PARITY
            for i, (k, v) in enumerate(cases.items())]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:  # one process per shape: both CPU cores
        res = {k: v for r in pool.map(run_with_devices, jobs) for k, v in r.items()}
    arrays = {k: dict(np.load(tmp / f"{k}.npz")) for k in res if k != "presets"}
    return cases, oracles, res, arrays


def test_every_mesh_shape_is_covered():
    assert sorted(m for _, ms in SHAPES.values() for m in ms) == sorted(
        [(8, 1, 1), (1, 8, 1), (1, 1, 8), (2, 2, 2), (1, 4, 2), (2, 1, 4)])


@pytest.mark.parametrize("name,ms", [(n, m) for n, (_, ms) in SHAPES.items() for m in ms])
def test_non_dividing_shapes_match_the_oracles_on_mesh(mesh_runs, name, ms):
    """load_hf_checkpoint(mesh=), forward, token_logprobs and its gradient, and the engine's greedy
    tokens and logprobs on a mesh equal the reference model's."""
    cases, oracles, res, arrays = mesh_runs
    o, a, r = oracles[name], arrays[_key(name, ms)], res[_key(name, ms)]
    path = cases[name][0]
    attn = np.load(os.path.join(path, "inputs.npz"))["attn"]
    weights = np.load(os.path.join(path, "inputs.npz"))["weights"]
    np.testing.assert_allclose(a["logits"][attn == 1], o["logits"][attn == 1], atol=1e-4)
    np.testing.assert_allclose(a["lp"][weights == 1], o["lp"][weights == 1], atol=1e-4)
    assert r["sharded_out"] == [8, 8]
    grads = {k[len("grad/"):]: v for k, v in a.items() if k.startswith("grad/")}
    scale = max(float(np.abs(g).max()) for g in o["grads"].values())
    assert set(o["grads"]) <= set(grads) and set(grads) - set(o["grads"]) <= {"lm_head.weight"}
    for k, g in o["grads"].items():
        np.testing.assert_allclose(grads[k], g, atol=1e-4 * scale, err_msg=k)
    assert o["margin"] > 1e-3  # the greedy oracle has no near-ties: exact tokens are a fair demand
    np.testing.assert_array_equal(a["gen_tokens"], o["gen_tokens"])
    np.testing.assert_allclose(a["gen_lp"], o["gen_lp"], atol=1e-4)
    assert r["finish"] == ["length"] * len(PROMPT_LENS) and r["cache_devices"] == 8


@pytest.mark.parametrize("name,ms", [(n, m) for n, (_, ms) in SHAPES.items() for m in ms])
def test_params_are_split_where_the_mesh_axis_divides(mesh_runs, name, ms):
    cases, _, res, _ = mesh_runs
    placement = res[_key(name, ms)]["placement"]
    cfg, _ = models.load_hf_checkpoint(cases[name][0])
    is_axes = lambda x: isinstance(x, tuple) and all(isinstance(n, (str, type(None))) for n in x)
    axes = {"/".join(str(getattr(k, "key", k)) for k in kp): v for kp, v in
            jax.tree_util.tree_flatten_with_path(models.param_axes(cfg), is_leaf=is_axes)[0]}
    assert set(placement) == set(axes)
    sizes = dict(zip(AXES, ms))
    for leaf, pl in placement.items():
        spec = _expected_spec(axes[leaf], pl["shape"], ms)
        assert pl["spec"] == spec, (leaf, pl, axes[leaf])
        assert pl["shard"] == [n // sizes[s] if s else n for n, s in zip(pl["shape"], spec)], (leaf, pl)
        assert pl["devices"] == 8


def test_placement_spot_checks(mesh_runs):
    """The oracle's verdicts on named leaves: what splits and what must stay whole."""
    res = mesh_runs[2]
    pl = res["untied-2x2x2"]["placement"]
    assert pl["layers/attn/q"]["spec"] == [None, "fsdp", "tensor", None]  # hidden 40 / 2, 6 heads / 2
    assert pl["layers/attn/k"]["spec"] == [None, "fsdp", None, None]  # 3 kv heads stay whole
    assert pl["lm_head"]["spec"] == ["fsdp", "tensor"] and pl["layers/mlp/gate"]["spec"] == [None, "fsdp", "tensor"]
    pl = res["tied-1x4x2"]["placement"]
    assert pl["embed"]["spec"] == [None, "fsdp"]  # vocab 1001 stays whole, hidden 36 / 4
    assert pl["layers/mlp/gate"]["spec"] == [None, "fsdp", None]  # intermediate 51 stays whole
    assert all(p["spec"] == [None] * len(p["shape"]) for p in res["tied-8x1x1"]["placement"].values())


def test_presets_on_eight_devices(mesh_runs):
    """Presets that fit 8 devices build their mesh ("single" takes the first device); the others
    say which preset, what it needs and which presets would fit."""
    presets = mesh_runs[2]["presets"]
    assert presets["single"] == [1, 1, 1]
    assert presets["cpu8"] == presets["gpu8_tp"] == [1, 4, 2]
    assert presets["gpu8"] == presets["tpu_fsdp"] == presets["auto"] == presets["tpu_dp_fsdp"] == [1, 8, 1]
    assert set(presets) == set(parallel.MESH_PRESETS)


@pytest.mark.parametrize("preset", ["cpu8", "gpu8", "gpu8_tp", "tpu_dp_fsdp"])
def test_preset_that_needs_more_devices_names_itself(preset):
    n = len(jax.devices())  # 1 in the pytest process
    with pytest.raises(ValueError, match=rf"mesh preset '{preset}' .* does not fit the {n} available devices"
                                         r".*Presets that fit: \['single', 'tpu_fsdp', 'auto'\]"):
        parallel.mesh_from_preset(preset)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(KeyError, match="unknown mesh preset 'gpu16'; known: .*'gpu8'"):
        parallel.mesh_from_preset("gpu16")


@pytest.mark.parametrize("sizes,match", [
    ((0, -1, 1), r"data=0 must be a positive int or -1"),
    ((1, -2, 1), r"fsdp=-2 must be a positive int or -1"),
    ((-2, -4, 1), r"data=-2 must be a positive int or -1"),
    ((1, 1, 2.0), r"tensor=2\.0 must be a positive int"),
    ((1, "1", 1), r"fsdp='1' must be a positive int"),
    ((1, True, 1), r"fsdp=True must be a positive int"),
    ((-1, -1, 1), r"at most one mesh axis may be -1"),
    ((2, 1, 1), r"mesh data=2 x fsdp=1 x tensor=1 = 2 does not match the 1 available devices"),
    ((2, -1, 1), r"1 devices are not divisible by the fixed axes product 2"),
])
def test_bad_mesh_sizes_are_named(sizes, match):
    with pytest.raises(ValueError, match=match):
        parallel.make_mesh(*sizes)


def test_make_mesh_without_devices():
    with pytest.raises(ValueError, match="no devices"):
        parallel.make_mesh(devices=[])
    assert dict(parallel.make_mesh(1, np.int64(-1), 1).shape) == {"data": 1, "fsdp": 1, "tensor": 1}


def test_rules_and_mesh_disagreeing_on_axis_names_is_an_error():
    """A mesh named other than data/fsdp/tensor, or a rules table with a mistyped mesh axis, would
    silently replicate every array over those devices."""
    from jax.sharding import AbstractMesh
    cfg = models.preset("tiny", compute_dtype="float32")
    foreign = AbstractMesh((2, 4), ("dp", "model"))
    with pytest.raises(ValueError, match=r"axes \['dp', 'model'\] that no rule maps onto"):
        models.param_shardings(cfg, foreign)
    typo = tuple((k, "fdsp" if v == "fsdp" else v) for k, v in parallel.DEFAULT_RULES)
    mesh = AbstractMesh((1, 8, 1), ("data", "fsdp", "tensor"))
    with pytest.raises(ValueError, match=r"maps onto mesh axes \['fdsp'\]"):
        parallel.logical_to_spec(("embed",), (64,), mesh, typo)
    # accepted: a mesh lacking a standard axis (size 1), a size-1 foreign axis, extra axes with rules
    assert parallel.logical_to_spec(("batch", "embed"), (2, 8), AbstractMesh((8,), ("fsdp",))) == P(None, "fsdp")
    assert parallel.logical_to_spec(("embed",), (8,), AbstractMesh((8, 1), ("fsdp", "x"))) == P("fsdp")
    rules = parallel.DEFAULT_RULES + (("experts", "expert"),)
    assert parallel.logical_to_spec(("experts", "embed"), (4, 8), AbstractMesh((4, 2), ("expert", "fsdp")),
                                    rules) == P("expert", "fsdp")


def test_logical_axes_must_match_the_array_rank():
    mesh = jax.sharding.AbstractMesh((1, 8, 1), ("data", "fsdp", "tensor"))
    with pytest.raises(ValueError, match=r"name 2 dimensions but the array has shape \(8,\)"):
        parallel.logical_to_spec(("embed", "mlp"), (8,), mesh)
