"""The quickstart's SFT data: expert conversations through the real tools, with a seeded share of
by-hand (no python) demonstrations."""

import types

import ml_collections

from reagent_jax.agent import envs
from reagent_jax.trainers import agent_pipeline


def _conversations(tmp_path, fraction: float, seed: int = 0):
    world = envs.make_world(seed=2, n_entities=8, n_questions=120, level_weights=(0.0, 1.0, 0.0), search_topk=1)
    config = ml_collections.ConfigDict(dict(seed=seed, sft=dict(by_hand_fraction=fraction),
                                            agent=dict(tools="search,python")))
    ctx = types.SimpleNamespace(world=world, config=config, workdir=str(tmp_path))
    loop = types.SimpleNamespace(config=types.SimpleNamespace(system_prompt="You are an agent."))
    registry = agent_pipeline.build_registry(ctx)
    return world.train, agent_pipeline.expert_conversations(ctx, registry, loop, world.train)


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


def test_training_from_files_without_an_evaluation_set_finishes(tmp_path):
    """An SFT run on data files with no `data.eval_path` (launching.md's first step) ends with its
    summary instead of crashing on an empty results table, and a re-run does too."""
    import json
    import os
    from tests.test_configs import _load
    from reagent_jax.trainers import agent_pipeline
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
