"""Training curves from `metrics.jsonl` as one PNG (reward, accuracy, loss, length).

Uses matplotlib's object API with the Agg canvas, not pyplot, so it works headless and does not
switch the backend of a notebook that imports it.
"""
from __future__ import annotations

import logging
import math
import os
from typing import Optional, Sequence

from reagent_jax.metrics.writer import read_metrics

DEFAULT_KEYS = ("critic/score/mean", "val/accuracy", "actor/pg_loss", "response_length/mean", "sft/nll",
                "dpo/loss", "rewards/accuracies")

TITLES = {
    "critic/score/mean": "Mean reward",
    "critic/rewards/mean": "Mean reward (shaped)",
    "val/accuracy": "Validation accuracy",
    "actor/pg_loss": "Policy-gradient loss",
    "actor/kl_loss": "KL loss",
    "actor/entropy": "Entropy",
    "actor/grad_norm": "Gradient norm",
    "response_length/mean": "Mean response length (tokens)",
    "num_turns/mean": "Mean turns per trajectory",
    "tool_call_counts/mean": "Mean tool calls per trajectory",
    "perf/throughput": "Throughput (tokens/s)",
    "perf/mfu": "Model FLOPs utilisation",
}


def title_for(key: str) -> str:
    """Readable subplot title; the raw key stays visible for grepping."""
    return f"{TITLES[key]} ({key})" if key in TITLES else key


def _ema(values: list[float], alpha: float) -> list[float]:
    out, acc = [], values[0]
    for v in values:
        acc = alpha * v + (1 - alpha) * acc
        out.append(acc)
    return out


def plot_curves(workdir: str | os.PathLike, keys: Optional[Sequence[str]] = None,
                out_png: Optional[str | os.PathLike] = None) -> str:
    """Writes one subplot per key (default: those of `DEFAULT_KEYS` that were logged); returns the path.

    Raises ValueError when none of the keys has a finite value (and lists the keys that do).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    workdir = os.fspath(workdir)
    if isinstance(keys, str):  # one key, not its characters
        keys = [keys]
    rows = read_metrics(workdir)
    series: dict[str, tuple[list[int], list[float]]] = {}
    for row in rows:
        for key, value in row.items():
            if key in ("step", "time") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                xs, ys = series.setdefault(key, ([], []))
                xs.append(row["step"])
                ys.append(float(value))
    wanted = list(keys) if keys is not None else [k for k in DEFAULT_KEYS if k in series]
    missing = [k for k in wanted if k not in series]
    if missing and keys is not None:
        logging.warning("plot_curves: no values for %s in %s", missing, workdir)
    wanted = [k for k in wanted if k in series]
    if not wanted:
        raise ValueError(f"nothing to plot in {workdir}: logged keys are {sorted(series)}")

    ncols = 1 if len(wanted) == 1 else 2
    nrows = math.ceil(len(wanted) / ncols)
    fig = Figure(figsize=(6 * ncols, 3.6 * nrows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    for i, key in enumerate(wanted):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        xs, ys = series[key]
        sparse = len(xs) <= 30  # e.g. validation every N steps: show the points
        ax.plot(xs, ys, marker="o" if sparse else None, markersize=3,
                alpha=1.0 if sparse else 0.35, color="C0", label=None if sparse else "raw")
        if not sparse:
            ax.plot(xs, _ema(ys, alpha=min(1.0, 10 / len(ys))), color="C0", label="smoothed")
            ax.legend(loc="best", fontsize=8)
        ax.set_title(title_for(key), fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    path = os.fspath(out_png) if out_png is not None else os.path.join(workdir, "curves.png")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    return path
