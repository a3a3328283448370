"""Run metrics: JSONL + TensorBoard writer, resumable read-back, progress bar, curves, tables."""

from reagent_jax.metrics.plots import DEFAULT_KEYS, plot_curves, title_for
from reagent_jax.metrics.progress import ProgressBar, progress_enabled, short_name
from reagent_jax.metrics.tables import markdown_table
from reagent_jax.metrics.writer import JSONL_NAME, TB_DIR, MetricsWriter, read_metrics, to_scalar

__all__ = [
    "DEFAULT_KEYS",
    "JSONL_NAME",
    "TB_DIR",
    "MetricsWriter",
    "ProgressBar",
    "markdown_table",
    "plot_curves",
    "progress_enabled",
    "read_metrics",
    "short_name",
    "title_for",
    "to_scalar",
]
