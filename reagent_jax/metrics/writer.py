"""Per-step scalar logging to `workdir/metrics.jsonl` and TensorBoard (`workdir/tb`).

JSONL is the record of truth (easy to read back for plots, tables and tests); TensorBoard is for
watching. Callers pass verl-style names (`actor/pg_loss`, `critic/score/mean`, `timing_s/gen`, ...)
with Python, NumPy or JAX scalars. Non-finite values are written as null (and not to TensorBoard)
with a counted warning, so a NaN loss is visible without breaking the file or the run.

Resuming: open the writer with `resume_step=S` (the restored checkpoint's step). It appends an
`{"event": "open", "resume_step": S}` line, and `read_metrics` drops the entries of steps >= S that
the killed run wrote before it; TensorBoard's own purge (`purge_step`) does the same there.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from typing import Any, Mapping, Optional

import numpy as np

JSONL_NAME = "metrics.jsonl"
TB_DIR = "tb"
_RESERVED = ("step", "time", "event")


def _is_main_process() -> bool:
    """Only JAX process 0 writes on multi-host runs (checked only if JAX is already imported)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return True
    try:
        return jax.process_index() == 0
    except Exception:  # backend not initialised yet: behave as a single process
        return True


def to_scalar(value: Any) -> float | int | bool:
    """Python number from a Python/NumPy/JAX scalar or a one-element array; TypeError otherwise."""
    if isinstance(value, (bool, int, float)):
        return value
    if hasattr(value, "__array__") or isinstance(value, np.generic):
        arr = np.asarray(value)
        if arr.size != 1:
            raise TypeError(f"expected a scalar, got an array of shape {arr.shape}")
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"expected a number, got dtype {arr.dtype}")
        return arr.reshape(()).item()
    raise TypeError(f"expected a number, got {type(value).__name__}")


def _ends_mid_line(path: str) -> bool:
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return False
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


class MetricsWriter:
    """Writes each step's scalars as one JSONL line and as TensorBoard scalars.

    Args:
      workdir: run directory; created if missing.
      tensorboard / jsonl: which sinks to write.
      resume_step: the step a resumed run restarts from (entries >= it from before are dropped).
      flush_secs: TensorBoard flush interval (the JSONL file is flushed after every step).
      enabled: write at all; default only on JAX process 0.
    """

    def __init__(self, workdir: str | os.PathLike, *, tensorboard: bool = True, jsonl: bool = True,
                 resume_step: Optional[int] = None, flush_secs: float = 30.0,
                 enabled: Optional[bool] = None):
        self.workdir = os.fspath(workdir)
        resume_step = None if resume_step is None else int(resume_step)  # NumPy / JAX ints: JSON and TB need int
        self.enabled = _is_main_process() if enabled is None else enabled
        self.nonfinite_counts: dict[str, int] = {}
        self.rejected_counts: dict[str, int] = {}
        self._flush_secs = flush_secs
        self._last_flush = time.monotonic()
        self._file = None
        self._tb = None
        if not self.enabled:
            return
        os.makedirs(self.workdir, exist_ok=True)
        if jsonl:
            path = os.path.join(self.workdir, JSONL_NAME)
            torn = _ends_mid_line(path)  # a killed run may have left half a line
            self._file = open(path, "a", encoding="utf-8")
            if torn:
                self._file.write("\n")
            self._write_line({"event": "open", "time": time.time(), "resume_step": resume_step})
        if tensorboard:
            from tensorboardX import SummaryWriter
            self._tb = SummaryWriter(os.path.join(self.workdir, TB_DIR), purge_step=resume_step,
                                     flush_secs=max(1, int(flush_secs)))

    @property
    def jsonl_path(self) -> str:
        return os.path.join(self.workdir, JSONL_NAME)

    def _write_line(self, obj: dict) -> None:
        self._file.write(json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n")
        self._file.flush()

    def _warn_count(self, counts: dict[str, int], key: str, message: str) -> None:
        n = counts[key] = counts.get(key, 0) + 1
        if n in (1, 10, 100) or n % 1000 == 0:  # counted, not one line per step
            logging.warning("%s (%d time%s so far for %r)", message, n, "s" * (n > 1), key)

    def write(self, step: int, scalars: Mapping[str, Any]) -> None:
        """Logs `scalars` at `step`. Bad values are reported and skipped; this never raises on them."""
        if not self.enabled:
            return
        step = int(step)
        row: dict[str, Any] = {"step": step, "time": time.time()}
        finite: dict[str, float] = {}
        for key, value in scalars.items():
            key = str(key)
            if key in _RESERVED:
                self._warn_count(self.rejected_counts, key, f"metric name {key!r} is reserved; skipped")
                continue
            try:
                value = to_scalar(value)
            except TypeError as e:
                self._warn_count(self.rejected_counts, key, f"metric {key!r} at step {step}: {e}; skipped")
                continue
            if isinstance(value, float) and not math.isfinite(value):
                self._warn_count(self.nonfinite_counts, key,
                                 f"metric {key!r} is {value} at step {step}; written as null")
                row[key] = None
                continue
            row[key] = finite[key] = value
        if self._file is not None:
            self._write_line(row)
        if self._tb is not None:
            for key, value in finite.items():
                self._tb.add_scalar(key, float(value), step)
            if time.monotonic() - self._last_flush >= self._flush_secs:
                self.flush()

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
        if self._tb is not None:
            self._tb.flush()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        """Flushes and closes; reports the totals of non-finite and rejected values once."""
        if self.nonfinite_counts:
            logging.warning("%s: non-finite values written as null: %s", self.workdir, self.nonfinite_counts)
        if self.rejected_counts:
            logging.warning("%s: non-scalar values skipped: %s", self.workdir, self.rejected_counts)
        self.nonfinite_counts, self.rejected_counts = {}, {}
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(workdir: str | os.PathLike) -> list[dict]:
    """One dict per step, sorted by step, as the (possibly resumed) run finally logged it.

    Several writes to one step in one session are merged (later keys win); a later session that
    logs a step again replaces it; a resume marker drops the earlier sessions' steps >= its step.
    Unreadable lines (e.g. a half-written last line of a killed run) are skipped with a warning.
    """
    path = os.path.join(os.fspath(workdir), JSONL_NAME)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no metrics file at {path}")
    by_step: dict[int, tuple[int, dict]] = {}  # step -> (session, merged entry)
    session, bad = 0, []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    raise ValueError("not an object")
            except ValueError:
                bad.append(lineno)
                continue
            if obj.get("event") == "open":
                session += 1
                resume = obj.get("resume_step")
                if resume is not None:
                    by_step = {s: v for s, v in by_step.items() if s < resume}
                continue
            if not isinstance(obj.get("step"), int):
                bad.append(lineno)
                continue
            previous = by_step.get(obj["step"])
            if previous is not None and previous[0] == session:
                obj = {**previous[1], **obj}
            by_step[obj["step"]] = (session, obj)
    if bad:
        logging.warning("%s: skipped %d unreadable line(s): %s", path, len(bad), bad[:10])
    return [by_step[s][1] for s in sorted(by_step)]
