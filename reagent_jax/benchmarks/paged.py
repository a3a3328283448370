"""GRPO's rollout shape through a contiguous and a paged KV cache (`rollout.kv_page_size`):
`questions` prompts, `n` sampled episodes each, all started together.

The paged engine prefills each prompt's full pages once and maps them into the other n - 1
sequences (prefix sharing), and its pool only needs the pages the live turns reserve; the
contiguous one prefills every sequence's prompt and holds slots x max_len. Same seeds, so both
draw the same tokens (checked).
"""
from __future__ import annotations

from typing import Union

import jax

from reagent_jax.benchmarks.rollout import _engine_run, _median_run, _model, _prompts
from reagent_jax.models.config import Qwen3Config
from reagent_jax.rollout.engine import Engine
from reagent_jax.rollout.sampling import SamplingParams


def grpo_rollout(cfg: Union[Qwen3Config, str] = "bench-256", questions: int = 4, n: int = 8, prompt_len: int = 256,
                 new_tokens: int = 64, page_size: int = 64, iters: int = 2, dtype: str = "float32") -> dict:
    cfg, params = _model(cfg, dtype)
    prompts = [p for p in _prompts(cfg, questions, prompt_len) for _ in range(n)]
    sps = [SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=i) for i in range(len(prompts))]
    slots, max_len = len(prompts), prompt_len + new_tokens
    max_len = -(-max_len // page_size) * page_size
    kw = dict(num_slots=slots, max_len=max_len, prefill_chunk=min(512, prompt_len), max_prefill_rows=min(slots, 8),
              decode_steps=16, window_buckets=(max_len,))
    runs = {}
    for name, extra in (("contiguous", {}), ("paged", dict(kv_page_size=page_size))):
        runs[name] = _median_run(lambda: _engine_run(lambda: Engine(cfg, params, **kw, **extra),
                                                     lambda e: e.generate(prompts, sps)), iters)
    same = [a.tokens for a in runs["contiguous"]["out"]] == [b.tokens for b in runs["paged"]["out"]]
    out = {"shape": dict(hidden=cfg.hidden_size, layers=cfg.num_layers, questions=questions, n=n,
                         prompt_len=prompt_len, new_tokens=new_tokens, page_size=page_size),
           "dtype": dtype, "device": jax.devices()[0].device_kind, "same_tokens": same}
    for name, r in runs.items():
        st = r["stats"]
        out[name] = {"wall_s": r["wall_s"], "prefill_tokens": st["prefill_tokens"],
                     "prefix_shared_tokens": st.get("prefix_shared_tokens", 0),
                     "prefill_s": st.get("prefill_seconds", 0.0), "decode_s": st.get("decode_seconds", 0.0),
                     "tokens_per_s": st["decode_tokens"] / r["wall_s"]}
    out["paged_vs_contiguous_wall"] = runs["paged"]["wall_s"] / runs["contiguous"]["wall_s"]
    return out
