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
