"""A training run killed with SIGKILL mid-GRPO and resumed logs the same metrics as an
uninterrupted run with the same seed (checkpoints hold params, optimizer state and step; the
data and rollout seeds of step s are pure functions of (seed, s))."""
import os
import signal
import subprocess
import sys
import time

from reagent_jax.metrics import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPARE = ("critic/score/mean", "actor/pg_loss", "actor/entropy", "response_length/mean", "num_turns/mean",
           "actor/grad_norm", "batch/kept_frac")
OVERRIDES = ["--config.sft.steps=3", "--config.sft.batch_size=4", "--config.grpo.steps=4", "--config.grpo.n=2",
             "--config.grpo.questions_per_step=2", "--config.grpo.drop_equal_reward_groups=False",
             "--config.grpo.micro_batches=1", "--config.eval.num_questions=2", "--config.checkpoint.every=1",
             "--config.world.n_questions=40", "--config.world.n_entities=10", "--config.model.hidden_size=64",
             "--config.model.intermediate_size=128", "--config.model.num_layers=2",
             "--config.agent.max_turns=2", "--config.agent.max_tokens_per_turn=24", "--config.rollout.num_slots=8"]


def _cmd(workdir):
    return [sys.executable, os.path.join(REPO, "launch/train.py"), "--config=" + os.path.join(REPO, "configs/quickstart.py"),
            f"--workdir={workdir}", *OVERRIDES]


def _env():
    return dict(os.environ, REAGENT_NO_PROGRESS="1", PYTHONPATH=REPO)


def test_sigkill_mid_grpo_then_resume_matches_uninterrupted(tmp_path):
    ref_dir, killed_dir = tmp_path / "ref", tmp_path / "killed"
    subprocess.run(_cmd(ref_dir), env=_env(), check=True, capture_output=True, timeout=900)

    proc = subprocess.Popen(_cmd(killed_dir), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 900
    grpo = killed_dir / "grpo"
    while time.time() < deadline:
        if (grpo / "metrics.jsonl").exists() and len(read_metrics(str(grpo))) >= 2:
            break
        assert proc.poll() is None, "run ended before it could be killed"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(read_metrics(str(grpo))) < 4, "the kill came too late to test anything"

    subprocess.run(_cmd(killed_dir), env=_env(), check=True, capture_output=True, timeout=900)
    ref = {m["step"]: m for m in read_metrics(str(ref_dir / "grpo"))}
    got = {m["step"]: m for m in read_metrics(str(killed_dir / "grpo"))}
    assert sorted(got) == sorted(ref) == [1, 2, 3, 4]
    for step in ref:
        for key in COMPARE:
            if key in ref[step]:
                assert got[step].get(key) == ref[step][key], (step, key, got[step].get(key), ref[step][key])
