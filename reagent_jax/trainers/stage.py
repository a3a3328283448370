"""The plain functional loop shared by every training stage (big_vision style).

A stage supplies `batch_fn(step, params) -> (batch | [batch, ...] | None, metrics)`: a list is
applied as consecutive optimizer updates within the step (PPO mini-batches; their metrics are
averaged). The data for `step` must be a pure function of (seed, step) and the current params,
so a run killed at any point and resumed from its last checkpoint replays exactly what an
uninterrupted run would have done. The runner owns the train state, its shardings, Orbax
checkpoints (keep last N), metrics (JSONL + TensorBoard), the progress bar and the final params
export.

Resuming: the newest readable checkpoint of `<stage>/ckpt` is restored (a damaged newer one is
skipped with a warning, see `TrainCheckpointer.restore_latest`); metrics of the steps after it
are logged again and replace the killed run's. Each checkpoint records the model, optimizer and
data settings it was written with. A changed model shape or optimizer-state layout is an error
(the arrays cannot be restored); any other change (learning rate, schedule, total steps, batch
size, seed, ...) is logged as a warning and the run goes on under the new settings from the
restored step: the optimizer's step count (so the schedule's position) and params are restored,
and the data of step s follows the new settings.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import numpy as np

from reagent_jax import checkpoint as ckpt_lib, metrics as metrics_lib
from reagent_jax.metrics import perf
from reagent_jax.models.config import Qwen3Config
from reagent_jax.models.flops import train_flops
from reagent_jax.models.functional import param_shapes, param_shardings
from reagent_jax.rl import train_step as ts
from reagent_jax.trainers.interrupt import StopRequested, stop_on_signals
from reagent_jax.typed_config import Block, Problem, at_least

log = logging.getLogger(__name__)

BatchFn = Callable[[int, Any], tuple[Optional[dict], dict]]


def _jsonable(x):
    return json.loads(json.dumps(x, default=str))


def _changes(old: Mapping, new: Mapping) -> list[str]:
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def _shapes(cfg: Qwen3Config) -> list:
    leaves = jax.tree_util.tree_leaves_with_path(param_shapes(cfg))
    return [(jax.tree_util.keystr(p), tuple(x.shape)) for p, x in leaves]


def _known(cls, d: Mapping) -> dict:
    """The fields of dataclass `cls` in `d` (a checkpoint of an older or newer version may differ)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def _opt_layout(opt_cfg: ts.OptimizerConfig, cfg: Qwen3Config):
    return jax.tree.structure(jax.eval_shape(ts.make_optimizer(opt_cfg).init, param_shapes(cfg)))


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(Block):
    """config.checkpoint: a train-state checkpoint every `every` steps (and at the end), the
    newest `keep` kept."""
    every: int = 50
    keep: int = 2

    def problems(self) -> list[Problem]:
        return at_least(self, every=1, keep=1)


class StageRunner:
    def __init__(self, ctx, stage: str, model_cfg, params, objective, opt_cfg: ts.OptimizerConfig, *,
                 total_steps: int, micro_batches: int = 1, checkpoint: CheckpointConfig = CheckpointConfig(),
                 progress_keys: Sequence[str] = (), data_config: Optional[Mapping[str, Any]] = None):
        """`data_config`: the settings that decide each step's data (batch size, seed, ...),
        recorded in every checkpoint so that a resume with other values is reported."""
        self.ctx, self.stage, self.model_cfg, self.opt_cfg = ctx, stage, model_cfg, opt_cfg
        self.total_steps, self.micro_batches = total_steps, micro_batches
        self.data_config = _jsonable(dict(data_config or {}))
        self.dir = ctx.stage_dir(stage)
        self.optimizer = ts.make_optimizer(opt_cfg)
        self.shardings = None
        if ctx.mesh is not None:
            self.shardings = ts.state_shardings(param_shardings(model_cfg, ctx.mesh), self.optimizer, ctx.mesh,
                                                param_shapes(model_cfg))
        self.step_fn = ts.make_train_step(objective, self.optimizer, num_micro_batches=micro_batches,
                                          shardings=self.shardings)
        self.ckpt = ckpt_lib.TrainCheckpointer(f"{self.dir}/ckpt", keep=checkpoint.keep)
        self.checkpoint_every = checkpoint.every
        self.state = ts.init_state(params, self.optimizer, self.shardings)
        self.start_step = 0
        restored = self.ckpt.restore_latest(self.state, check=self._check_resume)
        if restored is None:
            log.info("%s: no checkpoint in %s; starting at step 0", stage, self.ckpt.directory)
        else:
            self.start_step, self.state, _ = restored
            log.info("%s: resumed from step %d (%s)", stage, self.start_step, self.ckpt.directory)
            if self.start_step > total_steps:
                log.warning("%s: the checkpoint is at step %d, past total_steps=%d; nothing left to train",
                            stage, self.start_step, total_steps)
        self.saved_step = self.start_step
        self._warn_redone_steps()
        # metrics of step s are logged at s + 1: a (re)started run replaces everything from
        # start_step + 1 on, including what a run killed before its first checkpoint wrote
        self.writer = metrics_lib.MetricsWriter(self.dir, resume_step=self.start_step + 1)
        self.progress_keys = list(progress_keys)

    def _warn_redone_steps(self) -> None:
        """A run killed between checkpoints logged steps it has to train again: say which."""
        try:
            logged = [int(m["step"]) for m in metrics_lib.read_metrics(self.dir)]
        except (FileNotFoundError, KeyError, ValueError):
            return
        redone = [s for s in logged if s > self.start_step]
        if redone:
            log.warning("%s: steps %d-%d were logged after the last checkpoint (step %d) by an interrupted run; "
                        "they are trained again and their metrics replaced", self.stage, min(redone), max(redone),
                        self.start_step)

    def _save(self, step: int) -> None:
        self.ckpt.save(step, self.state, {"step": step, "stage": self.stage, **self._settings()})
        self.saved_step = step

    def _settings(self) -> dict:
        return {"model": _jsonable(dataclasses.asdict(self.model_cfg)),
                "optimizer": _jsonable(dataclasses.asdict(self.opt_cfg)),
                "total_steps": self.total_steps, "micro_batches": self.micro_batches, "data": self.data_config}

    def _check_resume(self, meta: dict) -> None:
        """Raises on a checkpoint whose arrays cannot fit this run; warns about other changes."""
        where = f"{self.stage}: checkpoint step {meta.get('step')} in {self.ckpt.directory}"
        now = self._settings()
        if "model" in meta:
            model_changes = _changes(meta["model"], now["model"])
            if model_changes and _shapes(Qwen3Config(**_known(Qwen3Config, meta["model"]))) != _shapes(self.model_cfg):
                raise ValueError(f"{where} was written for another model shape ({'; '.join(model_changes)}); "
                                 "resume with the original model config or use a new workdir")
        if "optimizer" in meta:
            old_opt = ts.OptimizerConfig(**_known(ts.OptimizerConfig, meta["optimizer"]))
            if _opt_layout(old_opt, self.model_cfg) != _opt_layout(self.opt_cfg, self.model_cfg):
                raise ValueError(f"{where} holds another optimizer-state layout "
                                 f"({'; '.join(_changes(meta['optimizer'], now['optimizer']))}); "
                                 "resume with the original optimizer config or use a new workdir")
        changes = [f"{group}.{c}" for group in ("model", "optimizer", "data") if group in meta
                   for c in _changes(meta[group], now[group])]
        top = [k for k in ("total_steps", "micro_batches") if k in meta]
        changes += _changes({k: meta[k] for k in top}, {k: now[k] for k in top})
        if changes:
            log.warning("%s was written with other settings; training goes on under the new ones: %s",
                        where, "; ".join(changes))

    def _peak_flops(self) -> float:
        devices = self.ctx.mesh.devices.flat if self.ctx.mesh is not None else jax.devices()[:1]
        return perf.peak_flops(devices)

    @property
    def params(self):
        return self.state.params

    def _update(self, batches: list, step: int) -> dict:
        """One optimizer update per batch; metrics averaged over them (skips summed)."""
        per_update = []
        flops = sum(train_flops(self.model_cfg, b["attention_mask"]) for b in batches if "attention_mask" in b)
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
        if flops:
            m["perf/model_tflops"] = flops / 1e12
        return m

    def run(self, batch_fn: BatchFn, after_step: Optional[Callable[[int, dict], dict]] = None):
        """Runs steps [start_step, total_steps); returns the final params (also saved to final/)."""
        bar = metrics_lib.ProgressBar(self.total_steps, desc=self.stage, keys=self.progress_keys,
                                      initial=self.start_step, log_every=max(1, self.total_steps // 10))
        with stop_on_signals(self.stage, lambda: self.saved_step) as stop:
            self._loop(batch_fn, after_step, bar, stop)
        ckpt_lib.save_params(self.ctx.final_dir(self.stage), self.model_cfg, self.state.params)
        return self.state.params

    def _loop(self, batch_fn: BatchFn, after_step, bar, stop) -> None:
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
                if "perf/model_tflops" in m:  # model FLOPs of the update over its devices' peak
                    m["perf/mfu"] = m["perf/model_tflops"] * 1e12 / max(m["timing_s/update_actor"], 1e-9) / \
                        self._peak_flops()
                m["timing_s/step"] = time.perf_counter() - t0
                if after_step is not None:
                    m.update(after_step(step, m) or {})
                self.writer.write(step + 1, m)
                bar.update(1, m)
                stop.agree()
                if (step + 1) % self.checkpoint_every == 0 or step + 1 == self.total_steps or stop.requested:
                    self._save(step + 1)
                if stop.requested and step + 1 < self.total_steps:
                    raise StopRequested(self.stage, step + 1, stop.signum)
        finally:
            bar.close()
            self.writer.close()
