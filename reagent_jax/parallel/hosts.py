"""Work split over the processes of a multi-host run, and host objects shared between them.

The rollout engine is process-local (each host decodes its own share of episodes on its own
chips, with no cross-host traffic per decode step and no need for the hosts' schedules to agree),
so the host-side results (trajectories) are exchanged once per call with `allgather_objects` and
every process continues with the same global list, as the SPMD train step needs.
"""
from __future__ import annotations

import pickle
from typing import Any

import jax
import numpy as np


def is_leader() -> bool:
    """Process 0: the one that writes the run's shared files (metrics, summaries, evaluations)."""
    return jax.process_index() == 0


def share(n: int, process_index: int | None = None, process_count: int | None = None) -> range:
    """This process's contiguous share of n jobs (sizes differ by at most one, earlier processes
    take the larger shares), so the shares concatenated in process order are the jobs in order."""
    p = jax.process_index() if process_index is None else process_index
    count = jax.process_count() if process_count is None else process_count
    size, extra = divmod(n, count)
    lo = p * size + min(p, extra)
    return range(lo, lo + size + (p < extra))


def barrier(name: str) -> None:
    """Every process waits here until all arrive (e.g. after process 0 wrote files they all read)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def allgather_objects(obj: Any) -> list:
    """Every process's `obj` (picklable), in process order; a collective: all processes call it
    in the same order. One process: [obj]."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils
    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int64))).reshape(-1)
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[:data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(buf)).reshape(len(sizes), -1)  # [P, max bytes]
    return [pickle.loads(rows[i, :sizes[i]].tobytes()) for i in range(len(sizes))]


def process_groups(devices) -> np.ndarray:
    """Devices grouped by process, [processes, devices per process], each row in the given
    order; raises when processes hold different numbers of them."""
    flat = list(np.asarray(devices).reshape(-1))
    by_process: dict[int, list] = {}
    for d in flat:
        by_process.setdefault(d.process_index, []).append(d)
    counts = {p: len(ds) for p, ds in by_process.items()}
    if len(set(counts.values())) != 1:
        raise ValueError(f"the mesh holds different numbers of devices per process: {counts}")
    rows = [by_process[p] for p in sorted(by_process)]
    out = np.empty((len(rows), len(rows[0])), dtype=object)
    for i, row in enumerate(rows):
        out[i, :] = row
    return out
