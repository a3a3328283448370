"""Compiles a run's device programs ahead of time for a topology and says whether each fits:
per-device memory from the compiler, what stays resident meanwhile, model FLOPs and the
roofline step time of the chip, collective bytes by kind against the layout's minimum, compile
time. `launch/compile_check.py` is the command-line face of `check_config`.
"""
from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import Optional, Sequence

import jax.numpy as jnp

from reagent_jax import parallel
from reagent_jax.aot import hlo_stats
from reagent_jax.parallel import chips
from reagent_jax.aot.programs import Program, run_programs

GIB = 1024 ** 3
# the TPU compiler's out-of-memory messages: "Used 142.8G of 95.74G hbm" and "the total memory
# required for HLO temporaries (17.01G) exceeds available HBM (15.75G)"
_OOM = (re.compile(r"Used ([\d.]+)([KMGT])? of [\d.]+[KMGT]? hbm", re.I),
        re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT])?\)", re.I))
_UNITS = {None: 1, "K": 1024, "M": 1024 ** 2, "G": GIB, "T": 1024 ** 4}


@dataclasses.dataclass
class ProgramReport:
    name: str
    notes: str
    fits: bool
    compiled: bool
    error: str = ""
    argument_bytes: float = 0.0  # per device
    output_bytes: float = 0.0
    alias_bytes: float = 0.0
    temp_bytes: float = 0.0
    program_bytes: float = 0.0  # arguments + outputs - aliased + temporaries (+ code)
    resident_bytes: float = 0.0  # held by other programs of the run meanwhile
    total_bytes: float = 0.0
    budget_bytes: float = 0.0
    model_flops: float = 0.0
    roofline_s: float = 0.0
    collective_bytes: dict = dataclasses.field(default_factory=dict)
    link_bytes: float = 0.0
    min_link_bytes: float = 0.0
    link_vs_min: Optional[float] = None
    compile_s: float = 0.0
    resident: dict = dataclasses.field(default_factory=dict)
    large_copies: list = dataclasses.field(default_factory=list)  # (op, bytes, executions) of copies >= Program.large_copy_bytes
    weight_bytes: float = 0.0  # per device: weights taken as arguments (engine programs; 0 = not reported)
    mixed_lengths: dict = dataclasses.field(default_factory=dict)  # decode: HBM bytes per step, mixed slot lengths


def _budget(devices, hbm_gib: Optional[float]) -> float:
    spec = chips.chip_spec(devices[0])
    chip = spec.hbm_gib * GIB if spec and spec.hbm_gib else None
    if hbm_gib:
        return min(hbm_gib * GIB, chip) if chip else hbm_gib * GIB
    return chip or float("inf")


def compile_program(p: Program, devices, budget: float, hlo_dir: Optional[str] = None,
                    compiler_options: Optional[dict] = None) -> ProgramReport:
    spec = chips.chip_spec(devices[0])
    resident = float(sum(p.resident.values()))
    rep = ProgramReport(p.name, p.notes, fits=False, compiled=False, resident_bytes=resident, budget_bytes=budget,
                        model_flops=p.model_flops, min_link_bytes=p.min_link_bytes, resident=dict(p.resident),
                        weight_bytes=p.weight_bytes, mixed_lengths=dict(p.mixed_lengths))
    if spec and spec.peak_tflops:
        n = len(devices)
        rep.roofline_s = max(p.model_flops / n / (spec.peak_tflops * 1e12), p.min_hbm_bytes / (spec.hbm_gbps * 1e9))
    t0 = time.perf_counter()
    try:
        compiled = p.fn.lower(*p.args, **p.kwargs).compile(compiler_options=compiler_options or None)
    except Exception as e:  # the compiler's own words, e.g. "Ran out of memory in memory space hbm"
        rep.compile_s = time.perf_counter() - t0
        msg = str(e)
        rep.error = msg.strip().splitlines()[0][:600] if msg.strip() else type(e).__name__
        m = next((found for found in (r.search(msg) for r in _OOM) if found), None)
        if m:  # for temporaries alone a lower bound of the program's bytes
            rep.program_bytes = float(m.group(1)) * _UNITS[(m.group(2) or "").upper() or None]
            rep.total_bytes = rep.program_bytes + resident
        return rep
    rep.compile_s = time.perf_counter() - t0
    rep.compiled = True
    mem = compiled.memory_analysis()
    rep.argument_bytes = float(mem.argument_size_in_bytes)
    rep.output_bytes = float(mem.output_size_in_bytes)
    rep.alias_bytes = float(mem.alias_size_in_bytes)
    rep.temp_bytes = float(mem.temp_size_in_bytes)
    rep.program_bytes = (rep.argument_bytes + rep.output_bytes - rep.alias_bytes + rep.temp_bytes
                         + float(mem.generated_code_size_in_bytes))
    rep.total_bytes = rep.program_bytes + resident
    rep.fits = rep.total_bytes <= budget
    text = compiled.as_text()
    hlo = hlo_stats.parse(text)
    rep.collective_bytes = hlo_stats.collective_bytes(hlo)
    rep.link_bytes = hlo_stats.link_bytes(rep.collective_bytes)
    rep.link_vs_min = rep.link_bytes / p.min_link_bytes if p.min_link_bytes else None
    rep.large_copies = sorted(hlo_stats.large_copies(hlo, p.large_copy_bytes), key=lambda c: -c[1] * c[2])[:5]
    if hlo_dir:
        os.makedirs(hlo_dir, exist_ok=True)
        with open(os.path.join(hlo_dir, p.name.replace("/", "__") + ".hlo.txt"), "w") as f:
            f.write(text)
    return rep


def check_config(config, topology: str, *, mesh_preset: Optional[str] = None, hbm_gib: Optional[float] = None,
                 hlo_dir: Optional[str] = None, only: Sequence[str] = (),
                 compiler_options: Optional[dict] = None) -> dict:
    """Compiles every program of `config`'s run for `topology`; returns the report as a dict.
    compiler_options: XLA flags for these compiles (e.g. {"xla_tpu_enable_windowed_einsum_for_all_gather":
    "false"}); a run gets the same through LIBTPU_INIT_ARGS / XLA_FLAGS."""
    devices = list(chips.topology_devices(topology))
    preset = mesh_preset or config.get("mesh", "single")
    if mesh_preset is None and preset == "single" and len(devices) > 1:
        preset = "auto"  # a one-device config on a slice: FSDP over all of it (--mesh=single keeps one chip)
    mesh = parallel.mesh_from_preset(preset, devices=devices)
    cfg, programs = run_programs(config, mesh)
    if only:
        programs = [p for p in programs if any(o in p.name for o in only)]
    budget = _budget(devices, hbm_gib)
    reports = [compile_program(p, devices, budget, hlo_dir, compiler_options) for p in programs]
    spec = chips.chip_spec(devices[0])
    return {
        "topology": topology, "device_kind": str(getattr(devices[0], "device_kind", "")),
        "num_devices": len(devices), "mesh": dict(mesh.shape), "mesh_preset": preset,
        "chip": dataclasses.asdict(spec) if spec else None, "budget_gib": budget / GIB,
        "model": {"num_params": cfg.num_params(), "param_dtype": cfg.param_dtype,
                  "compute_dtype": cfg.compute_dtype, "remat_policy": cfg.remat_policy, "attention": cfg.attention,
                  "param_bytes_per_device": cfg.num_params() * jnp.dtype(cfg.param_dtype).itemsize / mesh.size},
        "compiler_options": dict(compiler_options or {}),
        "all_fit": all(r.fits for r in reports),
        "programs": [dataclasses.asdict(r) for r in reports],
    }


def format_table(report: dict) -> str:
    """The report as a markdown table (one row per program)."""
    g = lambda b: f"{b / GIB:.2f}"
    head = ("| program | fits | GiB/chip (program + resident) | budget GiB | roofline ms | link GB (vs min) | "
            "AG / RS / AR / A2A / CP GB | compile s |")
    lines = [f"{report['topology']} ({report['device_kind']}, {report['num_devices']} devices, mesh {report['mesh']}); "
             f"model {report['model']['num_params'] / 1e9:.2f} B params, {report['model']['param_dtype']} params / "
             f"{report['model']['compute_dtype']} compute, remat {report['model']['remat_policy']}",
             "", head, "|" + "---|" * 8]
    for p in report["programs"]:
        fits = "yes" if p["fits"] else ("no" if p["compiled"] else "OOM" if p["program_bytes"] else "error")
        mem = f"{g(p['total_bytes'])} ({g(p['program_bytes'])} + {g(p['resident_bytes'])})"
        vs = f" ({p['link_vs_min']:.2f}x)" if p["link_vs_min"] else ""
        kinds = " / ".join(f"{p['collective_bytes'].get(k, 0) / 1e9:.2f}" for k in hlo_stats.KINDS)
        lines.append(f"| {p['name']} | {fits} | {mem} | {p['budget_bytes'] / GIB:.1f} | {p['roofline_s'] * 1e3:.1f} | "
                     f"{p['link_bytes'] / 1e9:.2f}{vs} | {kinds} | {p['compile_s']:.1f} |")
    mixed = [f"- {p['name']}: slots of {p['mixed_lengths']['lengths']} tokens read "
             f"{p['mixed_lengths']['read_bytes'] / 1e9:.2f} GB per step on the busiest chip, "
             f"{p['mixed_lengths']['vs_min']:.2f}x the minimum ({p['mixed_lengths']['min_bytes'] / 1e9:.2f} GB: "
             "weights + live KV)" + _pool_fit(p["mixed_lengths"]) for p in report["programs"] if p.get("mixed_lengths")]
    errors = [f"- {p['name']}: {p['error']}" for p in report["programs"] if p["error"]]
    return "\n".join(lines + ([""] + mixed if mixed else []) + ([""] + errors if errors else []))


def _pool_fit(mixed: dict) -> str:
    if "fits" not in mixed:
        return ""
    return "; their pages fit the paged pool" if mixed["fits"] else \
        "; their pages do NOT fit the paged pool (raise rollout.kv_pages)"
