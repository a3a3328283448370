"""Clean stops: SIGINT/SIGTERM end a stage after its current step with a checkpoint there; the
resumed run equals an uninterrupted one bitwise; a second Ctrl-C stops at once; launch/train.py
prints one line with the resume command and exits 128 + the signal number."""
import logging
import os
import signal
import subprocess
import sys
import time

import jax
import pytest

from reagent_jax.metrics import read_metrics
from reagent_jax.trainers.interrupt import StopRequested
from tests.trainers.test_edges import assert_trees_equal, batch, runner, train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _signalling_batch_fn(at_step, signum, times=1):
    def batch_fn(step, params):
        if step == at_step:
            for _ in range(times):
                os.kill(os.getpid(), signum)  # delivered to the main thread before the next bytecode
        return batch(step), {}
    return batch_fn


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_after_the_step_with_a_checkpoint_and_the_resume_is_exact(tmp_path, signum):
    ref, _, _ = train(tmp_path / "ref", total=6, every=4)
    r = runner(tmp_path / "stopped", total=6, every=4)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(StopRequested) as e:
        r.run(_signalling_batch_fn(2, signum))
    assert (e.value.stage, e.value.step, e.value.exit_code) == ("sft", 3, 128 + signum)
    assert r.ckpt.latest_step() == 3  # saved at the step it stopped after, not at every=4
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored after the stage
    assert [m["step"] for m in read_metrics(str(tmp_path / "stopped" / "sft"))] == [1, 2, 3]
    resumed, seen, _ = train(tmp_path / "stopped", total=6, every=4)
    assert seen == [3, 4, 5] and resumed.start_step == 3
    assert_trees_equal(jax.device_get(resumed.params), jax.device_get(ref.params))


def test_a_second_ctrl_c_stops_at_once(tmp_path):
    r = runner(tmp_path, total=6, every=4)
    with pytest.raises(KeyboardInterrupt):
        r.run(_signalling_batch_fn(1, signal.SIGINT, times=2))
    assert r.ckpt.latest_step() is None  # nothing saved: the warning said it resumes from step 0


def test_steps_redone_after_a_hard_kill_are_named(tmp_path, caplog):
    train(tmp_path, total=6, every=2, kill_at=3)  # checkpoint at 2, step 3 logged, killed in step 4
    with caplog.at_level(logging.WARNING, logger="reagent_jax.trainers.stage"):
        runner(tmp_path, total=6, every=2)
    assert "steps 3-3 were logged after the last checkpoint (step 2)" in caplog.text


def test_train_cli_sigint_prints_the_resume_command_and_resumes(tmp_path):
    workdir = tmp_path / "run"
    cmd = [sys.executable, os.path.join(REPO, "launch/train.py"), "--config=" + os.path.join(REPO, "configs/quickstart.py"),
           f"--workdir={workdir}", "--config.stages=sft", "--config.sft.steps=400", "--config.sft.batch_size=2",
           "--config.sft.max_len=256", "--config.world.n_questions=40", "--config.world.n_entities=10",
           "--config.model.hidden_size=32", "--config.model.intermediate_size=64", "--config.model.num_layers=1",
           "--config.eval.num_questions=0", "--config.checkpoint.every=1000"]
    env = dict(os.environ, REAGENT_NO_PROGRESS="1", PYTHONPATH=REPO)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    metrics = workdir / "sft" / "metrics.jsonl"
    while time.time() < deadline and not (metrics.exists() and len(read_metrics(str(workdir / "sft"))) >= 2):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    line = next(x for x in err.splitlines() if "stopped by SIGINT at sft step" in x)
    assert "(checkpoint saved); resume with: " in line and f"--workdir={workdir}" in line
    step = int(line.split("sft step ")[1].split()[0])
    assert 2 <= step < 400 and "Traceback" not in err
    assert sorted(int(n) for n in os.listdir(workdir / "sft" / "ckpt") if n.isdigit()) == [step]
