"""Expert python trajectories from GSM8K's calculator annotations, replayed through the agent
loop on SmolLM2's own ChatML template with the real python tool: token-exact and all correct."""
import json
import os

import pytest

from reagent_jax import chat, rewards, worlds
from reagent_jax.agent import tools
from reagent_jax.worlds.annotated import arithmetic, calculations
from reagent_jax.agent.loop import AgentConfig, AgentLoop
from tests.scripted_engine import ScriptedEngine

GSM8K_TRAIN = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "train", "gsm8k_train.jsonl")
needs_gsm8k = pytest.mark.skipif(not os.path.isfile(GSM8K_TRAIN), reason="shared GSM8K training rows not present")

NATALIA = {"id": "t/0", "question": "Natalia sold clips to 48 of her friends in April, and then half as many in May. "
                                    "How many clips did she sell altogether?", "answer": ["72"],
           "data_source": "gsm8k",
           "meta": {"solution": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                                "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May."}}


@pytest.mark.parametrize("expr, code", [("48/2", "48/2"), (" (3+4)*2 ", "(3+4)*2"), ("2^3", "2**3"),
                                        ("-5+1.5", "-5+1.5"), ("10//3%2", "10//3%2")])
def test_arithmetic_annotations_become_code(expr, code):
    assert arithmetic(expr) == code


@pytest.mark.parametrize("expr", ["__import__('os').system('rm -rf /')", "x*2", "9**9**9", "2**1000",
                                  "open('f').read()", "(lambda: 1)()", "'a'*10", "1 if 2 else 3", ""])
def test_anything_but_plain_arithmetic_is_refused(expr):
    assert arithmetic(expr) is None


def test_trajectory_computes_every_annotation_then_boxes_the_answer():
    conv = worlds.annotated_trajectory(NATALIA, worlds.run_python, system_prompt="S")
    assert [m["role"] for m in conv] == ["system", "user", "assistant", "tool", "assistant"]
    assert conv[2]["tool_calls"][0]["function"]["arguments"] == {"code": "print(48/2)\nprint(48+24)"}
    assert conv[3]["content"] == "24.0\n72"
    assert "<<" not in conv[4]["content"] and conv[4]["content"].endswith("\\boxed{72}.")
    assert worlds.annotated_trajectory({**NATALIA, "meta": {}}, worlds.run_python) is None
    direct = worlds.annotated_trajectory({**NATALIA, "meta": {"solution": "It is 72."}}, worlds.run_python)
    assert [m["role"] for m in direct] == ["system", "user", "assistant"]


@needs_gsm8k
def test_every_gsm8k_annotation_is_arithmetic_python_evaluates():
    rows = [json.loads(line) for line in open(GSM8K_TRAIN)][:500]
    codes = [c for r in rows for c in calculations(r["meta"]["solution"])]
    assert len(codes) > 1000
    for code in codes:
        float(eval(code, {"__builtins__": {}}))  # noqa: S307 - arithmetic() admitted only numbers and operators


@needs_gsm8k
def test_gsm8k_experts_through_the_loop_on_smollm2_are_token_exact_and_correct(smollm2_dir):
    tok = chat.load_tokenizer(smollm2_dir)
    registry = tools.build_registry(names=["python"])
    cfg = AgentConfig(max_turns=3, include_tool_schemas=True, system_prompt=worlds.SOLVER_SYSTEM_PROMPT)
    records = [json.loads(line) for line, _ in zip(open(GSM8K_TRAIN), range(6))]
    for r in records:
        r["data_source"] = r.pop("source")
    experts = {r["question"]: worlds.annotated_trajectory(r, worlds.RegistryTools(registry, verify_python=None).python,
                                                        system_prompt=cfg.system_prompt) for r in records}

    def policy(prompt_ids):
        text = tok.decode(prompt_ids)
        question = next(q for q in experts if q in text)
        return [m for m in experts[question] if m["role"] == "assistant"]

    loop = AgentLoop(ScriptedEngine(tok, policy), tok, registry, cfg, tool_names=["python"])
    trajs = loop.run(records)
    assert [t.finish_reason for t in trajs] == ["answer"] * len(records)
    for t in trajs:
        assert rewards.score_answer(t.final_text, t.question["answer"], "gsm8k") == 1.0
        ref = chat.render(tok, experts[t.question["question"]], tools=registry.schemas(), mode="train")
        closing = chat.close_assistant_turn(tok, t.tokens)
        assert t.tokens + closing == list(ref.ids)
        assert t.loss_mask + [0] * len(closing) == list(ref.loss_mask)
        assert t.tool_stats.calls == 1 and t.tool_stats.failures == 0
