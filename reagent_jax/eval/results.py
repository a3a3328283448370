"""The run's results file: one JSONL line per scored question, appended as questions finish.

Why one append-only file: an interrupted evaluation (pre-empted pod, Ctrl-C) loses at most the
questions in flight; a rerun with the same output directory reads the file and skips every
(benchmark, id) already scored with enough samples. A last line cut off mid-write is removed on
open; a later line for the same question replaces an earlier one.

Line: {"benchmark", "id", "question", "answer", "source", "k", "tools", "settings", "samples": [
        {"sample_index", "correct", "score", "method", "extracted", "judge", "trajectory",
         "refined": {... same fields ..., "critique", "rrm_score"} | absent}]}

"settings" is the fingerprint of what made the line (`settings_fingerprint`: policy, seed,
sampling, agent and scoring settings); a line with another fingerprint is stale, so a rerun with a
changed setting scores that question again instead of reporting the old result. The settings
themselves are kept beside the file (SETTINGS_NAME) so a rerun can say what changed.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any, Iterator, Mapping, Optional

log = logging.getLogger(__name__)
SETTINGS_NAME = "settings.json"


def settings_fingerprint(settings: Mapping[str, Any]) -> str:
    """A short stable hash of a JSON-able settings mapping (key order does not matter)."""
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def changed_settings(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """'key: old -> new' for every (nested) key whose value differs."""
    out = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += changed_settings(a, b, f"{prefix}{key}.")
        elif json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def sample_failed(sample: Mapping[str, Any]) -> bool:
    """A sample whose episode or scoring failed, incl. a prompt the engine cannot hold (it is in
    the results, scored wrong, and counted as failed)."""
    traj = sample.get("trajectory") or {}
    return sample.get("method") == "error" or traj.get("finish_reason") == "error" or bool(traj.get("error"))


class ResultStore:
    """settings: what produces the results (see the module docstring); None keeps every line."""

    def __init__(self, path: str | os.PathLike, settings: Optional[Mapping[str, Any]] = None):
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)) or ".", exist_ok=True)
        self._records: dict[tuple[str, str], dict[str, Any]] = {}
        self.fingerprint = None if settings is None else settings_fingerprint(settings)
        if os.path.exists(self.path):
            self._load()
        if settings is not None:
            self._check_settings(dict(settings))

    def _check_settings(self, settings: dict[str, Any]) -> None:
        """Warns (naming what changed) when lines of other settings are in the file, then records
        the current settings beside it."""
        side = os.path.join(os.path.dirname(os.path.abspath(self.path)), SETTINGS_NAME)
        stale = sum(r.get("settings") != self.fingerprint for r in self._records.values())
        if stale:
            old = {}
            if os.path.exists(side):
                try:
                    with open(side) as f:
                        old = json.load(f)
                except ValueError:
                    old = {}
            changed = changed_settings(old, json.loads(json.dumps(settings, default=str))) if old else []
            log.warning("%s: %d question(s) were scored with other settings (%s); they are scored again",
                        self.path, stale, "; ".join(changed[:8]) or "no settings.json to compare with")
        with open(side, "w") as f:
            json.dump(settings, f, indent=2, sort_keys=True, default=str)

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
        if rec is None or len(rec.get("samples", [])) < k or not self.current(rec):
            return False
        return not refine or all(s.get("refined") for s in rec["samples"][:k])

    def current(self, record: Mapping[str, Any]) -> bool:
        """Whether the line was made with this store's settings."""
        return self.fingerprint is None or record.get("settings") == self.fingerprint

    def append(self, record: dict[str, Any]) -> None:
        if self.fingerprint is not None:
            record = {**record, "settings": self.fingerprint}
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
        """The benchmark's lines made with the current settings."""
        return [r for (b, _), r in self._records.items() if b == benchmark and self.current(r)]

    def failure_reasons(self, limit: int = 3) -> list[str]:
        """'benchmark/id: reason' of the first failed samples (episode or scoring errors)."""
        out = []
        for rec in self._records.values():
            if not self.current(rec):
                continue
            for sample in rec.get("samples", []):
                traj = sample.get("trajectory") or {}
                if sample_failed(sample):
                    reason = traj.get("error") or (sample.get("judge") or {}).get("reasoning") or "unknown error"
                    out.append(f"{rec.get('id')}: {str(reason)[:200]}")
                    if len(out) >= limit:
                        return out
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._records.values())

    def __len__(self) -> int:
        return len(self._records)
