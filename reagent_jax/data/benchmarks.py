"""The normalised benchmark test sets (shared/data/benchmarks/*.jsonl, schema `BENCHMARK`).

Evaluation reads whole files (hundreds of rows), so this returns plain lists. A bare name such as
"bamboogle" is looked up in `benchmark_dir()`, so launch flags can say `--benchmarks=gsm8k_full,hle`.
"""
from __future__ import annotations

import os
from typing import Optional

from reagent_jax.data.schemas import BENCHMARK
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


def resolve_benchmark(path_or_name: str | os.PathLike) -> str:
    """A file path as given, or `<benchmark_dir>/<name>.jsonl` for a bare name."""
    path = os.fspath(path_or_name)
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


def load_benchmark(path: str | os.PathLike, *, limit: Optional[int] = None,
                   skipped: Optional[list] = None) -> list[dict]:
    """Validated rows of one benchmark file, in file order; broken rows are skipped with a warning.

    `skipped`, when given, is extended with (file, line, reason) of every broken row of the file,
    so an evaluation can report how many questions it could not even read.
    Raises ValueError when two rows share an `id` (results are keyed by id).
    """
    source = JsonlSource(resolve_benchmark(path), BENCHMARK)
    if skipped is not None:
        skipped.extend(source.skipped)
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
        source.close()
