r"""Benchmark evaluation entry point (absl flags + ml_collections config).

  python launch/evaluate.py --config=configs/evaluate_example.py --outdir=/tmp/eval \
      --config.policy.path=/tmp/quickstart/grpo/final --config.benchmarks=bamboogle,gsm8k_full \
      --config.limit=50 --config.k=4

Writes results.jsonl (trajectories with tool calls and scores; a rerun skips what is there),
summary.json, results.md and one <benchmark>.png per benchmark to --outdir, and prints the table.
See configs/evaluate_example.py for every option (tool sets, LLM judge, Reagent-C). One host:
the policy may span all of its devices (--config.mesh); the agent loop and tools run on its CPU.
"""
from __future__ import annotations

import logging
import os
import sys

from absl import app, flags

import config_checks  # launch/config_checks.py (this script's directory is on sys.path)

FLAGS = flags.FLAGS
_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                               "evaluate_example.py")
config_checks.define_config_file("config", _DEFAULT_CONFIG, "Path to an ml_collections config file.")
flags.DEFINE_string("outdir", None, "Output directory (results.jsonl, summary.json, results.md, charts).")
flags.mark_flags_as_required(["outdir"])


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    import jax
    config_checks.run_checked(lambda: config_checks.check_eval_config(FLAGS.config, num_devices=jax.device_count()))
    config_checks.writable_dir_or_exit("outdir", FLAGS.outdir)
    from reagent_jax.eval import from_config
    out = from_config.run(FLAGS.config, FLAGS.outdir)
    with open(out["paths"]["table"]) as f:
        print("\n" + f.read())
    print(f"wall time: {out['wall_s']:.1f} s   outputs: {FLAGS.outdir}")
    failed = {name: int(b.get("failed", 0)) for name, b in out["benchmarks"].items() if b.get("failed")}
    limit = int(FLAGS.config.get("max_failed_samples", 0))
    if failed and 0 <= limit < sum(failed.values()):
        from reagent_jax.eval.results import ResultStore
        reasons = ResultStore(out["results"]).failure_reasons(3)
        print(f"error: {sum(failed.values())} sample(s) failed ({', '.join(f'{k}: {v}' for k, v in failed.items())}; "
              f"first: {' | '.join(reasons)}); they are scored wrong in the table. Exiting 1 "
              f"(--config.max_failed_samples={limit}; -1 never fails the run)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main, flags_parser=config_checks.parse_flags)
