"""How far a lower-precision KV cache moves the engine's greedy tokens and logprobs from an fp32
cache's, with the same weights and compute dtype (`rollout.kv_dtype`).

The engine's logprobs become the trainer's old logprobs (`grpo.old_logprobs="rollout"`), so a
cache dtype is only free if they stay where an fp32 cache puts them. Per dtype: how many rows
draw the same greedy tokens, the median position of the first different token, and the
logprob error over the tokens before it (after it the two rows condition on different text).
"""
from __future__ import annotations

import json
import os
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from reagent_jax import models
from reagent_jax.data.benchmarks import resolve_benchmark
from reagent_jax.rollout import Engine, SamplingParams


def gsm8k_prompts(tokenizer, path: str, n: int) -> list[list[int]]:
    """The first n questions of a GSM8K benchmark file as chat prompts (the model's template)."""
    with open(path) as f:
        rows = [json.loads(line) for _, line in zip(range(n), f)]
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": r["question"]}],
                                               add_generation_prompt=True, return_dict=False)) for r in rows]


def compare(cfg, params, prompts: Sequence[Sequence[int]], dtypes: Sequence[str], new_tokens: int = 96,
            num_slots: Optional[int] = None) -> dict:
    """Greedy generation of `prompts` with each cache dtype against an fp32 cache."""
    max_len = max(map(len, prompts)) + new_tokens + 1
    kw = dict(num_slots=num_slots or len(prompts), max_len=max_len, prefill_chunk=min(512, max_len),
              decode_steps=16)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)
    ref = Engine(cfg, params, cache_dtype="float32", **kw).generate(prompts, greedy)
    out = {"prompts": len(prompts), "new_tokens": new_tokens, "compute_dtype": str(cfg.compute_dtype), "dtypes": {}}
    for dt in dtypes:
        t0 = time.perf_counter()
        got = Engine(cfg, params, cache_dtype=dt, **kw).generate(prompts, greedy)
        first = [next((i for i, (a, b) in enumerate(zip(r.tokens, g.tokens)) if a != b), len(r.tokens))
                 for r, g in zip(ref, got)]
        err = np.concatenate([np.abs(np.subtract(r.logprobs[:f], g.logprobs[:f])) for r, g, f in zip(ref, got, first)]
                             + [np.zeros(0)])
        out["dtypes"][dt] = {
            "cache_bytes_vs_fp32": jnp.dtype(dt).itemsize / 4,
            "identical_rows": sum(f == len(r.tokens) for f, r in zip(first, ref)),
            "median_first_difference": float(np.median(first)),
            "logprob_abs_error_mean": float(err.mean()) if err.size else 0.0,
            "logprob_abs_error_max": float(err.max()) if err.size else 0.0,
            "seconds": time.perf_counter() - t0}
    return out


def run(checkpoint: str, dtypes: Sequence[str], prompts: int, new_tokens: int, benchmark: str = "gsm8k_full") -> dict:
    """`launch/bench.py --mode=kv_dtype`: a checkpoint directory or a GGUF name (`smollm2`) in fp32,
    on the first `prompts` questions of a GSM8K-schema benchmark (a path or a name)."""
    from transformers import AutoTokenizer
    path = checkpoint if os.path.isdir(checkpoint) else models.gguf_checkpoint(checkpoint)
    cfg, params = models.load_hf_checkpoint(path)
    tok = AutoTokenizer.from_pretrained(path)
    questions = resolve_benchmark(benchmark)
    result = compare(cfg, params, gsm8k_prompts(tok, questions, prompts), dtypes, new_tokens)
    result.update(checkpoint=checkpoint, benchmark=questions, device=jax.devices()[0].device_kind)
    return result
