"""The tiny quickstart training run that the resume tests launch as subprocesses: its flags,
command and environment (4 simulated CPU devices unless told otherwise)."""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPARE = ("critic/score/mean", "actor/pg_loss", "actor/entropy", "response_length/mean", "num_turns/mean",
           "actor/grad_norm", "batch/kept_frac")
OVERRIDES = ["--config.sft.steps=3", "--config.sft.batch_size=4", "--config.grpo.steps=4", "--config.grpo.n=2",
             "--config.grpo.questions_per_step=2", "--config.grpo.drop_equal_reward_groups=False",
             "--config.grpo.micro_batches=1", "--config.eval.num_questions=2", "--config.checkpoint.every=1",
             "--config.world.n_questions=40", "--config.world.n_entities=10", "--config.model.hidden_size=64",
             "--config.model.intermediate_size=128", "--config.model.num_layers=2",
             "--config.agent.max_turns=2", "--config.agent.max_tokens_per_turn=24", "--config.rollout.num_slots=8"]
ARGS = [*OVERRIDES, "--config.mesh=auto"]  # the mesh over all 4 devices, as tests/pipelines/test_resume.py


def cmd(workdir) -> list[str]:
    return [sys.executable, os.path.join(REPO, "launch/train.py"), "--config=" + os.path.join(REPO, "configs/quickstart.py"),
            f"--workdir={workdir}", *ARGS]


def env(devices: int = 4, **extra) -> dict:
    out = dict(os.environ, REAGENT_NO_PROGRESS="1", PYTHONPATH=REPO, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", **extra)
    out.pop("REAGENT_DISTRIBUTED", None)
    return out
