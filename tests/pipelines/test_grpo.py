"""The plain GRPO pipeline (pipelines/grpo.py): prompts + reward functions -> completions -> GRPO,
no agent loop; its pieces (trainers/completions.py) and the registered reward functions."""
import json
import math
import os

import numpy as np
import pytest

from reagent_jax import rewards
from reagent_jax.metrics import read_metrics
from reagent_jax.pipelines import grpo as grpo_pipeline
from reagent_jax.pipelines.config_checks import ConfigError, check_train_config
from reagent_jax.rollout.session import Result
from reagent_jax.trainers.completions import CompletionsGRPO, completion_trajectory, prompt_messages
from tests import test_launch_edges as launch_edges

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(**overrides):
    return launch_edges._config("grpo_gsm8k", **{k.replace(".", "__"): v for k, v in overrides.items()})


def test_registered_reward_functions_against_their_references():
    rows = [json.loads(line) for line in open(os.path.join(REPO, "..", "shared", "data", "benchmarks",
                                                           "gsm8k_full.jsonl"))][:5]
    for row in rows:
        right, wrong = f"So the answer is \\boxed{{{row['answer'][0]}}}.", "So the answer is \\boxed{-1}."
        assert rewards.REWARD_FNS.get("answer")(right, row) == 1.0 == rewards.score_answer(
            right, row["answer"], row.get("data_source", row.get("source")))
        assert rewards.REWARD_FNS.get("answer")(wrong, row) == 0.0
    assert rewards.boxed_reward("x \\boxed{3}", {}) == 1.0
    assert rewards.boxed_reward("x \\boxed{", {}) == 0.0 and rewards.boxed_reward("3", {}) == 0.0
    with pytest.raises(ValueError, match="unknown reward function 'nope'; registered: .*answer"):
        rewards.REWARD_FNS.get("nope")


def test_prompts_trajectories_and_rewards_of_one_completion():
    assert prompt_messages({"question": "2+2?"}, "Be brief.") == [{"role": "system", "content": "Be brief."},
                                                                   {"role": "user", "content": "2+2?"}]
    chat = [{"role": "user", "content": "hi"}]
    assert prompt_messages({"messages": chat, "question": "ignored"}, "sys") == chat
    with pytest.raises(ValueError, match="record 'r1': no prompt"):
        prompt_messages({"id": "r1", "answer": ["4"]})
    t = completion_trajectory({"id": "q"}, [5, 6, 7], Result(0, [8, 9], [-0.5, -1.5], "length"), "text", 3)
    assert t.tokens == [5, 6, 7, 8, 9] and t.loss_mask == [0, 0, 0, 1, 1] and t.logprobs == [0, 0, 0, -0.5, -1.5]
    assert (t.prompt_len, t.finish_reason, t.sample_index, t.response_length) == (3, "length", 3, 2)

    def broken(text, record):
        raise KeyError("answer")
    strategy = CompletionsGRPO(tokenizer=None, reward_fns={"good": lambda t, r: 0.5, "broken": broken},
                               weights={"good": 2.0})
    out = strategy.rewards("x", {})
    assert out["good"] == 0.5 and math.isnan(out["broken"])  # loud, never a silent zero
    with pytest.raises(ValueError, match="at least one reward function"):
        CompletionsGRPO(tokenizer=None, reward_fns={})


def test_config_check_names_reward_and_pipeline_mistakes():
    check_train_config(_config(), check_paths=True)
    with pytest.raises(ConfigError) as e:
        check_train_config(_config(**{"rewards": "answer,nope", "reward_weights": "1,2,3", "pipeline": "grpo"}),
                           check_paths=False)
    assert "config.rewards='answer,nope': unknown nope; use names from answer, boxed" in str(e.value)
    assert "config.reward_weights='1,2,3': 3 weights for 2 rewards" in str(e.value)
    with pytest.raises(ConfigError, match="pipeline='grpo2'"):
        check_train_config(_config(pipeline="grpo2"), check_paths=False)


@pytest.mark.slow
def test_pipeline_trains_with_python_reward_functions_and_resumes(tmp_path, smollm2_dir):
    """A tiny random model with SmolLM2's tokenizer and chat template, two GRPO steps on GSM8K
    prompts with two reward functions of our own: the table has the policy before and after, each
    reward is logged per step, a reward that raises is counted, the update moves the params,
    and a second run on the same workdir trains nothing more."""
    calls = {"n": 0}

    def chars(text, record):
        return float(len(text) % 3) / 2.0  # differs between a random model's completions

    def flaky(text, record):
        calls["n"] += 1
        if calls["n"] == 3:  # the first training completion (2 held-out ones were scored before)
            raise RuntimeError("reward server down")
        return 0.0

    c = _config(**{"model.init_from": "", "tokenizer.path": smollm2_dir, "model.hidden_size": 64,
                   "model.intermediate_size": 128, "model.num_layers": 2, "model.num_heads": 4,
                   "model.num_kv_heads": 2, "model.head_dim": 16, "prompt.max_new_tokens": 12,
                   "rollout.max_len": 256, "rollout.num_slots": 8, "rollout.prefill_chunk": 256,
                   "grpo.steps": 2, "grpo.questions_per_step": 2, "grpo.n": 4, "grpo.micro_batches": 1,
                   "grpo.learning_rate": 1e-2, "grpo.drop_equal_reward_groups": False, "eval.num_questions": 2})
    wd = tmp_path / "run"
    summary = grpo_pipeline.run(c, str(wd), reward_fns={"chars": chars, "flaky": flaky})
    assert [r["policy"] for r in summary["table"]] == ["random_init", "grpo"]
    assert set(summary["table"][0]) >= {"held-out chars", "held-out flaky", "gen tokens/s"}
    assert summary["rewards"] == {"chars": 1.0, "flaky": 1.0}
    assert summary["kernels"] == {"platform": "cpu", "attention": "auto", "causal": "xla", "decode": "xla"}
    steps = [m for m in read_metrics(str(wd / "grpo")) if "step" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all("reward/chars/mean" in m and "reward/flaky/mean" in m for m in steps)
    assert steps[0]["batch/nonfinite_rewards"] == 1.0 and steps[1]["batch/nonfinite_rewards"] == 0.0
    assert any("actor/pg_loss" in m for m in steps)
    evals = [json.loads(line) for line in open(wd / "eval_grpo.jsonl")]
    assert len(evals) == 2 and set(evals[0]["rewards"]) == {"chars", "flaky"}
    assert (wd / "summary.json").exists() and (wd / "curves_grpo.png").exists()

    import jax
    from reagent_jax import checkpoint, models
    _, trained = checkpoint.load_params(str(wd / "grpo" / "final"))
    cfg, _ = checkpoint.load_params(str(wd / "grpo" / "final"))
    init = models.init_params(cfg, jax.random.PRNGKey(c.seed))
    assert not np.allclose(np.asarray(trained["embed"]), np.asarray(init["embed"]))

    again = grpo_pipeline.run(c, str(wd), reward_fns={"chars": chars, "flaky": lambda t, r: 0.0})
    assert [r["policy"] for r in again["table"]] == ["grpo"]  # finished: evaluated, not trained again
