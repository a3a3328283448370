"""Random-access record sources over JSONL (and parquet) files, validated once at index time.

Grain wants `len()` and `source[i]`; training sets (Reagent-RL-709K) are too large to hold as
Python objects, so a JSONL file is scanned once to record the byte offset of every valid line and
each `source[i]` reads and parses just that line (`os.pread`, safe from Grain's reader threads).
Parquet files are indexed by row and read one row group at a time (a small cache per file).

Broken rows are found while indexing, never mid-epoch: they are skipped with one warning per file
(how many, and the first few file:line reasons) and listed in `source.skipped` (or, with
`on_error="raise"`, the first one stops). A row is broken when it is not valid UTF-8, not JSON,
holds a lone surrogate (`"\ud800"`: valid JSON, but no tokenizer or UTF-8 writer accepts it) or
fails the schema. A file that is a JSON array rather than JSON Lines is an error either way:
it has no rows to skip, only a wrong format (launch/convert_data.py converts it).
"""
from __future__ import annotations

import bisect
import collections
import collections.abc
import glob
import hashlib
import json
import logging
import os
import re
import threading
from typing import Any, Iterator, Literal, Optional, Sequence

import numpy as np

from reagent_jax.data.schemas import RowError, Schema, get_schema

_BOM = b"\xef\xbb\xbf"
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # cheap pre-check before the exact one
_SHOWN_REASONS = 5  # reasons quoted in each per-file warning
_ROW_GROUP_CACHE = 2  # parquet row groups kept decoded per file

PathLike = str | os.PathLike


def expand_paths(paths: PathLike | Sequence[PathLike]) -> list[str]:
    """Files from a path, a glob pattern, a directory (its *.jsonl / *.parquet) or a list of those."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: list[str] = []
    for item in items:
        item = os.fspath(item)
        if os.path.isdir(item):
            found = sorted(glob.glob(os.path.join(item, "*.jsonl")) + glob.glob(os.path.join(item, "*.parquet")))
        elif any(c in item for c in "*?["):
            found = sorted(glob.glob(item))
        else:
            if not os.path.isfile(item):
                raise FileNotFoundError(f"data file not found: {item}")
            found = [item]
        if not found:
            raise FileNotFoundError(f"no .jsonl/.parquet files match {item}")
        out.extend(found)
    if not out:
        raise ValueError("no data files given")
    return out


class _JsonlFile:
    """Line offsets of the valid rows of one JSONL file."""

    def __init__(self, path: str, offsets: np.ndarray, lengths: np.ndarray, lines: np.ndarray):
        self.path, self.offsets, self.lengths, self.lines = path, offsets, lengths, lines
        self._fd: Optional[int] = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.offsets)

    def where(self, i: int) -> str:
        return f"{self.path}:{int(self.lines[i])}"

    def raw(self, i: int) -> Any:
        if self._fd is None:
            with self._lock:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDONLY)
        data = os.pread(self._fd, int(self.lengths[i]), int(self.offsets[i]))
        return json.loads(data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __getstate__(self):  # picklable for Grain worker processes: reopen lazily there
        state = dict(self.__dict__)
        state["_fd"], state["_lock"] = None, None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


class _ParquetFile:
    """Row numbers of the valid rows of one parquet file; rows are read per row group."""

    def __init__(self, path: str, rows: np.ndarray, group_starts: list[int]):
        self.path, self.rows, self.group_starts = path, rows, group_starts
        self._cache: collections.OrderedDict[int, list] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._pf = None

    def __len__(self) -> int:
        return len(self.rows)

    def where(self, i: int) -> str:
        return f"{self.path}:row {int(self.rows[i])}"

    def raw(self, i: int) -> Any:
        row = int(self.rows[i])
        group = bisect.bisect_right(self.group_starts, row) - 1
        with self._lock:
            if group not in self._cache:
                if self._pf is None:
                    import pyarrow.parquet as pq
                    self._pf = pq.ParquetFile(self.path)
                self._cache[group] = self._pf.read_row_group(group).to_pylist()
                while len(self._cache) > _ROW_GROUP_CACHE:
                    self._cache.popitem(last=False)
            self._cache.move_to_end(group)
            return self._cache[group][row - self.group_starts[group]]

    def close(self) -> None:
        self._pf, self._cache = None, collections.OrderedDict()

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_pf"], state["_lock"], state["_cache"] = None, None, collections.OrderedDict()
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()


class JsonlSource:
    """Grain `RandomAccessDataSource` over validated rows of one or many JSONL / parquet files.

    Args:
      paths: file(s), glob(s) or directories; `.parquet` files are read with pyarrow.
      schema: a `Schema`, a schema name (`"agent_rl"`, ...) or None (any JSON object).
      on_error: "skip" drops broken rows with a warning; "raise" stops at the first one.
    """

    def __init__(self, paths: PathLike | Sequence[PathLike], schema: Schema | str | None = None, *,
                 on_error: Literal["skip", "raise"] = "skip"):
        if on_error not in ("skip", "raise"):
            raise ValueError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
        self.schema = None if schema is None else get_schema(schema)
        self.on_error = on_error
        self.paths = expand_paths(paths)
        self.skipped: list[tuple[str, int, str]] = []  # (file, line or parquet row, reason)
        self._digest = hashlib.blake2b(digest_size=16)  # the kept rows' bytes, file by file
        self._files = [self._index(p) for p in self.paths]
        # A hash of the content (not of the paths; JSONL: the kept lines, parquet: the file's bytes):
        # a resumed loader refuses a state taken over other data of the same length (`make_loader`).
        # A str, so the source still pickles.
        self.content_fingerprint: str = self._digest.hexdigest()
        del self._digest
        self._starts = np.cumsum([0] + [len(f) for f in self._files])
        if self._starts[-1] == 0:
            reasons = "; ".join(f"{f}:{n}: {r}" for f, n, r in self.skipped[:_SHOWN_REASONS])
            raise ValueError(f"no valid rows in {', '.join(self.paths)}"
                             + (f" ({len(self.skipped)} broken, e.g. {reasons})" if reasons else " (files are empty)"))

    def _check(self, row: Any) -> dict:
        return self.schema.validate(row) if self.schema is not None else _any_object(row)

    def _reject(self, path: str, line: int, reason: str, bad: list) -> None:
        if self.on_error == "raise":
            raise ValueError(f"{path}:{line}: {reason}")
        bad.append((path, line, reason))

    def _index(self, path: str) -> _JsonlFile | _ParquetFile:
        bad: list[tuple[str, int, str]] = []
        if path.endswith(".parquet"):
            entry, total = self._index_parquet(path, bad)
        else:
            entry, total = self._index_jsonl(path, bad)
        if bad:
            unit = "row" if path.endswith(".parquet") else "line"
            shown = "; ".join(f"{unit} {n}: {r}" for _, n, r in bad[:_SHOWN_REASONS])
            more = f" (and {len(bad) - _SHOWN_REASONS} more)" if len(bad) > _SHOWN_REASONS else ""
            logging.warning("%s: skipped %d of %d rows: %s%s", path, len(bad), total, shown, more)
            self.skipped.extend(bad)
        return entry

    def _index_jsonl(self, path: str, bad: list) -> tuple[_JsonlFile, int]:
        offsets, lengths, lines = [], [], []
        total, offset = 0, 0
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                start, offset = offset, offset + len(raw)
                if lineno == 1 and raw.startswith(_BOM):
                    start, raw = start + len(_BOM), raw[len(_BOM):]
                if not raw.strip():
                    continue  # blank lines are not rows
                if total == 0 and _opens_array(raw):
                    raise ValueError(f"{path}:{lineno}: this is a JSON array, not JSON Lines (one object "
                                     "per line); convert it with launch/convert_data.py")
                total += 1
                try:
                    row = json.loads(raw.decode("utf-8-sig"))  # strict: also refuses encoded surrogates
                    if _SURROGATE_ESCAPE.search(raw):
                        _check_unicode(row)
                    self._check(row)
                except UnicodeDecodeError:
                    self._reject(path, lineno, "not valid UTF-8", bad)
                    continue
                except json.JSONDecodeError as e:
                    self._reject(path, lineno, f"bad JSON ({e.msg} at column {e.colno})", bad)
                    continue
                except RowError as e:
                    self._reject(path, lineno, str(e), bad)
                    continue
                offsets.append(start)
                lengths.append(len(raw))
                lines.append(lineno)
                self._digest.update(raw)
        return _JsonlFile(path, np.asarray(offsets, np.int64), np.asarray(lengths, np.int64),
                          np.asarray(lines, np.int64)), total

    def _index_parquet(self, path: str, bad: list) -> tuple[_ParquetFile, int]:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(f"reading {path} needs pyarrow (pip install pyarrow)") from None
        pf = pq.ParquetFile(path)
        rows, group_starts, row = [], [], 0
        for g in range(pf.num_row_groups):
            group_starts.append(row)
            for item in pf.read_row_group(g).to_pylist():
                try:
                    self._check(item)
                    rows.append(row)
                except RowError as e:
                    self._reject(path, row, str(e), bad)
                row += 1
        with open(path, "rb") as f:  # the bytes, not each row re-serialised (which cost ~40% of indexing)
            for block in iter(lambda: f.read(1 << 20), b""):
                self._digest.update(block)
        return _ParquetFile(path, np.asarray(rows, np.int64), group_starts), row

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _locate(self, index: int) -> tuple[_JsonlFile | _ParquetFile, int]:
        index = int(index)
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for {n} rows")
        index %= n
        k = int(np.searchsorted(self._starts, index, side="right")) - 1
        return self._files[k], index - int(self._starts[k])

    def __getitem__(self, index: int) -> dict:
        file, i = self._locate(index)
        try:
            return self._check(file.raw(i))
        except (ValueError, OSError) as e:  # the file changed after indexing
            raise RuntimeError(f"{file.where(i)}: row changed since it was indexed ({e})") from e

    def where(self, index: int) -> str:
        """`file:line` of a row, for error messages further down the pipeline."""
        file, i = self._locate(index)
        return file.where(i)

    def __iter__(self) -> Iterator[dict]:
        return (self[i] for i in range(len(self)))

    def close(self) -> None:
        for f in self._files:
            f.close()

    def __repr__(self) -> str:
        name = self.schema.name if self.schema else "any"
        return f"JsonlSource({len(self.paths)} files, {len(self)} rows, schema={name}, skipped={len(self.skipped)})"


class RowsAt(collections.abc.Sequence):
    """The rows of `source` at `indices`, each read on first access and then kept.

    A training step names its questions by index; handing the step a `RowsAt` instead of a list
    of read rows lets each host of a multi-host run read only the rows its own episodes use
    (`AgentLoop.run` fetches a record in the episode's thread), so per-step reads do not grow
    with the number of hosts. Thread-safe: two threads may both read a row; one copy is kept."""

    def __init__(self, source: Sequence[dict], indices: Sequence[int]):
        self.source, self.indices = source, [int(i) for i in indices]
        self._rows: dict[int, dict] = {}

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(len(self)))]
        j = range(len(self))[j]  # IndexError out of range; negative j counts from the end
        if j not in self._rows:
            self._rows.setdefault(j, self.source[self.indices[j]])
        return self._rows[j]

    @property
    def rows_read(self) -> int:
        """How many distinct rows this process has read."""
        return len(self._rows)


def _opens_array(line: bytes) -> bool:
    """The first row line of a pretty-printed JSON array (`[` alone, or `[` then an unfinished value)."""
    if not line.lstrip().startswith(b"["):
        return False
    try:
        json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return True
    return False  # a complete one-line list: an ordinary broken row


def _check_unicode(row: Any) -> None:
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise RowError(f"lone surrogate {e.object[e.start]!r} near {e.object[max(0, e.start - 20):e.start]!r} "
                       "(not valid Unicode)") from None


def _any_object(row: Any) -> dict:
    if not isinstance(row, dict):
        raise RowError(f"expected a JSON object, got {type(row).__name__}")
    return row
