"""Agent-RRM prompts: the judge's instructions, the rendered trajectory, and the critique turn.

Why: the reward model must see the *whole* trajectory (every reasoning step, tool call and tool
response), not just the final answer, to say where the process went wrong. Long tool outputs are
cut in the middle (head and tail kept, with a note) so one noisy page cannot crowd out the rest.

    build_rrm_messages(question, trajectory_messages, tools=None, max_tool_chars=3000,
                       multi_dim=False, with_confidence=False) -> [system, user]
    build_refinement_message(critique[, question]) -> user message (the Reagent-C second-attempt turn)
    render_judgement(think, critique, score, sub_scores=None, confidence=None) -> str
        the exact output format the RRM is trained to produce (used for SFT targets)

Output format the judge must follow (the parser in `rrm.parser` reads it back):

    <think>analysis of the whole trajectory</think>
    <critique>short, actionable advice for the agent; never the answer</critique>
    <score>0.85</score>
    <scores>reasoning=0.9; tool_use=0.8; information_use=0.9</scores>   (only with multi_dim)
    <confidence>0.7</confidence>                                           (only with_confidence)
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

SUB_SCORE_NAMES = ("reasoning", "tool_use", "information_use")
DEFAULT_MAX_TOOL_CHARS = 3000

RRM_SYSTEM_PROMPT = """\
You are an expert reviewer of AI agents that solve tasks by reasoning and calling tools. You will \
be given a question and the complete record of one agent's attempt at it: its reasoning, every tool \
call with its arguments, every tool response, and its final answer. You are not told the correct \
answer. Judge the attempt from the evidence in the record.

Reply with exactly three blocks, in this order, and nothing outside them:

<think>
Your analysis of the whole attempt, step by step. Look at when each tool was called and why; \
whether a tool, or its arguments, was the wrong choice; whether a needed tool call is missing; \
whether the agent used facts that no tool response supports or copied values wrongly; whether its \
logic and arithmetic hold; whether it checked doubtful intermediate results; whether its reasoning \
got better or worse over the turns; and whether the final answer follows from what it found and \
is given in the required format.
</think>
<critique>
Short, concrete advice that the agent will read before it tries again: name the mistakes and \
say what to do differently. Never state the answer and never give hints that reveal it. If the \
attempt is sound, say so briefly.
</critique>
<score>
One number from 0 to 1 for the overall quality of the attempt: near 1 for a correct answer that \
is fully supported by sound reasoning and good tool use, near 0 for a wrong or unsupported answer.
</score>"""

MULTI_DIM_INSTRUCTIONS = """

Besides the three blocks, add a fourth one after the score block that rates three aspects, each from 0 to 1:
<scores>reasoning=0.0; tool_use=0.0; information_use=0.0</scores>
reasoning: logic and arithmetic; tool_use: choice of tools, arguments and call format; \
information_use: faithful use of what the tools returned."""

CONFIDENCE_INSTRUCTIONS = """

Finish with one last block, <confidence>0.0</confidence>: a number from 0 to 1 saying how sure you \
are that your critique points at the real problems."""

REFINEMENT_TEMPLATE = """\
A reviewer examined your attempt and wrote this critique:

{critique}

Reconsider your reasoning and your tool use in light of the critique, then solve the question \
again. Use the tools where they help, and give the final answer as \\boxed{{...}}."""


def truncate_middle(text: str, max_chars: int) -> str:
    """Keeps the first and last max_chars/2 characters and notes how many were cut in between."""
    if max_chars < 2:
        raise ValueError(f"max_chars must be >= 2, got {max_chars}")
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[... {omitted} characters omitted from the middle of this tool output ...]\n{text[-tail:]}"


def _text_of(content: Any) -> str:
    """Message content as text (plain strings, or OpenAI content parts with "text")."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        return "\n".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content)
    return str(content)


def _split_think(text: str) -> tuple[str, str]:
    """Inline Qwen3 `<think>...</think>` (or a bare `...</think>`) -> (reasoning, rest)."""
    m = re.search(r"^\s*(?:<think>)?(.*?)</think>", text, flags=re.DOTALL)
    if m:
        return m.group(1).strip(), text[m.end() :].strip()
    return "", text.strip()


def _format_call(call: Any) -> tuple[str, str]:
    """One tool call -> (name, display text with its arguments as compact JSON)."""
    fn = call.get("function", call) if isinstance(call, Mapping) else {}
    name = str(fn.get("name", "?")) if isinstance(fn, Mapping) else "?"
    args = fn.get("arguments") if isinstance(fn, Mapping) else call
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return name, f"{name} {args}  (arguments are not valid JSON)"
    return name, f"{name} {json.dumps(args, ensure_ascii=False)}"


def _format_tools(tools: Sequence[Any]) -> str:
    """One line per tool; a bare string or spec (not in a list) is an error, not a list of characters/keys."""
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ValueError(f"tools must be a list of tool specs or names, got {type(tools).__name__}: {tools!r:.100}")
    lines = []
    for k, t in enumerate(tools):
        if isinstance(t, str):
            lines.append(f"- {t}")
            continue
        if not isinstance(t, Mapping):
            raise ValueError(f"tools[{k}] must be a tool spec dict or a name, got {type(t).__name__}: {t!r:.100}")
        fn = t.get("function", t)
        fn = fn if isinstance(fn, Mapping) else {}
        desc = str(fn.get("description", "")).strip()
        lines.append(f"- {fn.get('name', '?')}" + (f": {desc}" if desc else ""))
    return "\n".join(lines)


def render_trajectory(
    trajectory_messages: Sequence[Mapping[str, Any]],
    *,
    question: str | None = None,
    max_tool_chars: int = DEFAULT_MAX_TOOL_CHARS,
    include_system: bool = False,
) -> str:
    """Every turn as numbered sections; the first user turn is skipped when it repeats `question`."""
    sections = []
    pending_names: list[str] = []
    skipped_question = False
    for i, m in enumerate(trajectory_messages):
        if not isinstance(m, Mapping) or "role" not in m:
            raise ValueError(f"trajectory message {i} is not a chat message dict with a 'role': {m!r:.200}")
        role = m["role"]
        text = _text_of(m.get("content"))
        if role == "system" and not include_system:
            continue
        if role == "user" and not skipped_question and question is not None and text.strip() == question.strip():
            skipped_question = True
            continue
        n = len(sections) + 1
        if role == "assistant":
            pending_names = []  # responses answer the latest assistant turn, never an older one
            reasoning, rest = _split_think(text)
            if m.get("tool_calls"):  # raw call text duplicates the parsed calls listed below
                rest = re.sub(r"<tool_call>.*?(?:</tool_call>|$)", "", rest, flags=re.DOTALL).strip()
            reasoning = "\n".join(s for s in (_text_of(m.get("reasoning_content")).strip(), reasoning) if s)
            lines = [f"[{n}] Assistant"]
            if reasoning:
                lines.append(f"Reasoning:\n{reasoning}")
            if rest:
                lines.append(f"Message:\n{rest}")
            for k, call in enumerate(m.get("tool_calls") or (), 1):
                name, shown = _format_call(call)
                pending_names.append(name)
                lines.append(f"Tool call {k}: {shown}")
            if len(lines) == 1:
                lines.append("(empty turn)")
            sections.append("\n".join(lines))
        elif role == "tool":
            name = m.get("name") or (pending_names.pop(0) if pending_names else "tool")
            if m.get("name") and name in pending_names:
                pending_names.remove(name)
            sections.append(f"[{n}] Tool response ({name})\n{truncate_middle(text, max_tool_chars)}")
        else:
            sections.append(f"[{n}] {str(role).capitalize()}\n{text}")
    return "\n\n".join(sections) if sections else "(the agent produced no turns)"


def rrm_system_prompt(multi_dim: bool = False, with_confidence: bool = False) -> str:
    return RRM_SYSTEM_PROMPT + (MULTI_DIM_INSTRUCTIONS if multi_dim else "") + (CONFIDENCE_INSTRUCTIONS if with_confidence else "")


def build_rrm_messages(
    question: str,
    trajectory_messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    max_tool_chars: int = DEFAULT_MAX_TOOL_CHARS,
    multi_dim: bool = False,
    with_confidence: bool = False,
) -> list[dict[str, str]]:
    """[system, user] messages asking the RRM to judge one whole trajectory."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question must be a non-empty string, got {question!r:.100}")
    parts = [f"Question:\n{question.strip()}"]
    if tools:
        parts.append(f"Tools the agent could call:\n{_format_tools(tools)}")
    body = render_trajectory(trajectory_messages, question=question, max_tool_chars=max_tool_chars)
    parts.append(f"The agent's attempt:\n\n{body}")
    blocks = "<think>, <critique> and <score>" + (", <scores>" if multi_dim else "") + (" and <confidence>" if with_confidence else "")
    parts.append(f"Review the whole attempt above and reply with the {blocks} blocks.")
    return [
        {"role": "system", "content": rrm_system_prompt(multi_dim, with_confidence)},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


RESTATED_QUESTION = "\n\nThe question again: {question}"


def build_refinement_message(critique: str, question: str | None = None) -> dict[str, str]:
    """The user turn that feeds a critique back to the agent for a second attempt (Reagent-C).

    `question`: also restate the question at its end (`rrm.restate_question`). A small model
    that must retry after a long first attempt loses track of a question asked hundreds of tokens
    earlier (EXPERIMENTS.md, session 49); the restated one sits right before the retry."""
    critique = (critique or "").strip() or "The reviewer gave no specific critique. Check each step again."
    content = REFINEMENT_TEMPLATE.format(critique=critique)
    if question is not None:
        content += RESTATED_QUESTION.format(question=question.strip())
    return {"role": "user", "content": content}


def render_judgement(
    think: str,
    critique: str,
    score: float,
    *,
    sub_scores: Mapping[str, float] | None = None,
    confidence: float | None = None,
) -> str:
    """The RRM's output text in the exact trained format (scores written with two decimals)."""
    if not 0.0 <= float(score) <= 1.0:
        raise ValueError(f"score must be in [0, 1], got {score}")
    text = f"<think>\n{think.strip()}\n</think>\n<critique>\n{critique.strip()}\n</critique>\n<score>{float(score):.2f}</score>"
    if sub_scores is not None:
        text += "\n<scores>" + "; ".join(f"{k}={float(v):.2f}" for k, v in sub_scores.items()) + "</scores>"
    if confidence is not None:
        text += f"\n<confidence>{float(confidence):.2f}</confidence>"
    return text
