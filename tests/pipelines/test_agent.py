"""The quickstart's SFT data: expert conversations through the real tools, with a seeded share of
by-hand (no python) demonstrations."""

import types

import ml_collections
import pytest

from reagent_jax import worlds
from reagent_jax.pipelines import agent as agent_pipeline
from reagent_jax.rl.stage_config import SFTConfig


def _conversations(tmp_path, fraction: float, seed: int = 0, num_examples: int = 0, critique_fraction: float = 0.0):
    world = worlds.make_world(seed=2, n_entities=8, n_questions=120, level_weights=(0.0, 1.0, 0.0), search_topk=1)
    config = ml_collections.ConfigDict(dict(seed=seed, agent=dict(tools="search,python")))
    sft = SFTConfig(steps=1, batch_size=1, learning_rate=0.0, by_hand_fraction=fraction, num_examples=num_examples,
                    critique_fraction=critique_fraction)
    ctx = types.SimpleNamespace(world=world, config=config, workdir=str(tmp_path), blocks={"sft": sft})
    loop = types.SimpleNamespace(config=types.SimpleNamespace(system_prompt="You are an agent."))
    registry = agent_pipeline.build_registry(ctx)
    return world.train, agent_pipeline.sft_conversations(ctx, registry, loop, world.records("train"))


def _uses_python(messages) -> bool:
    return any(c["function"]["name"] == "python" for m in messages for c in m.get("tool_calls", []))


def test_by_hand_fraction_mixes_demonstrations_deterministically(tmp_path):
    questions, convs = _conversations(tmp_path, 0.5)
    by_hand = [not _uses_python(c) for c in convs]
    assert 0.3 < sum(by_hand) / len(by_hand) < 0.7
    for q, c in zip(questions, convs):  # either way the expert's answer is right
        assert c[-1]["content"].endswith(f"\\boxed{{{q.answer}}}.")
    assert [not _uses_python(c) for c in _conversations(tmp_path, 0.5)[1]] == by_hand  # same seed, same mix
    assert [not _uses_python(c) for c in _conversations(tmp_path, 0.5, seed=1)[1]] != by_hand
    assert all(_uses_python(c) for c in _conversations(tmp_path, 0.0)[1])


def test_num_examples_demonstrates_the_first_training_questions_only(tmp_path):
    questions, convs = _conversations(tmp_path, 0.0, num_examples=10)
    assert len(questions) > 10 and len(convs) == 10
    assert [c[1]["content"] for c in convs] == [q.question for q in questions[:10]]


def test_critique_fraction_adds_reagent_c_demonstrations_after_the_expert_ones(tmp_path):
    questions, plain = _conversations(tmp_path, 0.5)
    _, convs = _conversations(tmp_path, 0.5, critique_fraction=0.25)
    assert convs[:len(plain)] == plain  # the expert demonstrations (and their by-hand mix) are unchanged
    extra = convs[len(plain):]
    assert 0.15 * len(questions) < len(extra) < 0.35 * len(questions)
    for conv in extra:  # the first attempt out of the loss, then the critique, then a trained retry
        k = next(i for i, m in enumerate(conv) if m["role"] == "user" and i > 1)
        assert conv[k]["content"].startswith("A reviewer examined your attempt")
        assert all(m.get("weight") == 0 for m in conv[:k] if m["role"] == "assistant")
        assert all("weight" not in m for m in conv[k:])
    assert _conversations(tmp_path, 0.5, critique_fraction=0.25)[1] == convs  # seeded
    assert _conversations(tmp_path, 0.5, seed=1, critique_fraction=0.25)[1][len(plain):] != extra


def test_critique_fraction_without_demonstrations_to_build_is_refused(tmp_path):
    sft = SFTConfig(steps=1, batch_size=1, learning_rate=0.0, critique_fraction=0.2)
    config = ml_collections.ConfigDict(dict(seed=0, data=dict(sft_path="rows.jsonl", sft_from="")))
    ctx = types.SimpleNamespace(world=None, config=config, workdir=str(tmp_path), blocks={"sft": sft})
    with pytest.raises(ValueError, match='sft.critique_fraction needs demonstrations it can build'):
        agent_pipeline.sft_conversations(ctx, None, None, [])


def test_training_from_files_without_an_evaluation_set_finishes(tmp_path):
    """An SFT run on data files with no `data.eval_path` (launching.md's first step) ends with its
    summary instead of crashing on an empty results table, and a re-run does too."""
    import json
    import os
    from tests.test_configs import _load
    from reagent_jax.pipelines import agent as agent_pipeline
    rl = tmp_path / "rl.jsonl"
    rl.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": [str(i + 1)],
                                      "data_source": "gsm8k"}) + "\n" for i in range(4)))
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} + 1?"},
                                                    {"role": "assistant", "content": f"\\\\boxed{{{i + 1}}}"}]}) + "\n"
                           for i in range(4)))
    c = _load("quickstart")
    del c["world"]
    c.data = type(c.rrm)(dict(train_path=str(rl), eval_path="", sft_path=str(sft)))
    c.tokenizer.kind = "qwen3"
    c.stages = "sft"
    c.model.update(dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16))
    c.sft.update(dict(steps=1, batch_size=2, max_len=128, context_loss_weight=0.0, by_hand_fraction=0.0))
    c.rollout.update(dict(num_slots=2, max_len=128, prefill_chunk=64))
    for _ in range(2):  # the second run finds the finished stage
        summary = agent_pipeline.run(c, str(tmp_path / "run"))
        assert summary["table"] == [] and os.path.exists(tmp_path / "run" / "summary.json")


def test_smollm2_gsm8k_config_runs_sft_and_a_grpo_step_end_to_end(tmp_path, smollm2_dir):
    """configs/smollm2_gsm8k.py at a tiny scale: the real pretrained model with its own tokenizer
    and ChatML template, SFT on GSM8K expert trajectories, one GRPO step with the rule reward,
    evaluation after each stage; the stage outputs carry the model's tokenizer for serving."""
    import json
    import os
    from tests.test_configs import _load
    from reagent_jax import chat, serve
    c = _load("smollm2_gsm8k")
    if not os.path.isfile(c.data.train_path):
        pytest.skip("shared GSM8K files not present")
    c.model.init_from = smollm2_dir
    c.agent.update(dict(max_turns=2, max_tokens_per_turn=16))
    c.rollout.update(dict(num_slots=4, max_len=512, prefill_chunk=256, decode_steps=8))
    c.sft.update(dict(steps=1, batch_size=2, num_examples=2, max_len=512))
    c.grpo.update(dict(steps=1, questions_per_step=1, n=2, micro_batches=1))
    c.eval.update(dict(num_questions=1, max_turns=2))
    workdir = tmp_path / "run"
    summary = agent_pipeline.run(c, str(workdir))
    assert [row["policy"] for row in summary["table"]] == ["init", "sft", "grpo"]
    accuracy = {row["policy"]: row["held-out accuracy"] for row in summary["table"]}
    assert [(d["before"], d["after"], d["n"]) for d in summary["comparisons"]] == [("init", "sft", 1), ("sft", "grpo", 1)]
    for d in summary["comparisons"]:  # paired over the same questions: the mean is the accuracy gap
        assert d["estimate"] == pytest.approx(accuracy[d["after"]] - accuracy[d["before"]], abs=1e-6)
    assert summary["kernels"] == {"platform": "cpu", "attention": "auto", "causal": "xla", "decode": "xla"}
    metrics = [json.loads(line) for line in open(workdir / "grpo" / "metrics.jsonl")]
    assert metrics and all(m["grpo/score"] in (0.0, 0.5, 1.0) for m in metrics if "grpo/score" in m)
    tok = chat.load_tokenizer(serve.find_tokenizer(str(workdir / "grpo" / "final")))
    assert tok.chat_template == chat.load_tokenizer(smollm2_dir).chat_template
    traj = json.loads(open(workdir / "eval_grpo.jsonl").readline())
    assert traj["messages"][0]["content"] == c.agent.system_prompt and not traj["error"]
    assert traj["finish_reason"] in ("answer", "no_answer", "max_turns")


def test_an_evalplanner_run_serves_as_reagent_r_judge(tmp_path):
    """rrm.judge=evalplanner: the last finished judge stage of an EvalPlanner workdir (DPO rounds,
    then SFT, then seed), its own tokenizer, behind PairwiseRRM; unfinished stages are passed over."""
    import jax
    from reagent_jax import chat, checkpoint, models
    from reagent_jax.evalplanner.reward import PairwiseRRM
    from reagent_jax.rrm.base import JudgeFailure, JudgeRequest
    from reagent_jax.rrm.parser import JudgementStatus

    run = tmp_path / "ep"
    tok = chat.build_compact_tokenizer(["Which response is better? [[A]] [[B]] plan execution"] * 4, vocab_size=300)
    tok.save_pretrained(str(run / "tokenizer"))
    cfg = models.preset("tiny", vocab_size=len(tok), compute_dtype="float32", num_layers=1)
    for stage in ("judge_seed", "judge_sft", "judge_dpo_r1"):
        checkpoint.save_params(str(run / stage / "final"), cfg, models.init_params(cfg, jax.random.PRNGKey(0)))
    (run / "judge_dpo_r2" / "final").mkdir(parents=True)  # an interrupted round: no params yet
    assert agent_pipeline.latest_judge_dir(str(run)) == str(run / "judge_dpo_r1" / "final")
    with pytest.raises(ValueError, match="needs rrm.judge_dir"):
        agent_pipeline.latest_judge_dir("")
    with pytest.raises(ValueError, match="no finished judge stage"):
        agent_pipeline.latest_judge_dir(str(tmp_path))

    config = ml_collections.ConfigDict(dict(seed=0, rrm=dict(judge="evalplanner", judge_dir=str(run),
                                                             judge_format="plan_execute", max_len=256,
                                                             max_new_tokens=4)))
    rollout = types.SimpleNamespace(num_slots=4, prefill_chunk=64, decode_steps=4)
    judge = agent_pipeline.make_judge(types.SimpleNamespace(config=config, rollout=rollout, mesh=None))
    try:
        assert isinstance(judge, PairwiseRRM)
        traj = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "answer"}]
        out = judge.judge_many([JudgeRequest("q", traj), JudgeRequest("q", traj[:1] + [{"role": "assistant",
                                                                                          "content": "other"}])])
        assert len(out) == 2 and all(j.status in (JudgementStatus.OK, JudgeFailure.NO_REPLY) for j in out)
        assert all(0.0 <= j.score <= 1.0 for j in out) and judge.stats.total == 2
    finally:
        judge.reward.judge.engine.stop_background()
