r"""Training entry point (absl flags + ml_collections config).

  python launch/train.py --config=configs/quickstart.py --workdir=/tmp/quickstart
  python launch/train.py --config=configs/quickstart.py --workdir=/tmp/qs --config.grpo.steps=4
  python launch/train.py --config=configs/evalplanner_quickstart.py --workdir=/tmp/judge
  python launch/train.py --config=configs/quickstart.py --workdir=/tmp/qs_seeds --seeds=0,1,2
  python launch/train.py --config=configs/quickstart.py --workdir=/tmp/qs_rrm --seeds=0,1,2 \
      --strategies=grpo,reagent_r,reagent_u

The config's `pipeline` field picks the pipeline (default: the agent pipeline, stages sft,grpo).
Multi-host: set REAGENT_COORDINATOR / REAGENT_NUM_PROCESSES / REAGENT_PROCESS_ID (or
REAGENT_DISTRIBUTED=1 on Cloud TPU / SLURM) and run the same command on every host.
The config is checked first (reagent_jax/pipelines/config_checks.py): invalid fields stop the run before any work.
"""
from __future__ import annotations

import logging
import shlex
import signal
import sys

from absl import app, flags

import config_checks  # launch/config_checks.py (this script's directory is on sys.path)

FLAGS = flags.FLAGS
config_checks.define_config_file("config", None, "Path to an ml_collections config file.")
flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics, tokenizer, outputs).")
flags.DEFINE_string("seeds", "", "Comma-separated seeds (e.g. 0,1,2): run once per seed in <workdir>/seed_<s>, then "
                    "<workdir>/seeds_summary.json with each gain's mean and 95% interval over the seeds.")
flags.DEFINE_string("strategies", "", "Comma-separated GRPO strategies (e.g. grpo,reagent_r,reagent_u): each from the "
                    "same SFT policy (and trained RRM) per seed, in <workdir>/<strategy>/seed_<s>, then "
                    "<workdir>/strategies_summary.json and strategies.png comparing them (with --seeds: over the seeds).")
flags.DEFINE_bool("match_rollouts", True, "With --strategies: Reagent-U gets grpo.n/2 first attempts (plus their "
                  "retries), so it generates no more episodes per question than the other strategies.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax logs every file it writes at INFO
    logging.getLogger("reagent_jax").setLevel(logging.INFO)
    from reagent_jax.parallel import maybe_initialize_distributed
    maybe_initialize_distributed()
    config = FLAGS.config
    if FLAGS.seeds:
        from reagent_jax.pipelines.seeds import parse_seeds
        config_checks.run_checked(lambda: parse_seeds(FLAGS.seeds))
    if FLAGS.strategies:
        from reagent_jax.pipelines import strategy_sweep
        from reagent_jax.rrm.strategies import STRATEGIES
        config_checks.run_checked(lambda: strategy_sweep.parse_strategies(FLAGS.strategies, list(STRATEGIES)))
        config_checks.run_checked(lambda: strategy_sweep.check_sweep_config(config))
    import jax
    config_checks.run_checked(lambda: config_checks.check_train_config(config, FLAGS.workdir,
                                                                       num_devices=jax.device_count()))
    config_checks.writable_dir_or_exit("workdir", FLAGS.workdir)
    from reagent_jax.trainers.interrupt import StopRequested
    resume = "resume with: " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])
    signal.signal(signal.SIGTERM, _sigterm_outside_a_stage)
    try:
        _run_pipeline(config)
    except StopRequested as e:
        print(f"{e}; {resume}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("interrupted outside a training step (finished stages are kept, an unfinished one resumes from "
              f"its last checkpoint); {resume}", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)


def _sigterm_outside_a_stage(signum, frame):
    """SIGTERM during evaluation or set-up: stop like Ctrl-C (stages install their own handler)."""
    raise KeyboardInterrupt


def _pipeline_run(config):
    """The `run(config, workdir)` of the config's pipeline."""
    pipeline = config.get("pipeline", "agent")
    if pipeline == "agent":
        from reagent_jax.pipelines import agent as agent_pipeline
        return agent_pipeline.run
    if pipeline == "evalplanner":
        from reagent_jax.pipelines import evalplanner as ep_pipeline
        return ep_pipeline.run
    if pipeline == "grpo":
        from reagent_jax.pipelines import grpo as grpo_pipeline
        return grpo_pipeline.run
    raise ValueError(f"unknown pipeline {pipeline!r}; use 'agent', 'evalplanner' or 'grpo'")


def _run_pipeline(config) -> None:
    run = _pipeline_run(config)
    if FLAGS.strategies:
        from reagent_jax.pipelines import seeds, strategy_sweep
        from reagent_jax.rrm.strategies import STRATEGIES
        strategy_sweep.run_strategies(run, config, FLAGS.workdir,
                                      strategy_sweep.parse_strategies(FLAGS.strategies, list(STRATEGIES)),
                                      seeds.parse_seeds(FLAGS.seeds) if FLAGS.seeds else [config.seed],
                                      match_rollouts=FLAGS.match_rollouts)
    elif FLAGS.seeds:
        from reagent_jax.pipelines import seeds
        seeds.run_seeds(run, config, FLAGS.workdir, seeds.parse_seeds(FLAGS.seeds))
    else:
        run(config, FLAGS.workdir)


if __name__ == "__main__":
    app.run(main, flags_parser=config_checks.parse_flags)
