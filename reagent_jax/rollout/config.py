"""config.rollout as a typed block: the engine settings every pipeline and evaluation builds from.

Bucket lists are comma-separated positive integers in a config ("512,1024,2048", "" = the engine's
defaults) or tuples of ints; fixed buckets mean fewer compilations.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Union

from reagent_jax.typed_config import Block, Problem, at_least, one_of

Buckets = Union[str, tuple[int, ...]]
# fp8 halves bf16's cache bytes without scales: on SmolLM2 its logprobs are ~12x further from an
# fp32 cache's than bf16's (BENCHMARKS.md, "KV cache dtype"), so rollouts with it should
# recompute old logprobs (grpo.old_logprobs="recompute").
KV_DTYPES = ("", "float32", "bfloat16", "float8_e4m3fn", "float8_e5m2")
_INTS = re.compile(r"\s*\d+(\s*,\s*\d+)*\s*,?\s*")


def parse_buckets(value: Buckets) -> tuple[int, ...]:
    """"512, 1024," or (512, 1024) -> (512, 1024); "" -> ()."""
    if isinstance(value, str):
        return tuple(int(x) for x in value.split(",") if x.strip())
    return tuple(int(x) for x in value)


@dataclasses.dataclass(frozen=True)
class RolloutConfig(Block):
    num_slots: int = 16       # sequences decoded together (continuous batching)
    max_len: int = 2048       # prompt + completion tokens per slot
    prefill_chunk: int = 512  # prompt tokens per prefill call
    decode_steps: int = 8     # decode steps fused into one device call
    length_buckets: Buckets = ""
    row_buckets: Buckets = ""
    window_buckets: Buckets = ""
    kv_page_size: int = 0     # > 0: a paged KV cache of pages this long (`kernels.kv_pages`); 0: contiguous
    kv_pages: int = 0         # pages in the pool; 0: num_slots x max_len / kv_page_size (the contiguous size)
    kv_dtype: str = ""        # KV cache dtype ("" = the compute dtype); KV_DTYPES lists the choices

    def problems(self) -> list[Problem]:
        found = at_least(self, num_slots=1, prefill_chunk=1, decode_steps=1, max_len=2, kv_page_size=0, kv_pages=0)
        if self.kv_page_size > 0 and self.max_len % self.kv_page_size:
            found.append(("kv_page_size", f"must divide max_len={self.max_len}"))
        found += one_of(self, "kv_dtype", KV_DTYPES)
        if self.kv_pages > 0 and self.kv_page_size == 0:
            found.append(("kv_pages", "needs kv_page_size > 0 (the cache is contiguous without it)"))
        for key in ("length_buckets", "row_buckets", "window_buckets"):
            value = getattr(self, key)
            if isinstance(value, str) and value.strip() and not _INTS.fullmatch(value):
                found.append((key, "expected comma-separated positive integers, e.g. '512,1024,2048'"))
            elif isinstance(value, tuple) and not all(v >= 1 for v in value):
                found.append((key, "expected positive integers"))
        return found

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `rollout.Engine` (bucket lists only where set)."""
        kw = dict(num_slots=self.num_slots, max_len=self.max_len, prefill_chunk=self.prefill_chunk,
                  decode_steps=self.decode_steps)
        for key in ("length_buckets", "row_buckets", "window_buckets"):
            if parse_buckets(getattr(self, key)):
                kw[key] = parse_buckets(getattr(self, key))
        if self.kv_page_size > 0:
            kw.update(kv_page_size=self.kv_page_size, kv_pages=self.kv_pages or None)
        if self.kv_dtype:
            kw["cache_dtype"] = self.kv_dtype
        return kw
