"""The run's results file: one JSONL line per scored question, appended as questions finish.

Why one append-only file: an interrupted evaluation (pre-empted pod, Ctrl-C) loses at most the
questions in flight; a rerun with the same output directory reads the file and skips every
(benchmark, id) already scored with enough samples. A last line cut off mid-write is removed on
open; a later line for the same question replaces an earlier one.

Line: {"benchmark", "id", "question", "answer", "source", "k", "tools", "samples": [
        {"sample_index", "correct", "score", "method", "extracted", "judge", "trajectory",
         "refined": {... same fields ..., "critique", "rrm_score"} | absent}]}
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Iterator

log = logging.getLogger(__name__)


class ResultStore:
    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)) or ".", exist_ok=True)
        self._records: dict[tuple[str, str], dict[str, Any]] = {}
        if os.path.exists(self.path):
            self._load()

    def _load(self) -> None:
        with open(self.path, "rb") as f:
            data = f.read()
        lines, pos = data.split(b"\n"), 0
        for i, line in enumerate(lines):
            start, pos = pos, pos + len(line) + 1
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                key = (str(rec["benchmark"]), str(rec["id"]))
            except (ValueError, KeyError, TypeError) as e:
                if i == len(lines) - 1:  # the last line, without its newline: a write that was cut off
                    log.warning("%s: dropping an unfinished last line (%s)", self.path, e)
                    with open(self.path, "r+b") as f:
                        f.truncate(start)
                    return
                log.warning("%s:%d: skipping a broken line (%s)", self.path, i + 1, e)
                continue
            self._records[key] = rec
        if data and not data.endswith(b"\n"):  # a complete last line that lost its newline
            with open(self.path, "ab") as f:
                f.write(b"\n")

    def done(self, benchmark: str, qid: str, k: int, refine: bool = False) -> bool:
        """True when the question has >= k samples (each refined too when `refine`)."""
        rec = self._records.get((benchmark, str(qid)))
        if rec is None or len(rec.get("samples", [])) < k:
            return False
        return not refine or all(s.get("refined") for s in rec["samples"][:k])

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False, default=str)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (e.g. from a tool's output): \u-escape it
            line = json.dumps(record, ensure_ascii=True, default=str)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
        self._records[(str(record["benchmark"]), str(record["id"]))] = record

    def records(self, benchmark: str) -> list[dict[str, Any]]:
        return [r for (b, _), r in self._records.items() if b == benchmark]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._records.values())

    def __len__(self) -> int:
        return len(self._records)
