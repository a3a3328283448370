"""Accelerator chips as the compile check and MFU see them: HBM, peak bf16 FLOP/s, HBM bandwidth,
and the devices of a TPU topology that XLA's TPU compiler can target from a CPU-only host.

HBM is what the TPU compiler reports as available (v5e 15.75 GiB, v5p 95.74 GiB in its
out-of-memory messages), else the chip's nominal size. Peaks are the vendors' dense bf16 figures
per chip (per JAX device); override them with
`REAGENT_PEAK_TFLOPS` / `REAGENT_HBM_GIB` / `REAGENT_HBM_GBPS` for a chip the table lacks or a
different clock. A CPU has no table entry: MFU there uses the measured matmul peak
(`perf.matmul_peak_flops`).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

import jax


@dataclasses.dataclass(frozen=True)
class ChipSpec:
    name: str
    hbm_gib: float  # per device
    peak_tflops: float  # dense bf16 per device
    hbm_gbps: float  # per device


# device_kind substring (lower case) -> spec; the first match wins, so longer names come first
CHIPS: tuple[tuple[str, ChipSpec], ...] = (
    ("tpu v5 lite", ChipSpec("TPU v5e", 15.75, 197, 819)),
    ("tpu v5e", ChipSpec("TPU v5e", 15.75, 197, 819)),
    ("tpu v6 lite", ChipSpec("TPU v6e", 32, 918, 1640)),
    ("tpu v6e", ChipSpec("TPU v6e", 32, 918, 1640)),
    ("tpu v5p", ChipSpec("TPU v5p", 95.74, 459, 2765)),
    ("tpu v5", ChipSpec("TPU v5p", 95.74, 459, 2765)),
    ("tpu v4", ChipSpec("TPU v4", 32, 275, 1228)),
    ("h200", ChipSpec("H200", 141, 989, 4800)),
    ("h100", ChipSpec("H100-80G", 80, 989, 3350)),
    ("a800", ChipSpec("A800-80G", 80, 312, 2039)),
    ("a100", ChipSpec("A100-80G", 80, 312, 2039)),
)

# `--topology` names that need no TPU: the host's own devices
LOCAL = "local"

_TPU_ENV = {"TPU_ACCELERATOR_TYPE": "v5litepod-4", "TPU_WORKER_HOSTNAMES": "localhost"}


def chip_spec(device) -> Optional[ChipSpec]:
    """The table entry of a device (by `device_kind`), with the env overrides; None when unknown
    and not overridden (a CPU)."""
    kind = str(getattr(device, "device_kind", "")).lower()
    spec = next((s for key, s in CHIPS if key in kind), None)
    env = {k: os.environ.get(f"REAGENT_{k.upper()}") for k in ("peak_tflops", "hbm_gib", "hbm_gbps")}
    if not any(env.values()):
        return spec
    base = spec or ChipSpec(kind or "unknown", 0.0, 0.0, 0.0)
    return dataclasses.replace(base, **{k: float(v) for k, v in env.items() if v})


def topology_devices(name: str) -> Sequence[jax.Device]:
    """Devices to compile for: `local` = this host's devices; a TPU topology name such as
    `v5e:2x2`, `v5p:2x2x2`, `v6e:2x4`, `v4:2x2x1` = that slice's devices from libtpu (installed by
    `pip install "jax[tpu]"`), usable for ahead-of-time compilation on a CPU-only host."""
    if name == LOCAL:
        return jax.devices()
    for key, value in _TPU_ENV.items():  # libtpu wants an accelerator type even to cross-compile
        os.environ.setdefault(key, value)
    from jax.experimental import topologies
    try:
        return topologies.get_topology_desc(platform="tpu", topology_name=name).devices
    except Exception as e:  # libtpu missing, or a name it does not know
        raise ValueError(f"cannot get TPU topology {name!r} ({type(e).__name__}: {str(e)[:300]}). Names look like "
                         "v5e:2x2, v5e:4x4, v5p:2x2x2, v6e:2x4, v4:2x2x1, and need libtpu "
                         "(pip install \"jax[tpu]==<the pinned jax>\"); use --topology=local for this host's "
                         "devices") from None
