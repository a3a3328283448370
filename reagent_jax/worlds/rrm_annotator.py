"""Rule-based Agent-RRM annotations for synthetic-world trajectories: the quickstart's RRM SFT
data (`synthetic_rrm_records`) and a judge that needs no model (`RuleJudge`).

Why: the quickstart trains a tiny reward model with no teacher model at hand. In the synthetic
world every fact and every answer is known, so rules can find the real flaws of a trajectory and
write the `<think>` / `<critique>` / `<score>` text an expert judge would.

What is checked (flaw names match `worlds.expert.FLAWS`, plus `no_answer`):
  skipped_lookup       a needed value never appears in any tool response (not searched, or the
                       search missed and was not retried); any number used for it is unsupported
  misread_value        the value was retrieved but a different number was used or stated
  wrong_arithmetic     values are right but the answer is not what they combine to (python code
                       with the wrong operation, a result by hand, or an answer that ignores the
                       python output)
  no_boxed             the final message has no \\boxed{...}
  malformed_tool_call  a tool call that is not valid JSON, names an unknown tool or lacks arguments
  no_answer            the trajectory ends without a final message (or with an empty one)
  wrong_answer         none of the above, yet the answer is wrong (a fallback that should not fire)

The think text reasons only from what the trajectory shows (never from the hidden ground truth),
and the critique names mistakes without any number, so it cannot leak the answer.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from typing import Any, Mapping, Optional, Sequence

from reagent_jax.rrm.base import as_request
from reagent_jax.rrm.parser import Judgement, JudgementStats, parse_judgement
from reagent_jax.rrm.prompt import render_judgement
from reagent_jax.worlds.expert import labelled_trajectories
from reagent_jax.worlds.synthetic import Question, apply_ops, expression

KNOWN_TOOLS = ("search", "python")
CLEAN_SCORE = 0.95


@dataclasses.dataclass(frozen=True)
class Annotation:
    think: str
    critique: str
    score: float
    flaws: tuple[str, ...]  # empty for a clean trajectory
    sub_scores: dict[str, float]
    text: str  # the exact RRM output (render_judgement)


@dataclasses.dataclass
class _Call:
    name: str
    args: dict[str, Any]
    problem: str | None  # why the call is malformed, None if it is fine
    response: str | None = None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        return "\n".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content)
    return "" if content is None else str(content)


def _check_call(name: Any, args: Any) -> _Call:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return _Call(str(name), {}, "its arguments are not valid JSON")
    if name not in KNOWN_TOOLS:
        return _Call(str(name), args if isinstance(args, dict) else {}, f"it names an unknown tool {name!r}")
    if not isinstance(args, dict):
        return _Call(name, {}, "its arguments are not a JSON object")
    key = "query" if name == "search" else "code"
    if not isinstance(args.get(key), str) or not args[key].strip():
        return _Call(name, args, f"it has no {key!r} argument")
    return _Call(name, args, None)


def _raw_call(raw: str) -> _Call:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError:
        return _Call("?", {}, "it is not valid JSON")
    if not isinstance(obj, dict) or "name" not in obj:
        return _Call("?", {}, "it has no tool name")
    return _check_call(obj.get("name"), obj.get("arguments", {}))


def collect_turns(messages: Sequence[Mapping[str, Any]]) -> tuple[list[_Call], list[str], str | None]:
    """(calls in order with their responses, assistant prose, final message or None)."""
    calls: list[_Call] = []
    prose: list[str] = []
    final: str | None = None
    waiting: list[_Call] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"trajectory message {i} is not a dict: {m!r:.200}")
        role = m.get("role")
        if role == "assistant":
            content = _text(m.get("content"))
            raw = re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", content, flags=re.DOTALL)
            structured = m.get("tool_calls") or []
            turn = []
            for c in structured:
                fn = c.get("function", c) if isinstance(c, Mapping) else {}
                turn.append(_check_call(fn.get("name"), fn.get("arguments")))
            if not structured:
                turn = [_raw_call(r.strip()) for r in raw]
            text = re.sub(r"<tool_call>.*?(?:</tool_call>|$)", "", content, flags=re.DOTALL).strip()
            prose.append(text)
            calls += turn
            waiting += turn
            final = None if turn or not text else text  # an empty last turn (e.g. cut off in thinking) answers nothing
        elif role == "tool":
            if waiting:
                waiting.pop(0).response = _text(m.get("content"))
    return calls, prose, final


def _eval_node(node: ast.AST, env: dict[str, float]) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval_node(node.operand, env)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _eval_node(node.left, env), _eval_node(node.right, env)
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.Div: lambda: a / b, ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b}
        if type(node.op) in ops:
            return ops[type(node.op)]()
    raise ValueError("unsupported expression")


def evaluate_printed(code: str) -> float | None:
    """Value of the last print(...) of simple arithmetic code, without executing it (None if unsure)."""
    try:
        tree = ast.parse(code)
        env: dict[str, float] = {}
        last = None
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                env[stmt.targets[0].id] = _eval_node(stmt.value, env)
            elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name)
                  and stmt.value.func.id == "print" and len(stmt.value.args) == 1):
                last = _eval_node(stmt.value.args[0], env)
            else:
                return None
        return last
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    m = re.search(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
    return float(m.group()) if m else None


def numbers_in(text: str) -> set[float]:
    return {float(x) for x in re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?", text.replace(",", ""))}


def boxed_answer(text: str) -> str | None:
    found = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return found[-1].strip() if found else None


def format_number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _fact(attribute: str, entity: str) -> str:
    return rf"the\s+{re.escape(attribute)}\s+of\s+{re.escape(entity)}\s+is\s+(-?\d+)"


@dataclasses.dataclass
class _Findings:
    think: list[str] = dataclasses.field(default_factory=list)
    critique: list[str] = dataclasses.field(default_factory=list)
    flaws: list[str] = dataclasses.field(default_factory=list)

    def add(self, flaw: str | None, think: str, critique: str) -> None:
        if flaw and flaw not in self.flaws:
            self.flaws.append(flaw)
        self.think.append(think)
        if critique not in self.critique:
            self.critique.append(critique)


def _narrate(q: Question, calls: Sequence[_Call]) -> list[str]:
    """What the trajectory did, step by step, in the judge's words (only trajectory facts)."""
    needs = ", ".join(t.phrase for t in q.terms)
    lines = [f"The question needs {len(q.terms)} value{'s' if len(q.terms) > 1 else ''}: {needs}."
             + (f" They are combined in order with: {', then '.join(q.ops)}." if q.ops else "")]
    for k, c in enumerate(calls, 1):
        if c.problem:
            lines.append(f"Step {k}: the agent wrote a tool call that cannot run because {c.problem}.")
        elif c.name == "search":
            got = [f"{t.phrase} is {m.group(1)}" for t in q.terms
                   for m in [re.search(_fact(t.attribute, t.entity), c.response or "", re.I)] if m]
            seen = f"The result says {' and '.join(got)}." if got else "The result has no value the question needs."
            seen = seen if c.response is not None else "No result came back."
            lines.append(f"Step {k}: the agent searched for \"{c.args['query']}\". {seen}")
        else:
            out = (c.response or "").strip()
            got = f" and got {out}." if out else " and got no output."
            lines.append(f"Step {k}: the agent ran the python code {c.args['code'].strip()!r}{got}")
    return lines


def _final_value(final: str | None, f: _Findings) -> float | None:
    """The number the agent answered (from \\boxed{}, else the last number of its final message)."""
    if final is None:
        f.add("no_answer", "The agent never gave a final answer.",
              "You stopped without a final answer; finish with your answer in \\boxed{}.")
        return None
    answer = boxed_answer(final)
    if answer is None:
        f.add("no_boxed", "The final message does not put the answer in \\boxed{}, so it cannot be graded.",
              "Put the final answer inside \\boxed{} as required.")
        numbers = re.findall(r"-?\d+(?:\.\d+)?", final.replace(",", ""))
        return float(numbers[-1]) if numbers else None  # still judge the content: the last number
    f.think.append(f"The final answer is \\boxed{{{answer}}}.")
    return _number(answer)


def _check_lookups(q: Question, calls: Sequence[_Call], spoken: str, used: set[float], value: float | None,
                   f: _Findings) -> list[int | None]:
    """Per term: the retrieved value (or None). Adds skipped_lookup / misread_value findings."""
    responses = [c.response for c in calls if c.response]
    queries = " ".join(c.args["query"] for c in calls if c.name == "search" and not c.problem)
    observed: list[int | None] = []
    for t in q.terms:
        hits = [int(m.group(1)) for r in responses for m in [re.search(_fact(t.attribute, t.entity), r, re.I)] if m]
        o = hits[0] if hits else None
        observed.append(o)
        searched = re.search(rf"\b{re.escape(t.entity)}\b", queries, re.I) is not None
        stated = [int(m.group(1)) for m in re.finditer(_fact(t.attribute, t.entity), spoken, re.I)]
        misused = o is not None and (
            (bool(stated) and o not in stated)  # said a different number
            # unused values only count once the agent has answered
            or (value is not None and (float(o) not in used or (q.level == 1 and value != o)))
        )
        if o is None or (misused and not searched):  # a value seen only by chance still counts as not looked up
            lead = f"The agent never searched for {t.phrase}" if o is not None else f"No tool response contains {t.phrase}"
            tail = f", yet it used {stated[0]} for it; that number is not supported." if stated else \
                "; the answer rests on an unsupported value."
            f.add("skipped_lookup", lead + tail, f"You never retrieved {t.phrase}; search for it instead of assuming a value.")
        elif misused:
            f.add("misread_value", f"The search result gives {t.phrase} as {o}, but the agent did not use that number.",
                  f"The value you used for {t.phrase} does not match the search result; "
                  "copy values exactly from the tool responses.")
    return observed


def _check_arithmetic(q: Question, observed: Sequence[int], codes: Sequence[str], value: float, f: _Findings) -> None:
    expected = apply_ops(observed, q.ops)
    f.think.append(f"From the retrieved values the result is {expression(observed, q.ops, words=True)} = {expected}.")
    if value == expected:
        return
    computed = evaluate_printed(codes[-1]) if codes else None
    if not codes:
        f.add("wrong_arithmetic", f"The agent worked it out by hand and got {format_number(value)}, which is wrong.",
              "Your arithmetic is wrong; compute the result with the python tool instead of by hand.")
    elif computed is not None and computed != expected:
        f.add("wrong_arithmetic", f"The python code computes {format_number(computed)}, not the combination the question asks for.",
              "Your python code does not compute what the question asks; check each operation against the question.")
    else:
        f.add("wrong_arithmetic", f"The final answer {format_number(value)} does not match the computation.",
              "Your final answer does not match your computation; report the computed result.")


def _score(f: _Findings, correct: bool, answered: bool, by_hand: bool) -> float:
    """A clean trajectory gets CLEAN_SCORE; a correct answer loses for each process flaw; a wrong one
    scores by how far the process got (arithmetic slip > misread > skipped lookup)."""
    has = f.flaws.__contains__
    if correct:
        return clamp_score(CLEAN_SCORE - 0.45 * has("no_boxed") - 0.25 * has("malformed_tool_call")
                      - 0.6 * has("skipped_lookup") - 0.5 * has("misread_value") - 0.05 * by_hand)
    if not answered:
        return 0.0
    base = 0.05 if has("skipped_lookup") else 0.1 if has("misread_value") else 0.2 if has("wrong_arithmetic") else 0.1
    return clamp_score(base - 0.05 * has("malformed_tool_call") - 0.05 * has("no_boxed"))


def annotate(
    question: Question | Mapping[str, Any], messages: Sequence[Mapping[str, Any]], *, multi_dim: bool = False
) -> Annotation:
    """Find the real flaws of `messages` for a synthetic `question` and write the RRM judgement."""
    q = question if isinstance(question, Question) else Question.from_record(question)
    calls, prose, final = collect_turns(messages)
    spoken = "\n".join(prose)
    codes = [c.args["code"] for c in calls if c.name == "python" and not c.problem]
    used = numbers_in(spoken).union(*(numbers_in(code) for code in codes))  # every number the agent wrote
    f = _Findings(think=_narrate(q, calls))
    if any(c.problem for c in calls):
        f.add("malformed_tool_call", "The malformed tool call wasted a turn.",
              "One of your tool calls was malformed; write each call as one JSON object with a known tool name "
              "and its arguments.")
    value = _final_value(final, f)
    observed = _check_lookups(q, calls, spoken, used, value, f)
    by_hand = q.level > 1 and not codes
    if q.level > 1 and value is not None and not {"skipped_lookup", "misread_value"} & set(f.flaws):
        _check_arithmetic(q, [int(o) for o in observed if o is not None], codes, value, f)
    correct = value is not None and value == float(q.answer)
    if not f.flaws and not correct:
        f.add("wrong_answer", "The final answer does not follow from the retrieved values.",
              "Your final answer is not supported by the values you retrieved; recheck each step.")
    score = _score(f, correct, final is not None, by_hand)
    if not f.flaws:
        if by_hand:
            f.think.append("The agent did the arithmetic by hand; it is right, but the python tool would be safer.")
        f.think.append("Every needed value was retrieved and used correctly, and the answer follows from them.")
        f.critique.append("The attempt is sound: each needed value was looked up and used correctly, "
                          "and the answer is in the required format.")
    f.think.append(f"Overall the attempt is {'good' if score >= 0.8 else 'partly right' if score >= 0.3 else 'poor'}.")

    has = f.flaws.__contains__
    sub = {
        "reasoning": clamp_score(1.0 - 0.7 * has("wrong_arithmetic") - 0.3 * has("no_boxed") - 0.8 * has("no_answer")
                            - 0.1 * by_hand),
        "tool_use": clamp_score(1.0 - 0.6 * has("skipped_lookup") - 0.4 * has("malformed_tool_call")),
        "information_use": clamp_score(1.0 - 0.7 * has("misread_value") - 0.5 * has("skipped_lookup")),
    }
    think_text, critique_text = "\n".join(f.think), " ".join(f.critique)
    text = render_judgement(think_text, critique_text, score, sub_scores=sub if multi_dim else None)
    return Annotation(think_text, critique_text, score, tuple(f.flaws), sub, text)


def clamp_score(x: float) -> float:
    return round(min(1.0, max(0.0, x)), 2)


class RuleJudge:
    """The synthetic world's rule-based annotator used directly as a judge: a programmatic
    reference point (and the teacher the tiny local RRM is trained from)."""

    def __init__(self, multi_dim: bool = False):
        self.multi_dim = multi_dim
        self.stats = JudgementStats()

    def judge_many(self, items: Sequence[Any], records: Optional[Sequence[dict]] = None) -> list[Judgement]:
        """items as any judge takes them; each needs its question's record (with the answer): a
        `JudgeRequest.record` (as `rrm.judges.judge_trajectories` gives), or `records`, one per item."""
        requests = [as_request(it, i) for i, it in enumerate(items)]
        if records is None:
            records = [r.record for r in requests]
        if len(records) != len(items):
            raise ValueError(f"RuleJudge: {len(items)} items but {len(records)} records; one record per item")
        if any(rec is None for rec in records):
            raise ValueError("RuleJudge needs the question records (with answers) of the trajectories")
        out = [parse_judgement(annotate(rec, r.trajectory, multi_dim=self.multi_dim).text)
               for r, rec in zip(requests, records)]
        self.stats.update(out)
        return out


def synthetic_rrm_records(world, tools=None, split: str = "train", flaw_fraction: float = 0.7, seed: int = 0,
                          system_prompt=None) -> list[dict]:
    """RRM records on the synthetic world: expert and flawed trajectories, each annotated by the
    rule-based annotator (think / critique / score) — the Reagent-RRM-SFT schema."""
    out = []
    for lt in labelled_trajectories(world, split, flaw_fraction=flaw_fraction, seed=seed, tools=tools,
                                    system_prompt=system_prompt):
        rec = lt.question.to_record()
        a = annotate(rec, lt.messages)
        out.append({"id": f"{rec['id']}/{lt.flaw or 'expert'}", "question": rec["question"], "record": rec,
                    "trajectory": lt.messages, "think": a.think, "critique": a.critique, "score": a.score,
                    "text": a.text, "flaw": lt.flaw, "target": 0.0 if lt.flaw else 1.0})
    return out
