"""LLM-as-judge answer grading for evaluation, with a rule-based fallback.

Why: exact match and F1 under-count correct answers on open benchmarks (GAIA, WebWalkerQA,
xbench, HLE): "Barack Obama" vs "Obama", "1,000 m" vs "1 km". A grader model compares the
response's final answer with the references; when its request fails or its reply cannot be read,
the rule reward decides (`rewards.compute_reward(...).correctness >= 1`), and `Grade.method` says
which one did, so reports can show how many grades came from the fallback.

Judge reply format (asked for by GRADER_SYSTEM_PROMPT, read by `parse_grade`):
    <reasoning>short comparison of the final answer with the references</reasoning>
    <extracted_answer>the response's final answer as written, or NONE</extracted_answer>
    <correct>yes</correct>            (or no)

Parsing rules: tags match case-insensitively; a leading <think> block of the grader is skipped;
the last complete <correct> block counts (yes/true/correct -> True, no/false/incorrect -> False);
without tags a line "correct: yes|no" is accepted (status loose_format); an unreadable label gives
status bad_label, none at all missing_label, contradictory <correct> blocks conflicting_labels.

The response shown to the grader drops the model's <think> block (only the final answer is
graded) and is cut in the middle when longer than `max_response_chars`.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any, Mapping, Sequence

from reagent_jax.endpoints import ChatClient, Completion, EndpointConfig, EndpointError
from reagent_jax.rewards import compute_reward
from reagent_jax.rrm.prompt import truncate_middle

GRADER_SYSTEM_PROMPT = """\
You check answers to questions. You receive a question, one or more reference answers (each of \
them is acceptable) and a model's response. Decide whether the final answer of the response means \
the same as at least one reference answer.

How to decide:
- Grade only the final answer (usually inside \\boxed{...}, otherwise the conclusion the response \
ends with). The quality or length of the reasoning does not matter.
- Count as the same: other wording, letter case, articles, a name with or without titles or \
initials, units written out or abbreviated, equal numbers written differently (0.5 and 1/2; \
1,000 and 1000), a more precise value that rounds to the reference.
- Count as wrong: a different entity or value; an answer that is vaguer than the reference or \
covers only part of it; several different final answers or a hedge between options; no final \
answer at all.
- Do not solve the question yourself and do not overrule the references with your own knowledge.

Reply with exactly these three blocks and nothing else:
<reasoning>one or two sentences comparing the final answer with the references</reasoning>
<extracted_answer>the final answer exactly as the response gives it, or NONE</extracted_answer>
<correct>yes or no</correct>"""

DEFAULT_MAX_RESPONSE_CHARS = 6000
_YES = {"yes", "y", "true", "correct", "right"}
_NO = {"no", "n", "false", "incorrect", "wrong"}
_FLAGS = re.IGNORECASE | re.DOTALL


def _tag(name: str, closing: bool = False) -> str:
    return r"<\s*" + (r"/\s*" if closing else "") + name + r"\s*>"


def _without_think(text: str) -> str:
    """Text after the last </think> (Qwen3-style thinking), or the whole text."""
    closes = list(re.finditer(_tag("think", True), text, flags=re.IGNORECASE))
    return text[closes[-1].end():] if closes else text


def _block(text: str, name: str) -> list[str]:
    found = re.findall(_tag(name) + r"(.*?)" + _tag(name, True), text, flags=_FLAGS)
    if not found:  # an unclosed block at the end of a cut-off reply
        m = list(re.finditer(_tag(name) + r"(.*)$", text, flags=_FLAGS))
        found = [re.split(r"<\s*/?\s*\w+\s*>", m[-1].group(1))[0]] if m else []
    return [f.strip() for f in found]


def _label(raw: str) -> bool | None:
    """yes -> True, no -> False; None when both or neither polarity appears ("yes or no")."""
    words = re.findall(r"[a-z]+", re.sub(r"\bnot\s+(?:correct|right)\b", "incorrect", raw.lower()))
    positive, negative = any(w in _YES for w in words), any(w in _NO for w in words)
    return None if positive == negative else positive


@dataclasses.dataclass(frozen=True)
class ParsedGrade:
    correct: bool | None
    extracted: str | None
    reasoning: str
    status: str  # ok | loose_format | missing_label | bad_label | conflicting_labels


def parse_grade(text: Any) -> ParsedGrade:
    """Reads a grader reply (see the module docstring for the rules); never raises."""
    text = _without_think(text if isinstance(text, str) else "")
    reasoning = "\n".join(_block(text, "reasoning"))
    extracted_blocks = _block(text, "extracted_answer")
    extracted = extracted_blocks[-1] if extracted_blocks else None
    if extracted is not None and extracted.strip().upper() in ("", "NONE", "N/A"):
        extracted = None
    labels = _block(text, "correct")
    if labels:
        values = [_label(raw) for raw in labels]
        known = {v for v in values if v is not None}
        if len(known) > 1:
            return ParsedGrade(None, extracted, reasoning, "conflicting_labels")
        value = values[-1]
        return ParsedGrade(value, extracted, reasoning, "ok" if value is not None else "bad_label")
    loose = re.findall(r"^\W*correct\W*\s*[:=]\s*\**\s*(\w+)", text, flags=re.IGNORECASE | re.MULTILINE)
    if loose and _label(loose[-1]) is not None:
        return ParsedGrade(_label(loose[-1]), extracted, reasoning or text.strip()[:500], "loose_format")
    return ParsedGrade(None, extracted, reasoning, "missing_label")


@dataclasses.dataclass(frozen=True)
class GradeItem:
    question: str
    answers: Sequence[str]
    response: str
    data_source: str | None = None


@dataclasses.dataclass(frozen=True)
class Grade:
    correct: bool | None  # None: neither the grader nor the fallback could decide
    extracted: str | None
    reasoning: str
    status: str  # the grader's parse status, or "endpoint_error"
    method: str  # "llm", "rule_fallback" or "none"
    judge_text: str = ""  # the grader's raw reply ("" when the request failed)


def as_grade_item(item: GradeItem | Mapping[str, Any], index: int = 0) -> GradeItem:
    """A GradeItem from itself or a dict with question, answers (or answer / ground_truths),
    response and data_source; ValueError naming the item when something is missing."""
    if isinstance(item, Mapping):
        answers = next((item[k] for k in ("answers", "ground_truths", "answer", "golden_answers") if k in item), None)
        item = GradeItem(item.get("question"), answers, item.get("response"), item.get("data_source"))
    if not isinstance(item, GradeItem):
        raise ValueError(f"grade item {index}: expected GradeItem or dict, got {type(item).__name__}")
    answers = [item.answers] if isinstance(item.answers, (str, int, float)) else item.answers
    if not isinstance(answers, Sequence) or not any(str(a).strip() for a in answers):
        raise ValueError(f"grade item {index}: no reference answer given ({item.answers!r:.100})")
    if not isinstance(item.question, str) or not item.question.strip():
        raise ValueError(f"grade item {index}: question must be a non-empty string")
    if not isinstance(item.response, str):
        raise ValueError(f"grade item {index}: response must be a string, got {type(item.response).__name__}")
    return dataclasses.replace(item, answers=tuple(str(a).strip() for a in answers if str(a).strip()))


def grader_messages(item: GradeItem, max_response_chars: int = DEFAULT_MAX_RESPONSE_CHARS) -> list[dict[str, str]]:
    """[system, user] messages asking the grader about one response."""
    response = _without_think(item.response).strip() or "(empty response)"
    refs = "\n".join(f"- {a}" for a in item.answers)
    user = (f"Question:\n{item.question.strip()}\n\nReference answers (any one is correct):\n{refs}\n\n"
            f"Response:\n{truncate_middle(response, max_response_chars)}\n\n"
            "Grade the final answer of the response.")
    return [{"role": "system", "content": GRADER_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def rule_grade(item: GradeItem, status: str, judge_text: str = "") -> Grade:
    """The rule reward's verdict (EM / F1 >= threshold counts only when it reaches 1.0)."""
    result = compute_reward(item.response, list(item.answers), item.data_source)
    return Grade(result.correctness >= 1.0, result.answer, f"rule-based ({result.method})", status,
                 "rule_fallback", judge_text)


class LLMAnswerJudge:
    """Grades final answers with a grader model; `fallback="rule"` (default) or "none"."""

    def __init__(self, config: EndpointConfig, *, fallback: str = "rule",
                 max_response_chars: int = DEFAULT_MAX_RESPONSE_CHARS, client: ChatClient | None = None) -> None:
        if fallback not in ("rule", "none"):
            raise ValueError(f"fallback must be 'rule' or 'none', got {fallback!r}")
        self.config = config
        self.fallback = fallback
        self.max_response_chars = max_response_chars
        self._owns_client = client is None
        self.client = client if client is not None else ChatClient(config)

    def _grade(self, item: GradeItem, result: Completion | EndpointError) -> Grade:
        if isinstance(result, EndpointError):
            status, text, parsed = "endpoint_error", "", None
        else:
            text = result.text
            parsed = parse_grade(text)
            if parsed.correct is not None:
                return Grade(parsed.correct, parsed.extracted, parsed.reasoning, parsed.status, "llm", text)
            status = parsed.status
        if self.fallback == "rule":
            return rule_grade(item, status, text)
        reasoning = str(result) if isinstance(result, EndpointError) else parsed.reasoning
        return Grade(None, parsed.extracted if parsed else None, reasoning, status, "none", text)

    def grade_many(self, items: Sequence[GradeItem | Mapping[str, Any]], *, progress: str | None = None
                   ) -> list[Grade]:
        """One Grade per item, in order; never raises for a failed request (bad items raise first)."""
        checked = [as_grade_item(item, i) for i, item in enumerate(items)]
        prompts = [grader_messages(item, self.max_response_chars) for item in checked]
        results = self.client.complete_many(prompts, progress=progress)
        return [self._grade(item, result) for item, result in zip(checked, results)]

    def grade(self, question: str, answers: Sequence[str] | str, response: str,
              data_source: str | None = None) -> Grade:
        return self.grade_many([GradeItem(question, answers, response, data_source)])[0]

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> "LLMAnswerJudge":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def grade_summary(grades: Sequence[Grade], prefix: str = "judge/") -> dict[str, float]:
    """Accuracy (undecided counts as wrong), and counts by method and status, for reports."""
    n = len(grades)
    out = {f"{prefix}n": float(n), f"{prefix}accuracy": sum(g.correct is True for g in grades) / n if n else 0.0}
    for key, counts in (("method", collections.Counter(g.method for g in grades)),
                        ("status", collections.Counter(g.status for g in grades))):
        for name, count in sorted(counts.items()):
            out[f"{prefix}{key}/{name}"] = float(count)
    return out
