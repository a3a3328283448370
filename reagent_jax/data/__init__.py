"""Grain input pipelines: validated JSONL/parquet sources, TFDS/ArrayRecord datasets, row schemas, resumable batch loaders."""

from reagent_jax.data.benchmarks import (benchmark_dir, benchmark_name, list_benchmarks, load_benchmark,
                                         resolve_benchmark)
from reagent_jax.data.loader import BatchIterator, make_loader
from reagent_jax.data.schemas import (
    AGENT_RL,
    AGENT_SFT,
    BENCHMARK,
    EVALPLANNER_PAIR,
    RRM_RL,
    RRM_SFT,
    SCHEMAS,
    Field,
    RowError,
    Schema,
    get_schema,
)
from reagent_jax.data.sources import JsonlSource, RowsAt, expand_paths
from reagent_jax.data.tfds_rows import TfdsSource, build_dataset, is_tfds_spec, open_rows

__all__ = [
    "AGENT_RL",
    "AGENT_SFT",
    "BENCHMARK",
    "EVALPLANNER_PAIR",
    "RRM_RL",
    "RRM_SFT",
    "SCHEMAS",
    "TfdsSource",
    "BatchIterator",
    "Field",
    "JsonlSource",
    "RowError",
    "RowsAt",
    "Schema",
    "benchmark_dir",
    "benchmark_name",
    "build_dataset",
    "expand_paths",
    "get_schema",
    "is_tfds_spec",
    "list_benchmarks",
    "load_benchmark",
    "make_loader",
    "open_rows",
    "resolve_benchmark",
]
