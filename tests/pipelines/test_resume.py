"""Resuming: a training run killed with SIGKILL mid-GRPO and resumed logs the same metrics as an
uninterrupted run with the same seed (checkpoints hold params, optimizer state and step; the
data and rollout seeds of step s are pure functions of (seed, s)); and the same for a real
multi-process run. Both compare against one uninterrupted run (the `uninterrupted_run` fixture),
so they share a file: one test worker, one reference run.

The multi-process test: two JAX processes on one machine (2 simulated CPU devices each, gloo
collectives) run launch/train.py with the multi-host variables, are SIGKILLed mid-GRPO,
resume, and end with the metrics and params of one process holding all 4 devices.

What it exercises: `jax.distributed` set-up from REAGENT_* variables, a mesh over both
processes' devices, process-local rollout engines each generating its share of the episodes
(`hosts.share`) with the trajectories exchanged once per call, Orbax checkpoints written and
restored by both processes, and shared files written once (process 0)."""
import os
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

from reagent_jax.metrics import read_metrics
from tests.conftest import copy_run
from tests.quickstart_run import COMPARE, cmd as _cmd, env as _env


def test_sigkill_mid_grpo_then_resume_matches_uninterrupted(tmp_path, uninterrupted_run):
    """The killed run starts from the reference's finished SFT stage (what the resumed run does
    too), so only GRPO is run twice."""
    ref_dir = uninterrupted_run
    killed_dir = copy_run(ref_dir, tmp_path / "killed", drop_stages=("grpo",))
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(workdir, logdir, tag):
    port = _free_port()
    return [subprocess.Popen(_cmd(workdir), stdout=open(logdir / f"{tag}.p{i}.log", "w"), stderr=subprocess.STDOUT,
                             env=_env(2, REAGENT_COORDINATOR=f"127.0.0.1:{port}", REAGENT_NUM_PROCESSES="2",
                                      REAGENT_PROCESS_ID=str(i)), start_new_session=True)
            for i in range(2)]


def _kill(procs):
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _wait(procs, logdir, tag, timeout=900):
    deadline = time.time() + timeout
    while time.time() < deadline and any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):  # one failed: the other would wait forever
            break
        time.sleep(0.5)
    _kill(procs)
    codes = [p.returncode for p in procs]
    if codes != [0, 0]:
        tails = "\n".join((logdir / f"{tag}.p{i}.log").read_text()[-3000:] for i in range(2))
        pytest.fail(f"multi-process run {tag} exited {codes}:\n{tails}")


def _final_params(workdir):
    from reagent_jax import checkpoint
    import jax
    _, params = checkpoint.load_params(str(workdir / "grpo" / "final"))
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(params)}


def test_two_processes_killed_and_resumed_match_one_process(tmp_path, uninterrupted_run):
    ref_dir, run_dir = uninterrupted_run, tmp_path / "two"

    procs = _launch(run_dir, tmp_path, "first")
    deadline, grpo = time.time() + 900, run_dir / "grpo"
    while time.time() < deadline:
        if (grpo / "metrics.jsonl").exists() and len(read_metrics(str(grpo))) >= 2:
            break
        if any(p.poll() is not None for p in procs):
            _wait(procs, tmp_path, "first", timeout=0)
            pytest.fail("the two-process run ended before it could be killed")
        time.sleep(0.2)
    _kill(procs)
    assert len(read_metrics(str(grpo))) < 4, "the kill came too late to test anything"

    _wait(_launch(run_dir, tmp_path, "resumed"), tmp_path, "resumed")
    log0 = (tmp_path / "resumed.p0.log").read_text()
    assert "grpo: resumed from step" in log0, log0[-2000:]

    ref = {m["step"]: m for m in read_metrics(str(ref_dir / "grpo"))}
    got = {m["step"]: m for m in read_metrics(str(grpo))}
    assert sorted(got) == sorted(ref) == [1, 2, 3, 4]
    for step in ref:
        assert got[step]["response_length/mean"] == ref[step]["response_length/mean"], step  # same tokens
        for key in COMPARE:
            if key in ref[step]:
                np.testing.assert_allclose(got[step][key], ref[step][key], rtol=1e-4, atol=1e-6, err_msg=f"{step} {key}")
    a, b = _final_params(ref_dir), _final_params(run_dir)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=k)
    for name in ("summary.json", "eval_grpo.jsonl", "curves_grpo.png"):  # written once, by process 0
        assert (run_dir / name).exists(), name
