"""The host-side agent loop: token-exact episodes, tool-call fuzzing, real tools, the JAX engine."""
import json
import time

import jax
import pytest

from reagent_jax import chat, models, rewards, rollout, worlds
from reagent_jax.agent import tools
from reagent_jax.agent.loop import AgentConfig, AgentLoop, episode_seed
from reagent_jax.eval.agent_eval import evaluate_agent
from tests.scripted_engine import ScriptedEngine


@pytest.fixture(scope="module")
def world_setup(tmp_path_factory):
    world = worlds.make_world(worlds.WorldConfig(seed=3, n_entities=12, n_questions=24))
    corpus = world.write_corpus_jsonl(tmp_path_factory.mktemp("w") / "corpus.jsonl")
    registry = tools.build_registry({"search": {"backend": "local", "corpus": corpus}}, names=["search", "python"])
    tok = chat.build_compact_tokenizer(worlds.world_texts(world), vocab_size=400)
    return world, registry, tok




def test_scripted_expert_scores_100_percent_token_exactly(world_setup):
    """Expert turns replayed through the loop's token path with the real tools: every episode is
    correct, and the loop's tokens/mask equal a train-mode render of the expert conversation."""
    world, registry, tok = world_setup
    cfg = AgentConfig(max_turns=6, include_tool_schemas=False)
    experts = {q.question: worlds.expert_trajectory(world, q, tools=worlds.RegistryTools(registry),
                                                  system_prompt=cfg.system_prompt) for q in world.questions}

    def policy(prompt_ids):
        text = tok.decode(prompt_ids)
        q = next(q for q in experts if q in text)
        return [m for m in experts[q] if m["role"] == "assistant"]

    loop = AgentLoop(ScriptedEngine(tok, policy), tok, registry, cfg, tool_names=["search", "python"])
    records = world.records("train") + world.records("heldout")
    trajs = loop.run(records)
    assert [t.finish_reason for t in trajs] == ["answer"] * len(records)
    for t in trajs:
        assert rewards.score_answer(t.final_text, t.question["answer"], "synthetic") == 1.0
        expert = experts[t.question["question"]]
        ref = chat.render(tok, expert, mode="train")
        closing = chat.close_assistant_turn(tok, t.tokens)  # the template's "\n" after the last <|im_end|>
        assert t.tokens + closing == list(ref.ids)
        assert t.loss_mask + [0] * len(closing) == list(ref.loss_mask)
        assert t.tool_stats.failures == 0 and t.tool_stats.calls == sum(len(m.get("tool_calls", [])) for m in expert)


BAD_TURNS = {
    "malformed_json": '<tool_call>\n{"name": "search", "arguments": {"query": "x"}\n</tool_call>',
    "unknown_tool": '<tool_call>\n{"name": "teleport", "arguments": {"to": "mars"}}\n</tool_call>',
    "wrong_type": '<tool_call>\n{"name": "search", "arguments": {"query": 42}}\n</tool_call>',
    "missing_argument": '<tool_call>\n{"name": "python", "arguments": {}}\n</tool_call>',
    "megabyte_argument": '<tool_call>\n{"name": "python", "arguments": {"code": "#' + "x" * 1_000_000 + '"}}\n</tool_call>',
    "unclosed": '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}',
}


@pytest.mark.parametrize("kind", sorted(BAD_TURNS))
def test_malformed_tool_calls_become_readable_observations(world_setup, kind):
    world, registry, tok = world_setup
    turns = [{"role": "assistant", "content": BAD_TURNS[kind]},
             {"role": "assistant", "content": "The answer is \\boxed{7}."}]
    loop = AgentLoop(ScriptedEngine(tok, lambda ids: turns), tok, registry,
                     AgentConfig(max_turns=4, include_tool_schemas=False), tool_names=["search", "python"])
    (t,) = loop.run([{"question": "q?", "answer": ["7"], "data_source": "synthetic"}])
    assert t.finish_reason == "answer" and t.num_turns == 2  # the loop went on after the bad call
    obs = [m for m in t.messages if m["role"] == "tool"]
    assert len(obs) == 1 and obs[0]["content"].startswith("Error")
    assert len(obs[0]["content"]) < 20_000  # the megabyte never comes back to the model
    assert t.tool_stats.failures + t.tool_stats.parse_errors == 1


def test_final_step_message_and_turn_budget(world_setup):
    world, registry, tok = world_setup
    call = {"role": "assistant", "content": "again", "tool_calls": [
        {"type": "function", "function": {"name": "python", "arguments": {"code": "print(1)"}}}]}
    loop = AgentLoop(ScriptedEngine(tok, lambda ids: [call] * 10), tok, registry,
                     AgentConfig(max_turns=3, include_tool_schemas=False), tool_names=["python"])
    (t,) = loop.run([{"question": "q?", "answer": ["1"], "data_source": "synthetic"}])
    assert t.finish_reason == "max_turns" and t.num_turns == 3
    assert t.messages[-2]["content"] == loop.config.final_step_message  # sent before the last turn
    assert t.tool_stats.calls == 2


def test_tiny_random_model_runs_episodes_through_the_engine(world_setup):
    world, registry, tok = world_setup
    cfg = models.preset("tiny", vocab_size=len(tok) + 64 - len(tok) % 64, compute_dtype="float32")
    engine = rollout.Engine(cfg, models.init_params(cfg, jax.random.PRNGKey(0)), num_slots=8, max_len=2048,
                            prefill_chunk=128, tokenizer=tok)
    engine.start_background()
    try:
        loop = AgentLoop(engine, tok, registry, AgentConfig(max_turns=3, max_tokens_per_turn=24,
                                                             include_tool_schemas=True), tool_names=["search", "python"])
        res = evaluate_agent(loop, world.records("heldout")[:4], n=2, greedy=False)
    finally:
        engine.stop_background()
    trajs = res["trajectories"]
    assert len(trajs) == 8 and all(t.error is None for t in trajs), [t.error for t in trajs]
    for t in trajs:
        assert len(t.tokens) == len(t.loss_mask) == len(t.logprobs)
        assert t.prompt_len > 0 and sum(t.loss_mask) > 0
        for s, e in t.turn_spans:
            assert all(t.loss_mask[s:e]) and all(lp <= 0 for lp in t.logprobs[s:e])
        assert json.dumps(t.to_json())  # serialisable


def test_tool_latency_overlaps_with_other_episodes(world_setup):
    """Tools of one episode run while others proceed: 8 episodes x 2 tool turns with 200 ms tools
    take far less than the 3.2 s a serial loop would."""
    world, registry, tok = world_setup

    class SlowRegistry:
        names = registry.names

        def schemas(self):
            return registry.schemas()

        def call_many(self, calls):
            time.sleep(0.2)
            return registry.call_many(calls)

    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "python", "arguments": {"code": "print(2)"}}}]}
    turns = [call, call, {"role": "assistant", "content": "\\boxed{2}"}]
    loop = AgentLoop(ScriptedEngine(tok, lambda ids: turns), tok, SlowRegistry(),
                     AgentConfig(max_turns=5, include_tool_schemas=False), tool_names=["python"])
    t0 = time.perf_counter()
    trajs = loop.run([{"question": "q?", "answer": ["2"], "data_source": "synthetic"}] * 8)
    assert all(t.finish_reason == "answer" for t in trajs)
    assert time.perf_counter() - t0 < 2.0


def test_episode_seeds_stay_in_the_engine_range_for_any_run_seed():
    """GRPO derives run seeds as seed * 100_003 + step: a config seed of 1 used to overflow
    the engine's uint32 seeds (SamplingParams refused 100003300015)."""
    for base in (0, 1, 7, 100_003 * 12345 + 9, 2 ** 40):
        seeds = {episode_seed(base, j, i) for j in range(8) for i in range(8)}
        assert len(seeds) == 64 and all(0 <= s < 2 ** 31 for s in seeds)
        rollout.SamplingParams(seed=max(seeds))
    assert episode_seed(0, 2, 3) == 2 * 1009 + 3  # seed-0 runs keep their draws


class _CountingRows(list):
    """A question list that records which rows were read."""

    def __init__(self, rows):
        super().__init__(rows)
        self.read = []

    def __getitem__(self, j):
        self.read.append(j)
        return super().__getitem__(j)


def test_each_process_reads_only_the_questions_of_its_own_episodes(world_setup, monkeypatch):
    """On host 1 of 2 the loop runs (and reads the records of) the second half of the episodes only."""
    from reagent_jax.parallel import hosts
    world, registry, tok = world_setup
    real_share = hosts.share
    monkeypatch.setattr(hosts, "share", lambda n: real_share(n, 1, 2))
    loop = AgentLoop(ScriptedEngine(tok, lambda ids: ["\\boxed{1}"]), tok, registry,
                     AgentConfig(max_turns=2, include_tool_schemas=False))
    records = _CountingRows(world.records("train")[:6])
    trajs = loop.run(records, n=2)  # 12 episodes, record-major: host 1 runs episodes 6..11 = records 3..5
    assert sorted(set(records.read)) == [3, 4, 5]
    assert [t.question["id"] for t in trajs] == [records[j]["id"] for j in (3, 3, 4, 4, 5, 5)]
