"""Rollout engine against the model's own forward / token_logprobs (tiny fp32 Qwen3).

All engines here share one shape (4 slots, max_len 160, prefill chunk 32, one length and one
row bucket) so the kernels compile once for the whole file.
"""
import concurrent.futures
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import models, rollout
from reagent_jax.rollout import SamplingParams

KW = dict(num_slots=4, max_len=160, prefill_chunk=32, length_buckets=(32,), row_buckets=(4,), window_buckets=(64,),
          decode_steps=8)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=64)


@pytest.fixture(scope="module")
def model(peaked_tiny_model):
    return peaked_tiny_model


def prompts_of(lengths, seed=0, vocab=512):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


def padded(seqs, rows=8, width=160):
    """Right-padded [rows, width] tokens and mask: one shape for every oracle call (one compile)."""
    assert len(seqs) <= rows and max(map(len, seqs)) <= width
    toks, mask = np.zeros((rows, width), np.int32), np.zeros((rows, width), np.int32)
    for i, s in enumerate(seqs):
        toks[i, :len(s)], mask[i, :len(s)] = s, 1
    return toks, mask


def greedy_reference(cfg, params, prompts, new_tokens):
    """Step-by-step argmax of models.forward over the growing (right-padded) sequences."""
    seqs = [list(p) for p in prompts]
    for _ in range(new_tokens):
        logits = np.asarray(models.forward(cfg, params, *padded(seqs)))
        for i, s in enumerate(seqs):
            s.append(int(np.argmax(logits[i, len(s) - 1])))
    return [s[len(p):] for s, p in zip(seqs, prompts)]


def test_greedy_equals_stepwise_argmax_of_forward(model):
    """Five prompts (one longer than the prefill chunk) through four slots: padded batched
    prefill, chunked prefill, continuous batching, 64 fused-decode tokens each."""
    cfg, params = model
    prompts = prompts_of((5, 17, 40, 9, 3))
    eng = rollout.Engine(cfg, params, **KW)
    outs = eng.generate(prompts, GREEDY)
    ref = greedy_reference(cfg, params, prompts, 64)
    for o, r in zip(outs, ref):
        assert o.finish_reason == "length" and o.tokens == r
    st = eng.stats()
    assert st["prefill_tokens"] == sum(map(len, prompts))
    assert st["decode_tokens"] == 5 * 63  # the first token of each comes from prefill
    assert 0 < st["utilisation"] <= 1 and st["free_slots"] == 4
    # attention windows grow with the sequences: 64 positions, then the whole cache (160)
    assert st["kernel_shapes"] == ["decode[4,w160]", "decode[4,w64]", "prefill[4x32,w64]"]
    assert st["compiles"] <= 3  # each shape compiled at most once (0 if an earlier test did)


@pytest.mark.parametrize("sp", [SamplingParams(temperature=1.0, max_new_tokens=40, seed=1),
                                SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=40, seed=2),
                                SamplingParams(temperature=0.0, max_new_tokens=40)])
def test_logprobs_equal_trainer_token_logprobs(model, sp):
    cfg, params = model
    prompts = prompts_of((7, 21), seed=3)
    eng = rollout.Engine(cfg, params, **KW)
    outs = eng.generate(prompts, sp)
    temp = sp.temperature if sp.temperature > 0 else 1.0
    seqs = [p + o.tokens for p, o in zip(prompts, outs)]
    ref = np.asarray(models.token_logprobs(cfg, params, *padded(seqs), temperature=temp))
    logits = np.asarray(models.forward(cfg, params, *padded(seqs)))
    for i, (p, o) in enumerate(zip(prompts, outs)):
        n = len(o.tokens)
        np.testing.assert_allclose(o.logprobs, ref[i, len(p):len(p) + n], atol=1e-4)
        if sp.top_k:  # sampled tokens lie inside the truncated set
            lg = logits[i, len(p) - 1:len(p) - 1 + n]
            ranks = (lg > lg[np.arange(n), o.tokens][:, None]).sum(-1)
            assert ranks.max() < sp.top_k
        # top_logprobs (a server's alternatives): the same distribution; the sampled token is in
        # the top 4 with its own logprob, or below all four
        top_lp, top_ids = eng.top_logprobs(p + o.tokens, len(p), 4, sp.temperature)
        assert top_lp.shape == top_ids.shape == (n, 4)
        hit = top_ids == np.asarray(o.tokens)[:, None]
        np.testing.assert_allclose(top_lp[hit], np.asarray(o.logprobs)[hit.any(-1)], atol=1e-4)
        assert np.all(top_lp[~hit.any(-1), -1] >= np.asarray(o.logprobs)[~hit.any(-1)] - 1e-4)
        if sp.temperature == 0:
            assert hit[:, 0].all()


def _stop_token_after(tokens, at_least=3):
    """A token that first appears at index >= at_least of a greedy continuation."""
    for i in range(at_least, len(tokens)):
        if tokens[i] not in tokens[:i]:
            return i, tokens[i]
    raise AssertionError("no fresh token to stop on")


def test_multi_turn_append_reuses_cache_and_equals_fresh_prefill(model):
    cfg, params = model
    prompt = prompts_of((12,), seed=5)[0]
    eng = rollout.Engine(cfg, params, **KW)
    free_run = eng.generate([prompt], GREEDY)[0].tokens
    i, stop = _stop_token_after(free_run, 4)
    sid = eng.start(prompt, GREEDY.replace(stop_token_ids=[stop]), multi_turn=True)
    r1 = eng.wait(sid)
    assert r1.finish_reason == "stop" and r1.stop == stop and r1.tokens == free_run[:i + 1]
    tool = prompts_of((11,), seed=6)[0]
    before = eng.stats()["prefill_tokens"]
    eng.append(sid, tool, then_resume=GREEDY.replace(max_new_tokens=20))
    r2 = eng.wait(sid)
    # Only the unfed stop token and the tool tokens were prefilled: no history recompute.
    assert eng.stats()["prefill_tokens"] - before == len(tool) + 1
    assert r2.turn == 1 and r2.prompt_len == len(prompt) + len(r1.tokens) + len(tool)
    history = prompt + r1.tokens + tool
    fresh = rollout.Engine(cfg, params, **KW).generate([history], GREEDY.replace(max_new_tokens=20))[0]
    assert r2.tokens == fresh.tokens
    np.testing.assert_allclose(r2.logprobs, fresh.logprobs, atol=1e-4)
    assert eng.tokens(sid) == history + r2.tokens
    # A third turn after appending without resuming, then resuming with an empty append.
    eng.append(sid, [1, 2, 3])
    eng.append(sid, [], then_resume=GREEDY.replace(max_new_tokens=5))
    r3 = eng.wait(sid)
    ref = greedy_reference(cfg, params, [history + r2.tokens + [1, 2, 3]], 5)[0]
    assert r3.tokens == ref
    eng.release(sid)
    assert eng.stats()["free_slots"] == 4
    with pytest.raises(ValueError, match="unknown session id"):
        eng.append(sid, [1], then_resume=GREEDY)


def letters(ids):
    """A toy detokenizer: token t -> one letter (so stop strings are easy to place)."""
    return "".join(chr(ord("a") + t % 26) for t in ids)


def test_stop_strings_and_failing_detokenizer(model):
    cfg, params = model
    prompts = prompts_of((6, 10), seed=8)
    free = rollout.Engine(cfg, params, **KW).generate(prompts, GREEDY)
    text = letters(free[0].tokens)
    target = text[9:12]  # ends at token 11 (or earlier, if it already occurred)
    end = text.index(target) + len(target)
    eng = rollout.Engine(cfg, params, decode_fn=letters, **KW)
    outs = eng.generate(prompts, GREEDY.replace(stop_strings=[target]))
    assert outs[0].finish_reason == "stop_string" and outs[0].stop == target
    assert outs[0].tokens == free[0].tokens[:end]
    assert outs[1].tokens == free[1].tokens[:len(outs[1].tokens)]
    if target not in letters(free[1].tokens):
        assert outs[1].finish_reason == "length"

    def broken(ids):
        raise RuntimeError("detokenizer down")
    eng = rollout.Engine(cfg, params, decode_fn=broken, **KW)
    outs = eng.generate(prompts, [GREEDY.replace(stop_strings=["x"]), GREEDY.replace(max_new_tokens=8)])
    assert outs[0].finish_reason == "error" and "detokenizer down" in outs[0].error
    assert outs[1].finish_reason == "length" and outs[1].tokens == free[1].tokens[:8]


def test_generation_ends_with_length_when_the_cache_is_full(model):
    cfg, params = model
    prompt = prompts_of((150,), seed=9)[0]  # five prefill chunks
    out = rollout.Engine(cfg, params, **KW).generate([prompt], GREEDY)[0]
    assert out.finish_reason == "length" and len(prompt) + len(out.tokens) == KW["max_len"]
    assert out.tokens == greedy_reference(cfg, params, [prompt], 10)[0]


def test_paused_sessions_do_not_block_and_short_requests_overtake_long_ones(model):
    cfg, params = model
    eng = rollout.Engine(cfg, params, **KW)
    held = [eng.start(p, GREEDY.replace(max_new_tokens=3), multi_turn=True) for p in prompts_of((4, 5), seed=10)]
    for sid in held:
        assert eng.wait(sid).finish_reason == "length"
    # Two slots are held by paused sessions; eight requests (one 10x longer) share the other two.
    prompts = prompts_of((6, 7, 8, 9, 10, 11, 12, 13), seed=11)
    budgets = [40] + [4] * 7
    sids = [eng.start(p, GREEDY.replace(max_new_tokens=n)) for p, n in zip(prompts, budgets)]
    done = {}
    for _ in range(200):  # bounded: each step makes progress
        done.update({r.session_id: r for r in eng.step()})
        assert eng.stats()["paused"] == 2
        if len(done) == len(sids):
            break
    assert list(done)[-1] == sids[0]  # all seven short requests finished while the long one ran
    ref = greedy_reference(cfg, params, prompts, 40)
    assert [done[sid].tokens for sid in sids] == [r[:n] for r, n in zip(ref, budgets)]
    assert eng.stats()["turns"] == 2 + 8
    for sid in held:
        eng.append(sid, [7], then_resume=GREEDY.replace(max_new_tokens=2))
        assert len(eng.wait(sid).tokens) == 2
        eng.release(sid)
    assert eng.stats()["free_slots"] == 4


def test_seeded_sampling_is_independent_of_batch_composition_and_fusion(model):
    cfg, params = model
    target = prompts_of((9,), seed=12)[0]
    sp = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=24, seed=123)
    alone = rollout.Engine(cfg, params, **KW).generate([target], sp)[0]
    others = prompts_of((14, 3, 30), seed=13)
    mixed = [SamplingParams(temperature=0.0, max_new_tokens=30), SamplingParams(temperature=1.3, top_k=5, max_new_tokens=7, seed=5),
             SamplingParams(temperature=0.5, max_new_tokens=50, seed=9)]
    outs = rollout.Engine(cfg, params, **KW).generate(others + [target], mixed + [sp])  # lands in another slot
    assert outs[-1].tokens == alone.tokens and outs[-1].seed == 123
    np.testing.assert_allclose(outs[-1].logprobs, alone.logprobs, atol=1e-5)
    one_step = rollout.Engine(cfg, params, **{**KW, "decode_steps": 1}).generate([target], sp)[0]
    assert one_step.tokens == alone.tokens
    other_seed = rollout.Engine(cfg, params, **KW).generate([target], sp.replace(seed=124))[0]
    assert other_seed.tokens != alone.tokens


def test_bad_input_errors_name_the_problem_and_others_are_served(model):
    cfg, params = model
    eng = rollout.Engine(cfg, params, **KW)
    ok = prompts_of((5,), seed=14)[0]
    cases = [
        (lambda: eng.start(list(range(160)), GREEDY), "prompt has 160 tokens but max_len=160"),
        (lambda: eng.start([], GREEDY), "empty prompt"),
        (lambda: eng.start([1, 512], GREEDY), "token id 512 at position 1 is outside the vocabulary"),
        (lambda: eng.start(ok, SamplingParams(stop_strings=["x"])), "need a detokenizer"),
        (lambda: SamplingParams(temperature=-0.5), "temperature=-0.5"),
        (lambda: SamplingParams(top_p=0.0), "top_p=0.0"),
        (lambda: SamplingParams(top_p=1.5), "top_p=1.5"),
        (lambda: SamplingParams(top_k=-1), "top_k=-1"),
        (lambda: SamplingParams(max_new_tokens=0), "max_new_tokens=0"),
        (lambda: eng.append(12345, [1], then_resume=GREEDY), "unknown session id 12345"),
        (lambda: eng.release(12345), "unknown session id 12345"),
        (lambda: eng.wait(12345), "unknown session id 12345"),
    ]
    for fn, msg in cases:
        with pytest.raises(ValueError, match=msg):
            fn()
    single = eng.start(ok, GREEDY.replace(max_new_tokens=2))
    with pytest.raises(ValueError, match="multi_turn=False"):
        eng.append(single, [1], then_resume=GREEDY)
    multi = eng.start(ok, GREEDY.replace(max_new_tokens=2), multi_turn=True)
    with pytest.raises(ValueError, match="is waiting; append after its turn ends"):
        eng.append(multi, [1], then_resume=GREEDY)
    eng.wait(multi)
    with pytest.raises(ValueError, match="exceed max_len=160"):
        eng.append(multi, list(range(160)), then_resume=GREEDY)
    eng.release(multi)
    assert eng.wait(single).finish_reason == "length"
    outs = eng.generate([ok, [], ok, list(range(400))], GREEDY.replace(max_new_tokens=6))
    assert [o.finish_reason for o in outs] == ["length", "error", "length", "error"]
    assert "prompts[1]: empty prompt" in outs[1].error and "prompts[3]" in outs[3].error
    assert outs[0].tokens == outs[2].tokens == greedy_reference(cfg, params, [ok], 6)[0]
    with pytest.raises(ValueError, match="num_slots=0"):
        rollout.Engine(cfg, params, **{**KW, "num_slots": 0})


def test_update_params_recompiles_nothing(model):
    cfg, params = model
    new = jax.tree.map(lambda x: x * 1.1 if x.ndim >= 2 else x, params)
    jax.block_until_ready(new)
    eng = rollout.Engine(cfg, params, **KW)
    prompts = prompts_of((6, 20), seed=15)
    eng.generate(prompts, GREEDY.replace(max_new_tokens=12))
    compiles, listening = [], [True]  # jax has no public unregister: the flag turns it off

    def listener(event, *args, **kw):
        if listening[0] and event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        before = eng.stats()["compiles"]
        eng.update_params(new)
        outs = eng.generate(prompts, GREEDY.replace(max_new_tokens=12))
    finally:
        listening[0] = False
    assert compiles == [] and eng.stats()["compiles"] == before
    assert [o.tokens for o in outs] == greedy_reference(cfg, new, prompts, 12)
    with pytest.raises(ValueError, match="expected"):
        eng.update_params(jax.tree.map(lambda x: x[..., :1] if x.ndim >= 2 else x, params))


def test_agent_threads_with_background_driver(model):
    """Four threads run two-turn sessions (tool 'latency' included) against a background
    driver; results equal the single-threaded ones."""
    cfg, params = model
    prompts = prompts_of((5, 8, 11, 14, 17, 6), seed=16)
    sp = GREEDY.replace(max_new_tokens=6)

    def agent(eng, p):
        sid = eng.start(p, sp, multi_turn=True)
        r1 = eng.wait(sid, timeout=60)
        time.sleep(0.02)  # the tool runs; other sessions keep decoding
        eng.append(sid, [3, 1, 4], then_resume=sp)
        r2 = eng.wait(sid, timeout=60)
        eng.release(sid)
        return r1.tokens, r2.tokens

    serial = [agent(rollout.Engine(cfg, params, **KW), p) for p in prompts[:1]]
    with rollout.Engine(cfg, params, **KW) as eng:
        eng.start_background()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            threaded = list(pool.map(lambda p: agent(eng, p), prompts))
        assert eng.stats()["free_slots"] == 4
    assert threaded[0] == serial[0]
    first = greedy_reference(cfg, params, prompts, 6)
    second = greedy_reference(cfg, params, [p + t1 + [3, 1, 4] for p, t1 in zip(prompts, first)], 6)
    assert threaded == list(zip(first, second))


@pytest.mark.parametrize("raise_errors", [True, False])
def test_a_failing_kernel_ends_only_its_sequences(model, raise_errors):
    """A kernel that cannot run (here: weights of the wrong shape, slipped past update_params)
    fails the sequences of that call; by default the driver raises EngineError, with
    raise_errors=False (servers) they get an "error" result. Either way the engine keeps serving."""
    cfg, params = model
    eng = rollout.Engine(cfg, params, raise_errors=raise_errors, **KW)
    paused = eng.start(prompts_of((5,), seed=17)[0], GREEDY.replace(max_new_tokens=2), multi_turn=True)
    assert eng.wait(paused).finish_reason == "length"
    good = eng._params
    eng._params = jax.tree.map(lambda x: x[..., :-1] if x.ndim >= 2 else x, good)
    if raise_errors:
        with pytest.raises(rollout.EngineError, match="prefill kernel failed.*raise_errors=False"):
            eng.generate(prompts_of((6, 7), seed=18), GREEDY.replace(max_new_tokens=3))
    else:
        bad = eng.generate(prompts_of((6, 7), seed=18), GREEDY.replace(max_new_tokens=3))
        assert [o.finish_reason for o in bad] == ["error", "error"] and "prefill kernel failed" in bad[0].error
    eng._params = good
    outs = eng.generate(prompts_of((6, 7), seed=18), GREEDY.replace(max_new_tokens=3))
    assert [o.tokens for o in outs] == greedy_reference(cfg, params, prompts_of((6, 7), seed=18), 3)
    eng.append(paused, [9], then_resume=GREEDY.replace(max_new_tokens=2))  # its cache survived
    assert eng.wait(paused).finish_reason == "length"
    eng.release(paused)


def test_engine_error_reaches_waiters_of_a_background_driver(model):
    """With a background driver the EngineError stops it and every wait() raises it, instead of
    the caller blocking or reading an error row; start_background() serves again."""
    cfg, params = model
    eng = rollout.Engine(cfg, params, **KW)
    eng.free_weights()
    eng.start_background()
    try:
        sid = eng.start(prompts_of((6,), seed=19)[0], GREEDY.replace(max_new_tokens=3))
        with pytest.raises(rollout.EngineError, match="weights were freed.*update_params"):
            eng.wait(sid, timeout=60)
        eng.update_params(params)
        eng.start_background()
        sid = eng.start(prompts_of((6,), seed=19)[0], GREEDY.replace(max_new_tokens=3))
        assert eng.wait(sid, timeout=60).tokens == greedy_reference(cfg, params, prompts_of((6,), seed=19), 3)[0]
    finally:
        eng.stop_background()


def test_engine_keeps_its_own_weights_when_the_train_step_donates(model):
    """The engine copies the weights it is given (cast to the compute dtype, on its own layout),
    so a train step that donates the state it was built from cannot delete them; a donated tree
    handed to update_params is refused with the fix in the message."""
    from reagent_jax.rl import objectives, train_step
    cfg, params = model
    optimizer = train_step.make_optimizer(train_step.OptimizerConfig(learning_rate=1e-2))
    state = train_step.init_state(jax.tree.map(jnp.copy, params), optimizer)
    eng = rollout.Engine(cfg, state.params, **KW)
    prompts = prompts_of((6, 9), seed=20)
    before = eng.generate(prompts, GREEDY.replace(max_new_tokens=4))
    step = train_step.make_train_step(objectives.SFTObjective(cfg), optimizer)
    tokens = np.asarray(prompts_of((12, 12), seed=21))
    batch = {"tokens": tokens, "attention_mask": np.ones_like(tokens), "loss_mask": np.ones_like(tokens)}
    old = state
    state, _ = step(state, batch)
    assert jax.tree.leaves(old.params)[0].is_deleted()  # donated
    again = eng.generate(prompts, GREEDY.replace(max_new_tokens=4))
    assert [o.tokens for o in again] == [o.tokens for o in before] and all(o.finish_reason == "length" for o in again)
    with pytest.raises(ValueError, match="deleted or donated.*update_params\\(state.params\\)"):
        eng.update_params(old.params)
    eng.update_params(state.params)
    outs = eng.generate(prompts, GREEDY.replace(max_new_tokens=4))
    assert [o.tokens for o in outs] == greedy_reference(cfg, state.params, prompts, 4)


def test_default_shape_buckets(model):
    cfg, params = model
    eng = rollout.Engine(cfg, params, num_slots=4, max_len=3000, prefill_chunk=512, max_prefill_rows=8)
    assert eng.length_buckets == (32, 128, 512) and eng.row_buckets == (1, 2, 4)  # rows capped by the slots
    assert eng.window_buckets == (256, 1024, 3000)
    assert rollout.geometric_buckets(1, 8) == (1, 2, 4, 8) and rollout.geometric_buckets(256, 100, 4) == (100,)
    with pytest.raises(ValueError, match="largest length bucket 64 must be >= prefill_chunk=512"):
        rollout.Engine(cfg, params, num_slots=4, max_len=3000, prefill_chunk=512, length_buckets=(64,))


def test_bf16_engine_runs_on_cpu(model):
    """bf16 compute on CPU (issue: XLA:CPU has no bf16 x bf16 -> f32 kernel for the batched
    attention products, so two ~443-token rows failed every call): the engine holds bf16 weights
    and its first-token logprobs stay within bf16 rounding of the fp32 engine's."""
    cfg, params = model
    cfg16 = cfg.replace(compute_dtype="bfloat16")
    prompts = prompts_of((443, 421), seed=22)
    kw = dict(KW, max_len=512, window_buckets=(512,))
    eng16 = rollout.Engine(cfg16, params, **kw)
    assert {x.dtype for x in jax.tree.leaves(eng16._params)} == {jnp.dtype(jnp.bfloat16)}
    outs16 = eng16.generate(prompts, GREEDY.replace(max_new_tokens=3))
    outs32 = rollout.Engine(cfg, params, **kw).generate(prompts, GREEDY.replace(max_new_tokens=3))
    assert [o.finish_reason for o in outs16] == ["length", "length"]
    for a, b in zip(outs16, outs32):
        assert abs(a.logprobs[0] - b.logprobs[0]) < 0.5 and np.isfinite(a.logprobs).all()  # bf16 logits: ~0.2 off


@pytest.mark.parametrize("platform", ["gpu", "tpu", "tpu positions-minor"])
def test_accelerator_cache_orders_give_the_same_tokens(model, monkeypatch, platform):
    """The accelerator KV-cache order [L, N, S, K, D] (`kernels.kv_layout`), run here on CPU by
    forcing it: with XLA attention (GPU) and with TPU's ragged decode kernel (Pallas interpret
    mode), also as XLA:TPU lays out a cache with few heads per chip (positions second-minor: a
    scatter per head, the kernel reading the [L, N, K, S, D] view). Prefill, fused decode and a
    multi-turn append give the greedy tokens of models.forward, as the CPU order does."""
    from reagent_jax.kernels import attention, kv_layout
    platform, _, minor = platform.partition(" ")
    monkeypatch.setattr(kv_layout, "order", lambda mesh: kv_layout.ORDERS[platform])
    monkeypatch.setattr(kv_layout, "positions_minor", lambda dtype, heads, on: bool(minor))
    if platform == "tpu":
        monkeypatch.setattr(attention, "choose_decode", lambda impl, mesh: "ragged")
    jax.clear_caches()  # the same shapes as the other case: trace again with this kernel choice
    cfg, params = model
    eng = rollout.Engine(cfg, params, **KW)
    sizes = {"l": cfg.num_layers, "n": KW["num_slots"], "s": KW["max_len"], "k": cfg.num_kv_heads, "d": cfg.head_dim}
    assert eng._cache[0].shape == tuple(sizes[a] for a in kv_layout.ORDERS[platform])
    # the ragged kernel reads each slot up to its own length: decode runs over the whole cache
    assert eng.decode_windows == ((KW["max_len"],) if platform == "tpu" else eng.window_buckets)
    prompts = prompts_of((5, 40, 9), seed=23)
    outs = eng.generate(prompts, GREEDY.replace(max_new_tokens=12))
    assert [o.tokens for o in outs] == greedy_reference(cfg, params, prompts, 12)
    sid = eng.start(prompts[0], GREEDY.replace(max_new_tokens=4), multi_turn=True)
    first = eng.wait(sid).tokens
    eng.append(sid, [7, 8, 9], then_resume=GREEDY.replace(max_new_tokens=4))
    second = eng.wait(sid).tokens
    assert first + [7, 8, 9] + second == greedy_reference(cfg, params, [prompts[0]], 4)[0] + [7, 8, 9] + \
        greedy_reference(cfg, params, [prompts[0] + greedy_reference(cfg, params, [prompts[0]], 4)[0] + [7, 8, 9]], 4)[0]
    eng.release(sid)
