"""Device meshes (`data`, `fsdp`, `tensor`), presets, and multi-host initialisation.

The same code runs on 1 CPU, 8 simulated CPU devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=8`, set before importing jax), one 8-GPU node
and TPU slices; only the mesh shape differs.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from reagent_jax.parallel.rules import MESH_AXES

# name -> (data, fsdp, tensor); -1 means "all remaining devices".
MESH_PRESETS = {
    "single": (1, 1, 1),          # one CPU / GPU
    "cpu8": (1, 4, 2),            # 8 simulated CPU devices: fsdp 4 x tensor 2
    "gpu8": (1, 8, 1),            # one 8-GPU node (8xA800/H100/H200): FSDP over NVLink
    "gpu8_tp": (1, 4, 2),         # same node, tensor-parallel pairs (long contexts / big models)
    "tpu_fsdp": (1, -1, 1),       # any TPU slice: FSDP over all chips
    "tpu_dp_fsdp": (-1, 8, 1),    # multi-slice / large pods: data over hosts, FSDP within
    "auto": (1, -1, 1),
}


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1,
              devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all). One size may be -1 (the rest)."""
    devices = list(devices if devices is not None else jax.devices())
    if not devices:
        raise ValueError("make_mesh: no devices given")
    sizes = [data, fsdp, tensor]
    for axis, size in zip(MESH_AXES, sizes):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or (size < 1 and size != -1):
            raise ValueError(f"make_mesh: {axis}={size!r} must be a positive int or -1 (all remaining devices)")
    sizes = [int(s) for s in sizes]
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got data={data} fsdp={fsdp} tensor={tensor}")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices are not divisible by the fixed axes product {known}")
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} = {int(np.prod(sizes))} "
                         f"does not match the {len(devices)} available devices")
    try:
        from jax.experimental import mesh_utils
        grid = mesh_utils.create_device_mesh(sizes, devices=devices)
    except Exception:  # odd topologies / CPU: plain order is fine
        grid = np.array(devices).reshape(sizes)
    return Mesh(grid, MESH_AXES)


def mesh_platform(mesh: Optional[Mesh]) -> str:
    """The platform ("cpu", "gpu", "tpu") of the devices a program on `mesh` runs on: the mesh's
    own devices, or the default device without a mesh. Kernel choices read this, never
    `jax.default_backend()`, so a CPU host compiling for TPU devices (launch/compile_check.py)
    traces the TPU program and CPU-only kernels never enter an accelerator program."""
    device = mesh.devices.flat[0] if mesh is not None else jax.devices()[0]
    platform = device.platform.lower()
    return "gpu" if platform in ("cuda", "rocm") else platform


def mesh_from_preset(name: str, devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
    """The preset's mesh over `devices` (default: all). "single" takes the first device, so it
    also works on a multi-device host; other presets must fit the device count exactly."""
    if name not in MESH_PRESETS:
        raise KeyError(f"unknown mesh preset {name!r}; known: {sorted(MESH_PRESETS)}")
    devices = list(devices if devices is not None else jax.devices())
    if name == "single":
        devices = devices[:1]
    try:
        return make_mesh(*MESH_PRESETS[name], devices=devices)
    except ValueError as e:
        fits = [p for p in MESH_PRESETS if preset_fits(p, len(devices))]
        data, fsdp, tensor = MESH_PRESETS[name]
        raise ValueError(f"mesh preset {name!r} (data={data} x fsdp={fsdp} x tensor={tensor}, -1 = the rest) does not "
                         f"fit the {len(devices)} available devices: {e}. Presets that fit: {fits}") from None


def preset_fits(name: str, num_devices: int) -> bool:
    """Whether `mesh_from_preset(name)` works on `num_devices` devices ("single" always does)."""
    sizes = MESH_PRESETS[name]
    known = int(np.prod([s for s in sizes if s != -1]))
    return name == "single" or (num_devices % known == 0 if -1 in sizes else known == num_devices)


def maybe_initialize_distributed(coordinator_address: Optional[str] = None,
                                 num_processes: Optional[int] = None,
                                 process_id: Optional[int] = None) -> bool:
    """Calls `jax.distributed.initialize` for multi-host runs; a no-op on one host.

    Arguments fall back to the env vars `REAGENT_COORDINATOR`, `REAGENT_NUM_PROCESSES`,
    `REAGENT_PROCESS_ID`. On Cloud TPU and SLURM, JAX auto-detects everything: set
    `REAGENT_DISTRIBUTED=1` to initialise with no arguments.
    """
    coordinator_address = coordinator_address or os.environ.get("REAGENT_COORDINATOR")
    if num_processes is None and "REAGENT_NUM_PROCESSES" in os.environ:
        num_processes = int(os.environ["REAGENT_NUM_PROCESSES"])
    if process_id is None and "REAGENT_PROCESS_ID" in os.environ:
        process_id = int(os.environ["REAGENT_PROCESS_ID"])
    if coordinator_address:
        jax.distributed.initialize(coordinator_address=coordinator_address,
                                   num_processes=num_processes, process_id=process_id)
        return True
    if os.environ.get("REAGENT_DISTRIBUTED") == "1":
        jax.distributed.initialize()
        return True
    return False
