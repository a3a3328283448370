"""Agent-RRM prompt: the whole trajectory is rendered, long tool outputs are cut in the middle."""

import json

import pytest

from reagent_jax import rrm, worlds

QUESTION = "What is the population of Varel plus the area of Quoss?"
LONG = "HEAD-MARK " + "x" * 6000 + " MIDDLE-MARK " + "y" * 6000 + " TAIL-MARK"
TRAJECTORY = [
    {"role": "system", "content": "AGENT-SYSTEM-PROMPT"},
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": "I will look up Varel first.", "reasoning_content": "THINK-ONE",
     "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": "population of Varel"}}}]},
    {"role": "tool", "content": "Varel has population 452."},
    {"role": "assistant", "content": "<think>THINK-TWO</think>Now Quoss.",
     "tool_calls": [{"type": "function", "function": {"name": "browse", "arguments": json.dumps({"url": "http://q.example", "query": "area"})}},
                    {"type": "function", "function": {"name": "search", "arguments": "{not json"}}]},
    {"role": "tool", "content": LONG},
    {"role": "tool", "name": "search", "content": "Quoss area 37."},
    {"role": "user", "content": "FOLLOW-UP-USER-TURN"},
    {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "python", "arguments": {"code": "print(452 + 37)"}}}]},
    {"role": "tool", "content": "489"},
    {"role": "assistant", "content": "The answer is \\boxed{489}."},
]
TOOLS = [{"type": "function", "function": {"name": "search", "description": "Search the corpus.", "parameters": {}}}, "python"]


@pytest.fixture(scope="module")
def messages():
    return rrm.build_rrm_messages(QUESTION, TRAJECTORY, tools=TOOLS, max_tool_chars=1000)


def test_structure_and_system_prompt(messages):
    assert [m["role"] for m in messages] == ["system", "user"]
    system = messages[0]["content"]
    for tag in ("<think>", "</think>", "<critique>", "</critique>", "<score>", "</score>"):
        assert tag in system
    assert "Never state the answer" in system
    assert "<scores>" not in system and "<confidence>" not in system


def test_every_turn_call_and_response_is_rendered_in_order(messages):
    user = messages[1]["content"]
    expected_in_order = [
        QUESTION, "search: Search the corpus.", "- python",
        "THINK-ONE", "I will look up Varel first.", 'search {"query": "population of Varel"}',
        "Tool response (search)", "Varel has population 452.",
        "THINK-TWO", "Now Quoss.", 'browse {"url": "http://q.example", "query": "area"}',
        "search {not json  (arguments are not valid JSON)",
        "Tool response (browse)", "HEAD-MARK", "TAIL-MARK",
        "Tool response (search)", "Quoss area 37.",
        "FOLLOW-UP-USER-TURN",
        'python {"code": "print(452 + 37)"}', "Tool response (python)", "489",
        "The answer is \\boxed{489}.",
    ]
    pos = -1
    for piece in expected_in_order:
        found = user.find(piece, pos + 1)
        assert found > pos, f"{piece!r} missing or out of order"
        pos = found
    assert user.count(QUESTION) == 1, "the question is not repeated from the first user turn"
    assert "AGENT-SYSTEM-PROMPT" not in user
    assert "<think>THINK-TWO" not in user and "Reasoning:\nTHINK-TWO" in user, "inline thinking becomes a Reasoning section"


def test_long_tool_output_is_truncated_in_the_middle(messages):
    user = messages[1]["content"]
    assert "MIDDLE-MARK" not in user
    omitted = len(LONG) - 1000
    assert f"[... {omitted} characters omitted from the middle of this tool output ...]" in user
    assert len(user) < 4000


def test_raw_tool_call_text_shown_once_or_kept_when_unparsed():
    call = {"name": "search", "arguments": {"query": "q1"}}
    raw = 'Looking.\n<tool_call>\n{"name": "search", "arguments": {"query": "q1"}}\n</tool_call>'
    parsed = [{"role": "assistant", "content": raw, "tool_calls": [{"type": "function", "function": call}]}]
    user = rrm.build_rrm_messages(QUESTION, parsed)[1]["content"]
    assert user.count('"q1"') == 1 and "<tool_call>" not in user and "Looking." in user
    broken = [{"role": "assistant", "content": raw[:-15]}]  # unparsed, cut off: the judge must see it
    user = rrm.build_rrm_messages(QUESTION, broken)[1]["content"]
    assert "<tool_call>" in user and "Tool call 1" not in user


def test_truncate_middle_keeps_head_and_tail():
    assert rrm.truncate_middle("short", 10) == "short"
    text = "".join(chr(ord("a") + i % 26) for i in range(500))
    cut = rrm.truncate_middle(text, 100)
    head, note, tail = cut.split("\n")
    assert head == text[:50] and tail == text[-50:] and "400 characters omitted" in note
    with pytest.raises(ValueError):
        rrm.truncate_middle(text, 1)


def test_multi_dim_and_confidence_options():
    msgs = rrm.build_rrm_messages(QUESTION, TRAJECTORY, multi_dim=True, with_confidence=True)
    assert "<scores>reasoning=0.0; tool_use=0.0; information_use=0.0</scores>" in msgs[0]["content"]
    assert "<confidence>" in msgs[0]["content"]
    assert "<scores>" in msgs[1]["content"] and "<confidence>" in msgs[1]["content"]
    assert "Tools the agent could call" not in msgs[1]["content"]


def test_expert_trajectory_renders_fully():
    world = worlds.make_world(seed=0, n_entities=20, n_questions=40)
    q = next(q for q in world.questions if q.level == 3)
    traj = worlds.expert_trajectory(world, q)
    user = rrm.build_rrm_messages(q.question, traj)[1]["content"]
    for m in traj[1:]:
        assert m["content"] in user
        for c in m.get("tool_calls", []):
            assert json.dumps(c["function"]["arguments"]) in user


def test_refinement_message_carries_the_critique():
    m = rrm.build_refinement_message("You never looked up the area of Quoss.")
    assert m["role"] == "user"
    assert "You never looked up the area of Quoss." in m["content"]
    assert "\\boxed{...}" in m["content"] and "again" in m["content"]
    assert "no specific critique" in rrm.build_refinement_message("  ")["content"]
    restated = rrm.build_refinement_message("Check the sum.", "What is 2 + 3? ")["content"]
    assert restated == m["content"].replace("You never looked up the area of Quoss.", "Check the sum.") + \
        "\n\nThe question again: What is 2 + 3?"


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="question"):
        rrm.build_rrm_messages("", TRAJECTORY)
    with pytest.raises(ValueError, match="message 1"):
        rrm.build_rrm_messages(QUESTION, [{"role": "user", "content": "hi"}, "oops"])
    assert "no turns" in rrm.build_rrm_messages(QUESTION, [])[1]["content"]
