"""Reagent-R / -U / -C on the synthetic world with scripted policies and the rule judge:
group construction, masks token by token, rewards, and the RRM GRPO reward."""
import dataclasses
import json

import numpy as np
import pytest

from reagent_jax import chat, rrm, worlds
from reagent_jax.agent import tools
from reagent_jax.agent.loop import AgentConfig, AgentLoop
from reagent_jax.rl import grpo_advantages
from reagent_jax.rrm import strategies
from reagent_jax.rrm.training import rrm_reward
from reagent_jax.worlds.rrm_annotator import RuleJudge
from tests.scripted_engine import ScriptedEngine


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    world = worlds.make_world(worlds.WorldConfig(seed=5, n_entities=12, n_questions=20, level_weights=(0.0, 1.0, 0.0)))
    corpus = world.write_corpus_jsonl(tmp_path_factory.mktemp("w") / "corpus.jsonl")
    registry = tools.build_registry({"search": {"backend": "local", "corpus": corpus}}, names=["search", "python"])
    tok = chat.build_compact_tokenizer(worlds.world_texts(world) + [rrm.rrm_system_prompt()], vocab_size=400)
    cfg = AgentConfig(max_turns=6, include_tool_schemas=False)
    real = worlds.RegistryTools(registry)
    first = {q.question: worlds.flawed_trajectory(world, q, "wrong_arithmetic", tools=real, system_prompt=cfg.system_prompt)
             for q in world.train}
    second = {q.question: worlds.expert_trajectory(world, q, tools=real, system_prompt=cfg.system_prompt) for q in world.train}
    critique_marker = rrm.build_refinement_message("CRITIQUE")["content"].split("CRITIQUE")[0][:40]

    def policy(prompt_ids):
        text = tok.decode(prompt_ids)
        q = next(q for q in first if q in text)
        source = second if critique_marker in text else first  # second attempt after the critique
        return [m for m in source[q] if m["role"] == "assistant"]

    loop = AgentLoop(ScriptedEngine(tok, policy), tok, registry, cfg, tool_names=["search", "python"])
    return world, tok, loop


def test_reagent_u_pools_initial_and_refined_and_masks_new_tokens_only(setup):
    world, tok, loop = setup
    records = world.records("train")[:3]
    strat = strategies.ReagentU(RuleJudge(), strategies.RRMConfig(lam=0.0))
    trajs, rewards, groups, m = strat.collect(loop, records, n=2, seed=0)
    first, refined = trajs[:6], trajs[6:]
    assert len(refined) == 6 and m["reagent/refined_frac"] == 1.0
    np.testing.assert_array_equal(groups, [0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2])
    assert m["reagent/attempt1_acc"] < 1.0 and m["reagent/attempt2_acc"] == 1.0  # the critique helped
    for t1, t2 in zip(first, refined):
        assert t2.attempt == 2 and t2.critique and t2.question is t1.question
        n1 = len(t1.tokens)
        assert t2.tokens[:n1] == t1.tokens  # the first attempt is an exact prefix
        assert not any(t2.loss_mask[:t2.prompt_len])  # first attempt + critique turn are context
        critique_turn = tok.decode(t2.tokens[n1:t2.prompt_len])
        assert t2.critique in critique_turn and critique_turn.rstrip().endswith("assistant")
        # exactly the second attempt's sampled turns carry loss, nothing else
        new_turns = [m for m in t2.messages[len(t1.messages) + 1:] if m["role"] == "assistant"]
        sampled = [i for i, x in enumerate(t2.loss_mask) if x]
        assert len(sampled) == sum(e - s for s, e in t2.turn_spans) and len(t2.turn_spans) == len(new_turns)
        assert all(s >= t2.prompt_len for s, _ in t2.turn_spans)
    # one advantage normalisation over the pooled group of 4 (2 initial + 2 refined)
    adv = np.asarray(grpo_advantages(rewards, groups).advantages)
    g0 = rewards[groups == 0]
    np.testing.assert_allclose(adv[groups == 0], (g0 - g0.mean()) / (g0.std(ddof=1) + 1e-6), rtol=1e-5)


def test_restate_question_ends_every_critique_turn_with_the_question(setup):
    """rrm.restate_question: Reagent-U's and Reagent-C's critique turns end with the question, which
    a small model otherwise loses hundreds of tokens back; off, the turn is the critique alone."""
    world, tok, loop = setup
    records = world.records("train")[:2]
    for restate in (False, True):
        strat = strategies.ReagentU(RuleJudge(), strategies.RRMConfig(lam=0.0, restate_question=restate))
        trajs, _, _, _ = strat.collect(loop, records, n=1, seed=0)
        ref = strategies.evaluate_refinement(loop, RuleJudge(), records, restate_question=restate)
        for first, second in list(zip(trajs[:2], trajs[2:])) + list(zip(ref["first"], ref["refined"])):
            turn = second.messages[len(first.messages)]
            assert turn["role"] == "user" and turn["content"].startswith("A reviewer examined your attempt")
            assert turn["content"].endswith(f"The question again: {first.question['question']}") == restate


def test_selective_refinement_and_reagent_r_reward(setup):
    world, tok, loop = setup
    records = world.records("train")[:2]
    nothing = strategies.ReagentU(RuleJudge(), strategies.RRMConfig(refine_below=0.0))
    trajs, _, groups, m = nothing.collect(loop, records, n=1, seed=0)
    assert len(trajs) == 2 and m["reagent/refined_frac"] == 0.0  # no score is < 0: nothing refined
    r = strategies.ReagentR(RuleJudge(), strategies.RRMConfig(lam=0.3))
    trajs, rewards, _, m = r.collect(loop, records, n=1, seed=0)
    js = RuleJudge().judge_many([(t.question["question"], t.messages[1:]) for t in trajs],
                                records=[t.question for t in trajs])
    np.testing.assert_allclose(rewards, [0.0 + 0.3 * j.score for j in js], rtol=1e-6)  # wrong arithmetic: rule 0


def test_reagent_c_reports_both_attempts(setup):
    world, tok, loop = setup
    out = strategies.evaluate_refinement(loop, RuleJudge(), world.records("train")[:4])
    assert out["attempt1_accuracy"] == 0.0 and out["attempt2_accuracy"] == 1.0
    assert out["attempt1_scores"] == [0.0] * 4 and out["attempt2_scores"] == [1.0] * 4
    none = strategies.evaluate_refinement(loop, RuleJudge(), world.records("train")[:4], refine_below=0.0)
    assert none["refined_frac"] == 0.0 and none["attempt2_scores"] == none["attempt1_scores"]  # selective: no retry


class _AlternatingJudge(RuleJudge):
    """The rule judge's critiques with scores 0.2, 0.8, 0.2, ... so that a threshold splits them."""

    def judge_many(self, *args, **kwargs):
        out = super().judge_many(*args, **kwargs)
        return [dataclasses.replace(j, score=0.2 if i % 2 == 0 else 0.8) for i, j in enumerate(out)]


def test_selective_refinement_read_off_all_refined_attempts_equals_a_selective_run(setup, tmp_path):
    """The pipeline reports selective Reagent-C from the all-refined run (`refinement_report`): it
    must equal running selective refinement itself, and its paired interval must be the bootstrap's."""
    from reagent_jax.eval.statistics import paired_bootstrap
    from reagent_jax.pipelines.agent_rrm import ATTEMPT1, ATTEMPT2, refinement_report
    world, tok, loop = setup
    records = world.records("train")[:4]
    everything = strategies.evaluate_refinement(loop, _AlternatingJudge(), records)
    selective = strategies.evaluate_refinement(loop, _AlternatingJudge(), records, refine_below=0.5)
    rows, scores, extra = refinement_report(everything, records, str(tmp_path), refine_below=1.0,
                                            selective_below=0.5, seed=3)
    assert [r["policy"] for r in rows] == [ATTEMPT1, ATTEMPT2, "attempt 2 where RRM score < 0.5"]
    assert rows[2]["held-out accuracy"] == selective["attempt2_accuracy"] == 0.5 and rows[2]["refined"] == 0.5
    assert scores == {ATTEMPT1: [0.0] * 4, ATTEMPT2: [1.0] * 4}
    want = paired_bootstrap(everything["attempt1_scores"], selective["attempt2_scores"], seed=3).to_dict()
    assert extra == [{"before": ATTEMPT1, "after": rows[2]["policy"], **want}]
    lines = [json.loads(line) for line in open(tmp_path / "refinement.jsonl")]
    assert [(line["attempt1"], line["rrm_score"], line["attempt2"]) for line in lines] == [
        (0.0, 0.2, 1.0), (0.0, 0.8, 1.0)] * 2 and all(line["critique"] for line in lines)
    for line, retry in zip(lines, everything["refined"]):  # the retry's own turns, after the critique turn
        assert line["attempt2_messages"] == retry.messages[-len(line["attempt2_messages"]):]
        assert line["attempt2_messages"][0]["role"] == "assistant" and line["attempt2_finish_reason"] == "answer"
    rows, _, extra = refinement_report(selective, records, str(tmp_path), refine_below=0.5, selective_below=0.5)
    assert len(rows) == 2 and extra == []  # already selective: nothing to read off
    lines = [json.loads(line) for line in open(tmp_path / "refinement.jsonl")]
    assert ["attempt2_messages" in line for line in lines] == [True, False, True, False]  # only retried ones


@pytest.mark.parametrize("text,target,want", [
    ("<think>ok</think><critique>fine</critique><score>0.8</score>", 1.0, 0.8),
    ("<think>ok</think><critique>fine</critique><score>0.8</score>", 0.0, 0.2),
    ("<critique>fine</critique><score>0.8</score>", 1.0, 0.0),          # missing think: format gate
    ("<think>a</think><critique>b</critique><score>high</score>", 1.0, 0.0),
    ("no tags at all", 0.0, 0.0),
])
def test_rrm_grpo_reward(text, target, want):
    assert rrm_reward(text, target) == pytest.approx(want)


def test_strategies_and_judges_are_registries_that_configs_name():
    """config.strategy and config.rrm.judge name registry entries (`rrm.strategies.STRATEGIES`,
    `pipelines.agent.JUDGES`); an unknown name lists the registered ones."""
    from reagent_jax.pipelines.agent import JUDGES
    from reagent_jax.trainers.grpo import PlainGRPO
    judge, cfg = RuleJudge(), strategies.RRMConfig(lam=0.2)
    assert list(strategies.STRATEGIES) == ["grpo", "reagent_c", "reagent_r", "reagent_u"]
    assert isinstance(strategies.build("grpo", judge), PlainGRPO)
    assert isinstance(strategies.build("reagent_c", judge), PlainGRPO)  # Reagent-C trains on the rule reward
    r = strategies.build("reagent_r", judge, cfg)
    assert isinstance(r, strategies.ReagentR) and r.judge is judge and r.config.lam == 0.2
    assert isinstance(strategies.build("reagent_u", judge, cfg), strategies.ReagentU)
    with pytest.raises(ValueError, match=r"unknown strategy 'reagent_x'; registered: \['grpo', 'reagent_c'"):
        strategies.build("reagent_x", judge)
    assert list(JUDGES) == ["rule", "local", "remote", "evalplanner"]
    assert isinstance(JUDGES.get("rule")(None), RuleJudge)
    with pytest.raises(ValueError, match="unknown Agent-RRM judge 'llm'"):
        JUDGES.get("llm")
