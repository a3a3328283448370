"""GRPO strategies from one SFT policy per seed, compared over held-out questions and seeds."""
import json
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from reagent_jax.eval.statistics import mean_ci, paired_bootstrap
from reagent_jax.metrics import MetricsWriter
from reagent_jax.pipelines import strategy_sweep
from reagent_jax.rrm.strategies import STRATEGIES
from reagent_jax.typed_config import ConfigError
from tests.conftest import copy_run
from tests.quickstart_run import ARGS, REPO, env

IDS = [f"q{i}" for i in range(40)]


def _sft_scores():
    s = np.zeros(40)
    s[:10] = 1
    return s


def _fake_run(solved, shared_rrm=False):
    """An agent pipeline whose final policy solves `solved[(strategy, seed)]` more questions than
    SFT; it writes the files a real run writes (tokenizer, SFT policy, GRPO metrics)."""
    calls = []

    def run(config, workdir):
        stages = config.stages.split(",")
        calls.append((config.strategy, config.seed, config.stages, config.grpo.n, workdir))
        if "sft" in stages:
            for rel in ("tokenizer", *(f"{s}/final" for s in stages if s != "grpo")):
                os.makedirs(os.path.join(workdir, rel))
                open(os.path.join(workdir, rel, "made_by"), "w").write(f"{config.strategy} seed {config.seed}")
        else:  # the later strategies start from the first one's SFT policy (and trained judge)
            for rel in ("tokenizer", "sft/final", *(("rrm_sft/final",) if shared_rrm else ())):
                assert open(os.path.join(workdir, rel, "made_by")).read() == f"grpo seed {config.seed}"
        w = MetricsWriter(os.path.join(workdir, "grpo"), tensorboard=False)
        episodes = 8 * config.grpo.n * (2 if config.strategy == "reagent_u" else 1)
        for step in range(1, 4):
            w.write(step, {"batch/kept_frac": 0.5, "batch/episodes": episodes, "batch/groups": 8,
                           "batch/zero_std_groups": step, "timing_s/step": 10.0 * step})
        w.close()
        sft = _sft_scores()
        final = sft.copy()
        final[10:10 + solved[(config.strategy, config.seed)]] = 1
        return {"table": [{"policy": "sft", "held-out accuracy": sft.mean()},
                          {"policy": config.strategy, "held-out accuracy": final.mean()}],
                "comparisons": [], "question_ids": IDS,
                "question_scores": {"sft": sft.tolist(), config.strategy: final.tolist()}}
    return run, calls


def _config(stages="sft,grpo"):
    return ml_collections.ConfigDict(dict(seed=7, stages=stages, strategy="grpo", pipeline="agent",
                                          grpo=dict(n=8)))


def test_strategies_share_each_seeds_sft_policy_and_compare_paired_and_over_seeds(tmp_path, capsys):
    solved = {("grpo", 0): 2, ("grpo", 1): 4, ("reagent_r", 0): 6, ("reagent_r", 1): 12,
              ("reagent_u", 0): 2, ("reagent_u", 1): 0}
    run, calls = _fake_run(solved)
    out = strategy_sweep.run_strategies(run, _config(), str(tmp_path), ["grpo", "reagent_r", "reagent_u"], [0, 1])
    wd = lambda name, seed: os.path.join(str(tmp_path), name, f"seed_{seed}")  # noqa: E731
    assert calls == [("grpo", 0, "sft,grpo", 8, wd("grpo", 0)), ("grpo", 1, "sft,grpo", 8, wd("grpo", 1)),
                     ("reagent_r", 0, "grpo", 8, wd("reagent_r", 0)), ("reagent_r", 1, "grpo", 8, wd("reagent_r", 1)),
                     ("reagent_u", 0, "grpo", 4, wd("reagent_u", 0)), ("reagent_u", 1, "grpo", 4, wd("reagent_u", 1))]
    assert json.load(open(tmp_path / strategy_sweep.SUMMARY_NAME)) == json.loads(json.dumps(out))
    assert (tmp_path / strategy_sweep.PLOT_NAME).stat().st_size > 0
    assert all((tmp_path / name / "seeds_summary.json").exists() for name in ("grpo", "reagent_r", "reagent_u"))

    r = out["per_strategy"]["reagent_r"]
    assert r["accuracy"] == mean_ci([16 / 40, 22 / 40]).to_dict() and r["start_accuracy"]["estimate"] == 0.25
    assert r["per_seed"][0]["groups_with_variance_frac"] == pytest.approx(np.mean([7 / 8, 6 / 8, 5 / 8]))
    assert r["step_s"]["estimate"] == pytest.approx(20.0) and r["episodes_per_step"]["estimate"] == 64
    assert out["per_strategy"]["reagent_u"]["episodes_per_question"] == "4 first attempts + their retries"
    assert out["per_strategy"]["reagent_u"]["episodes_per_step"]["estimate"] == 64  # as many as the others

    by_after = {c["after"]: c for c in out["comparisons"]}
    assert set(by_after) == {"reagent_r", "reagent_u"} and by_after["reagent_r"]["before"] == "grpo"
    for name, c in by_after.items():
        per_seed = {}
        for seed in (0, 1):
            base, mine = _sft_scores(), _sft_scores()
            base[10:10 + solved[("grpo", seed)]] = 1
            mine[10:10 + solved[(name, seed)]] = 1
            per_seed[seed] = paired_bootstrap(base, mine, seed=seed).to_dict()
        assert c["per_seed"] == per_seed
        expected = mean_ci([per_seed[0]["estimate"], per_seed[1]["estimate"]])
        assert (c["estimate"], c["lo"], c["hi"], c["n"]) == pytest.approx((expected.estimate, expected.lo,
                                                                           expected.hi, 2))
    assert by_after["reagent_r"]["seeds_gaining"] == [0, 1] and by_after["reagent_u"]["seeds_losing"] == [1]
    printed = capsys.readouterr().out
    assert "grpo -> reagent_r: mean +0.150 [" in printed and "| reagent_u |" in printed


def test_a_trained_judge_is_shared_too(tmp_path):
    solved = {(name, 0): 1 for name in ("grpo", "reagent_r")}
    run, calls = _fake_run(solved, shared_rrm=True)
    strategy_sweep.run_strategies(run, _config("rrm_sft,sft,grpo"), str(tmp_path), ["grpo", "reagent_r"], [0])
    assert [c[2] for c in calls] == ["rrm_sft,sft,grpo", "grpo"]  # the judge is trained once per seed


def test_strategy_flags_are_checked_before_any_work(tmp_path):
    known = list(STRATEGIES)
    for bad in ("grpo", "grpo,grpo", "grpo,reagent_x"):
        with pytest.raises(ConfigError, match="--strategies="):
            strategy_sweep.parse_strategies(bad, known)
    with pytest.raises(ConfigError, match="a grpo stage"):
        strategy_sweep.check_sweep_config(ml_collections.ConfigDict(dict(stages="sft", pipeline="agent")))
    c = _config()
    c.grpo.n = 1
    with pytest.raises(ConfigError, match="grpo.n >= 2"):
        strategy_sweep.strategy_config(c, "reagent_u")
    assert strategy_sweep.strategy_config(c, "reagent_u", match_rollouts=False).grpo.n == 1
    proc = subprocess.run([sys.executable, "launch/train.py", "--config=configs/quickstart.py",
                           f"--workdir={tmp_path / 'run'}", "--strategies=grpo,reagnet_r"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "FATAL invalid config: --strategies='grpo,reagnet_r': unknown" in proc.stderr
    assert not os.path.exists(tmp_path / "run")


def test_strategies_end_to_end_from_a_finished_quickstart_run(tmp_path, uninterrupted_run):
    """The real pipeline: the first strategy's seed is a finished tiny run; Reagent-R trains from
    its SFT policy and is compared with it on the same held-out questions."""
    copy_run(uninterrupted_run, tmp_path / "grpo" / "seed_1")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "launch/train.py"),
                           "--config=" + os.path.join(REPO, "configs/quickstart.py"), f"--workdir={tmp_path}",
                           *ARGS, "--config.grpo.steps=1", "--strategies=grpo,reagent_r"],
                          env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.load(open(tmp_path / strategy_sweep.SUMMARY_NAME))
    assert out["seeds"] == [1] and out["strategies"] == ["grpo", "reagent_r"]
    r = out["per_strategy"]["reagent_r"]
    assert r["start_accuracy"] == out["per_strategy"]["grpo"]["start_accuracy"]  # the same SFT policy
    assert r["per_seed"]["1"]["episodes_per_step"] == 4 and 0 <= r["groups_with_variance_frac"]["estimate"] <= 1
    (c,) = out["comparisons"]
    assert c["n"] == 1 and c["per_seed"]["1"]["n"] == 2  # the two held-out questions, paired
    assert os.listdir(tmp_path / "reagent_r" / "seed_1" / "sft") == ["final"]  # SFT was copied, not rerun
    assert (tmp_path / strategy_sweep.PLOT_NAME).exists()
