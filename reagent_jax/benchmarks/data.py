"""Random-access read benchmark: ArrayRecord (TfdsSource) vs JSONL (JsonlSource) over the same rows.

What a pod host pays to start reading (JSONL: index every line; ArrayRecord: open the files) and
to read records at random, and how much resident memory each source holds per process: measured
in a fresh process (spawned), since the benchmark's own process has just built the dataset and
frees memory while it measures.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import time

import grain
import numpy as np
import psutil

from reagent_jax.data.loader import make_loader
from reagent_jax.data.tfds_rows import GROUP_SIZE, build_dataset, open_rows


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _loader_rate(source, reads: int, seed: int, worker_count: int) -> int:
    """Records/s through the training loader (shuffled Grain batches of 64), `worker_count`
    reader processes (0: in this process); worker start-up is not timed."""
    loader = make_loader(source, batch_size=64, seed=seed, shard_by_process=False, worker_count=worker_count,
                         read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=256))
    try:
        seen = len(next(loader))  # the workers are up
        t0 = time.perf_counter()
        while seen < reads:
            seen += len(next(loader))
        return round((seen - 64) / (time.perf_counter() - t0))
    finally:
        loader.close()


def _open(name: str, path: str, spec: str, data_dir: str):
    return open_rows(path if name == "jsonl" else spec, "agent_rl", data_dir=data_dir)


def _rss_growth(name: str, path: str, spec: str, data_dir: str, order: np.ndarray) -> int:
    """Resident bytes a fresh process gains by opening the source and reading `order` (libraries
    imported first, so only the source's own index, readers and caches count)."""
    from tensorflow_datasets.proto import tf_example_pb2  # noqa: F401  (TFDS itself, for both kinds)
    rss0 = _rss()
    source = _open(name, path, spec, data_dir)
    for i in order:
        source[int(i)]
    return _rss() - rss0


def run(num_records: int = 100_000, reads: int = 100_000, seed: int = 0, workers: tuple[int, ...] = (0, 2),
        group_size: int = GROUP_SIZE) -> dict:
    """Times opening and `reads` random reads of `num_records` GSM8K-sized agent_rl rows (shards in
    chunks of `group_size` records), then the loader's throughput with each count of reader
    processes in `workers`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.jsonl")
        with open(path, "w") as f:
            for i in range(num_records):
                f.write(json.dumps({"question": f"Question {i}: " + "word " * 40, "answer": [str(i)],
                                    "data_source": "gsm8k", "meta": {"solution": "step " * 30}}) + "\n")
        t0 = time.perf_counter()
        spec = build_dataset("agent_rl", "bench", {"train": path}, data_dir=os.path.join(tmp, "tfds"),
                             group_size=group_size)
        build_s = time.perf_counter() - t0
        order = np.random.default_rng(seed).integers(0, num_records, reads)
        out = {"num_records": num_records, "reads": reads, "group_size": group_size, "build_s": round(build_s, 2)}
        data_dir = os.path.join(tmp, "tfds")
        with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
            for name in ("jsonl", "array_record"):
                t0 = time.perf_counter()
                source = _open(name, path, spec, data_dir)
                open_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                for i in order:
                    source[int(i)]
                read_s = time.perf_counter() - t0
                loader_rates = {w: _loader_rate(source, reads, seed, w) for w in workers}
                rss_growth = pool.apply(_rss_growth, (name, path, spec, data_dir, order))
                out[name] = {"open_s": round(open_s, 3), "read_s": round(read_s, 3),
                             "records_per_s": round(reads / read_s), "open_plus_read_s": round(open_s + read_s, 3),
                             **{f"loader_records_per_s_{w}_workers": r for w, r in loader_rates.items()},
                             "rss_growth_mb": round(rss_growth / 2**20, 1)}
                del source
        return out
