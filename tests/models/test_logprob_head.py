"""The output head: the fused head + per-token loss against the rematerialised path (values and
gradients), its metrics outputs carry no gradient, and the objectives' fused paths against their
unfused ones; the executed matmul FLOPs show the saved projection."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import models
from reagent_jax.aot import hlo_stats
from reagent_jax.models.functional import token_loss_and_logprobs
from reagent_jax.rl import objectives
from tests.multidevice import run_with_devices

TIED = models.preset("tiny", compute_dtype="float32", num_layers=1)
UNTIED = models.preset("tiny", compute_dtype="float32", num_layers=1, tie_word_embeddings=False)


def _batch(cfg, b=3, t=21, seed=0):
    rng = np.random.default_rng(seed)
    attn = (np.arange(t)[None] < np.array([t, t - 6, t - 2, t - 3])[:b, None]).astype(np.int32)
    loss_mask = np.zeros((b, t), np.float32)
    loss_mask[:, 4:] = 1
    return {"tokens": rng.integers(0, cfg.vocab_size, (b, t)).astype(np.int32), "attention_mask": attn,
            "loss_mask": loss_mask * attn, "old_logprobs": rng.normal(-6, 0.3, (b, t)).astype(np.float32),
            "ref_logprobs": rng.normal(-6, 0.3, (b, t)).astype(np.float32),
            "advantages": rng.normal(size=(b,)).astype(np.float32),
            "weight": rng.uniform(0, 1, (b, t)).astype(np.float32)}


def _token_loss(lp, ent, a):
    """A per-token loss touching both outputs nonlinearly: weighted exp-ratio + entropy."""
    return jnp.sum(a["weight"] * (jnp.exp(lp - a["old_logprobs"]) * a["advantages"] - 0.1 * ent))


@pytest.mark.parametrize("cfg,chunk,temperature", [(TIED, 8, 1.0), (UNTIED, 64, 0.7)], ids=["tied-4chunks", "untied-1chunk"])
def test_fused_head_loss_matches_the_rematerialised_path(cfg, chunk, temperature):
    """Several chunks with a ragged last one (T-1 = 20 over 8) and a single chunk: loss (also
    without differentiation), logprobs, entropies and every parameter's gradient agree with
    autodiff through `token_logprobs`."""
    params = models.init_params(cfg, jax.random.PRNGKey(1))
    b = _batch(cfg)
    aux = {k: jnp.asarray(b[k]) for k in ("weight", "old_logprobs")}
    aux["advantages"] = jnp.broadcast_to(jnp.asarray(b["advantages"])[:, None], b["tokens"].shape)
    kw = dict(temperature=temperature, chunk_size=chunk, return_entropy=True)

    def fused(p):
        loss, lp, ent = token_loss_and_logprobs(cfg, p, b["tokens"], b["attention_mask"], _token_loss, aux, **kw)
        return loss, (lp, ent)

    def reference(p):
        lp, ent = models.token_logprobs(cfg, p, b["tokens"], b["attention_mask"], **kw)
        return _token_loss(lp, ent, aux), (lp, ent)

    (l1, (lp1, ent1)), g1 = jax.jit(jax.value_and_grad(fused, has_aux=True))(params)
    (l2, (lp2, ent2)), g2 = jax.jit(jax.value_and_grad(reference, has_aux=True))(params)
    np.testing.assert_allclose(l1, l2, rtol=1e-5)
    np.testing.assert_allclose(jax.jit(lambda p: fused(p)[0])(params), l2, rtol=1e-5)  # forward only
    np.testing.assert_allclose(lp1, lp2, atol=1e-5)
    np.testing.assert_allclose(ent1, ent2, atol=1e-5)
    jax.tree.map(_close, g1, g2)


def _close(a, reference):
    np.testing.assert_allclose(a, reference, atol=1e-5 * max(1.0, float(np.abs(reference).max())))


def test_fused_outputs_are_for_metrics_only():
    """Logprobs and entropies come back without gradient (the contract the backward pass relies on):
    a loss built from them differentiates to zero, and without return_entropy the loss sees None."""
    params = models.init_params(TIED, jax.random.PRNGKey(0))
    b = _batch(TIED)
    seen = []

    def loss_fn(lp, ent, a):
        seen.append(ent)
        return jnp.sum(a * lp)

    def through_outputs(p):
        _, lp, _ = token_loss_and_logprobs(TIED, p, b["tokens"], None, loss_fn, jnp.asarray(b["weight"]))
        return jnp.sum(lp)

    grads = jax.grad(through_outputs)(params)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads))
    assert seen and all(e is None for e in seen)


GRPO_CASES = [dict(beta=0.04, entropy_coef=0.01),
              dict(policy_loss="cispo", loss_agg_mode="seq-mean-token-mean", beta=0.1),
              dict(loss_agg_mode="token-sum-norm", kl_kind="k1", beta=0.2, temperature=0.7, chunk_size=8)]


@pytest.mark.parametrize("kw", GRPO_CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_grpo_fused_head_equals_unfused(kw):
    """Loss, every metric and every gradient of the fused GRPO objective match `fused_head=False`."""
    b = {k: v for k, v in _batch(UNTIED, seed=2).items() if k != "weight"}
    params = models.init_params(UNTIED, jax.random.PRNGKey(2))
    out = {}
    for fused in (True, False):
        obj = objectives.GRPOObjective(UNTIED, fused_head=fused, **kw)
        assert obj.fuses_head is fused
        counts = obj.counts(b)
        out[fused] = jax.jit(jax.value_and_grad(lambda p: obj.loss(p, b, counts), has_aux=True))(params)
    ((l1, m1), g1), ((l2, m2), g2) = out[True], out[False]
    np.testing.assert_allclose(l1, l2, rtol=1e-5, atol=1e-7)
    assert m1.keys() == m2.keys()
    for k in m1:
        np.testing.assert_allclose(m1[k], m2[k], rtol=1e-5, atol=1e-7, err_msg=k)
    jax.tree.map(_close, g1, g2)


def test_sequence_level_losses_keep_the_rematerialised_head():
    """GSPO's ratio is a mean over the sequence: not per-token, so never fused (nor is an
    aggregation mode or policy loss registered without the trait)."""
    assert not objectives.GRPOObjective(TIED, policy_loss="gspo").fuses_head
    assert objectives.GRPOObjective(TIED, policy_loss="ppo").fuses_head  # an alias keeps its entry's traits
    assert not objectives.GRPOObjective(TIED, fused_head=False).fuses_head


def test_sft_fused_head_equals_unfused():
    b = {k: v for k, v in _batch(TIED, seed=3).items() if k in ("tokens", "attention_mask", "loss_mask")}
    params = models.init_params(TIED, jax.random.PRNGKey(3))
    out = []
    for fused in (True, False):
        obj = objectives.SFTObjective(TIED, context_weight=0.3, chunk_size=8, fused_head=fused)
        counts = obj.counts(b)
        out.append(jax.jit(jax.value_and_grad(lambda p: obj.loss(p, b, counts), has_aux=True))(params))
    ((l1, m1), g1), ((l2, m2), g2) = out
    np.testing.assert_allclose(l1, l2, rtol=1e-6)
    for k in m1:
        np.testing.assert_allclose(m1[k], m2[k], rtol=1e-6, err_msg=k)
    jax.tree.map(lambda a, r: np.testing.assert_allclose(a, r, atol=1e-6), g1, g2)


def test_the_fused_head_executes_one_projection_less():
    """Compiled GRPO updates over 4 logprob chunks: the rematerialised head runs forward, recompute,
    dh and dW (4 projections per token), the fused one 3; counted in the HLO's matmuls."""
    cfg = models.preset("tiny", compute_dtype="float32", num_layers=1, vocab_size=4096)
    b = {k: v for k, v in _batch(cfg, t=33).items() if k != "weight"}
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    executed = {}
    for fused in (True, False):
        obj = objectives.GRPOObjective(cfg, chunk_size=8, fused_head=fused)
        counts = obj.counts(b)
        fn = jax.jit(jax.grad(lambda p: obj.loss(p, b, counts)[0]))
        executed[fused] = hlo_stats.matmul_flops(fn.lower(params).compile().as_text())
    head = 2.0 * b["tokens"].shape[0] * 32 * cfg.hidden_size * cfg.vocab_size  # one projection of 4 x 8 chunks
    np.testing.assert_allclose(executed[False] - executed[True], head, rtol=0.02)


def test_sharded_fused_head_equals_one_device():
    """On 8 simulated devices (fsdp 4 x tensor 2, untied head split over the vocabulary): the fused
    GRPO gradient equals the single-device rematerialised one."""
    code = """
    import json, jax, numpy as np
    from reagent_jax import models, parallel
    from reagent_jax.rl import objectives
    from tests.models.test_logprob_head import UNTIED, _batch
    b = {k: v for k, v in _batch(UNTIED, b=4, seed=4).items() if k != "weight"}
    params = models.init_params(UNTIED, jax.random.PRNGKey(4))
    kw = dict(beta=0.04, entropy_coef=0.01, chunk_size=8)
    ref = objectives.GRPOObjective(UNTIED, fused_head=False, **kw)
    g_ref = jax.jit(jax.grad(lambda p: ref.loss(p, b, ref.counts(b))[0]))(params)
    mesh = parallel.make_mesh(1, 4, 2)
    sharded = jax.device_put(params, models.param_shardings(UNTIED, mesh))
    obj = objectives.GRPOObjective(UNTIED, mesh=mesh, **kw)
    g = jax.jit(jax.grad(lambda p: obj.loss(p, b, obj.counts(b))[0]))(sharded)
    diff = max(float(np.abs(np.asarray(a) - np.asarray(r)).max()) for a, r in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)))
    print(json.dumps({"diff": diff, "fused": obj.fuses_head}))
    """
    res = run_with_devices(code)
    assert res["fused"] and res["diff"] <= 1e-5, res


@pytest.mark.parametrize("cfg,chunk,temperature", [(TIED, 8, 1.0), (UNTIED, 64, 0.7)], ids=["tied-3chunks", "untied-1chunk"])
def test_top_logprobs_match_a_numpy_reference(cfg, chunk, temperature):
    """Row t ranks the candidates for token t from the logits at t - 1: log softmax(logits / T) over
    the whole vocabulary, top k by value, across chunk boundaries."""
    params = models.init_params(cfg, jax.random.PRNGKey(3))
    batch = _batch(cfg)
    tokens, attn = batch["tokens"], batch["attention_mask"]
    lp, ids = models.top_logprobs(cfg, params, tokens, attn, k=5, temperature=temperature, chunk_size=chunk)
    logits = np.asarray(models.forward(cfg, params, tokens, attn), np.float64) / temperature  # [B, T, V]
    ref = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    order = np.argsort(-ref, axis=-1, kind="stable")[..., :5]
    np.testing.assert_array_equal(np.asarray(ids)[:, 1:], order[:, :-1])
    np.testing.assert_allclose(np.asarray(lp)[:, 1:], np.take_along_axis(ref, order, -1)[:, :-1], atol=2e-5)
    assert np.all(np.asarray(lp)[:, 0] == 0) and np.all(np.diff(np.asarray(lp), axis=-1) <= 0)
