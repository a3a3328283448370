r"""Ahead-of-time compile check (MaxText's train_compile.py for this project): compiles every
device program a config's run executes for a TPU topology, on this host, without any TPU.

  python launch/compile_check.py --config=configs/qwen3_8b_reagent_u.py --topology=v5p:2x2x2 --hbm_gib=80
  python launch/compile_check.py --config=configs/quickstart.py --topology=v5e:2x2 --json_out=/tmp/qs.json
  python launch/compile_check.py --config=configs/colab_qwen3_1p7b.py --topology=local

Per program (train step of each stage at its longest sequence, reference / old-logprob passes,
rollout prefill chunk and decode call, the judge's where it runs locally): per-device memory from
the compiler plus what other programs keep resident meanwhile, against the chip's HBM and
--hbm_gib (a budget standing for a GPU: 80 for A800/H100-80G); model FLOPs and the chip's
roofline time; collective bytes by kind against the layout's minimum; compile time. A table
on stdout, one JSON object in --json_out, the optimised HLO of each program in --hlo_dir.
TPU names need libtpu (`pip install "jax[tpu]==<the pinned jax>"`); `local` compiles for this
host's own devices (a GPU or TPU machine). Exit status 1 when a program does not fit.
"""
from __future__ import annotations

import json
import logging
import os
import sys

if not any(a in ("--topology=local", "local") for a in sys.argv[1:]):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the host only traces; the TPU devices come from libtpu

from absl import app, flags

import config_checks  # launch/config_checks.py (this script's directory is on sys.path)

FLAGS = flags.FLAGS
config_checks.define_config_file("config", None, "Path to an ml_collections training config file.")
flags.DEFINE_string("topology", "v5p:2x2x2", "TPU topology (v5e:2x2, v5e:4x4, v5p:2x2x2, v6e:2x4, v4:2x2x1, ...) "
                    "or 'local' for this host's devices.")
flags.DEFINE_float("hbm_gib", None, "Memory budget per device in GiB (default: the chip's HBM).", lower_bound=0.0)
flags.DEFINE_string("mesh", None, "Mesh preset to compile for (default: the config's mesh; 'single' on a slice "
                    "means FSDP over every chip).")
flags.DEFINE_list("only", [], "Compile only the programs whose names contain one of these (e.g. train_step).")
flags.DEFINE_multi_string("xla", [], "key=value XLA compiler option for these compiles (repeatable), e.g. "
                          "xla_tpu_enable_windowed_einsum_for_all_gather=false.")
flags.DEFINE_string("json_out", None, "Write the report as one JSON object here.")
flags.DEFINE_string("hlo_dir", None, "Write each program's optimised HLO text here.")
flags.mark_flags_as_required(["config"])


def main(argv):
    del argv
    logging.getLogger("absl").setLevel(logging.WARNING)
    config = FLAGS.config
    try:  # data paths and endpoints do not matter for compiling; report what the run itself would refuse
        config_checks.check_train_config(config, None, num_devices=None, check_paths=False)
    except config_checks.ConfigError as e:
        print(f"note: the run itself would first need: {e}", file=sys.stderr)
    from reagent_jax.aot.check import check_config, format_table
    try:
        bad = [o for o in FLAGS.xla if "=" not in o]
        if bad:
            raise ValueError(f"--xla wants key=value, got {bad}")
        options = dict(o.split("=", 1) for o in FLAGS.xla)
        report = check_config(config, FLAGS.topology, mesh_preset=FLAGS.mesh, hbm_gib=FLAGS.hbm_gib,
                              hlo_dir=FLAGS.hlo_dir, only=FLAGS.only, compiler_options=options)
    except ValueError as e:  # an unknown topology, a mesh that does not fit it, a batch the mesh cannot split
        print(f"FATAL {e}", file=sys.stderr)
        sys.exit(1)
    print(format_table(report))
    if FLAGS.json_out:
        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.json_out)), exist_ok=True)
        with open(FLAGS.json_out, "w") as f:
            json.dump(report, f, indent=2)
    sys.exit(0 if report["all_fit"] else 1)


if __name__ == "__main__":
    app.run(main, flags_parser=config_checks.parse_flags)
