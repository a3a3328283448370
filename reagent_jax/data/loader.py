"""Batched, shuffled, per-host-sharded Grain pipelines whose position is a small JSON dict.

A training run saves `it.get_state()` in its checkpoint sidecar; after a kill, a fresh loader with
the same arguments and `it.set_state(state)` yields exactly the batch that would have come next.
Grain derives every element from its index (shuffle and epoch reseeding included), so the state
is just the next index plus a fingerprint that catches resuming with different data or settings.

Batches are lists of records (dicts), not stacked arrays: rows hold ragged text and answer lists;
tokenisation and padding happen later, on the host, per batch.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, Optional, Sequence

import grain
from absl import flags

_FINGERPRINT_KEYS = ("num_records", "batch_size", "seed", "shuffle", "num_epochs",
                     "drop_remainder", "shard_index", "shard_count")


def _read_batch(source: Sequence[Any], map_fn: Optional[Callable[[Any], Any]], indices: list) -> list:
    """The records at `indices` (batched when the source can: ArrayRecord, JSONL), mapped."""
    read = getattr(source, "__getitems__", None)
    records = read([int(i) for i in indices]) if read is not None else [source[int(i)] for i in indices]
    return records if map_fn is None else [map_fn(r) for r in records]


def _shard_options(shard_by_process: bool, shard_options: Optional[grain.sharding.ShardOptions]):
    if shard_options is not None:
        return shard_options
    if shard_by_process:  # one shard per JAX process (host); drop the uneven tail
        return grain.sharding.ShardByJaxProcess(drop_remainder=True)
    return grain.sharding.NoSharding()


class BatchIterator(Iterator[list]):
    """Iterator over batches (lists of records) with JSON-serialisable `get_state` / `set_state`.

    The position is the index of the next batch: every batch is a pure function of its index, so
    resuming starts the pipeline at that index, whether its batches are read in this process or in
    `worker_count` worker processes (a state taken with one count resumes under another)."""

    def __init__(self, dataset: grain.MapDataset, fingerprint: dict, read_options: grain.ReadOptions,
                 steps_per_epoch: int, worker_count: int = 0):
        self._dataset = dataset
        self._read_options = read_options
        self._worker_count = worker_count
        self.fingerprint = fingerprint
        self.steps_per_epoch = steps_per_epoch  # batches per pass over this host's shard
        self._it = None
        self._start(0)

    def _start(self, next_index: int) -> None:
        self.close()
        iter_ds = self._dataset[next_index:].to_iter_dataset(self._read_options)
        if self._worker_count:  # each worker process reads and decodes whole batches, in order
            if not flags.FLAGS.is_parsed():  # a notebook or test: Grain's workers read absl flags
                flags.FLAGS.mark_as_parsed()  # (their defaults) and fail when none were parsed
            iter_ds = iter_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=self._worker_count))
        self._it = iter(iter_ds)
        self._next_index = next_index

    def __iter__(self) -> "BatchIterator":
        return self

    def __next__(self) -> list:
        batch = next(self._it)
        self._next_index += 1
        return batch

    def get_state(self) -> dict:
        """Position (JSON-serialisable): store it with the checkpoint."""
        return {"grain": {"next_index": self._next_index}, **self.fingerprint}

    def set_state(self, state: dict) -> None:
        """Continues from `state`; refuses a state taken with different data or settings. (A
        state saved before the loader fingerprinted content has no "content" entry: not checked.)"""
        if not isinstance(state, dict) or not isinstance(state.get("grain"), dict) or \
                not isinstance(state["grain"].get("next_index"), int):
            raise ValueError(f"not a loader state (expected a dict from get_state()), got {state!r}")
        diff = {k: (state.get(k), v) for k, v in self.fingerprint.items()
                if state.get(k) != v and (k != "content" or "content" in state)}
        if diff:
            shown = ", ".join(f"{k}: saved {a!r} vs now {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"loader state does not match this loader ({shown}); resuming would "
                             "not continue the same sequence of batches")
        self._start(state["grain"]["next_index"])

    def close(self) -> None:
        """Stops prefetch threads and worker processes (the iterator is unusable afterwards)."""
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


def make_loader(source: Sequence[Any], *, batch_size: int, seed: int, shuffle: bool = True,
                num_epochs: Optional[int] = None, shard_by_process: bool = True,
                drop_remainder: bool = True, map_fn: Optional[Callable[[Any], Any]] = None,
                shard_options: Optional[grain.sharding.ShardOptions] = None,
                read_options: Optional[grain.ReadOptions] = None, worker_count: int = 0) -> BatchIterator:
    """A resumable iterator over batches of `source` (a `JsonlSource` or any random-access sequence).

    Args:
      batch_size: records per batch on this host (the per-host share of the global batch).
      seed: shuffle seed; each epoch is reshuffled deterministically from it.
      num_epochs: passes over the data; None repeats forever (RL loops count steps, not epochs).
      shard_by_process: give each JAX process a disjoint, equal-sized strided slice of the rows.
      drop_remainder: drop a final short batch (only reachable with a finite `num_epochs`).
      map_fn: applied to each record before batching (e.g. prompt rendering), in reader threads.
      shard_options: explicit Grain sharding (overrides `shard_by_process`; for tests and tools).
      read_options: Grain reader threads / prefetch; default 2 threads, 64 records ahead.
      worker_count: processes that read and decode batches (0: in this process). Decoding is
        Python under the GIL, so threads do not add throughput and processes do; the batches and
        their order are the same for any count, so a state resumes under another count.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if isinstance(worker_count, bool) or not isinstance(worker_count, int) or worker_count < 0:
        raise ValueError(f"worker_count must be an int >= 0, got {worker_count!r}")
    if num_epochs is not None and num_epochs < 1:
        raise ValueError(f"num_epochs must be >= 1 or None, got {num_epochs}")
    n = len(source)
    opts = _shard_options(shard_by_process, shard_options)
    index, count = opts.shard_index, opts.shard_count
    if not 0 <= index < count:
        raise ValueError(f"shard index {index} out of range for {count} shards")
    # Grain shuffles, shards and batches record *indices*; each batch is then read in one
    # `__getitems__` call. The same permutation as shuffling the records themselves, at one Grain
    # element per batch instead of per record (Grain's per-element cost dominated the reads).
    ds = grain.MapDataset.range(n)
    if count > 1:
        usable = n - n % count if opts.drop_remainder else n
        ds = ds[:usable][index::count]
    shard_len = len(ds)
    if shard_len == 0:
        raise ValueError(f"shard {index} of {count} is empty ({n} records in all)")
    epoch_batches = shard_len // batch_size if drop_remainder else -(-shard_len // batch_size)
    if num_epochs is not None and shard_len * num_epochs < batch_size and drop_remainder:
        raise ValueError(f"batch_size {batch_size} exceeds the {shard_len * num_epochs} records this "
                         f"host sees in {num_epochs} epoch(s); no batch would be produced")
    if shuffle:
        ds = ds.shuffle(seed=seed)
    ds = ds.repeat(num_epochs)
    # Repeating forever there is no final short batch; Grain's length arithmetic over the endless
    # dataset overflows for batch_size 1 without drop_remainder, so batch as if it were set.
    ds = ds.batch(batch_size, drop_remainder=drop_remainder or num_epochs is None, batch_fn=list)
    ds = ds.map(functools.partial(_read_batch, source, map_fn))
    fingerprint = dict(zip(_FINGERPRINT_KEYS, (n, batch_size, seed, shuffle, num_epochs,
                                               drop_remainder, index, count)))
    content = getattr(source, "content_fingerprint", None)  # JsonlSource: a hash of the rows
    if content is not None:
        fingerprint["content"] = content
    read_options = read_options or grain.ReadOptions(num_threads=2, prefetch_buffer_size=64)
    return BatchIterator(ds, fingerprint, read_options, max(epoch_batches, 1), worker_count)
