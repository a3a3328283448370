"""cuDNN flash attention (kernels/gpu/cudnn.py). Here: its compaction of padded rows (the same
gathers around XLA's attention) equals the XLA path's masked attention for left, right and
interior padding, forward and gradient (sharded: tests/kernels/test_attention.py); the kernel
choice. On a GPU (JAX_PLATFORMS=cuda, as launch/bench_gpu.sh runs it): the cuDNN kernel itself
against the XLA path, alone and inside the model."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reagent_jax import models
from reagent_jax.kernels import attention
from reagent_jax.kernels.gpu import cudnn
from tests.kernels.test_attention import grads, qkv, xla_attention

on_gpu = pytest.mark.skipif(jax.devices()[0].platform != "gpu", reason="needs an NVIDIA GPU")


def with_hole(valid):
    """Row 1 also has interior padding (not produced by the project's batches, but allowed)."""
    return valid.at[1, 100:110].set(False)


def compacted(impl):
    return lambda qg, k, v, valid: cudnn.compacted_causal_attention(qg, k, v, valid, qg.shape[-1] ** -0.5, impl)


@pytest.mark.parametrize("t", [256, 200])
@jax.default_matmul_precision("highest")  # fp32 products on a GPU too (TF32 there by default)
def test_compaction_equals_the_masked_xla_attention_forward_and_gradient(t):
    qg, k, v, valid = qkv(t=t)
    valid = with_hole(valid)
    real = valid[:, :, None, None, None]
    np.testing.assert_allclose(jnp.where(real, jax.jit(compacted("xla"))(qg, k, v, valid), 0),
                               jnp.where(real, xla_attention(qg, k, v, valid), 0), atol=1e-5)
    for a, b in zip(grads(compacted("xla"), qg, k, v, valid), grads(xla_attention, qg, k, v, valid)):
        np.testing.assert_allclose(a, b, atol=1e-5 * max(float(jnp.abs(b).max()), 1.0))


def test_the_choice_follows_the_devices_dtype_and_head_dim():
    assert attention.choose("auto", None, 256, jnp.bfloat16, 128) == ("cudnn" if jax.devices()[0].platform == "gpu"
                                                                      else "xla")
    assert cudnn.supports(jnp.bfloat16, 128) is None
    assert "not float32" in cudnn.supports(jnp.float32, 128)
    assert "multiple of 8" in cudnn.supports(jnp.bfloat16, 100)
    if jax.devices()[0].platform != "gpu":
        with pytest.raises(ValueError, match="attention='cudnn': it runs on NVIDIA GPUs, and this program runs on cpu"):
            attention.choose("cudnn", None, 256, jnp.bfloat16, 128)
    models.preset("tiny", attention="cudnn")  # a valid config value; the devices decide at trace time


def scored_positions(attn):
    """Tokens whose logprob the model predicts from a real token: the first real token of a
    left-padded row is predicted from padding, whose outputs no path defines (they carry no loss)."""
    return attn & jnp.pad(attn[:, :-1], ((0, 0), (1, 0)))


def test_the_model_runs_the_chosen_kernel(monkeypatch):
    """With the devices taken for a GPU, the model's causal attention goes through the cuDNN
    path (here its compaction around XLA's attention), as close to fp32 logprobs as the XLA path."""
    calls = []
    original = cudnn.cudnn_attention

    def spy(*args, **kw):
        calls.append(args[0].shape)
        return original(*args, **kw, implementation="xla")

    cfg = models.preset("tiny", compute_dtype="bfloat16", vocab_size=256, head_dim=64)
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 256, (2, 64)), jnp.int32)
    attn = jnp.asarray(np.arange(64)[None, :] >= np.array([[0], [20]]))  # row 1 left-padded
    scored = scored_positions(attn)
    ref = models.token_logprobs(cfg.replace(attention="xla", compute_dtype="float32"), params, tokens, attn)
    err = lambda lp: np.abs(np.where(scored, lp - ref, 0)).max()
    xla = err(models.token_logprobs(cfg.replace(attention="xla"), params, tokens, attn))
    monkeypatch.setattr(attention, "mesh_platform", lambda mesh: "gpu")
    monkeypatch.setattr(cudnn, "cudnn_attention", spy)
    routed = err(models.token_logprobs(cfg, params, tokens, attn))
    assert calls, "the model never called the cuDNN kernel"
    assert routed <= 1.5 * xla + 1e-2, (routed, xla)  # bf16 both: as close to fp32 as the XLA path


class _Device:
    def __init__(self, platform):
        self.platform = platform


class _Mesh:  # what `mesh_platform` reads of a mesh
    def __init__(self, platform):
        self.devices = np.array([_Device(platform)])


@pytest.mark.parametrize("platform,dtype,expected", [
    ("cpu", "bfloat16", ("xla", "xla")), ("tpu", "bfloat16", ("splash", "ragged")),
    ("cuda", "bfloat16", ("cudnn", "xla")), ("cuda", "float32", ("xla", "xla"))])
def test_the_run_metadata_names_the_kernels_of_its_devices(platform, dtype, expected):
    report = attention.kernels_report(models.preset("qwen3-0.6b", compute_dtype=dtype), _Mesh(platform))
    assert (report["causal"], report["decode"]) == expected
    assert report["platform"] == ("gpu" if platform == "cuda" else platform) and report["attention"] == "auto"


# ---- on a GPU: the cuDNN kernel itself -------------------------------------------------------------------


def cudnn_fn(qg, k, v, valid):
    return cudnn.cudnn_attention(qg, k, v, valid, qg.shape[-1] ** -0.5)


@on_gpu
@pytest.mark.parametrize("t", [256, 200])
def test_cudnn_in_bf16_is_as_close_to_fp32_attention_as_the_xla_path(t):
    qg, k, v, valid = qkv(t=t, d=128, dtype=jnp.bfloat16)
    valid = with_hole(valid)
    real = valid[:, :, None, None, None]
    up = [x.astype(jnp.float32) for x in (qg, k, v)]
    ref = xla_attention(*up, valid)
    err = {name: jnp.where(real, jnp.abs(jax.jit(fn)(qg, k, v, valid).astype(jnp.float32) - ref), 0.0)
           for name, fn in (("cudnn", cudnn_fn), ("xla", xla_attention))}
    assert float(err["cudnn"].max()) <= 1.1 * float(err["xla"].max()) + 1e-3
    ref_g = grads(xla_attention, *up, valid)
    for g_cudnn, g_xla, g_ref in zip(grads(cudnn_fn, qg, k, v, valid), grads(xla_attention, qg, k, v, valid), ref_g):
        g_cudnn, g_xla, g_ref = (np.asarray(x, np.float32) for x in (g_cudnn, g_xla, g_ref))
        scale = np.abs(g_ref).max()
        assert np.abs(g_cudnn - g_ref).mean() < 2e-3 * scale
        # cuDNN's backward rounds more in bf16 at its worst element (0.6% of the largest gradient
        # at t=200 on an H200, 2x the XLA path's); the mean bound above catches a real error
        assert np.abs(g_cudnn - g_ref).max() <= 3 * np.abs(g_xla - g_ref).max() + 1e-3 * scale


@on_gpu
def test_model_logprobs_with_cudnn_are_as_close_to_fp32_as_xla():
    cfg = models.preset("tiny", compute_dtype="bfloat16", vocab_size=256, head_dim=64)
    params = models.init_params(cfg, jax.random.PRNGKey(0))
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 256, (2, 128)), jnp.int32)
    attn = jnp.asarray(np.arange(128)[None, :] >= np.array([[0], [30]]))  # row 1 left-padded
    scored = scored_positions(attn)
    ref = models.token_logprobs(cfg.replace(attention="xla", compute_dtype="float32"), params, tokens, attn)
    err = {impl: np.abs(np.where(scored, models.token_logprobs(cfg.replace(attention=impl), params, tokens, attn)
                                 - ref, 0)).max() for impl in ("xla", "cudnn")}
    assert attention.choose("auto", None, 128, jnp.bfloat16, 64) == "cudnn"
    assert err["cudnn"] <= 1.5 * err["xla"] + 1e-2, err
