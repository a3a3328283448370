"""Orbax checkpoints: model-only snapshots (convert / export) and resumable training state.

Training checkpoints hold one pytree (params, optimizer state, step, RNG, ...) plus a JSON
sidecar (data-iterator position, config, metrics so far). Restoring places every leaf directly
with the sharding of the template it is given, so a run resumes on any mesh.

A run killed mid-save must resume from its last complete checkpoint, never crash on the partial
one nor silently start over: orbax writes each step into a temporary directory and renames it
when done (leftovers are removed at start), `TrainCheckpointer.restore_latest` falls back past a
damaged step directory (a missing or corrupt file) and moves it aside, and `save_params` writes
its config file last and atomically, so a directory with a config always holds whole params.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from typing import Any, Callable, Optional

import jax
import orbax.checkpoint as ocp
from jax.sharding import Mesh

from reagent_jax.models.config import Qwen3Config
from reagent_jax.models.functional import param_shapes, param_shardings

log = logging.getLogger(__name__)

_CONFIG = "reagent_config.json"
_PARTIAL_MARK = ".orbax-checkpoint-tmp"  # orbax's suffix for a step directory still being written


def _abstract(tree):
    """ShapeDtypeStructs carrying each leaf's sharding (restore targets)."""
    def one(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
    return jax.tree.map(one, tree)


def save_params(directory: str, cfg: Qwen3Config, params) -> None:
    """Writes params (Orbax) and the model config next to them."""
    directory = os.path.abspath(directory)
    config_path = os.path.join(directory, _CONFIG)
    try:  # until the new params are complete, the directory must not look like a checkpoint
        os.remove(config_path)
    except FileNotFoundError:
        pass
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(os.path.join(directory, "params"), params, force=True)
    ckptr.wait_until_finished()
    tmp = f"{config_path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(dataclasses.asdict(cfg), f, indent=2)
    os.replace(tmp, config_path)  # atomic: a kill leaves no config or a whole one


def is_params_dir(directory: str) -> bool:
    """Whether `directory` holds complete `save_params` output (its config file is written last)."""
    return os.path.exists(os.path.join(directory, _CONFIG))


def load_config(directory: str, **config_overrides) -> Qwen3Config:
    """The model config of a `save_params` directory (no arrays are read)."""
    directory = os.path.abspath(directory)
    path = os.path.join(directory, _CONFIG)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{directory} is not a reagent_jax params checkpoint (no {_CONFIG})")
    try:
        with open(path) as f:
            saved = json.load(f)
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e}): the checkpoint was not completely written") from e
    return Qwen3Config(**{**saved, **config_overrides})


def load_params(directory: str, mesh: Optional[Mesh] = None, **config_overrides):
    """Reads a `save_params` directory -> (cfg, params), sharded by the rules when a mesh is given."""
    directory = os.path.abspath(directory)
    cfg = load_config(directory, **config_overrides)
    shapes = param_shapes(cfg)
    if mesh is not None:
        shardings = param_shardings(cfg, mesh)
    else:  # explicit: a checkpoint written on a mesh must still load on one device
        one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shardings = jax.tree.map(lambda _: one, shapes)
    shapes = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)
    params = ocp.StandardCheckpointer().restore(os.path.join(directory, "params"), shapes)
    return cfg, params


class TrainCheckpointer:
    """Keeps the last `keep` training checkpoints under `directory` (None: all of them);
    save / restore / restore_latest / latest_step."""

    def __init__(self, directory: str, keep: Optional[int] = 3, async_save: bool = False):
        if keep is not None and keep < 1:  # orbax would delete every checkpoint right after writing it
            raise ValueError(f"checkpoint keep={keep}: keep at least 1 checkpoint (None keeps all)")
        self.directory = os.path.abspath(directory)
        self.unreadable_dir = self.directory + ".unreadable"
        partial = sorted(n for n in os.listdir(self.directory) if _PARTIAL_MARK in n) \
            if os.path.isdir(self.directory) else []
        if partial:
            log.warning("%s: removing %d incomplete checkpoint save(s) of a run stopped mid-save: %s",
                        self.directory, len(partial), ", ".join(partial))
            if jax.process_index() == 0:
                for name in partial:
                    shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=async_save)
        self._mngr = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> Optional[int]:
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._mngr.all_steps())

    def save(self, step: int, state, meta: dict[str, Any]) -> None:
        self._mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                      meta=ocp.args.JsonSave(meta)), force=True)
        self._mngr.wait_until_finished()

    def restore(self, template, step: Optional[int] = None):
        """Restores (state, meta) of `step` (default latest) onto the shardings of `template`."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        out = self._mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(_abstract(template)),
                                                               meta=ocp.args.JsonRestore()))
        return out["state"], out["meta"]

    def restore_meta(self, step: int) -> dict:
        """The JSON sidecar of `step` alone (cheap: no arrays are read)."""
        meta = self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        if not isinstance(meta, dict):
            raise ValueError(f"checkpoint metadata is {type(meta).__name__}, not an object")
        return meta

    def restore_latest(self, template, check: Optional[Callable[[dict], None]] = None):
        """(step, state, meta) of the newest checkpoint that restores; None when there is none.

        A step that cannot be read (a missing, empty or corrupt file) is skipped with a warning;
        once an older step restored, the skipped ones are moved to `<directory>.unreadable/` (kept
        for inspection) so the run can write those steps again. `check(meta)` runs before a step's
        arrays are read and raises to reject an incompatible checkpoint; its error propagates. If
        no step restores, raises RuntimeError with each step's error and moves nothing.
        """
        steps = sorted(self.all_steps(), reverse=True)
        if not steps:
            return None
        failed = []

        def skip(step, e):
            failed.append((step, e))
            log.warning("%s: checkpoint step %d is unreadable (%s: %s); trying the previous one",
                        self.directory, step, type(e).__name__, str(e)[:300])

        for step in steps:
            try:
                meta = self.restore_meta(step)
            except Exception as e:  # orbax/tensorstore raise many types for a damaged directory
                skip(step, e)
                continue
            if check is not None:
                check(meta)
            try:
                state, meta = self.restore(template, step)
            except Exception as e:
                skip(step, e)
                continue
            if failed:
                self._move_unreadable([s for s, _ in failed])
            return step, state, meta
        errors = "; ".join(f"step {s}: {type(e).__name__}: {str(e)[:300]}" for s, e in failed)
        raise RuntimeError(f"none of the {len(steps)} checkpoint(s) in {self.directory} could be restored ({errors}). "
                           "Nothing was changed; move that directory away to start the stage from scratch.")

    def _move_unreadable(self, steps: list[int]) -> None:
        if jax.process_index() == 0:
            os.makedirs(self.unreadable_dir, exist_ok=True)
            for step in steps:
                src = os.path.join(self.directory, str(step))
                dst = os.path.join(self.unreadable_dir, str(step))
                if os.path.exists(dst):
                    dst = f"{dst}-{time.time_ns()}"
                if os.path.exists(src):
                    shutil.move(src, dst)
                    log.warning("moved unreadable checkpoint step %d to %s", step, dst)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices("reagent_jax.checkpoint.move_unreadable")
        self._mngr.reload()

    def close(self):
        self._mngr.close()
