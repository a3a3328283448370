"""A tqdm progress bar that shows a few key metrics under short names.

`tqdm.auto` picks the widget bar in notebooks and the text bar in terminals. In batch jobs
(stderr not a TTY) or with REAGENT_NO_PROGRESS=1 the bar is off, so logs are not filled with
carriage-return noise; `log_every` then writes a plain log line every N steps instead.
"""
from __future__ import annotations

import logging
import math
import os
import sys
from typing import Any, Mapping, Optional, Sequence

from reagent_jax.metrics.writer import to_scalar

ENV_DISABLE = "REAGENT_NO_PROGRESS"

# Short names for the postfix; other keys use their last path part ("actor/pg_loss" -> "pg_loss").
SHORT_NAMES = {
    "critic/score/mean": "score",
    "critic/rewards/mean": "reward",
    "val/accuracy": "val_acc",
    "response_length/mean": "resp_len",
    "num_turns/mean": "turns",
    "tool_call_counts/mean": "tools",
    "perf/throughput": "tok/s",
    "perf/mfu": "mfu",
    "timing_s/step": "s/step",
    "timing_s/gen": "gen_s",
    "timing_s/update_actor": "upd_s",
}


def short_name(key: str) -> str:
    """Postfix label for a metric key."""
    if key in SHORT_NAMES:
        return SHORT_NAMES[key]
    parts = [p for p in key.split("/") if p and p != "mean"]
    return parts[-1] if parts else key


def _in_notebook() -> bool:
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython else None
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def progress_enabled() -> bool:
    """False with REAGENT_NO_PROGRESS=1, or outside notebooks when stderr is not a TTY."""
    if os.environ.get(ENV_DISABLE, "").strip().lower() in ("1", "true", "yes"):
        return False
    if _in_notebook():
        return True
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def _fmt(value: Any) -> str:
    try:
        value = to_scalar(value)
    except TypeError:
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


class ProgressBar:
    """Progress over `total` steps with chosen metrics in the postfix.

    Args:
      keys: metric keys to show (a list, or a mapping key -> short label).
      disable: force on/off; default `progress_enabled()`.
      log_every: when the bar is off, log a line every this many steps (None: never).
    """

    def __init__(self, total: Optional[int], desc: str = "", keys: Sequence[str] | Mapping[str, str] = (), *,
                 initial: int = 0, disable: Optional[bool] = None, log_every: Optional[int] = None,
                 file: Any = None):
        from tqdm.auto import tqdm
        self.labels = dict(keys) if isinstance(keys, Mapping) else {k: short_name(k) for k in keys}
        self.desc, self.total, self.step = desc, total, initial
        self.disabled = (not progress_enabled()) if disable is None else disable
        self.log_every = log_every
        self.postfix: dict[str, str] = {}
        self._bar = tqdm(total=total, desc=desc, initial=initial, disable=self.disabled,
                         dynamic_ncols=True, leave=True, file=file)

    def update(self, n: int = 1, metrics: Optional[Mapping[str, Any]] = None) -> None:
        """Advances by `n` steps and shows the latest values of the chosen keys."""
        self.step += n
        if metrics:
            self.set_metrics(metrics)
        self._bar.update(n)
        # a line whenever a multiple of log_every is reached or passed (updates may advance by n > 1)
        if self.disabled and self.log_every and self.step // self.log_every > (self.step - n) // self.log_every:
            total = f"/{self.total}" if self.total else ""
            shown = " ".join(f"{k}={v}" for k, v in self.postfix.items())
            logging.info("%s step %d%s %s", self.desc, self.step, total, shown)

    def set_metrics(self, metrics: Mapping[str, Any]) -> None:
        """Updates the postfix from a metrics dict (keys not chosen are ignored)."""
        for key, label in self.labels.items():
            if key in metrics:
                self.postfix[label] = _fmt(metrics[key])
        if not self.disabled:
            self._bar.set_postfix(self.postfix, refresh=False)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
