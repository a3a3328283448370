"""A paged KV cache (`kernels.kv_pages`, `rollout.pages`): the paged engine gives the contiguous
engine's tokens and logprobs (which equal the step-by-step argmax of models.forward and the
trainer's logprobs, tests/rollout/test_engine.py), with a pool too small for every slot at
max_len, on one and on 8 simulated devices, and with TPU's ragged kernel reading the pages."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import models, rollout
from reagent_jax.kernels import kv_layout, kv_pages
from reagent_jax.rollout import RolloutConfig, SamplingParams
from reagent_jax.rollout.pages import PageTable
from tests.multidevice import run_with_devices
from tests.rollout.test_engine import GREEDY, KW, greedy_reference, padded, prompts_of

PAGED = dict(KW, kv_page_size=32)  # max_len 160 = 5 pages a slot; windows 64 and 160


@pytest.fixture(scope="module")
def model(peaked_tiny_model):
    return peaked_tiny_model


# ---- the host's block table -------------------------------------------------------------------

def test_page_table_reserves_trims_and_releases_per_shard():
    t = PageTable(num_slots=4, max_len=64, page_size=16, num_pages=6, shards=2)  # slots 0-1 | 2-3, pages 0-2 | 3-5
    assert t.reserve(0, 17) and t.table[0].tolist() == [0, 1, 6, 6]  # 2 pages of shard 0; 6 = none
    assert t.reserve(2, 48) and t.table[2].tolist() == [3, 4, 5, 6]
    assert not t.reserve(1, 33) and t.held(1) == 0  # shard 0 has one page left: nothing taken
    assert not t.reserve(3, 1)  # shard 1 is full
    assert t.reserve(1, 16) and t.table[1, 0] == 2
    assert t.reserve(0, 20) and t.held(0) == 2  # already held: no-op
    t.trim(2, 17)  # keeps the pages of its first 17 positions
    assert t.table[2].tolist() == [3, 4, 6, 6] and t.reserve(3, 16) and t.table[3, 0] == 5
    assert not t.reserve(3, 1000) and t.held(3) == 1  # capped at the table's 4 pages: 3 more, none free
    for slot in range(4):
        t.release(slot)
    assert t.free_pages() == 6 and (t.table == 6).all()
    with pytest.raises(ValueError, match="must divide max_len"):
        PageTable(4, 60, 16, 8)
    with pytest.raises(ValueError, match="multiples of the 2 data shards"):
        PageTable(4, 64, 16, 7, shards=2)


def test_live_pages_are_shared_by_prompts_that_begin_with_them():
    t = PageTable(num_slots=3, max_len=64, page_size=4, num_pages=12)
    a = list(range(10))  # pages [0-3] [4-7], then 2 tokens
    assert t.share_prefix(0, a) == 0 and t.reserve(0, 12)
    t.publish(0, a, written=6)  # page 0 written, page 1 half: only page 0 is offered
    assert t.share_prefix(1, a + [99]) == 4 and t.table[1, 0] == t.table[0, 0]
    t.release(1)
    t.publish(0, a, written=10)
    b = a[:8] + [50, 51, 52]
    assert t.share_prefix(1, b) == 8 and t.table[1, :2].tolist() == t.table[0, :2].tolist()
    assert t.share_prefix(2, a[:8]) == 4  # the last token is always computed: page 1 would cover it
    assert t.reserve(1, 16) and t.table[1, 2] not in t.table[0]  # its own page after the shared ones
    t.release(0)  # the publisher leaves: the sharers keep pages 0 and 1
    assert t.free_pages() == 12 - 4
    t.release(2)
    t.release(1)
    assert t.free_pages() == 12 and not t._index and not t._key_of
    # a freed page reused for other tokens matches nothing of the old prefix
    assert t.reserve(0, 8) and t.share_prefix(1, a) == 0


@pytest.mark.parametrize("order", ["lnksd", "lnskd", "lnskd positions-minor"])
def test_gather_and_scatter_are_the_block_table_in_numpy(monkeypatch, order):
    """Both cache orders, and the accelerator order of a pool that XLA:TPU lays out positions
    second-minor (gathered and scattered through its [L, P, K, page, D] view): the same values."""
    order, _, minor = order.partition(" ")
    monkeypatch.setattr(kv_layout, "order", lambda mesh: order)
    monkeypatch.setattr(kv_layout, "positions_minor", lambda dtype, heads, platform: bool(minor))
    rng = np.random.default_rng(0)
    L, P, page, K, D = 2, 5, 4, 3, 2
    pool = rng.normal(size=(L, P, page, K, D) if order == "lnskd" else (L, P, K, page, D)).astype(np.float32)
    table = np.array([[3, 0, 5], [1, 5, 5]], np.int32)  # 5 = no page
    window = np.asarray(kv_pages.gather(jnp.asarray(pool), jnp.asarray(table)))
    as_lnskd = pool if order == "lnskd" else pool.transpose(0, 1, 3, 2, 4)  # [L, P, page, K, D]
    want = np.zeros((L, 2, 3 * page, K, D), np.float32)
    for b in range(2):
        for j, p in enumerate(table[b]):
            if p < P:
                want[:, b, j * page:(j + 1) * page] = as_lnskd[:, p]
    np.testing.assert_array_equal(window, want if order == "lnskd" else want.transpose(0, 1, 3, 2, 4))
    back = np.asarray(kv_pages.scatter(jnp.zeros(pool.shape), jnp.asarray(window * 2), jnp.asarray(table)))
    touched = np.zeros(P, bool)
    touched[[3, 0, 1]] = True
    np.testing.assert_array_equal(back[:, touched], 2 * pool[:, touched])
    assert not back[:, ~touched].any()  # no page of the empty id was written


# ---- the engine --------------------------------------------------------------------------------

def test_paged_engine_equals_contiguous_engine_and_forward(model):
    """Five prompts (one longer than the prefill chunk) through four slots with a pool of 8
    pages: each turn reserves 2-4 of them, so only two or three run at once and the others
    wait for pages; tokens are the contiguous engine's and models.forward's argmax."""
    cfg, params = model
    prompts = prompts_of((5, 17, 40, 9, 3))
    contiguous = rollout.Engine(cfg, params, **KW).generate(prompts, GREEDY)
    eng = rollout.Engine(cfg, params, **PAGED, kv_pages=8)
    outs = eng.generate(prompts, GREEDY)
    assert [o.tokens for o in outs] == [o.tokens for o in contiguous] == greedy_reference(cfg, params, prompts, 64)
    st = eng.stats()
    assert st["page_waits"] > 0 and st["kv_pages"] == 8 and st["kv_pages_free"] == 8
    assert eng._cache[0].shape == kv_layout.cache_shape(cfg, 8, 32)  # the pool, not 4 x 160


def test_samples_of_one_prompt_prefill_it_once(model):
    """GRPO's shape: 4 samples of one 70-token prompt (and two other prompts). The first
    prefills the prompt; the others wait one round and map its 2 full pages, so 3 x 64
    positions are never computed; tokens and logprobs are the contiguous engine's."""
    cfg, params = model
    rng = np.random.default_rng(0)
    base = rng.integers(0, 512, 70).tolist()
    prompts = [base] * 4 + [base[:40] + [1, 2, 3], rng.integers(0, 512, 9).tolist()]
    sps = [SamplingParams(temperature=1.0, max_new_tokens=30, seed=i) for i in range(len(prompts))]
    contiguous = rollout.Engine(cfg, params, **KW).generate(prompts, sps)
    eng = rollout.Engine(cfg, params, **PAGED)
    outs = eng.generate(prompts, sps)
    assert [o.tokens for o in outs] == [o.tokens for o in contiguous]
    for a, b in zip(outs, contiguous):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)
    st = eng.stats()
    assert st["prefix_shared_tokens"] == 3 * 64
    assert st["prefill_tokens"] + st["prefix_shared_tokens"] == sum(map(len, prompts))
    assert st["kv_pages_free"] == st["kv_pages"]
    # a multi-turn session on shared pages writes its next turn into pages of its own
    sids = [eng.start(base, GREEDY.replace(max_new_tokens=5), multi_turn=True) for _ in range(2)]
    firsts = [eng.wait(sid).tokens for sid in sids]
    eng.append(sids[1], [7, 8, 9], then_resume=GREEDY.replace(max_new_tokens=5))
    second = eng.wait(sids[1]).tokens
    assert firsts[0] == firsts[1] == greedy_reference(cfg, params, [base], 5)[0]
    assert second == greedy_reference(cfg, params, [base + firsts[1] + [7, 8, 9]], 5)[0]
    eng.append(sids[0], [7, 8, 9], then_resume=GREEDY.replace(max_new_tokens=5))
    assert eng.wait(sids[0]).tokens == second  # the other holder's cache was not touched
    for sid in sids:
        eng.release(sid)
    assert eng.stats()["kv_pages_free"] == eng.stats()["kv_pages"]


@pytest.mark.parametrize("sp", [SamplingParams(temperature=1.0, max_new_tokens=40, seed=1),
                                SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=40, seed=2)])
def test_paged_sampling_and_logprobs_equal_the_trainers(model, sp):
    cfg, params = model
    prompts = prompts_of((7, 21, 33), seed=3)
    contiguous = rollout.Engine(cfg, params, **KW).generate(prompts, sp)
    outs = rollout.Engine(cfg, params, **PAGED).generate(prompts, sp)
    assert [o.tokens for o in outs] == [o.tokens for o in contiguous]
    seqs = [p + o.tokens for p, o in zip(prompts, outs)]
    ref = np.asarray(models.token_logprobs(cfg, params, *padded(seqs), temperature=sp.temperature))
    for i, (p, o) in enumerate(zip(prompts, outs)):
        np.testing.assert_allclose(o.logprobs, ref[i, len(p):len(p) + len(o.tokens)], atol=1e-4)


def test_multi_turn_sessions_trim_their_pages_and_resume(model):
    """A paused session keeps only its tokens' pages; its next turn reserves again (waiting
    while the pool is short) and continues from its cache as the contiguous engine does."""
    cfg, params = model
    prompt = prompts_of((12,), seed=5)[0]
    runs = []
    for kw in (KW, dict(PAGED, kv_pages=6)):
        eng = rollout.Engine(cfg, params, **kw)
        sid = eng.start(prompt, GREEDY.replace(max_new_tokens=30), multi_turn=True)  # 42 positions: 2 pages
        r1 = eng.wait(sid)
        if "kv_pages" in kw:
            assert eng.stats()["kv_pages_free"] == 6 - 2
            # another session takes 3 pages meanwhile (80 positions)
            other = eng.start(prompts_of((20,), seed=9)[0], GREEDY.replace(max_new_tokens=60), multi_turn=True)
            eng.wait(other)
            assert eng.stats()["kv_pages_free"] == 6 - 2 - 3  # trimmed to its 81 tokens: 3 pages
        eng.append(sid, [1, 2, 3], then_resume=GREEDY.replace(max_new_tokens=60))
        if "kv_pages" in kw:
            eng.step()  # 45 tokens + 60 to draw need 4 pages: it holds 2 and 1 is free, so it waits
            assert eng.stats()["prefill"] == 1 and eng.stats()["page_waits"] > 0
            eng.release(other)
        r2 = eng.wait(sid)
        runs.append((r1.tokens, r2.tokens))
        eng.release(sid)
        if "kv_pages" in kw:
            assert eng.stats()["kv_pages_free"] == 6
    assert runs[0] == runs[1]


@pytest.mark.parametrize("raise_errors", [True, False])
def test_turns_that_wait_for_each_others_pages_fail_loudly(model, raise_errors):
    """Three paused sessions hold the whole pool (2 pages each) and all resume wanting more: no
    turn can ever run, so they end with an error naming kv_pages instead of hanging."""
    cfg, params = model
    eng = rollout.Engine(cfg, params, **PAGED, kv_pages=6, raise_errors=raise_errors)
    sids = [eng.start(p, GREEDY.replace(max_new_tokens=30), multi_turn=True) for p in prompts_of((12, 12, 12), seed=4)]
    for sid in sids:
        eng.wait(sid)
    assert eng.stats()["kv_pages_free"] == 0
    for sid in sids:
        eng.append(sid, [1, 2, 3], then_resume=GREEDY.replace(max_new_tokens=60))  # 105 positions: 4 pages each
    if raise_errors:
        with pytest.raises(rollout.EngineError, match="KV page pool exhausted: 3 turn"):
            eng.wait(sids[0])
    results = [eng.wait(sid) for sid in sids]
    assert all(r.finish_reason == "error" and "raise kv_pages" in r.error for r in results)
    assert eng.stats()["kv_pages_free"] == 6  # their pages went back


def test_a_queued_turn_holding_its_pages_runs_before_a_blocked_head(model):
    """Nothing decodes; the head of the queue needs pages that the turn behind it holds: that
    turn runs out of order (rather than both waiting forever), and the head runs once its
    caller releases it."""
    cfg, params = model
    a_prompt, b_prompt = prompts_of((12, 12), seed=8)
    ref = rollout.Engine(cfg, params, **KW)
    eng = rollout.Engine(cfg, params, **PAGED, kv_pages=6)
    runs = {}
    for e in (ref, eng):
        a, b = (e.start(p, GREEDY.replace(max_new_tokens=30), multi_turn=True) for p in (a_prompt, b_prompt))
        e.wait(a), e.wait(b)
        e.append(a, [1, 2, 3], then_resume=GREEDY.replace(max_new_tokens=100))  # 145 positions: 5 pages, 2 free
        e.append(b, [4, 5, 6], then_resume=GREEDY.replace(max_new_tokens=10))  # 55: the 2 pages it holds
        second_b = e.wait(b).tokens
        e.release(b)
        runs[e is eng] = (second_b, e.wait(a).tokens)
    assert runs[True] == runs[False] and len(runs[True][1]) == 100


def test_a_turn_larger_than_the_pool_is_refused_at_once(model):
    cfg, params = model
    eng = rollout.Engine(cfg, params, **PAGED, kv_pages=4)
    with pytest.raises(ValueError, match=r"need 5 KV pages of 32 positions, but the pool holds 4 per data shard"):
        eng.start(prompts_of((40,))[0], GREEDY.replace(max_new_tokens=100))
    with pytest.raises(ValueError, match="must divide every attention window bucket"):
        rollout.Engine(cfg, params, **dict(KW, kv_page_size=48))
    with pytest.raises(ValueError, match="kv_pages needs kv_page_size"):
        rollout.Engine(cfg, params, **KW, kv_pages=4)


def test_ragged_kernel_reads_the_pages_in_place(model, monkeypatch):
    """TPU's decode kernel (Pallas interpret mode) over the pool with the block table: no window
    is gathered (decode runs at window max_len), and the tokens are forward's argmax."""
    from reagent_jax.kernels import attention
    cfg, params = model
    prompts = prompts_of((5, 40, 9), seed=23)
    sp = GREEDY.replace(max_new_tokens=12)
    fp8_xla = rollout.Engine(cfg, params, **KW, cache_dtype="float8_e4m3fn").generate(prompts, sp)
    monkeypatch.setattr(kv_layout, "order", lambda mesh: kv_layout.ORDERS["tpu"])
    monkeypatch.setattr(attention, "choose_decode", lambda impl, mesh: "ragged")
    jax.clear_caches()
    eng = rollout.Engine(cfg, params, **PAGED, kv_pages=10)
    outs = eng.generate(prompts, sp)
    assert [o.tokens for o in outs] == greedy_reference(cfg, params, prompts, 12)
    assert all(s.startswith("decode[4,w160]") for s in eng.stats()["kernel_shapes"] if s.startswith("decode"))
    # an fp8 pool: the kernel computes in the query's dtype, as XLA attention over an fp8 cache does
    fp8 = rollout.Engine(cfg, params, **PAGED, kv_pages=10, cache_dtype="float8_e4m3fn").generate(prompts, sp)
    assert [o.tokens for o in fp8] == [o.tokens for o in fp8_xla]
    for a, b in zip(fp8, fp8_xla):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    # as XLA:TPU lays out an fp8 pool with < 4 heads per chip: pages written head by head and
    # read through the [L, P, K, page, D] view (kv_layout.positions_minor)
    monkeypatch.setattr(kv_layout, "positions_minor", lambda dtype, heads, platform: True)
    jax.clear_caches()
    minor = rollout.Engine(cfg, params, **PAGED, kv_pages=10, cache_dtype="float8_e4m3fn").generate(prompts, sp)
    assert [(o.tokens, o.logprobs) for o in minor] == [(o.tokens, o.logprobs) for o in fp8]
    jax.clear_caches()


def test_rollout_config_paging_fields():
    r = RolloutConfig.from_config(dict(max_len=1024, kv_page_size=128, kv_pages=40), "rollout")
    assert r.engine_kwargs()["kv_page_size"] == 128 and r.engine_kwargs()["kv_pages"] == 40
    assert "kv_page_size" not in RolloutConfig().engine_kwargs()
    assert RolloutConfig(kv_page_size=128).engine_kwargs()["kv_pages"] is None  # the contiguous size
    with pytest.raises(Exception, match="kv_page_size=100: must divide max_len=1024"):
        RolloutConfig.from_config(dict(max_len=1024, kv_page_size=100), "rollout")
    with pytest.raises(Exception, match="kv_pages=8: needs kv_page_size > 0"):
        RolloutConfig.from_config(dict(kv_pages=8), "rollout")
    assert RolloutConfig(kv_dtype="float8_e4m3fn").engine_kwargs()["cache_dtype"] == "float8_e4m3fn"
    with pytest.raises(Exception, match="kv_dtype='int4'"):
        RolloutConfig.from_config(dict(kv_dtype="int4"), "rollout")


def test_paged_engine_on_eight_devices_matches_one_device():
    """Slots and pages split over data 4 (each slot's 4 pages on its own shard), heads over tensor 2;
    against one device with half the pool (turns wait for pages there)."""
    setup = """
import json, jax, numpy as np
from reagent_jax import models, parallel, rollout
cfg = models.preset("tiny", compute_dtype="float32")
params = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, models.init_params(cfg, jax.random.PRNGKey(0)))
prompts = [np.random.default_rng(i).integers(0, 512, n).tolist() for i, n in enumerate((5, 19, 40, 8, 12))]
KW = dict(num_slots=4, max_len=96, prefill_chunk=32, length_buckets=(32,), row_buckets=(4,), window_buckets=(32,),
          decode_steps=4, kv_page_size=32, kv_pages=16)
sps = [rollout.SamplingParams(temperature=0.0, max_new_tokens=40),
       rollout.SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=40, seed=3)]
"""
    res = run_with_devices(setup + """
mesh = parallel.make_mesh(data=1, fsdp=4, tensor=2)
eng = rollout.Engine(cfg, jax.device_put(params, models.param_shardings(cfg, mesh)), mesh=mesh, **KW)
outs = [eng.generate(prompts, sp) for sp in sps]
print(json.dumps({"tokens": [[o.tokens for o in out] for out in outs], "logprobs": [[o.logprobs for o in out] for out in outs],
                  "pool_spec": (list(eng._cache[0].sharding.spec) + [None] * 5)[:5], "shards": eng._pages.shards,
                  "table": eng._pages.table.tolist(), "free": eng.stats()["kv_pages_free"]}))
""")
    scope = {}
    exec(setup, scope)
    eng = rollout.Engine(scope["cfg"], scope["params"], **{**scope["KW"], "kv_pages": 8})
    for i, sp in enumerate(scope["sps"]):
        outs = eng.generate(scope["prompts"], sp)
        assert res["tokens"][i] == [o.tokens for o in outs]
        for a, b in zip(res["logprobs"][i], outs):
            np.testing.assert_allclose(a, b.logprobs, atol=1e-4)
    assert res["pool_spec"] == [None, "data", "tensor", None, None]  # [L, P, K, page, D]
    assert res["shards"] == 4 and res["free"] == 16
