"""Orbax checkpoints: model-only snapshots (convert / export) and resumable training state.

Training checkpoints hold one pytree (params, optimizer state, step, RNG, ...) plus a JSON
sidecar (data-iterator position, config, metrics so far). Restoring places every leaf directly
with the sharding of the template it is given, so a run resumes on any mesh.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp
from jax.sharding import Mesh

from reagent_jax.models.config import Qwen3Config
from reagent_jax.models.functional import param_shapes, param_shardings

_CONFIG = "reagent_config.json"


def _abstract(tree):
    """ShapeDtypeStructs carrying each leaf's sharding (restore targets)."""
    def one(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))
    return jax.tree.map(one, tree)


def save_params(directory: str, cfg: Qwen3Config, params) -> None:
    """Writes params (Orbax) and the model config next to them."""
    directory = os.path.abspath(directory)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(os.path.join(directory, "params"), params, force=True)
    ckptr.wait_until_finished()
    with open(os.path.join(directory, _CONFIG), "w") as f:
        json.dump(dataclasses.asdict(cfg), f, indent=2)


def load_params(directory: str, mesh: Optional[Mesh] = None, **config_overrides):
    """Reads a `save_params` directory -> (cfg, params), sharded by the rules when a mesh is given."""
    directory = os.path.abspath(directory)
    path = os.path.join(directory, _CONFIG)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{directory} is not a reagent_jax params checkpoint (no {_CONFIG})")
    with open(path) as f:
        cfg = Qwen3Config(**{**json.load(f), **config_overrides})
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
    """Keeps the last `keep` training checkpoints under `directory`; save/restore/latest_step."""

    def __init__(self, directory: str, keep: int = 3, async_save: bool = False):
        self.directory = os.path.abspath(directory)
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

    def close(self):
        self._mngr.close()
