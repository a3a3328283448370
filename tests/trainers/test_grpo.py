"""GRPO updates per rollout step: mini-batch splitting and the runner's consecutive updates."""
import jax
import numpy as np
import optax
import pytest

from reagent_jax import models
from reagent_jax.rl import objectives, train_step as ts
from reagent_jax.trainers.batching import default_buckets
from reagent_jax.pipelines.context import RunContext
from reagent_jax.trainers.grpo import update_batches
from reagent_jax.trainers.stage import CheckpointConfig, StageRunner

CFG = models.preset("tiny", compute_dtype="float32", num_layers=2)


def rows(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t = int(rng.integers(6, 40))
        out.append({"tokens": rng.integers(1, CFG.vocab_size, t).tolist(), "loss_mask": [0] * 3 + [1] * (t - 3),
                    "old_logprobs": rng.normal(-6, 0.3, t).tolist(), "advantages": float(i) - n / 2})
    return out


def real_rows(batch):
    """(advantage, tokens) of each real row of a padded batch."""
    keep = batch["attention_mask"].sum(1) > 0
    return [(float(a), tuple(t[m > 0])) for a, t, m, k in
            zip(batch["advantages"], batch["tokens"], batch["attention_mask"], keep) if k]


@pytest.mark.parametrize("n,k,micro", [(13, 1, 2), (13, 3, 2), (64, 4, 2), (5, 8, 1)])
def test_mini_batches_partition_the_rows_deterministically(n, k, micro):
    rs = rows(n)
    kw = dict(mini_batches=k, micro_batches=micro, row_cap=max(n, 2), buckets=default_buckets(64), max_len=64)
    batches = update_batches(rs, seed=0, step=3, **kw)
    assert len(batches) == min(k, n)
    got = sorted(r for b in batches for r in real_rows(b))
    assert got == sorted((r["advantages"], tuple(r["tokens"])) for r in rs)  # every row exactly once
    sizes = [len(real_rows(b)) for b in batches]
    assert max(sizes) - min(sizes) <= 1
    share = -(-max(n, 2) // k)  # each update's share of the step's row budget, rounded up to micro
    for b in batches:
        assert b["tokens"].shape[0] % micro == 0 and "row_mask" not in b
        assert b["tokens"].shape[0] <= -(-share // micro) * micro
    again = update_batches(rs, seed=0, step=3, **kw)
    assert all(real_rows(a) == real_rows(b) for a, b in zip(batches, again))  # a resumed step splits alike
    if k > 1 and n > k:
        other = update_batches(rs, seed=0, step=4, **kw)
        assert [real_rows(b) for b in other] != [real_rows(b) for b in batches]
    with pytest.raises(ValueError, match="mini_batches"):
        update_batches(rs, seed=0, step=0, **{**kw, "mini_batches": 0})


def test_runner_applies_a_list_of_batches_as_consecutive_updates(tmp_path):
    objective = objectives.GRPOObjective(CFG, eps_low=0.2, eps_high=0.28)
    batches = update_batches(rows(12, seed=1), mini_batches=3, micro_batches=2, row_cap=12,
                             buckets=default_buckets(64), max_len=64, seed=0, step=0)
    params = models.init_params(CFG, jax.random.PRNGKey(0))
    opt_cfg = ts.OptimizerConfig(learning_rate=1e-3, total_steps=3)

    # by hand: three optimizer updates, one per mini-batch
    opt = ts.make_optimizer(opt_cfg)
    step = ts.make_train_step(objective, opt, num_micro_batches=2)
    state = ts.init_state(jax.tree.map(np.array, params), opt)
    ratios = []
    for b in batches:
        state, m = step(state, ts.shard_batch(b, None))
        ratios.append(float(m["actor/ppo_kl"]))

    ctx = RunContext(config=None, workdir=str(tmp_path), mesh=None, tokenizer=None)
    runner = StageRunner(ctx, "grpo", CFG, params, objective, opt_cfg, total_steps=1, micro_batches=2,
                         checkpoint=CheckpointConfig(every=10))
    out = runner.run(lambda s, p: (batches, {}))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), out, state.params)
    assert int(runner.state.step) == 3
    from reagent_jax.metrics import read_metrics
    m = [r for r in read_metrics(str(tmp_path / "grpo")) if r.get("step") == 1][0]
    assert m["train/updates"] == 3.0
    np.testing.assert_allclose(m["actor/ppo_kl"], np.mean(ratios), rtol=1e-5, atol=1e-7)


def _episodes(path):
    import json
    return [(r["messages"], r["final_text"]) for r in map(json.loads, open(path))]


def test_grpo_stage_alone_continues_from_the_workdirs_sft_with_mini_batches_and_recomputed_logprobs(tmp_path,
                                                                                                  uninterrupted_run):
    """`--config.stages=grpo` after an SFT run starts from sft/final (not random init); two
    updates per step with old logprobs recomputed by the trainer: the first update's ratio is 1
    up to float error (the trainer agrees with itself), so ppo_kl stays tiny but clipping can act.
    The stage uses the GSPO policy loss (registered, named by the config) with its paper's
    aggregation; the other CLI runs cover the default PPO loss."""
    import json
    import subprocess

    from reagent_jax.metrics import read_metrics
    from tests.conftest import copy_run
    from tests.quickstart_run import cmd, env  # the resume tests' tiny run: its SFT stage is done
    wd = copy_run(uninterrupted_run, tmp_path / "run", drop_stages=("grpo",))
    base = [a for a in cmd(wd) if not a.startswith("--config.grpo.steps")]
    sft_eval = _episodes(wd / "eval_sft.jsonl")
    out = subprocess.run(base + ["--config.stages=grpo", "--config.grpo.steps=2", "--config.grpo.mini_batches=2",
                                 "--config.grpo.old_logprobs=recompute", "--config.grpo.questions_per_step=4",
                                 "--config.grpo.policy_loss=gspo", "--config.grpo.loss_agg_mode=seq-mean-token-mean"],
                         env=env(), check=True, capture_output=True, text=True, timeout=900)
    assert "starting from the finished sft stage" in out.stderr
    table = json.load(open(wd / "summary.json"))["table"]
    assert [r["policy"] for r in table] == ["sft", "grpo"]
    assert _episodes(wd / "eval_sft.jsonl") == sft_eval  # the same policy, evaluated again
    steps = [m for m in read_metrics(str(wd / "grpo")) if "step" in m]
    assert [m["step"] for m in steps] == [1, 2]
    updated = [m for m in steps if "actor/ppo_kl" in m]
    assert updated, "no step had rows to train on"
    for m in updated:
        assert m["train/updates"] == 2.0 and "timing_s/old_logprobs" in m
        assert abs(m["actor/ppo_kl"]) < 0.05


class _Episode:
    def __init__(self, finish_reason="answer", response_length=5):
        self.finish_reason, self.response_length = finish_reason, response_length


@pytest.mark.parametrize("drop_equal", [False, True])
def test_failed_episodes_and_nonfinite_rewards_join_no_group(drop_equal):
    """A NaN/inf reward or a failed episode is left out of its group's mean and std (NumPy
    reference over the remaining members) and out of the update; the step still trains the rest."""
    from reagent_jax.rl import get_advantage_fn
    from reagent_jax.trainers.grpo import episode_advantages
    scores = np.array([1.0, 0.0, np.nan, 1.0, 0.5, 0.5, np.inf, 0.0, 0.25, 0.75])
    groups = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    eps = [_Episode() for _ in scores]
    eps[9] = _Episode("error")
    eps[8] = _Episode(response_length=0)  # counts in its group, but has nothing to train on
    adv, keep, finite = episode_advantages(get_advantage_fn("grpo"), eps, scores, groups, drop_equal)
    np.testing.assert_array_equal(finite, np.isfinite(scores))
    valid = np.isfinite(scores) & np.array([e.finish_reason != "error" for e in eps])
    want = np.zeros(len(scores))
    for g in np.unique(groups):
        members = (groups == g) & valid
        r = scores[members]
        if len(r) >= 2 and r.max() > r.min():
            want[members] = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
        elif len(r) == 1:
            want[members] = r  # a group of one: mean 0, std 1 (verl)
    np.testing.assert_allclose(np.asarray(adv.advantages), want, rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(np.asarray(adv.advantages)))
    expect_keep = valid & np.array([e.response_length > 0 for e in eps])
    if drop_equal:
        expect_keep &= ~np.isin(groups, [1])  # group 1's valid rewards are all 0.5
    np.testing.assert_array_equal(keep, expect_keep)
