"""Logit parity of reagent_jax Qwen3 against transformers' Qwen3ForCausalLM (the oracle)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import models
from tests.conftest import hf_logits

SHAPES = {
    "untied_gqa": dict(),
    "tied": dict(tie_word_embeddings=True),
    "head_dim_not_hidden_over_heads": dict(hidden_size=48, head_dim=24, num_attention_heads=4),
    "one_kv_head": dict(num_key_value_heads=1),
    "kv_equals_heads": dict(num_key_value_heads=4),
    "odd_layers": dict(num_hidden_layers=3, intermediate_size=80),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_logits_match_transformers(hf_qwen3, name):
    path, hf = hf_qwen3(**SHAPES[name])
    cfg, params = models.load_hf_checkpoint(path, dtype=jnp.float32)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 11))
    ours = np.asarray(models.forward(cfg, params, tokens))
    np.testing.assert_allclose(ours, hf_logits(hf, tokens), atol=1e-4, rtol=0)


def test_padded_batches_match_transformers(hf_qwen3):
    path, hf = hf_qwen3(num_key_value_heads=1)
    cfg, params = models.load_hf_checkpoint(path)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, cfg.vocab_size, (3, 9))
    lengths = np.array([9, 5, 2])
    # Right padding: default positions (arange) agree with HF's.
    right = (np.arange(9)[None] < lengths[:, None]).astype(np.int32)
    ours = np.asarray(models.forward(cfg, params, tokens, attention_mask=right))
    ref = hf_logits(hf, tokens, attention_mask=right)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(ours[b, :n], ref[b, :n], atol=1e-4)
    # Left padding: our default positions skip the padding; HF needs them given explicitly.
    left = right[:, ::-1].copy()
    pos = np.maximum(np.cumsum(left, 1) - 1, 0)
    ours = np.asarray(models.forward(cfg, params, tokens, attention_mask=left))
    ref = hf_logits(hf, tokens, attention_mask=left, position_ids=pos)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(ours[b, 9 - n:], ref[b, 9 - n:], atol=1e-4)
        # and each row equals the unpadded row on its own
        alone = np.asarray(models.forward(cfg, params, tokens[b:b + 1, 9 - n:]))
        np.testing.assert_allclose(ours[b, 9 - n:], alone[0], atol=1e-4)


def test_bf16_compute_within_tolerance(hf_qwen3):
    """bf16 matmuls (8-bit mantissa, rel. error ~2^-8 per op) over 2 layers: logits agree with the
    fp32 oracle to a few 1e-2 absolute at logit scale ~1, and the argmax almost always agrees."""
    path, hf = hf_qwen3()
    cfg, params = models.load_hf_checkpoint(path, compute_dtype="bfloat16")
    tokens = np.random.default_rng(2).integers(0, cfg.vocab_size, (2, 16))
    ours = np.asarray(models.forward(cfg, params, tokens))
    ref = hf_logits(hf, tokens)
    scale = np.abs(ref).max()
    assert np.abs(ours - ref).max() <= 0.03 * scale
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


def test_unrolled_and_remat_layers_give_same_logits_and_grads(hf_qwen3):
    path, _ = hf_qwen3(num_hidden_layers=3)
    tokens = np.random.default_rng(3).integers(0, 256, (2, 7))
    outs = []
    for kw in (dict(), dict(scan_layers=False), dict(remat_policy="full"), dict(remat_policy="dots_saveable")):
        cfg, params = models.load_hf_checkpoint(path, **kw)
        loss = lambda p: models.token_logprobs(cfg, p, tokens).sum()
        outs.append((np.asarray(models.forward(cfg, params, tokens)), jax.grad(loss)(params)))
    for logits, grads in outs[1:]:
        np.testing.assert_allclose(logits, outs[0][0], atol=1e-5)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads, outs[0][1])


def test_token_logprobs_equal_log_softmax_of_forward(hf_qwen3):
    path, _ = hf_qwen3(tie_word_embeddings=True)
    cfg, params = models.load_hf_checkpoint(path)
    rng = np.random.default_rng(4)
    tokens = rng.integers(0, cfg.vocab_size, (3, 13))
    mask = np.ones_like(tokens)
    mask[1, 10:] = 0
    logits = np.asarray(models.forward(cfg, params, tokens, attention_mask=mask), np.float64)
    for temp in (1.0, 0.7):
        lp_ref = jax.nn.log_softmax(logits / temp, axis=-1)
        ref = np.take_along_axis(np.asarray(lp_ref)[:, :-1], tokens[:, 1:, None], -1)[..., 0]
        for chunk in (1, 5, 64):  # chunk sizes that divide, don't divide, and exceed T
            ours, ent = models.token_logprobs(cfg, params, tokens, attention_mask=mask, temperature=temp,
                                              chunk_size=chunk, return_entropy=True)
            ours = np.asarray(ours)
            assert np.all(ours[:, 0] == 0)
            np.testing.assert_allclose(ours[:, 1:], ref, atol=1e-5)
            p = np.exp(np.asarray(lp_ref))
            ent_ref = -(p * np.asarray(lp_ref)).sum(-1)[:, :-1]
            np.testing.assert_allclose(np.asarray(ent)[:, 1:], ent_ref, atol=1e-4)


def test_cached_forward_equals_full_forward(hf_qwen3):
    """Prefill in two uneven chunks into a KV cache, rows at different offsets == full forward."""
    path, _ = hf_qwen3()
    cfg, params = models.load_hf_checkpoint(path)
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, cfg.vocab_size, (2, 12))
    full = np.asarray(models.forward(cfg, params, tokens))
    shape = (cfg.num_layers, 2, cfg.num_kv_heads, 32, cfg.head_dim)
    cache = (jnp.zeros(shape), jnp.zeros(shape))
    l1, cache = models.forward_with_cache(cfg, params, tokens[:, :7], cache, jnp.array([0, 0]))
    l2, cache = models.forward_with_cache(cfg, params, tokens[:, 7:], cache, jnp.array([7, 7]))
    np.testing.assert_allclose(np.concatenate([l1, l2], 1), full, atol=1e-4)
    # Row 1 only: write its tail at a different offset in a fresh cache; same logits.
    cache = (jnp.zeros(shape), jnp.zeros(shape))
    _, cache = models.forward_with_cache(cfg, params, tokens[:, :4], cache, jnp.array([0, 0]))
    l3, _ = models.forward_with_cache(cfg, params, tokens[:, 4:], cache, jnp.array([4, 4]))
    np.testing.assert_allclose(np.asarray(l3), full[:, 4:], atol=1e-4)


def test_cached_forward_on_selected_slots(hf_qwen3):
    """slot_ids route rows to cache rows; a padding row (write_index >= S) leaves the cache alone."""
    path, _ = hf_qwen3()
    cfg, params = models.load_hf_checkpoint(path)
    tokens = np.random.default_rng(6).integers(0, cfg.vocab_size, (1, 6))
    full = np.asarray(models.forward(cfg, params, tokens))
    shape = (cfg.num_layers, 3, cfg.num_kv_heads, 16, cfg.head_dim)
    cache = (jnp.zeros(shape), jnp.zeros(shape))
    batch = np.concatenate([tokens, tokens])  # row 0 -> slot 2, row 1 is padding
    logits, cache = models.forward_with_cache(cfg, params, batch, cache, jnp.array([0, 16]), jnp.array([2, 0]))
    np.testing.assert_allclose(np.asarray(logits[0]), full[0], atol=1e-4)
    k = np.asarray(cache[0])
    assert np.all(k[:, 0] == 0) and np.all(k[:, 1] == 0) and np.any(k[:, 2, :6] != 0)


def test_token_entropy_stays_exact_for_large_logits(hf_qwen3):
    """Entropy of large-magnitude logits (a trained model's) is computed relative to the row maximum:
    as lse - E[logits] two ~1e3 terms cancel to float32 rounding (2e-4 nats off here, more at larger
    offsets)."""
    path, _ = hf_qwen3(tie_word_embeddings=True)
    cfg, params = models.load_hf_checkpoint(path)
    params["final_norm"]["scale"] = params["final_norm"]["scale"] * 2000.0
    tokens = np.random.default_rng(7).integers(0, cfg.vocab_size, (2, 9))
    logits = np.asarray(models.forward(cfg, params, tokens), np.float64)
    assert np.abs(logits).max() > 500
    lp_ref = logits - logits.max(-1, keepdims=True)
    lp_ref = lp_ref - np.log(np.exp(lp_ref).sum(-1, keepdims=True))
    ent_ref = -(np.exp(lp_ref) * lp_ref).sum(-1)[:, :-1]
    _, ent = models.token_logprobs(cfg, params, tokens, return_entropy=True)
    np.testing.assert_allclose(np.asarray(ent)[:, 1:], ent_ref, atol=2e-5)
