"""Rollout engine edge cases (found by an audit) against models.forward / token_logprobs.

One engine shape for the whole file (2 slots, max_len 48, one length / row / window bucket), so
the kernels compile once; the oracle runs at one padded shape too.
"""
import jax
import numpy as np
import pytest

from reagent_jax import models, rollout
from reagent_jax.rollout import SamplingParams, driver

ML = 48
KW = dict(num_slots=2, max_len=ML, prefill_chunk=16, length_buckets=(16,), row_buckets=(2,), window_buckets=(ML,),
          decode_steps=4)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def model(peaked_tiny_model):
    return peaked_tiny_model


def prompts_of(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 512, n).tolist() for n in lengths]


def padded(seqs):
    toks, mask = np.zeros((4, ML), np.int32), np.zeros((4, ML), np.int32)
    for i, s in enumerate(seqs):
        toks[i, :len(s)], mask[i, :len(s)] = s, 1
    return toks, mask


def forward_logits(cfg, params, seqs):
    """fp64 logits of models.forward at every position of each (right-padded) sequence."""
    return np.asarray(models.forward(cfg, params, *padded(seqs)), np.float64)


def greedy_reference(cfg, params, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(forward_logits(cfg, params, [seq])[0, len(seq) - 1])))
    return seq[len(prompt):]


def test_tiny_temperature_draws_the_argmax_with_its_true_logprob(model):
    """T = 1e-6 gave logprobs > 0 and T = 1e-30 gave inf logprobs and random tokens: logits / T
    was rounded differently in the fusions that read it (x * (1/T) in one, x / T in another)."""
    cfg, params = model
    prompt = prompts_of((7,), seed=1)[0]
    eng = rollout.Engine(cfg, params, **KW)
    ref = greedy_reference(cfg, params, prompt, 10)
    logits = forward_logits(cfg, params, [prompt + ref])[0, len(prompt) - 1:len(prompt) + 9]
    for t in (1e-3, 1e-6, 1e-30):
        out = eng.generate([prompt], SamplingParams(temperature=t, max_new_tokens=10, seed=3))[0]
        assert out.tokens == ref, t
        z = (logits - logits.max(-1, keepdims=True)) / t  # log softmax(logits / T), computed stably
        want = z[np.arange(10), ref] - np.log(np.exp(z).sum(-1))
        assert np.all(np.asarray(out.logprobs) <= 0.0), (t, out.logprobs)
        np.testing.assert_allclose(out.logprobs, want, atol=1e-3 if t == 1e-3 else 1e-4, err_msg=str(t))


def test_sampler_logprobs_stay_finite_and_nonpositive_at_tiny_temperatures():
    logits = np.asarray(jax.random.normal(jax.random.PRNGKey(4), (5, 600)) * 3.0)
    temps = np.array([1e-6, 1e-8, 1e-20, 1e-30, 1e-37], np.float32)
    tok, lp = jax.jit(rollout.sample)(logits, temps, np.ones(5, np.float32), np.zeros(5, np.int32),
                                      np.arange(5, dtype=np.uint32), np.full(5, 3, np.int32))
    np.testing.assert_array_equal(tok, np.argmax(logits, -1))
    np.testing.assert_allclose(lp, 0.0, atol=1e-6)  # margins of ~1e-2 / T: the top token has p = 1


def test_huge_top_k_and_budget_are_served_and_do_not_wedge_the_engine(model):
    """top_k or max_new_tokens >= 2**31 raised OverflowError while packing int32 arrays, and the
    request stayed queued, so every later call raised it again."""
    cfg, params = model
    eng = rollout.Engine(cfg, params, **KW)
    prompt = prompts_of((5,), seed=2)[0]
    plain = SamplingParams(temperature=1.0, max_new_tokens=ML, seed=7)
    outs = eng.generate([prompt, prompt], [plain.replace(top_k=2 ** 31), plain.replace(max_new_tokens=2 ** 40)])
    ref = eng.generate([prompt], plain)[0]  # top_k >= vocab means no top-k; the budget is the cache
    assert [o.tokens for o in outs] == [ref.tokens] * 2 and len(ref.tokens) == ML - len(prompt)
    assert [o.finish_reason for o in outs] == ["length"] * 2
    assert eng.generate([prompt], GREEDY)[0].tokens == greedy_reference(cfg, params, prompt, 12)


def test_a_request_the_packer_cannot_encode_fails_alone(model, monkeypatch):
    cfg, params = model
    eng = rollout.Engine(cfg, params, **KW)
    real, calls = driver.prefill_batch, []

    def flaky(*a, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise OverflowError("cannot pack")
        return real(*a, **kw)
    monkeypatch.setattr(driver, "prefill_batch", flaky)
    prompt = prompts_of((6,), seed=3)[0]
    bad = eng.generate([prompt], GREEDY)[0]
    assert bad.finish_reason == "error" and "prefill packing failed" in bad.error and "cannot pack" in bad.error
    assert eng.generate([prompt], GREEDY)[0].tokens == greedy_reference(cfg, params, prompt, 12)
    assert eng.stats()["free_slots"] == KW["num_slots"]


def test_stop_string_spelled_by_single_byte_tokens(model):
    """A byte-level BPE may spell a 4-byte character with 4 tokens: the stop-string window has to
    count UTF-8 bytes (it counted characters, so "🤖🤖🤖" = 12 tokens never matched)."""
    cfg, params = model
    prompt = prompts_of((6,), seed=8)[0]
    free = greedy_reference(cfg, params, prompt, 40)
    target = "🤖🤖🤖".encode()
    for k in range(len(free) - len(target)):  # a stretch of the run that can spell the target
        table = {}
        if all(table.setdefault(t, b) == b for t, b in zip(free[k:k + len(target)], target)) and \
                not set(free[:k]) & set(table):
            break
    else:
        pytest.skip("no stretch of distinct-enough tokens in this run")

    def byte_decode(ids):
        return bytes(table.get(t, ord("a")) for t in ids).decode("utf-8", errors="replace")
    eng = rollout.Engine(cfg, params, decode_fn=byte_decode, **KW)
    out = eng.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=40, stop_strings=["🤖🤖🤖"]))[0]
    assert out.finish_reason == "stop_string" and out.tokens == free[:k + len(target)]


def test_sampling_params_take_numpy_numbers_and_refuse_lossy_ones(model):
    cfg, params = model
    sp = SamplingParams(temperature=np.float32(0.5), top_p=np.float64(0.9), top_k=np.int64(5),
                        max_new_tokens=np.int32(6), seed=np.uint32(11), stop_token_ids=np.array([3, 4]))
    assert (type(sp.temperature), type(sp.top_k), type(sp.max_new_tokens), type(sp.seed)) == (float, int, int, int)
    assert sp.stop_token_ids == (3, 4) and hash(sp) == hash(sp.replace())
    prompt = prompts_of((5,), seed=4)[0]
    eng = rollout.Engine(cfg, params, **KW)
    py = SamplingParams(temperature=0.5, top_p=0.9, top_k=5, max_new_tokens=6, seed=11, stop_token_ids=(3, 4))
    assert eng.generate([prompt], sp)[0].tokens == eng.generate([prompt], py)[0].tokens
    assert SamplingParams(stop_token_ids=None, stop_strings=None) == SamplingParams()
    assert SamplingParams(stop_token_ids=7).stop_token_ids == (7,)
    for bad, msg in [(dict(temperature=float("inf")), "temperature=inf must be a finite"),
                     (dict(stop_token_ids=[5.7]), "stop_token_ids"),  # int() made it 5
                     (dict(stop_token_ids=["5"]), "stop_token_ids"),
                     (dict(max_new_tokens=True), "max_new_tokens=True"),
                     (dict(seed=False), "seed=False"),
                     (dict(stop_strings=5), "stop_strings")]:
        with pytest.raises(ValueError, match=msg):
            SamplingParams(**bad)


def letters(ids):
    return "".join(chr(ord("a") + t % 26) for t in ids)


def test_released_sessions_are_forgotten_and_ended_ones_say_why(model):
    """A multi-turn session released while running or queued stayed in the engine forever; an
    append to a session that ended with an error said "unknown session id"."""
    cfg, params = model
    eng = rollout.Engine(cfg, params, **{**KW, "num_slots": 1}, decode_fn=letters)
    sp = GREEDY.replace(max_new_tokens=30)
    running = eng.start([1, 2, 3], sp, multi_turn=True)
    queued = eng.start([4, 5], sp, multi_turn=True)  # one slot: waits
    eng._step(claim=False)  # prefill + one decode call: the first session is mid-turn
    eng.release(running)
    eng.release(queued)
    assert eng.wait(running).finish_reason == eng.wait(queued).finish_reason == "cancelled"
    for sid in (running, queued):
        with pytest.raises(ValueError, match="unknown session id"):
            eng.tokens(sid)
    assert eng.stats()["free_slots"] == 1

    def broken(ids):
        raise RuntimeError("detokenizer down")
    eng = rollout.Engine(cfg, params, **{**KW, "num_slots": 1}, decode_fn=broken)
    sid = eng.start([1, 2, 3], sp.replace(stop_strings=["x"]), multi_turn=True)
    assert eng.wait(sid).finish_reason == "error"
    with pytest.raises(ValueError, match="session .* has ended .*'error': decode_fn failed.*release it"):
        eng.append(sid, [1], then_resume=sp)
    eng.release(sid)
    with pytest.raises(ValueError, match="unknown session id"):
        eng.tokens(sid)
