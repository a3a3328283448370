"""The plain functional loop shared by every training stage (big_vision style).

A stage supplies `batch_fn(step, params) -> (batch | [batch, ...] | None, metrics)`: a list is
applied as consecutive optimizer updates within the step (PPO mini-batches; their metrics are
averaged). The data for `step` must be a pure function of (seed, step) and the current params,
so a run killed at any point and resumed from its last checkpoint replays exactly what an
uninterrupted run would have done. The runner owns the train state, its shardings, Orbax
checkpoints (keep last N), metrics (JSONL + TensorBoard), the progress bar and the final params
export.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

from reagent_jax import checkpoint, metrics as metrics_lib
from reagent_jax.models.functional import param_shapes, param_shardings
from reagent_jax.rl import train_step as ts

log = logging.getLogger(__name__)

BatchFn = Callable[[int, Any], tuple[Optional[dict], dict]]


class StageRunner:
    def __init__(self, ctx, stage: str, model_cfg, params, objective, opt_cfg: ts.OptimizerConfig, *,
                 total_steps: int, micro_batches: int = 1, checkpoint_every: int = 50, keep: int = 2,
                 progress_keys: Sequence[str] = ()):
        self.ctx, self.stage, self.model_cfg = ctx, stage, model_cfg
        self.total_steps = total_steps
        self.dir = ctx.stage_dir(stage)
        self.optimizer = ts.make_optimizer(opt_cfg)
        self.shardings = None
        if ctx.mesh is not None:
            self.shardings = ts.state_shardings(param_shardings(model_cfg, ctx.mesh), self.optimizer, ctx.mesh,
                                                param_shapes(model_cfg))
        self.step_fn = ts.make_train_step(objective, self.optimizer, num_micro_batches=micro_batches,
                                          shardings=self.shardings)
        self.ckpt = checkpoint.TrainCheckpointer(f"{self.dir}/ckpt", keep=keep)
        self.checkpoint_every = checkpoint_every
        self.state = ts.init_state(params, self.optimizer, self.shardings)
        self.start_step = 0
        latest = self.ckpt.latest_step()
        if latest is not None:
            self.state, meta = self.ckpt.restore(self.state, latest)
            self.start_step = int(meta["step"])
            log.info("%s: resumed from step %d (%s)", stage, self.start_step, self.ckpt.directory)
        # metrics of step s are logged at s + 1: a resumed run rewrites from start_step + 1 on
        resume = self.start_step + 1 if latest is not None else None
        self.writer = metrics_lib.MetricsWriter(self.dir, resume_step=resume)
        self.progress_keys = list(progress_keys)

    @property
    def params(self):
        return self.state.params

    def _update(self, batches: list, step: int) -> dict:
        """One optimizer update per batch; metrics averaged over them (skips summed)."""
        per_update = []
        for batch in batches:
            self.state, tm = self.step_fn(self.state, ts.shard_batch(batch, self.ctx.mesh))
            per_update.append({k: float(np.asarray(v)) for k, v in jax.device_get(tm).items()})
        m = {k: float(np.mean([u[k] for u in per_update])) for k in per_update[0]}
        skipped = sum(u.get("train/skipped_nonfinite", 0.0) for u in per_update)
        if skipped:
            m["train/skipped_nonfinite"] = skipped
            log.warning("%s step %d: non-finite loss or gradient in %d of %d updates; skipped", self.stage, step,
                        int(skipped), len(batches))
        if len(batches) > 1:
            m["train/updates"] = float(len(batches))
        return m

    def run(self, batch_fn: BatchFn, after_step: Optional[Callable[[int, dict], dict]] = None):
        """Runs steps [start_step, total_steps); returns the final params (also saved to final/)."""
        bar = metrics_lib.ProgressBar(self.total_steps, desc=self.stage, keys=self.progress_keys,
                                      initial=self.start_step, log_every=max(1, self.total_steps // 10))
        try:
            for step in range(self.start_step, self.total_steps):
                t0 = time.perf_counter()
                batch, m = batch_fn(step, self.state.params)
                t1 = time.perf_counter()
                m = dict(m)
                if batch is not None:
                    m.update(self._update(batch if isinstance(batch, list) else [batch], step))
                else:
                    m["train/skipped_empty_batch"] = 1.0
                m["timing_s/update_actor"] = time.perf_counter() - t1
                m["timing_s/step"] = time.perf_counter() - t0
                if after_step is not None:
                    m.update(after_step(step, m) or {})
                self.writer.write(step + 1, m)
                bar.update(1, m)
                if (step + 1) % self.checkpoint_every == 0 or step + 1 == self.total_steps:
                    self.ckpt.save(step + 1, self.state, {"step": step + 1, "stage": self.stage})
        finally:
            bar.close()
            self.writer.close()
        checkpoint.save_params(self.ctx.final_dir(self.stage), self.model_cfg, self.state.params)
        return self.state.params
