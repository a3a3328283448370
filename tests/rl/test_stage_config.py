"""The typed stage blocks: every shipped config reads as them, the registries decide the names,
and run_grpo / run_sft / grpo_objective take either the typed block or the config's own block."""
import dataclasses
import glob
import importlib.util
import os

import pytest

from reagent_jax import models
from reagent_jax.pipelines.context import TYPED_BLOCKS, typed_blocks
from reagent_jax.rl import POLICY_LOSSES
from reagent_jax.rl.objectives import grpo_objective
from reagent_jax.rl.stage_config import DPOConfig, GRPOConfig, SFTConfig
from reagent_jax.typed_config import ConfigError

CFG = models.preset("tiny", compute_dtype="float32", num_layers=1)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(path):
    spec = importlib.util.spec_from_file_location("cfg", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config()


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "configs", "*.py"))))
def test_every_shipped_config_reads_as_typed_blocks_with_its_own_values(path):
    config = _config(path)
    blocks = typed_blocks(config)
    assert set(blocks) == {name for name in TYPED_BLOCKS if name in config}
    for name, block in blocks.items():
        for key in config[name].keys():  # nothing dropped, nothing replaced by a default
            value = config[name][key]
            assert getattr(block, key) == (tuple(value) if isinstance(value, list) else value), (name, key)


def test_grpo_names_come_from_the_registries_so_a_users_entry_is_accepted():
    base = dict(steps=1, questions_per_step=2, n=2, learning_rate=1e-3)
    with pytest.raises(ConfigError, match=r"config.grpo.policy_loss='mine': use one of vanilla"):
        GRPOConfig.from_config({**base, "policy_loss": "mine"}, "grpo")

    @POLICY_LOSSES.register("mine_for_this_test")
    def mine(logprobs, old_logprobs, advantages, loss_mask, **clip):
        return POLICY_LOSSES.get("vanilla")(logprobs, old_logprobs, advantages, loss_mask, **clip)

    try:
        g = GRPOConfig.from_config({**base, "policy_loss": "mine_for_this_test"}, "grpo")
        assert grpo_objective(CFG, g).policy_loss == "mine_for_this_test"
    finally:
        POLICY_LOSSES._entries.pop("mine_for_this_test")
        POLICY_LOSSES._canonical.pop("mine_for_this_test")


def test_grpo_objective_reads_a_config_block_and_the_typed_block_alike():
    block = dict(steps=1, questions_per_step=2, n=4, learning_rate=1e-3, eps_high=0.3, beta=0.05, kl_kind="k2",
                 policy_loss="gspo", loss_agg_mode="seq-mean-token-mean", fused_head=False)
    a, b = grpo_objective(CFG, block, 0.7), grpo_objective(CFG, GRPOConfig.from_config(block, "grpo"), 0.7)
    assert a == b
    assert (a.eps_high, a.beta, a.kl_kind, a.policy_loss, a.temperature, a.fused_head) == (0.3, 0.05, "k2", "gspo",
                                                                                          0.7, False)


@pytest.mark.parametrize("cls,block,want", [
    (GRPOConfig, dict(steps=1, questions_per_step=0, n=2, learning_rate=1e-3, dual_clip_c=1.0, mini_batches=0),
     ["config.g.questions_per_step=0: must be >= 1", "config.g.mini_batches=0: must be >= 1",
      "config.g.dual_clip_c=1.0: must be > 1"]),
    (SFTConfig, dict(steps=1, batch_size=6, micro_batches=4, learning_rate=1e-3, by_hand_fraction=1.5),
     ["config.g.micro_batches=4: batch_size=6 is not divisible by 4 micro-batches",
      "config.g.by_hand_fraction=1.5: must be in [0.0, 1.0]"]),
    (DPOConfig, dict(steps=1, batch_size=4, learning_rate=1e-3, loss_type="kto", label_smoothing=0.6, rounds=0),
     ["config.g.loss_type='kto': use one of sigmoid", "config.g.label_smoothing=0.6: must be in [0.0, 0.5]",
      "config.g.rounds=0: must be >= 1"]),
])
def test_stage_blocks_reject_bad_values(cls, block, want):
    with pytest.raises(ConfigError) as e:
        cls.from_config(block, "g")
    lines = [ln.strip() for ln in str(e.value).splitlines()[1:]]
    assert len(lines) == len(want) and all(any(ln.startswith(w) for ln in lines) for w in want), lines


def test_fit_batch_style_copies_keep_the_type_and_validate():
    s = SFTConfig(steps=2, batch_size=8, micro_batches=2, learning_rate=1e-3, context_loss_weight=1.0)
    assert dataclasses.replace(s, batch_size=4).context_loss_weight == 1.0
    with pytest.raises(ConfigError, match="not divisible"):
        dataclasses.replace(s, batch_size=5)
