"""Reagent-C SFT demonstrations: the first attempt is rendered but out of every loss, the critique is
the rule judge's own text for that attempt, and only the expert's retry is trained."""
import random
import re

import pytest

from reagent_jax import chat, worlds
from reagent_jax.rrm.prompt import build_refinement_message
from reagent_jax.worlds import critique_demos, gsm8k_annotator, rrm_annotator
from reagent_jax.worlds.expert import run_python
from tests.worlds.test_gsm8k_annotator import RECORD

SYSTEM = "Use the tools."


@pytest.fixture(scope="module")
def world():
    return worlds.make_world(seed=3, n_entities=8, n_questions=60, level_weights=(0.3, 0.7, 0.0), search_topk=1)


def test_critique_conversation_hides_the_attempt_and_appends_critique_and_retry():
    first = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "wrong"}]
    retry = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": []},
             {"role": "tool", "content": "t"}, {"role": "assistant", "content": "right"}]
    conv = critique_demos.critique_conversation(first, "Check the sum.", retry)
    assert conv == [first[0], {**first[1], "weight": 0}, build_refinement_message("Check the sum."), *retry[1:]]
    assert "weight" not in first[1]  # the inputs are not modified
    with pytest.raises(ValueError, match="same prompt"):
        critique_demos.critique_conversation(first, "c", [{"role": "user", "content": "other"}, retry[-1]])
    with pytest.raises(ValueError, match="final assistant turn"):
        critique_demos.critique_conversation(first[:1], "c", retry)
    with pytest.raises(ValueError, match="agent's turns"):
        critique_demos.critique_conversation(first, "c", retry[:1])


def test_synthetic_demonstrations_carry_the_rule_judges_critique_and_train_only_the_retry(world):
    tok = chat.load_tokenizer(None)
    rng = random.Random(0)
    flaws = set()
    for q in world.train[:40]:
        conv = critique_demos.synthetic_critique_demonstration(world, q, rng, system_prompt=SYSTEM)
        k = next(i for i, m in enumerate(conv) if m["role"] == "user" and i > 1)  # the critique turn
        first, retry = conv[:k], conv[k + 1:]
        assert all(m.get("weight") == 0 for m in first if m["role"] == "assistant")
        annotation = rrm_annotator.annotate(q, first)
        assert conv[k] == build_refinement_message(annotation.critique)  # what the rule judge says at inference
        assert not set(re.findall(r"\d+", annotation.critique)) & {q.answer}  # never the answer
        assert retry == worlds.expert_trajectory(world, q, system_prompt=SYSTEM)[2:]
        assert retry[-1]["content"].endswith(f"\\boxed{{{q.answer}}}.")
        flaws.add(annotation.flaws[0] if annotation.flaws else None)
        r = chat.render(tok, conv, mode="train")
        trained = tok.decode([i for i, m in zip(r.ids, r.loss_mask) if m])
        assert trained.count("<|im_end|>") == sum(m["role"] == "assistant" for m in retry)
    assert None in flaws and len(flaws) >= 4  # sound attempts and several kinds of flaw
    restated = critique_demos.synthetic_critique_demonstration(world, world.train[1], random.Random(0),
                                                               system_prompt=SYSTEM, restate_question=True)
    turn = next(m for i, m in enumerate(restated) if m["role"] == "user" and i > 1)
    assert turn["content"].endswith(f"The question again: {world.train[1].question}")
    again = critique_demos.synthetic_critique_demonstration(world, world.train[0], random.Random(0), system_prompt=SYSTEM)
    assert again == critique_demos.synthetic_critique_demonstration(world, world.train[0], random.Random(0),
                                                                    system_prompt=SYSTEM)


def test_gsm8k_demonstrations_use_the_solution_annotator():
    seen = set()
    for seed in range(12):
        conv = critique_demos.gsm8k_critique_demonstration(RECORD, run_python, random.Random(seed), system_prompt=SYSTEM)
        k = next(i for i, m in enumerate(conv) if m["role"] == "user" and i > 1)
        critique = gsm8k_annotator.annotate(RECORD, conv[:k]).critique
        assert conv[k] == build_refinement_message(critique) and "72" not in critique
        assert conv[-1]["content"].endswith("\\boxed{72}.") and "weight" not in conv[-1]
        seen.add(critique)
    assert len(seen) >= 3
    assert critique_demos.gsm8k_critique_demonstration({**RECORD, "meta": {}}, run_python, random.Random(0)) is None
