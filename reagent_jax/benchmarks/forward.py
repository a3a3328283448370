"""Forward and forward+backward throughput of the JAX Qwen3 next to transformers (torch, CPU).

Both sides get the same random weights (ours exported with `save_hf_checkpoint`, loaded by
`Qwen3ForCausalLM`), the same batch and the same dtype: fp32, or (dtype="bfloat16") fp32 weights
with bf16 compute, torch under bf16 autocast. Forward = logits for every position; backward =
gradient of the summed next-token log-likelihood w.r.t. all parameters.
"""
from __future__ import annotations

import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from reagent_jax.metrics import perf
from reagent_jax.models.config import Qwen3Config
from reagent_jax.models.functional import forward, init_params, token_logprobs
from reagent_jax.models.hf_io import save_hf_checkpoint


def _jax_side(cfg, params, tokens, iters):
    fwd = lambda: forward(cfg, params, tokens)
    loss_grad = jax.jit(jax.grad(lambda p, t: token_logprobs(cfg, p, t, chunk_size=128).sum()))
    fb = lambda: loss_grad(params, tokens)
    return perf.time_calls(fwd, iters), perf.time_calls(fb, iters)


def _torch_side(cfg, params, tokens, iters, dtype):
    import torch
    from transformers import Qwen3ForCausalLM
    perf.set_torch_threads()
    with tempfile.TemporaryDirectory() as d:
        save_hf_checkpoint(d, cfg, params)
        model = Qwen3ForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
    t = torch.tensor(np.asarray(tokens))

    def fwd():
        with torch.no_grad(), perf.torch_compute(dtype):
            return model(t).logits

    def fb():
        model.zero_grad(set_to_none=True)
        with perf.torch_compute(dtype):
            logits = model(t).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, t[:, 1:, None]).sum()
        lp.backward()

    return perf.time_calls(fwd, iters), perf.time_calls(fb, iters)


def run(cfg: Qwen3Config, batch: int = 4, seq_len: int = 512, iters: int = 3, with_torch: bool = True,
        dtype: str = "float32") -> dict:
    """Forward and forward+backward tokens/s and MFU (against the measured matmul peak in `dtype`)."""
    cfg = cfg.replace(param_dtype="float32", compute_dtype=perf.check_bench_dtype(dtype))
    params = init_params(cfg, jax.random.PRNGKey(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq_len)), jnp.int32)
    n_tok = batch * seq_len
    peak = perf.matmul_peak_flops(dtype=jnp.dtype(dtype))
    f_times, fb_times = _jax_side(cfg, params, tokens, iters)
    flops_fwd = cfg.flops_per_token(seq_len) * n_tok
    out = {
        "shape": dict(hidden=cfg.hidden_size, layers=cfg.num_layers, vocab=cfg.vocab_size, batch=batch, seq_len=seq_len),
        "dtype": dtype,
        "machine_matmul_peak_gflops": peak / 1e9,
        "jax_forward_tokens_per_s": n_tok / perf.median(f_times),
        "jax_fwd_bwd_tokens_per_s": n_tok / perf.median(fb_times),
        "jax_forward_mfu": flops_fwd / perf.median(f_times) / peak,
        "jax_fwd_bwd_mfu": 3 * flops_fwd / perf.median(fb_times) / peak,
    }
    if with_torch:
        tf, tfb = _torch_side(cfg, params, tokens, iters, dtype)
        out.update({
            "torch_forward_tokens_per_s": n_tok / perf.median(tf),
            "torch_fwd_bwd_tokens_per_s": n_tok / perf.median(tfb),
        })
        out["forward_speedup_vs_torch"] = out["jax_forward_tokens_per_s"] / out["torch_forward_tokens_per_s"]
        out["fwd_bwd_speedup_vs_torch"] = out["jax_fwd_bwd_tokens_per_s"] / out["torch_fwd_bwd_tokens_per_s"]
    return out
