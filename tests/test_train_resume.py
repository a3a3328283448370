"""A training run killed with SIGKILL mid-GRPO and resumed logs the same metrics as an
uninterrupted run with the same seed (checkpoints hold params, optimizer state and step; the
data and rollout seeds of step s are pure functions of (seed, s))."""
import signal
import subprocess
import time

from reagent_jax.metrics import read_metrics

from tests.quickstart_run import COMPARE, cmd as _cmd, env as _env


def test_sigkill_mid_grpo_then_resume_matches_uninterrupted(tmp_path, uninterrupted_run):
    ref_dir, killed_dir = uninterrupted_run, tmp_path / "killed"
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
