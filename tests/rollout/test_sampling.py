"""The fused sampler against an exact NumPy oracle of temperature / top-k / top-p sampling."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import models, rollout
from reagent_jax.rollout import SamplingParams

V = 64
sample = jax.jit(rollout.sample)


def exact_probs(logits, temperature, top_p=1.0, top_k=0):
    """Oracle: top-k on logits / T, then the smallest prefix of the renormalised top-k whose
    mass reaches top_p; softmax over what is kept."""
    z = np.asarray(logits, np.float64) / temperature
    order = np.argsort(-z, kind="stable")
    k = top_k if 0 < top_k < len(z) else len(z)
    cand = order[:k]
    p = np.exp(z[cand] - z[cand].max())
    p /= p.sum()
    n = k if top_p >= 1 else int(np.searchsorted(np.cumsum(p), top_p) + 1)
    keep = cand[:min(n, k)]
    out = np.zeros(len(z))
    out[keep] = np.exp(z[keep] - z[keep].max())
    return out / out.sum()


def chi2_quantile(dof, z=4.753):  # Wilson-Hilferty; z = 4.753 is the 1 - 1e-6 normal quantile
    return dof * (1 - 2 / (9 * dof) + z * np.sqrt(2 / (9 * dof))) ** 3


CASES = [dict(temperature=1.0), dict(temperature=0.7, top_k=5), dict(temperature=1.3, top_p=0.8),
         dict(temperature=0.7, top_k=12, top_p=0.9), dict(temperature=2.0, top_p=0.5, top_k=40)]


def _check_distribution(logits, cases, n, tv_tol, fn=sample):
    v = logits.shape[-1]
    temp = np.concatenate([np.full(n, c["temperature"], np.float32) for c in cases])
    top_p = np.concatenate([np.full(n, c.get("top_p", 1.0), np.float32) for c in cases])
    top_k = np.concatenate([np.full(n, c.get("top_k", 0), np.int32) for c in cases])
    rows = len(temp)
    seeds = np.arange(rows, dtype=np.uint32)
    tok, lp = fn(jnp.broadcast_to(logits, (rows, v)), temp, top_p, top_k, seeds, np.full(rows, 7, np.int32))
    tok, lp = np.asarray(tok), np.asarray(lp)
    for i, case in enumerate(cases):
        t = tok[i * n:(i + 1) * n]
        p = exact_probs(logits, case["temperature"], case.get("top_p", 1.0), case.get("top_k", 0))
        counts = np.bincount(t, minlength=v)
        assert counts[p == 0].sum() == 0, f"{case}: truncated tokens were drawn"
        big = p * n >= 5
        expected = np.append(p[big] * n, p[~big].sum() * n)
        observed = np.append(counts[big], counts[~big].sum())
        if expected[-1] == 0:
            expected, observed = expected[:-1], observed[:-1]
        stat = ((observed - expected) ** 2 / expected).sum()
        assert stat < chi2_quantile(len(expected) - 1), f"{case}: chi2 {stat:.1f} over {len(expected) - 1} dof"
        assert 0.5 * np.abs(counts / n - p).sum() < tv_tol
        # Reported logprob: full-vocabulary log softmax at temperature T, before truncation.
        ref = jax.nn.log_softmax(logits / case["temperature"])[t]
        np.testing.assert_allclose(lp[i * n:(i + 1) * n], ref, atol=1e-5)


def test_sampled_distribution_matches_exact_one_per_row_params_in_one_batch():
    _check_distribution(jax.random.normal(jax.random.PRNGKey(1), (V,)) * 2.0, CASES, 20000, 0.02)


def test_two_level_draw_over_many_chunks_matches_exact_distribution():
    """600 tokens = 5 chunks of 128 (the last one padded): the chunk draw and the draw inside
    the chunk together give the exact distribution, with and without truncation."""
    logits = jax.random.normal(jax.random.PRNGKey(7), (600,)) * 3.0
    cases = [dict(temperature=1.0), dict(temperature=1.3, top_p=0.8), dict(temperature=0.7, top_k=200)]
    _check_distribution(logits, cases, 20000, 0.05)


def test_greedy_rows_and_key_determinism():
    logits = jax.random.normal(jax.random.PRNGKey(2), (6, V)) * 3.0
    temp = np.array([0, 0, 1, 1, 1, 1], np.float32)
    args = (np.ones(6, np.float32), np.zeros(6, np.int32))
    seeds = np.array([0, 0, 5, 5, 5, 6], np.uint32)
    pos = np.array([0, 0, 3, 3, 4, 3], np.int32)
    tok, lp = sample(logits, temp, *args, seeds, pos)
    np.testing.assert_array_equal(tok[:2], np.argmax(logits[:2], -1))
    np.testing.assert_allclose(lp[:2], jax.nn.log_softmax(logits[:2])[np.arange(2), tok[:2]], atol=1e-6)
    # Same (seed, position) and same logits -> same draw in any row: rows 2 and 3 share all.
    same = sample(jnp.stack([logits[2]] * 6), temp, *args, seeds, pos)[0]
    assert same[2] == same[3]
    # The key depends only on (seed, position): 400 draws with distinct seeds or positions vary.
    many = sample(jnp.broadcast_to(logits[2], (400, V)), np.ones(400, np.float32), np.ones(400, np.float32),
                  np.zeros(400, np.int32), np.arange(400, dtype=np.uint32) % 20, np.arange(400, dtype=np.int32) // 20)[0]
    assert len(set(np.asarray(many).tolist())) > 5
    again = sample(jnp.broadcast_to(logits[2], (400, V)), np.ones(400, np.float32), np.ones(400, np.float32),
                   np.zeros(400, np.int32), np.arange(400, dtype=np.uint32) % 20, np.arange(400, dtype=np.int32) // 20)[0]
    np.testing.assert_array_equal(many, again)


def test_engine_first_tokens_are_the_samplers_draws(peaked_tiny_model):
    """Many one-token requests (one per seed) from one prompt: the engine's draws equal the
    sampler applied to models.forward's logits, and lie in the top-k set."""
    cfg, params = peaked_tiny_model
    prompt = np.random.default_rng(4).integers(0, cfg.vocab_size, 10).tolist()
    eng = rollout.Engine(cfg, params, num_slots=4, max_len=160, prefill_chunk=32, length_buckets=(32,),
                         row_buckets=(4,), decode_steps=8)
    sps = [SamplingParams(temperature=0.8, top_k=3, max_new_tokens=1, seed=s) for s in range(32)]
    outs = eng.generate([prompt] * 32, sps)
    logits = np.asarray(models.forward(cfg, params, np.array([prompt])))[0, -1]
    ref = sample(jnp.broadcast_to(logits, (32, cfg.vocab_size)), np.full(32, 0.8, np.float32), np.ones(32, np.float32),
                 np.full(32, 3, np.int32), np.arange(32, dtype=np.uint32), np.full(32, len(prompt), np.int32))[0]
    got = [o.tokens[0] for o in outs]
    assert got == np.asarray(ref).tolist()
    assert set(got) <= set(np.argsort(-logits)[:3].tolist()) and len(set(got)) > 1
    assert all(o.finish_reason == "length" and o.seed == i for i, o in enumerate(outs))


@pytest.mark.parametrize("bad,msg", [(dict(seed=-1), "seed=-1"), (dict(seed=2 ** 32), "seed="),
                                     (dict(stop_token_ids=[-3]), "stop token id -3"),
                                     (dict(stop_strings=[""]), "stop string")])
def test_sampling_params_validation(bad, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**bad)


def _sorted_keep(scaled, top_p, top_k):
    """Oracle keep-set of one row by a full sort (the definition `truncate` implements)."""
    return exact_probs(scaled, 1.0, top_p, top_k) > 0


@pytest.mark.parametrize("fast_k", [4, 256])
def test_truncate_matches_a_full_sort_on_both_paths(fast_k):
    """fast_k=4 forces most rows onto the bisection fallback; 256 decides them from lax.top_k.
    Vocabulary 1000 (not a multiple of the 128-wide chunks), flat and peaked rows."""
    v, rows = 1000, 12
    rng = np.random.default_rng(3)
    scale = np.array([0.3, 1, 3, 8] * 3, np.float32)[:, None]
    scaled = (rng.normal(size=(rows, v)) * scale).astype(np.float32)
    top_p = np.array([1, .5, .9, .99, 1, .95, .3, 1, .8, .999, .7, .9], np.float32)
    top_k = np.array([5, 0, 0, 0, 300, 40, 2, 1, 600, 0, 999, 3], np.int32)
    out = np.asarray(jax.jit(rollout.sampling.truncate, static_argnames="fast_k")(scaled, top_p, top_k, fast_k=fast_k))
    for i in range(rows):
        keep = np.isfinite(out[i])
        np.testing.assert_array_equal(keep, _sorted_keep(scaled[i], top_p[i], top_k[i]), err_msg=f"row {i}")
        np.testing.assert_array_equal(out[i][keep], scaled[i][keep])


def test_first_argmax_on_an_uneven_vocabulary_with_ties():
    x = np.random.default_rng(0).normal(size=(5, 1000)).astype(np.float32)
    x[1, [7, 900]] = 50.0  # tie across chunks: the first index wins
    x[2, [130, 131]] = 50.0  # tie inside a chunk
    x[3] = -np.inf
    x[3, 999] = 0.0  # the maximum in the padded tail chunk
    np.testing.assert_array_equal(np.asarray(jax.jit(rollout.sampling.first_argmax)(x)), np.argmax(x, axis=-1))


def test_sampling_without_truncation_code_draws_the_same_tokens():
    """The engine compiles `truncation=False` when no row uses top-k / top-p: same draws."""
    logits = jax.random.normal(jax.random.PRNGKey(5), (64, 300)) * 2.0
    temp = np.where(np.arange(64) % 4 == 0, 0.0, 0.9).astype(np.float32)
    args = (np.ones(64, np.float32), np.zeros(64, np.int32), np.arange(64, dtype=np.uint32), np.full(64, 3, np.int32))
    with_code = jax.jit(rollout.sample)(logits, temp, *args)
    without = jax.jit(rollout.sample, static_argnames="truncation")(logits, temp, *args, truncation=False)
    np.testing.assert_array_equal(with_code[0], without[0])
    np.testing.assert_allclose(with_code[1], without[1], atol=1e-6)


@pytest.mark.parametrize("tied,dtype", [(True, "float32"), (False, "float32"), (True, "bfloat16"), (False, "bfloat16")])
def test_sampling_logits_equal_the_models_projection(tied, dtype):
    """The sampler's projection (a fused multiply-reduce for tied fp32 on CPU) gives the model's
    logits, vocabulary-major."""
    from reagent_jax.models.qwen3 import Qwen3
    from reagent_jax.rollout.kernels import sampling_logits
    cfg = models.preset("tiny", tie_word_embeddings=tied, compute_dtype=dtype)
    params = models.init_params(cfg, jax.random.PRNGKey(1))
    h = jax.random.normal(jax.random.PRNGKey(2), (5, cfg.hidden_size))
    ref = Qwen3(cfg).apply({"params": params}, h, method=Qwen3.project)
    out, _ = jax.jit(sampling_logits, static_argnums=0)(cfg, params, h)
    assert out.shape == (cfg.vocab_size, 5) and out.dtype == jnp.float32
    np.testing.assert_allclose(out.T, ref, atol=1e-5 if dtype == "float32" else 2e-2)


@pytest.mark.parametrize("v", [1000, 128, 50])
def test_chunk_stats_match_numpy(v):
    """Chunk maxima and exp-sums at each row's temperature, a partial last chunk included; a chunk
    of -inf logits sums to 0 (not nan)."""
    rng = np.random.default_rng(v)
    logits = rng.normal(size=(v, 4)).astype(np.float32) * 3
    logits[:min(v, 128), 3] = -np.inf
    logits[-1, 3] = 0.5  # the last chunk of row 3 holds one finite value
    temperature = jnp.asarray([0.0, 0.7, 1.3, 1.0])
    inv_t = rollout.sampling.inverse_temperature(temperature)
    np.testing.assert_allclose(inv_t, [1.0, 1 / 0.7, 1 / 1.3, 1.0], rtol=1e-7)
    cmax, csum = jax.jit(rollout.sampling.chunk_stats)(jnp.asarray(logits), inv_t)
    c = -(-v // 128)
    pad = np.full((c * 128, 4), -np.inf)
    pad[:v] = logits
    p3 = pad.reshape(c, 128, 4)
    ref_max = p3.max(1)
    shift = np.where(np.isfinite(ref_max), ref_max, 0.0)
    with np.errstate(invalid="ignore"):
        ref_sum = np.exp((p3 - shift[:, None]) * np.asarray(inv_t, np.float64)).sum(1)
    np.testing.assert_array_equal(cmax, ref_max)
    np.testing.assert_allclose(csum, ref_sum, rtol=1e-5)
    assert np.all(np.isfinite(np.asarray(csum)))


def test_sampler_with_given_statistics_equals_the_sampler_alone():
    """Handing `sample_vocab_major` the statistics (as the CPU decode kernel does) changes
    nothing: same tokens for greedy, temperature and top-p / top-k rows, same logprobs."""
    rng = np.random.default_rng(3)
    v, b = 1003, 6
    logits = jnp.asarray(rng.normal(size=(v, b)).astype(np.float32) * 4)
    temperature = jnp.asarray([0.0, 1.0, 0.6, 1.5, 0.8, 1e-30], jnp.float32)
    top_p = jnp.asarray([1.0, 1.0, 0.9, 1.0, 0.5, 1.0], jnp.float32)
    top_k = jnp.asarray([0, 0, 0, 20, 5, 0], jnp.int32)
    seeds, positions = jnp.arange(b, dtype=jnp.uint32), jnp.full(b, 7, jnp.int32)
    sample = jax.jit(rollout.sampling.sample_vocab_major)
    stats = rollout.sampling.chunk_stats(logits, rollout.sampling.inverse_temperature(temperature))
    for seed in range(5):
        args = (logits, temperature, top_p, top_k, seeds + 100 * seed, positions)
        alone, given = sample(*args), sample(*args, stats=stats)
        np.testing.assert_array_equal(alone[0], given[0])
        np.testing.assert_allclose(alone[1], given[1], atol=1e-6)
    greedy = np.asarray(alone[0])[[0, 5]]
    np.testing.assert_array_equal(greedy, np.argmax(np.asarray(logits), axis=0)[[0, 5]])
    ref = jax.nn.log_softmax(logits[:, 1])[alone[0][1]]
    np.testing.assert_allclose(alone[1][1], ref, atol=1e-5)


@pytest.mark.parametrize("v, shards, chunk", [(151936, 1, 128), (151936, 4, 32), (151936, 8, 16), (151936, 2, 64),
                                              (49152, 8, 128), (600, 4, 2), (601, 4, 128)])
def test_vocab_chunks_never_straddle_two_devices(v, shards, chunk):
    s = rollout.sampling.vocab_chunk(v, shards)
    assert s == chunk and (v % shards or (v // shards) % s == 0)


def test_vocab_parallel_sampler_draws_the_exact_distribution_and_the_same_greedy_tokens():
    """vocab_shards=4 on 384 tokens: chunks of 32, chunk reads as masked reductions, top-k per
    device then over the devices' candidates. Sampled tokens follow the exact distribution with
    and without truncation; greedy tokens and logprobs equal the gather path's."""
    par = jax.jit(lambda x, *a: rollout.sampling.sample_vocab_major(x.T, *a, vocab_shards=4))
    logits = jax.random.normal(jax.random.PRNGKey(3), (384,)) * 3.0
    cases = [dict(temperature=1.0), dict(temperature=1.3, top_p=0.8), dict(temperature=0.7, top_k=60)]
    _check_distribution(logits, cases, 20000, 0.05, fn=par)
    batch = jax.random.normal(jax.random.PRNGKey(4), (6, 384)) * 3.0
    g = (np.zeros(6, np.float32), np.ones(6, np.float32), np.zeros(6, np.int32), np.arange(6, dtype=np.uint32),
         np.zeros(6, np.int32))
    t_par, lp_par = par(batch, *g)
    t_ref, lp_ref = sample(batch, *g)
    np.testing.assert_array_equal(t_par, t_ref)
    np.testing.assert_allclose(lp_par, lp_ref, atol=1e-6)


def test_vocab_split_logits_are_sampled_where_they_lie():
    """Logits split over 4 devices by vocabulary: the draws equal those of the same logits on one
    device, and no [V, B] array crosses devices (no all-gather or all-to-all of the logits)."""
    from tests.multidevice import run_with_devices
    out = run_with_devices("""
        import json, re
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from reagent_jax.rollout import sampling
        mesh = Mesh(np.array(jax.devices()[:4]), ("tensor",))
        v, b = 4 * 480, 16  # 480 per device: chunks of 32 (128 would straddle devices)
        logits = jax.random.normal(jax.random.PRNGKey(0), (v, b)) * 3.0
        temp = jnp.where(jnp.arange(b) % 2 == 0, 0.0, 0.8).astype(jnp.float32)
        top_p = jnp.where(jnp.arange(b) % 4 == 1, 0.9, 1.0).astype(jnp.float32)  # some rows truncated
        top_k = jnp.where(jnp.arange(b) % 4 == 3, 40, 0).astype(jnp.int32)
        args = (temp, top_p, top_k, jnp.arange(b, dtype=jnp.uint32), jnp.full(b, 5, jnp.int32))
        fn = jax.jit(lambda l, *a: sampling.sample_vocab_major(l, *a, vocab_shards=4))
        split = jax.device_put(logits, NamedSharding(mesh, P("tensor", None)))
        tok_split, lp_split = fn(split, *args)
        tok_one, lp_one = fn(logits, *args)
        hlo = fn.lower(split, *args).compile().as_text()
        moved = [l for l in hlo.splitlines() if re.search(r"all-gather|all-to-all|collective-permute", l)
                 and re.search(r"\\[(%d|%d,%d)" % (v, b, v), l)]
        print(json.dumps(dict(same_tok=bool((tok_split == tok_one).all()),
                              lp_err=float(jnp.abs(lp_split - lp_one).max()), moved=moved)))
    """, n=4)
    assert out["same_tok"] and out["lp_err"] < 1e-5
    assert out["moved"] == []
