"""Rollout: KV-cache prefill/decode kernels, fused sampling, and a continuous-batching engine.

    engine = rollout.Engine(cfg, params, num_slots=16, max_len=4096)
    outs = engine.generate(prompts, rollout.SamplingParams(temperature=0.0, max_new_tokens=64))
    outs[i].tokens, outs[i].logprobs, outs[i].finish_reason

Logprobs are log softmax(logits / T) over the full vocabulary before top-k / top-p truncation
(T = 1 for greedy): the trainer's `models.token_logprobs(..., temperature=T)`.

    engine = rollout.Engine(cfg, params, num_slots=64, max_len=4096, kv_page_size=256, kv_pages=512)

pages the KV cache (`pages.py`): 64 slots share a pool the size of 32 full ones.
"""
from reagent_jax.rollout.config import RolloutConfig
from reagent_jax.rollout.engine import Engine, EngineError
from reagent_jax.rollout.kernels import geometric_buckets, init_cache
from reagent_jax.rollout.layout import ENGINE_RULES, engine_mesh
from reagent_jax.rollout.sampling import SamplingParams, sample
from reagent_jax.rollout.session import FINISH_REASONS, Result

__all__ = ["Engine", "RolloutConfig", "EngineError", "ENGINE_RULES", "engine_mesh", "SamplingParams", "Result", "FINISH_REASONS", "sample", "init_cache",
           "geometric_buckets"]
