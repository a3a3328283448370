"""Token sequences -> fixed-shape training arrays, with length buckets so each run compiles a
handful of shapes instead of one per batch."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def bucket_length(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= n; beyond the largest bucket, the next multiple of it."""
    for b in sorted(buckets):
        if n <= b:
            return b
    top = max(buckets)
    return -(-n // top) * top


def default_buckets(max_len: int, smallest: int = 64, growth: float = 1.25, multiple: int = 64) -> tuple[int, ...]:
    """Lengths from `smallest` up to max_len (included), each ~`growth` x the previous, rounded up
    to `multiple`: at most ~25% padding per batch for a dozen-odd compiled shapes up to 8k
    (powers of two waste up to half the step on padding)."""
    out, b = [], smallest
    while b < max_len:
        out.append(b)
        b = max(b + multiple, int(b * growth) // multiple * multiple)
    out.append(max_len)
    return tuple(out)


def pad_rows(rows: Sequence[dict[str, Sequence]], *, buckets: Sequence[int], batch_size: Optional[int] = None,
             float_keys: Sequence[str] = ("old_logprobs", "ref_logprobs"), int_keys: Sequence[str] = ("context_mask",),
             max_len: Optional[int] = None) -> dict:
    """Right-pads per-sequence lists into [B, T] arrays (T = bucket of the longest row).

    Each row has `tokens` and `loss_mask` and optionally per-token float lists (`float_keys`) or
    int lists (`int_keys`, e.g. SFT's `context_mask`);
    scalar per-row values (e.g. `advantages`) are stacked. `attention_mask` is derived. Rows are
    truncated to `max_len` when given (their loss mask too). With `batch_size`, the batch is padded
    with empty rows (all masks 0) so the shape stays fixed; `row_mask` marks real rows.
    """
    if not rows:
        raise ValueError("pad_rows got no rows")
    n = len(rows)
    bsz = batch_size or n
    if n > bsz:
        raise ValueError(f"{n} rows do not fit batch_size={bsz}")
    longest = max(len(r["tokens"]) for r in rows)
    if max_len is not None:
        longest = min(longest, max_len)
    t = bucket_length(longest, buckets)
    if max_len is not None:
        t = min(t, max_len)
    out = {"tokens": np.zeros((bsz, t), np.int32), "attention_mask": np.zeros((bsz, t), np.int32),
           "loss_mask": np.zeros((bsz, t), np.int32), "row_mask": np.zeros((bsz,), np.int32)}
    per_token = [k for k in (*float_keys, *int_keys) if k in rows[0]]
    scalars = [k for k, v in rows[0].items() if k not in ("tokens", "loss_mask", *per_token) and np.ndim(v) == 0]
    for k in per_token:
        out[k] = np.zeros((bsz, t), np.int32 if k in int_keys else np.float32)
    for k in scalars:
        out[k] = np.zeros((bsz,), np.float32)
    for i, r in enumerate(rows):
        m = min(len(r["tokens"]), t)
        out["tokens"][i, :m] = r["tokens"][:m]
        out["attention_mask"][i, :m] = 1
        out["loss_mask"][i, :m] = r["loss_mask"][:m]
        out["row_mask"][i] = 1
        for k in per_token:
            out[k][i, :m] = r[k][:m]
        for k in scalars:
            out[k][i] = r[k]
    return out
