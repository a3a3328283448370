"""The fp32 CPU GEMM through OpenBLAS (kernels/cpu/gemm.py): values and gradients against NumPy,
the model on that path against transformers and against XLA's own GEMM, and the fallbacks; the
decode projection kernel (`vocab_logits`) against NumPy and in the engine's sampler."""
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import models
from reagent_jax.kernels.cpu import gemm as cpu_gemm
from reagent_jax.models.functional import forward, token_logprobs
from tests.conftest import hf_logits

pytestmark = pytest.mark.skipif(not cpu_gemm.usable(jnp.zeros((cpu_gemm.MIN_ROWS, 2)), jnp.zeros((2, 2))),
                                reason="OpenBLAS GEMM unavailable (no scipy-openblas64 or no C++ compiler)")


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (3, 5, 7), (129, 3, 64), (257, 1001, 64), (1000, 130, 33)])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False), (True, True)])
def test_matmul_values_and_gradients_match_numpy(m, n, k, trans_a, trans_b):
    """Both split directions (n >= m: columns, else rows), odd extents, every transpose flag; the
    gradients (themselves this GEMM, transposed) against float64 NumPy."""
    rng = np.random.default_rng(m * 7 + n)
    a = _rand(rng, *((k, m) if trans_a else (m, k)))
    b = _rand(rng, *((n, k) if trans_b else (k, n)))
    g = _rand(rng, m, n)
    op_a = a.T.astype(np.float64) if trans_a else a.astype(np.float64)
    op_b = b.T.astype(np.float64) if trans_b else b.astype(np.float64)
    out = jax.jit(cpu_gemm.matmul, static_argnums=(2, 3))(a, b, trans_a, trans_b)
    np.testing.assert_allclose(np.asarray(out), op_a @ op_b, rtol=1e-5, atol=1e-4)
    da, db = jax.grad(lambda a, b: (cpu_gemm.matmul(a, b, trans_a, trans_b) * g).sum(), (0, 1))(a, b)
    da_ref, db_ref = g @ op_b.T, op_a.T @ g
    np.testing.assert_allclose(np.asarray(da), da_ref.T if trans_a else da_ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(db), db_ref.T if trans_b else db_ref, rtol=1e-5, atol=1e-4)


def test_second_order_gradient_matches_einsum():
    rng = np.random.default_rng(0)
    x, w = _rand(rng, 40, 6), _rand(rng, 6, 5)

    def hess_diag(mm):
        def f(x):
            return jnp.tanh(mm(x, w)).sum()
        return jax.grad(lambda x: (jax.grad(f)(x) ** 2).sum())(x)

    np.testing.assert_allclose(hess_diag(cpu_gemm.matmul), hess_diag(jnp.matmul), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("eq,x_shape,w_shape", [
    ("bte,ehd->bthd", (3, 50, 16), (16, 4, 8)),
    ("bthd,hde->bte", (3, 50, 4, 8), (4, 8, 16)),
    ("btf,fe->bte", (2, 70, 24), (24, 16)),
])
def test_contract_is_the_einsum(eq, x_shape, w_shape):
    n = cpu_gemm.leading_contraction(eq)
    rng = np.random.default_rng(1)
    x, w = _rand(rng, *x_shape), _rand(rng, *w_shape)
    g = _rand(rng, *jnp.einsum(eq, x, w).shape)
    ours = jax.value_and_grad(lambda x, w: (cpu_gemm.contract(x, w, n) * g).sum(), (0, 1))(x, w)
    ref = jax.value_and_grad(lambda x, w: (jnp.einsum(eq, x, w, precision="highest") * g).sum(), (0, 1))(x, w)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-4)
    for a, b in zip(ours[1], ref[1]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_contract_rows_and_vmap():
    rng = np.random.default_rng(2)
    x, emb = _rand(rng, 4, 40, 8), _rand(rng, 300, 8)
    ref = np.einsum("bte,ve->btv", x, emb)
    np.testing.assert_allclose(jax.jit(cpu_gemm.contract_rows)(x, emb), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.vmap(cpu_gemm.contract_rows, (0, None))(x, emb), ref, rtol=1e-5, atol=1e-5)


def test_concurrent_gemms_in_one_program():
    """Independent GEMMs that XLA may run at the same time, each splitting over the same pool."""
    rng = np.random.default_rng(3)
    xs = [_rand(rng, 300, 64) for _ in range(4)]
    w = _rand(rng, 64, 500)
    outs = jax.jit(lambda *xs: [cpu_gemm.matmul(x, w) for x in xs])(*xs)
    for x, o in zip(xs, outs):
        np.testing.assert_allclose(o, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("eq,expected", [
    ("bte,ehd->bthd", 1), ("bthd,hde->bte", 2), ("btf,fe->bte", 1), ("bte,ekd->btkd", 1),
    ("bkms,bksd->bkmd", None),  # batched attention: not a weight contraction
    ("...e,ve->...v", None), ("bte,ef->bft", None), ("bte,ee->bte", None), ("nonsense", None),
])
def test_leading_contraction(eq, expected):
    assert cpu_gemm.leading_contraction(eq) == expected


def test_usable_only_for_like_for_like_cases(monkeypatch):
    big, w = jnp.zeros((2, cpu_gemm.MIN_ROWS, 4)), jnp.zeros((4, 3))
    assert cpu_gemm.usable(big, w)
    assert not cpu_gemm.usable(big[:, :10], w)  # decode-sized: XLA's fused small GEMMs win
    assert not cpu_gemm.usable(big.astype(jnp.bfloat16), w)
    assert not cpu_gemm.usable(big, w.astype(jnp.bfloat16))
    assert not cpu_gemm.usable(big, jnp.zeros((4, 0)))

    class Mesh2:  # a 2-device mesh of this host's CPU
        size = 2
        devices = np.array(jax.devices()[:1] * 2)
    assert not cpu_gemm.usable(big, w, mesh=Mesh2())
    # "bthd,hde": rows are b*t, not b*t*h
    assert not cpu_gemm.usable(jnp.zeros((1, 100, 4, 8)), jnp.zeros((4, 8, 3)), n_contract=2)
    monkeypatch.setenv("REAGENT_CPU_GEMM", "xla")
    assert not cpu_gemm.usable(big, w)
    monkeypatch.setenv("REAGENT_CPU_GEMM", "fast")
    with pytest.raises(ValueError, match="REAGENT_CPU_GEMM='fast'.*auto, blas, xla"):
        cpu_gemm.usable(big, w)


def test_unavailable_blas_falls_back_or_fails_clearly(monkeypatch, tmp_path, caplog):
    """A missing compiler: `auto` logs why and uses XLA; `blas` is an error naming the cause."""
    monkeypatch.setenv("REAGENT_CACHE_DIR", str(tmp_path))  # nothing compiled there yet
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    load = cpu_gemm._library.__wrapped__  # the uncached body; the process's registration stays as is
    with caplog.at_level(logging.INFO, logger="reagent_jax.kernels.cpu.gemm"):
        assert load() is None
    assert "no-such-compiler" in caplog.text
    monkeypatch.setenv("REAGENT_CPU_GEMM", "blas")
    with pytest.raises(RuntimeError, match="REAGENT_CPU_GEMM=blas.*no-such-compiler"):
        load()


def test_compile_failure_reports_the_compiler_output(monkeypatch, tmp_path):
    monkeypatch.setenv("REAGENT_CACHE_DIR", str(tmp_path))
    bad = tmp_path / "bad.cc"
    bad.write_text("this is not C++\n")
    monkeypatch.setattr(cpu_gemm, "_SOURCES", (cpu_gemm._SOURCES[0], bad))
    with pytest.raises(RuntimeError, match="compiling the CPU kernels failed.*bad.cc"):
        cpu_gemm._compile()
    assert not list(tmp_path.glob("*.so"))  # nothing half-written is left to be loaded later


def test_compiled_library_is_keyed_by_the_compiler_command(monkeypatch, tmp_path):
    """A library built by another compiler command (or other flags) is never reused for this one."""
    monkeypatch.setenv("REAGENT_CACHE_DIR", str(tmp_path))
    first = cpu_gemm._compile()
    assert cpu_gemm._compile() == first  # built once, then reused
    monkeypatch.setenv("CXX", "g++")
    assert cpu_gemm._compile() != first


def _xla_path(fn, monkeypatch):
    """Runs fn with the OpenBLAS path off (a fresh trace, so no cached executable is reused)."""
    monkeypatch.setenv("REAGENT_CPU_GEMM", "xla")
    try:
        return fn()
    finally:
        monkeypatch.setenv("REAGENT_CPU_GEMM", "auto")


@pytest.mark.parametrize("tied", [False, True])
def test_model_on_the_blas_path_matches_transformers(hf_qwen3, monkeypatch, tied):
    """150 rows per GEMM (>= MIN_ROWS), so q/k/v/o, the MLP and the projection take OpenBLAS; the
    logits equal transformers' and XLA's path, padded rows included."""
    path, hf = hf_qwen3(tie_word_embeddings=tied)
    cfg, params = models.load_hf_checkpoint(path, dtype=jnp.float32)
    rng = np.random.default_rng(4)
    tokens = rng.integers(0, cfg.vocab_size, (3, 50))
    mask = (np.arange(50)[None] < np.array([50, 31, 7])[:, None]).astype(np.int32)
    hlo = forward.lower(cfg, params, tokens, attention_mask=mask).as_text()
    assert hlo.count("reagent_sgemm") == 8  # q, k, v, o, gate, up, down (the scanned layer) + the projection
    ours = np.asarray(forward(cfg, params, tokens, attention_mask=mask))
    ref = hf_logits(hf, tokens, attention_mask=mask)
    for b, n in enumerate([50, 31, 7]):
        np.testing.assert_allclose(ours[b, :n], ref[b, :n], atol=1e-4, rtol=0)
    xla = _xla_path(lambda: np.asarray(jax.jit(forward.__wrapped__, static_argnames="cfg")(
        cfg, params, tokens, attention_mask=mask)), monkeypatch)
    np.testing.assert_allclose(ours, xla, atol=1e-5, rtol=0)


def test_training_gradients_match_the_xla_path(hf_qwen3, monkeypatch):
    path, _ = hf_qwen3()
    cfg, params = models.load_hf_checkpoint(path, dtype=jnp.float32)
    tokens = np.random.default_rng(5).integers(0, cfg.vocab_size, (2, 80))

    def grads():
        def loss(p):
            return token_logprobs.__wrapped__(cfg, p, tokens, chunk_size=32).sum()
        return jax.jit(jax.value_and_grad(loss))(params)

    ours = grads()
    ref = _xla_path(grads, monkeypatch)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-5)
    for path_, a in jax.tree_util.tree_leaves_with_path(ours[1]):
        b = dict(jax.tree_util.tree_leaves_with_path(ref[1]))[path_]
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path_))


_VOCAB_KERNEL = cpu_gemm.vocab_logits_usable(jnp.zeros((4, 2)), jnp.zeros((1, 2)))
needs_vocab_kernel = pytest.mark.skipif(not _VOCAB_KERNEL, reason="vocab_logits kernel needs an AVX-512 CPU")


@needs_vocab_kernel
@pytest.mark.parametrize("v,k", [(1003, 67), (8, 256), (129, 16)])
@pytest.mark.parametrize("b", [1, 5, 16, 17, 32, 33, 64])
def test_vocab_logits_matches_numpy(v, k, b):
    """Every register tile (one or two vectors of rows), row groups of 32, and the tails: vocab
    rows not a multiple of the tile or of the chunk, hidden sizes not a multiple of the unrolled
    block. The chunk statistics equal the sampler's own (`chunk_stats`) on the kernel's logits,
    at each row's temperature (greedy rows at 1, and a tiny temperature)."""
    from reagent_jax.rollout.sampling import CHUNK, chunk_stats, inverse_temperature
    rng = np.random.default_rng(v + k + b)
    w, h = _rand(rng, v, k), _rand(rng, b, k)
    temperature = jnp.asarray(rng.choice([0.0, 0.3, 1.0, 2.5, 1e-6], b), jnp.float32)
    inv_t = inverse_temperature(temperature)
    out, cmax, csum = jax.jit(cpu_gemm.vocab_logits, static_argnums=3)(w, h, inv_t, CHUNK)
    assert out.shape == (v, b) and cmax.shape == csum.shape == (-(-v // CHUNK), b)
    np.testing.assert_allclose(out, w.astype(np.float64) @ h.T.astype(np.float64), rtol=1e-5, atol=1e-4)
    ref_max, ref_sum = chunk_stats(out, inv_t)
    np.testing.assert_array_equal(cmax, ref_max)
    np.testing.assert_allclose(csum, ref_sum, rtol=2e-6)
    assert np.all(np.asarray(csum) >= 1.0)  # each chunk's maximum contributes exp(0) = 1 exactly


@needs_vocab_kernel
@pytest.mark.parametrize("chunk", [1, 8, 100, 600])
def test_vocab_logits_statistics_for_any_chunk(chunk):
    from reagent_jax.rollout.sampling import inverse_temperature
    rng = np.random.default_rng(chunk)
    w, h = _rand(rng, 517, 24), _rand(rng, 3, 24)
    inv_t = inverse_temperature(jnp.asarray([1.0, 0.5, 0.0]))
    out, cmax, csum = jax.jit(cpu_gemm.vocab_logits, static_argnums=3)(w, h, inv_t, chunk)
    c = -(-517 // chunk)
    pad = np.full((c * chunk, 3), -np.inf)
    pad[:517] = np.asarray(out, np.float64)
    p3 = pad.reshape(c, chunk, 3)
    np.testing.assert_array_equal(cmax, p3.max(1))
    np.testing.assert_allclose(csum, np.exp((p3 - p3.max(1)[:, None]) * np.asarray(inv_t, np.float64)).sum(1), rtol=2e-6)


@needs_vocab_kernel
def test_vocab_logits_usable_only_where_it_applies(monkeypatch):
    w, h = jnp.zeros((300, 8)), jnp.zeros((16, 8))
    assert cpu_gemm.vocab_logits_usable(w, h)
    assert not cpu_gemm.vocab_logits_usable(w, jnp.zeros((cpu_gemm.VOCAB_LOGITS_MAX_ROWS + 1, 8)))
    assert not cpu_gemm.vocab_logits_usable(w, jnp.zeros((0, 8)))
    assert not cpu_gemm.vocab_logits_usable(w, jnp.zeros((16, 9)))  # hidden sizes differ
    assert not cpu_gemm.vocab_logits_usable(w.astype(jnp.bfloat16), h)
    assert not cpu_gemm.vocab_logits_usable(w, h.astype(jnp.bfloat16))

    class Mesh2:  # a 2-device mesh of this host's CPU
        size = 2
        devices = np.array(jax.devices()[:1] * 2)
    assert not cpu_gemm.vocab_logits_usable(w, h, mesh=Mesh2())
    monkeypatch.setenv("REAGENT_CPU_GEMM", "xla")
    assert not cpu_gemm.vocab_logits_usable(w, h)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_sampling_logits_paths_agree(monkeypatch, tied, rows):
    """The engine's decode projection: the kernel (tied, AVX-512), the matrix-vector product (one
    row) and the multiply-reduce all give the model's own logits, vocabulary-major."""
    from reagent_jax.models.qwen3 import Qwen3
    from reagent_jax.rollout import kernels
    cfg = models.preset("tiny", compute_dtype="float32", tie_word_embeddings=tied)
    params = models.init_params(cfg, jax.random.PRNGKey(1))
    h = jnp.asarray(_rand(np.random.default_rng(rows), rows, cfg.hidden_size))
    fn = lambda: jax.jit(lambda p, h: kernels.sampling_logits(cfg, p, h)[0])
    ours = fn()(params, h)
    hlo = fn().lower(params, h).as_text()
    assert ("reagent_vocab_logits" in hlo) == (tied and _VOCAB_KERNEL)
    if rows == 1 and "reagent_vocab_logits" not in hlo:  # a multiply-reduce over one row took ~0.5 s
        assert "dot_general" in hlo
    ref = Qwen3(cfg).apply({"params": params}, h, method=Qwen3.project).T  # [V, B]
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=1e-5)
    xla = _xla_path(lambda: fn()(params, h), monkeypatch)
    np.testing.assert_allclose(ours, xla, atol=1e-5, rtol=1e-5)
    # the kernel also hands the sampler its chunk statistics (at temperature 1 by default)
    from reagent_jax.rollout.sampling import chunk_stats
    _, stats = jax.jit(lambda p, h: kernels.sampling_logits(cfg, p, h))(params, h)
    assert (stats is not None) == ("reagent_vocab_logits" in hlo)
    if stats is not None:
        for got, want in zip(stats, chunk_stats(ours, jnp.ones(rows))):
            np.testing.assert_allclose(got, want, rtol=2e-6)
