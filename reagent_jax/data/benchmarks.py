"""The normalised benchmark test sets (shared/data/benchmarks/*.jsonl, schema `BENCHMARK`).

Evaluation reads whole files (hundreds of rows), so this returns plain lists. A bare name such as
"bamboogle" is looked up in `benchmark_dir()`, so launch flags can say `--benchmarks=gsm8k_full,hle`.
A `tfds:reagent_benchmark/NAME[:split]` spec reads a built dataset instead (`data.build_dataset`),
in its record order (TFDS shuffles at build time, so `limit` takes a fixed sample, not the file's head).
"""
from __future__ import annotations

import os
from typing import Optional

from reagent_jax.data.schemas import BENCHMARK
from reagent_jax.data import tfds_rows
from reagent_jax.data.sources import JsonlSource

ENV_DIR = "REAGENT_BENCHMARK_DIR"


def benchmark_dir() -> Optional[str]:
    """$REAGENT_BENCHMARK_DIR, else shared/data/benchmarks inside or next to the repository."""
    if os.environ.get(ENV_DIR):
        return os.environ[ENV_DIR]
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for base in (repo, os.path.dirname(repo)):
        candidate = os.path.join(base, "shared", "data", "benchmarks")
        if os.path.isdir(candidate):
            return candidate
    return None


def resolve_benchmark(path_or_name: str | os.PathLike, data_dir: Optional[str] = None) -> str:
    """A file path as given, `<benchmark_dir>/<name>.jsonl` for a bare name, or a `tfds:` spec of a
    built dataset (FileNotFoundError naming the build command when there is none)."""
    path = os.fspath(path_or_name)
    if tfds_rows.is_tfds_spec(path):
        tfds_rows.dataset_dir(path, data_dir)
        return path
    if os.path.isfile(path):
        return path
    if os.sep not in path and not path.endswith(".jsonl"):
        base = benchmark_dir()
        if base is not None and os.path.isfile(os.path.join(base, path + ".jsonl")):
            return os.path.join(base, path + ".jsonl")
        raise FileNotFoundError(f"benchmark {path!r} not found (looked in {base or 'no benchmark dir'}; "
                                f"set ${ENV_DIR} or pass a file path)")
    raise FileNotFoundError(f"benchmark file not found: {path}")


def list_benchmarks(directory: Optional[str] = None) -> list[str]:
    """Names of the benchmark files available (without `.jsonl`)."""
    directory = directory or benchmark_dir()
    if directory is None or not os.path.isdir(directory):
        return []
    return sorted(f[:-len(".jsonl")] for f in os.listdir(directory) if f.endswith(".jsonl"))


def benchmark_name(path: str) -> str:
    """The results key of a benchmark path: the file's stem, or a `tfds:` dataset's name (with its
    split when not train)."""
    if tfds_rows.is_tfds_spec(path):
        _, name, split = tfds_rows.parse_spec(path)
        return name if split == "train" else f"{name}_{split}"
    return os.path.splitext(os.path.basename(path))[0]


def load_benchmark(path: str | os.PathLike, *, limit: Optional[int] = None,
                   skipped: Optional[list] = None, data_dir: Optional[str] = None) -> list[dict]:
    """Validated rows of one benchmark file (in file order) or built `tfds:` dataset (in record
    order); broken rows are skipped with a warning.

    `skipped`, when given, is extended with (file, line, reason) of every broken row, so an
    evaluation can report how many questions it could not even read (a built dataset kept only the
    count: its rows are named in the build's warnings).
    Raises ValueError when two rows share an `id` (results are keyed by id).
    """
    path = resolve_benchmark(path, data_dir)
    source = tfds_rows.open_rows(path, BENCHMARK, data_dir=data_dir)
    broken = (source.skipped if isinstance(source, JsonlSource) else
              [(path, "build", "broken row skipped when the dataset was built")] * source.skipped_rows)
    if skipped is not None:
        skipped.extend(broken)
    try:
        n = len(source) if limit is None else min(limit, len(source))
        rows, seen = [], {}
        for i in range(n):
            row = source[i]
            if row["id"] in seen:
                raise ValueError(f"{source.where(i)}: duplicate id {row['id']!r} "
                                 f"(first at {seen[row['id']]})")
            seen[row["id"]] = source.where(i)
            rows.append(row)
        return rows
    finally:
        if isinstance(source, JsonlSource):
            source.close()
