"""One recipe over several seeds: each seed's run in its own workdir, then means with intervals."""
import json
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from reagent_jax.eval.statistics import mean_ci, paired_bootstrap
from reagent_jax.pipelines import seeds as seeds_lib
from reagent_jax.typed_config import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fake_run(gains):
    """A pipeline whose SFT -> GRPO change on 40 paired questions is gains[seed]."""
    calls = []

    def run(config, workdir):
        calls.append((config.seed, workdir))
        sft = np.zeros(40)
        sft[:10] = 1
        grpo = sft.copy()
        k = round(gains[config.seed] * 40)
        if k >= 0:
            grpo[10:10 + k] = 1  # k more questions solved
        else:
            grpo[:-k] = 0  # -k fewer
        table = [{"policy": "sft", "held-out accuracy": sft.mean(), "turns": 2.0},
                 {"policy": "grpo", "held-out accuracy": grpo.mean(), "turns": 2.5}]
        comparisons = [{"before": "sft", "after": "grpo", **paired_bootstrap(sft, grpo, seed=config.seed).to_dict()}]
        return {"table": table, "comparisons": comparisons}
    return run, calls


def test_run_seeds_runs_each_seed_in_its_workdir_and_summarises(tmp_path, capsys):
    gains = {0: 0.15, 1: 0.05, 2: -0.05}
    run, calls = _fake_run(gains)
    config = ml_collections.ConfigDict(dict(seed=7, stages="sft,grpo"))
    out = seeds_lib.run_seeds(run, config, str(tmp_path), [0, 1, 2])
    assert calls == [(s, os.path.join(str(tmp_path), f"seed_{s}")) for s in (0, 1, 2)] and config.seed == 7
    assert json.load(open(tmp_path / seeds_lib.SUMMARY_NAME)) == json.loads(json.dumps(out))
    (c,) = out["comparisons"]
    expected = mean_ci([gains[s] for s in (0, 1, 2)])
    assert (c["estimate"], c["lo"], c["hi"], c["n"]) == pytest.approx((expected.estimate, expected.lo, expected.hi, 3))
    assert c["per_seed"] == pytest.approx(gains) and c["seeds_gaining"] == [0] and c["seeds_losing"] == []
    acc = out["policies"]["grpo"]["held-out accuracy"]
    assert acc["estimate"] == pytest.approx(0.25 + np.mean(list(gains.values()))) and acc["n"] == 3
    assert out["policies"]["sft"]["turns"] == mean_ci([2.0, 2.0, 2.0]).to_dict()
    assert "sft -> grpo: mean +0.050 [" in capsys.readouterr().out


def test_seeds_flag_is_checked_before_any_work(tmp_path):
    for bad in ("0,x", "1,1"):
        with pytest.raises(ConfigError, match="--seeds="):
            seeds_lib.parse_seeds(bad)
    assert seeds_lib.parse_seeds("2, 0,1") == [2, 0, 1]
    proc = subprocess.run([sys.executable, "launch/train.py", "--config=configs/quickstart.py",
                           f"--workdir={tmp_path / 'run'}", "--seeds=0,zero"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "FATAL invalid config: --seeds='0,zero'" in proc.stderr
    assert not os.path.exists(tmp_path / "run")
