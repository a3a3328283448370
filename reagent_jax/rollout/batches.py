"""Host-side packing of sessions into the fixed, bucketed arrays the kernels take (NumPy only).

Bucketing keeps the number of compiled shapes small: a prefill call has a row count from
`row_buckets`, a chunk length from `length_buckets` and an attention window from
`window_buckets`; the decode call always covers all slots, with a window from `window_buckets`.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from reagent_jax.rollout.kernels import DecodeState, Sampling, bucket
from reagent_jax.rollout.session import Session


_INT32_MAX = int(np.iinfo(np.int32).max)  # top_k / budgets beyond it mean the same as it (no limit)


def _sampling_arrays(sessions: Sequence[Optional[Session]]) -> Sampling:
    n = len(sessions)
    temp = np.zeros(n, np.float32)
    top_p = np.ones(n, np.float32)
    top_k = np.zeros(n, np.int32)
    seeds = np.zeros(n, np.uint32)
    for i, s in enumerate(sessions):
        if s is not None:
            sp = s.sampling
            temp[i], top_p[i], top_k[i], seeds[i] = sp.temperature, sp.top_p, min(sp.top_k, _INT32_MAX), s.seed
    return Sampling(temp, top_p, top_k, seeds)


def needs_truncation(sessions: Sequence[Optional[Session]]) -> bool:
    """Whether any sampled (temperature > 0) row uses top-k or top-p: the kernels' static
    `truncation` flag, so batches without it run a program without the truncation code."""
    return any(s is not None and s.sampling.temperature > 0 and (s.sampling.top_k > 0 or s.sampling.top_p < 1.0)
               for s in sessions)


def prefill_batch(rows: Sequence[Session], prefill_chunk: int, length_buckets: Sequence[int],
                  row_buckets: Sequence[int], window_buckets: Sequence[int], max_len: int, num_slots: int):
    """Packs the next chunk (<= prefill_chunk tokens) of each row's unwritten tokens.

    Returns (kernel kwargs, chunk lengths [len(rows)], completes [len(rows)] bool: the chunk
    is the row's last, so the token the kernel draws for it is real).
    """
    lens = [min(len(s.tokens) - s.cached, prefill_chunk) for s in rows]
    b = bucket(len(rows), row_buckets)
    t = bucket(max(lens), length_buckets)
    tokens = np.zeros((b, t), np.int32)
    write_index = np.full(b, max_len, np.int32)  # padding rows: writes dropped
    slot_ids = np.full(b, num_slots, np.int32)  # padding rows: out of range (gather fills, scatter drops)
    last_index = np.zeros(b, np.int32)
    for i, (s, n) in enumerate(zip(rows, lens)):
        tokens[i, :n] = s.tokens[s.cached:s.cached + n]
        write_index[i], slot_ids[i], last_index[i] = s.cached, s.slot, n - 1
    completes = [s.cached + n == len(s.tokens) for s, n in zip(rows, lens)]
    sampling = _sampling_arrays(list(rows) + [None] * (b - len(rows)))
    window = bucket(max(s.cached + n for s, n in zip(rows, lens)), window_buckets)
    kwargs = dict(tokens=tokens, write_index=write_index, slot_ids=slot_ids, last_index=last_index,
                  sampling=sampling, window=window, truncation=needs_truncation(rows))
    return kwargs, lens, completes


def decode_window(slots: Sequence[Optional[Session]], num_steps: int, window_buckets: Sequence[int], max_len: int) -> int:
    """Smallest window that fits every active slot's next `num_steps` writes (at least one)."""
    longest = max(s.cached for s in slots if s is not None)
    return bucket(min(max_len, longest + num_steps), window_buckets)


def decode_state(slots: Sequence[Optional[Session]], max_stop_ids: int, exit_on_done: bool) -> DecodeState:
    """DecodeState over all slots; `slots[i]` is the decoding session in slot i or None.
    exit_on_done: sessions wait for a slot, so the call returns as soon as one frees up.

    Only the first `max_stop_ids` stop ids of a row are checked on device (the host checks all
    of them and drops anything drawn after a stop, so more ids only cost wasted steps).
    """
    n = len(slots)
    tokens = np.zeros(n, np.int32)
    lengths = np.zeros(n, np.int32)
    active = np.zeros(n, bool)
    remaining = np.zeros(n, np.int32)
    stop_ids = np.full((n, max_stop_ids), -1, np.int32)
    for i, s in enumerate(slots):
        if s is None:
            continue
        tokens[i], lengths[i], active[i] = s.tokens[-1], s.cached, True
        remaining[i] = min(s.sampling.max_new_tokens - s.drawn, _INT32_MAX)
        ids = s.sampling.stop_token_ids[:max_stop_ids]
        stop_ids[i, :len(ids)] = ids
    return DecodeState(tokens, lengths, active, remaining, _sampling_arrays(slots), stop_ids, np.bool_(exit_on_done))
