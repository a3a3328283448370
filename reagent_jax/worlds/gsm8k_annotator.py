"""Rule-based Agent-RRM annotations for GSM8K python-tool trajectories, from the worked solution.

Why: Agent-RRM needs judgements that name the flawed step without giving the answer, and no
teacher model is at hand offline. GSM8K's reference solutions mark every computation as
`<<48/2=24>>`, so a rule annotator that sees the solution knows the value each step must reach
and can say which step a trajectory never reaches. The trained RRM then judges held-out
trajectories with no reference at all.

What is checked (plus `malformed_tool_call`, `no_boxed`, `no_answer` as in `rrm_annotator`):
  missed_step      the first solution step whose value appears in no tool output and no prose
                   (named by its number and its words, never its value)
  answer_mismatch  every step's value was reached, yet the boxed answer is something else
A correct answer scores CLEAN_SCORE less format penalties; a wrong one 0.05 plus up to 0.25 for
the share of steps it reached. `flawed_trajectories` builds wrong, skipped and format-broken
variants of the expert trajectory (`worlds.annotated`) so the RRM sees both kinds.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from typing import Any, Callable, Mapping, Optional, Sequence

from reagent_jax.rrm.parser import Judgement, JudgementStats, parse_judgement
from reagent_jax.rrm.base import as_request
from reagent_jax.rrm.prompt import render_judgement
from reagent_jax.worlds.annotated import ANNOTATION, SOLVER_SYSTEM_PROMPT, annotated_trajectory, arithmetic
from reagent_jax.worlds.expert import tool_call
from reagent_jax.worlds.rrm_annotator import (CLEAN_SCORE, boxed_answer, clamp_score, collect_turns, format_number,
                                              numbers_in)

FLAWS = ("wrong_step", "skipped_step", "wrong_final", "no_boxed", "malformed_tool_call", "by_hand")
_OPERATION = {"+": "an addition", "-": "a subtraction", "*": "a multiplication", "/": "a division"}


@dataclasses.dataclass(frozen=True)
class Step:
    """One calculation of the reference solution: its code, the value it reaches, its words."""

    code: str
    value: float
    words: str  # the solution's sentence without numbers: names the step without giving the value
    operation: str


@dataclasses.dataclass(frozen=True)
class GSM8KAnnotation:
    think: str
    critique: str
    score: float
    flaws: tuple[str, ...]
    step: int | None  # the 1-based solution step the critique names, None when it names none
    correct: bool
    text: str  # the exact RRM output (render_judgement)


def _float(text: str) -> Optional[float]:
    try:
        v = float(text.replace(",", "").replace("$", "").strip())
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b)) or round(a, 2) == round(b, 2)


def solution_steps(solution: str) -> list[Step]:
    """The arithmetic steps of a worked solution, in order (annotations that are not arithmetic or
    whose value is not a number are left out)."""
    steps = []
    for line in solution.splitlines():
        for m in ANNOTATION.finditer(line):
            code, value = arithmetic(m.group(1)), _float(m.group(2))
            if code is None or value is None:
                continue
            words = ANNOTATION.sub(" ", line)
            words = re.sub(r"[\d.,$%]+|#+", " ", words)  # numbers first, then the operators between them
            words = re.sub(r"(?<!\w)[-+*/=x×()](?!\w)", " ", words)
            words = " ".join(words.split()[:12]).strip(" .:;") or "a calculation"
            ops = [_OPERATION[c] for c in code if c in _OPERATION]
            steps.append(Step(code, value, words, ops[-1] if len(set(ops)) == 1 else "a calculation"))
    return steps


def _record_parts(record: Mapping[str, Any]) -> tuple[list[Step], float]:
    solution = (record.get("meta") or {}).get("solution")
    answers = record.get("answer") or []
    answer = _float(str(answers[0])) if answers else None
    if not isinstance(solution, str) or answer is None:
        raise ValueError(f"GSM8K record {record.get('id', '?')!r} needs meta.solution and a numeric answer")
    return solution_steps(solution), answer


def annotate(record: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> GSM8KAnnotation:
    """Judge `messages` against `record`'s worked solution and write the RRM judgement."""
    steps, answer = _record_parts(record)
    calls, prose, final = collect_turns(messages)
    seen = set().union(*(numbers_in(c.response or "") for c in calls), *(numbers_in(p) for p in prose))
    reached = [any(_close(x, s.value) for x in seen) for s in steps]
    has_python = any(c.name == "python" and not c.problem for c in calls)
    think = [f"A correct solution takes {len(steps)} calculation step{'s' if len(steps) != 1 else ''}."]
    for k, c in enumerate(calls, 1):
        if c.problem:
            think.append(f"Call {k} cannot run because {c.problem}.")
        else:
            out = ", ".join((c.response or "").split("\n")).strip()[:200]
            think.append(f"Call {k} runs {c.name} and gets {out or 'no output'}.")
    flaws: list[str] = []
    critique: list[str] = []
    if any(c.problem for c in calls):
        flaws.append("malformed_tool_call")
        critique.append("One of your tool calls was malformed; write each call as one JSON object with the tool's "
                        "name and its arguments.")
    value = None
    if final is None:
        flaws.append("no_answer")
        critique.append("You stopped without a final answer; finish with your answer in \\boxed{}.")
    else:
        boxed = boxed_answer(final)
        if boxed is None:
            flaws.append("no_boxed")
            critique.append("Put the final answer inside \\boxed{} as required.")
            numbers = re.findall(r"-?\d+(?:\.\d+)?", final.replace(",", ""))
            value = float(numbers[-1]) if numbers else None
        else:
            value = _float(boxed)
            think.append(f"The final answer is \\boxed{{{boxed}}}.")
    correct = value is not None and _close(value, answer)
    step = None
    if not correct and final is not None:
        missed = next((k for k, ok in enumerate(reached) if not ok), None)
        if missed is not None:
            step, s = missed + 1, steps[missed]
            flaws.append("missed_step")
            think.append(f"It reaches the values of {sum(reached)} of the {len(steps)} steps; step {step} "
                         f"({s.words}) is never reached.")
            critique.append(f"Step {step} is missing or wrong: your work never gets the right value for "
                            f"'{s.words}' ({s.operation}). Work it out with the python tool.")
        else:
            flaws.append("answer_mismatch")
            think.append("Every step's value appears in the work, but the final answer is not the last of them.")
            critique.append("Your final answer does not match your own computation; report the value your last "
                            "step computes.")
    if correct:
        think.append("The answer is right" + (" and every step is computed with python." if has_python else
                                              ", worked out by hand."))
        if not flaws:
            critique.append("The attempt is sound: each step is computed and the answer is in the required format.")
    score = _score(flaws, correct, final is not None, reached, by_hand=correct and not has_python and bool(steps))
    think.append(f"Overall the attempt is {'good' if score >= 0.8 else 'partly right' if score >= 0.3 else 'poor'}.")
    think_text, critique_text = "\n".join(think), " ".join(critique)
    return GSM8KAnnotation(think_text, critique_text, score, tuple(flaws), step, correct,
                           render_judgement(think_text, critique_text, score))


def _score(flaws: Sequence[str], correct: bool, answered: bool, reached: Sequence[bool], by_hand: bool) -> float:
    has = flaws.__contains__
    if correct:
        raw = CLEAN_SCORE - 0.45 * has("no_boxed") - 0.25 * has("malformed_tool_call") - 0.05 * by_hand
    elif not answered:
        raw = 0.0
    else:
        share = sum(reached) / len(reached) if reached else 0.0
        raw = 0.05 + 0.25 * share - 0.05 * has("malformed_tool_call") - 0.05 * has("no_boxed")
    return clamp_score(raw)


def _wrong_value(rng: random.Random, true: float) -> float:
    """A plausible wrong number near `true` (never equal to it)."""
    for _ in range(10):
        v = true + rng.choice([-1, 1]) * rng.choice([1, 2, 10, max(1, round(abs(true) * 0.5))])
        if not _close(v, true):
            return v
    return true + 1


def flawed_trajectory(record: Mapping[str, Any], flaw: str, python: Callable[[str], str], rng: random.Random,
                      system_prompt: Optional[str] = SOLVER_SYSTEM_PROMPT) -> Optional[list[dict[str, Any]]]:
    """The expert trajectory of `record` with one flaw of FLAWS (None where it does not apply)."""
    expert = annotated_trajectory(dict(record), python, system_prompt=system_prompt)
    steps, answer = _record_parts(record)
    if expert is None or not steps:
        return None
    head = [m for m in expert if m["role"] in ("system", "user")]
    codes = [s.code for s in steps]

    def computed(kept: Sequence[str], box: float, words: str) -> list[dict[str, Any]]:
        code = "\n".join(f"print({c})" for c in kept)
        turns = [{"role": "assistant", "content": "Let me compute each step with Python.",
                  "tool_calls": [tool_call("python", {"code": code})]},
                 {"role": "tool", "content": python(code)}] if kept else []
        final_turn = {"role": "assistant", "content": f"{words} The answer is \\boxed{{{format_number(box)}}}."}
        return head + turns + [final_turn]

    final = expert[-1]["content"]
    if flaw == "wrong_step":  # the last calculation done with the wrong operation
        swap = {"+": "-", "-": "+", "*": "/", "/": "*"}
        last = next((i for i in range(len(codes[-1]) - 1, 0, -1) if codes[-1][i] in swap), None)
        if last is None:
            return None
        bad = codes[-1][:last] + swap[codes[-1][last]] + codes[-1][last + 1:]
        try:
            got = _float(python(f"print({bad})"))
        except Exception:  # noqa: BLE001 - a division by zero etc.: the flaw does not apply
            return None
        if got is None or _close(got, answer):
            return None
        return computed(codes[:-1] + [bad], got, "From the results,")
    if flaw == "skipped_step":  # stops one step short and answers the step before
        if len(steps) < 2:
            return None
        k = rng.randrange(1, len(steps))
        return None if _close(steps[k - 1].value, answer) else computed(codes[:k], steps[k - 1].value, "So,")
    if flaw == "wrong_final":  # computes every step, then reports another number
        return computed(codes, _wrong_value(rng, answer), "After checking the results,")
    if flaw == "no_boxed":
        return expert[:-1] + [{"role": "assistant", "content": re.sub(r"\\boxed\{([^{}]*)\}", r"\1", final)}]
    if flaw == "malformed_tool_call":
        broken = json.dumps({"name": "python", "arguments": {"code": f"print({codes[0]})"}})[:-2]
        return head + [{"role": "assistant", "content": f"<tool_call>{broken}</tool_call>"},
                       {"role": "tool", "content": "error: the tool call is not valid JSON"}] + expert[len(head):]
    if flaw == "by_hand":
        return head + [expert[-1]]
    raise ValueError(f"unknown GSM8K flaw {flaw!r}; expected one of {FLAWS}")


def gsm8k_rrm_records(records: Sequence[Mapping[str, Any]], python: Callable[[str], str], *,
                      flaw_fraction: float = 0.6, seed: int = 0,
                      system_prompt: Optional[str] = SOLVER_SYSTEM_PROMPT) -> list[dict]:
    """RRM records (the Reagent-RRM-SFT schema) from GSM8K rows with worked solutions: per row the
    expert trajectory or, with probability `flaw_fraction`, a flawed one, each annotated."""
    rng = random.Random(seed)
    out = []
    for rec in records:
        if not (rec.get("meta") or {}).get("solution"):
            continue
        flaw = rng.choice(FLAWS) if rng.random() < flaw_fraction else None
        msgs = (flawed_trajectory(rec, flaw, python, rng, system_prompt) if flaw else None)
        if msgs is None:
            flaw, msgs = None, annotated_trajectory(dict(rec), python, system_prompt=system_prompt)
        if msgs is None:
            continue
        a = annotate(rec, msgs)
        out.append({"id": f"{rec.get('id', len(out))}/{flaw or 'expert'}", "question": rec["question"],
                    "record": dict(rec),
                    "trajectory": msgs, "think": a.think, "critique": a.critique, "score": a.score, "text": a.text,
                    "flaw": flaw, "step": a.step, "target": 1.0 if a.correct else 0.0})
    return out


class GSM8KRuleJudge:
    """The annotator used directly as a judge (it needs each item's record with the solution)."""

    def __init__(self):
        self.stats = JudgementStats()

    def judge_many(self, items: Sequence[Any]) -> list[Judgement]:
        requests = [as_request(it, i) for i, it in enumerate(items)]
        if any(r.record is None for r in requests):
            raise ValueError("GSM8KRuleJudge needs each item's record (with meta.solution)")
        out = [parse_judgement(annotate(r.record, r.trajectory).text) for r in requests]
        self.stats.update(out)
        return out
