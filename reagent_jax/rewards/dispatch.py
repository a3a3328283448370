"""Rule reward of one response: adaptive dispatch by data source, as in Reagent.

  yes/no gold (yes, no, true, false)  -> word containment, whatever the source
  math sources (gsm8k, math500, aime24, aime25, math, deepscaler, ...) -> math equivalence (0/1)
  qa sources (hotpotqa, 2wiki, musique, bamboogle, nq, triviaqa, popqa, simpleqa, webwalker,
  gaia, hle, xbench, ...; any source whose name contains "qa")   -> EM = 1, else F1 if >= 0.3
  any other source                                            -> EM/F1, then math equivalence
The score is the maximum over the acceptable answers and always lies in [0, 1].

The answer is the last ``\\boxed{}`` (or ``\\fbox{}``) outside thinking (see ``extraction``); a
response without one falls back to its last ``<answer>...</answer>`` outside thinking, then to the
whole response when it is a single short line without thinking (so callers may pass a bare answer).
``compute_reward`` reports whether the format was right and can replace the score by a penalty
when it was not.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from reagent_jax.rewards.extraction import drop_thinking, find_last_boxed, strip_latex_text
from reagent_jax.rewards.math_equiv import math_equal_check
from reagent_jax.rewards.qa import is_yes_no, qa_score, yes_no_score

MATH_SOURCES = frozenset(
    {"gsm8k", "math500", "math", "aime", "aime24", "aime25", "deepscaler", "amc", "amc23", "minerva",
     "olympiadbench", "omnimath", "omni_math", "dapo", "numina"}
)
QA_SOURCES = frozenset(
    {"hotpotqa", "2wiki", "2wikimultihopqa", "musique", "bamboogle", "nq", "triviaqa", "popqa", "simpleqa",
     "webwalker", "webwalkerqa", "gaia", "hle", "xbench", "search"}
)
MAX_BARE_ANSWER_CHARS = 200
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"


@dataclass(frozen=True)
class RewardResult:
    score: float  # the reward to use: ``correctness``, or the format penalty when it applies
    correctness: float  # rule score in [0, 1], as ``score_answer`` returns
    answer: str | None  # the extracted answer (None if none was found)
    method: str  # "math", "em", "f1", "yes_no", "math_fallback", "none" (no answer / no match),
    #              "math_timeout" (scored 0 because math-verify timed out or crashed: not shown wrong)
    source_kind: str  # "math", "qa" or "auto"
    has_boxed: bool  # a \boxed / \fbox answer was found
    malformed: bool  # the last box was unterminated or empty
    format_ok: bool  # the answer came from a well-formed box


def source_kind(data_source: str | None) -> str:
    """"math", "qa" or "auto" for a data-source name (case- and separator-insensitive)."""
    name = (data_source or "").strip().lower()
    if name in MATH_SOURCES:
        return "math"
    if name in QA_SOURCES:
        return "qa"
    parts = set(re.split(r"[^a-z0-9]+", name)) - {""}
    if parts & MATH_SOURCES:
        return "math"
    if parts & QA_SOURCES or "qa" in name:
        return "qa"
    return "auto"


def compute_reward(
    response_text: str,
    ground_truths: str | Sequence[str],
    data_source: str | None = None,
    *,
    format_penalty: float | None = None,
    math_timeout_s: int = 5,
) -> RewardResult:
    """Score a response; with ``format_penalty`` set, a response without a well-formed box scores
    ``format_penalty`` (e.g. -1 or 0) instead of its correctness."""
    golds = _as_ground_truths(ground_truths)
    if not isinstance(response_text, str):
        raise TypeError(f"response_text must be str, got {type(response_text).__name__}")
    boxed = find_last_boxed(response_text)
    answer = boxed.text if boxed.text is not None else _fallback_answer(response_text, boxed.found)
    kind = source_kind(data_source)
    correctness, method = (0.0, "none") if answer is None else _score(answer, golds, kind, math_timeout_s)
    format_ok = boxed.text is not None
    score = correctness if format_penalty is None or format_ok else float(format_penalty)
    return RewardResult(score, correctness, answer, method, kind, boxed.found, boxed.malformed, format_ok)


def score_answer(response_text: str, ground_truths: str | Sequence[str], data_source: str | None = None) -> float:
    """Rule reward in [0, 1] of ``response_text`` against the acceptable answers."""
    return compute_reward(response_text, ground_truths, data_source).correctness


def score_trajectory(traj) -> float:
    """R_rule of one agent episode (an `agent.Trajectory`): its final text against its question's
    answer(s), by the question's data source. Training (GRPO and the Reagent strategies) and
    evaluation score episodes with this one function."""
    q = traj.question
    answers = q["answer"] if isinstance(q["answer"], (list, tuple)) else [q["answer"]]
    return float(score_answer(traj.final_text, list(answers), q.get("data_source")))


def _score(answer: str, golds: list[str], kind: str, timeout_s: int) -> tuple[float, str]:
    best, method, gave_up = 0.0, "none", False
    text_answer = strip_latex_text(answer)
    for gold in golds:
        if is_yes_no(gold):
            value, how = yes_no_score(text_answer, gold), "yes_no"
        elif kind == "math":
            equal, reason = math_equal_check(answer, gold, timeout_s)
            value, how = float(equal), "math"
            gave_up = gave_up or reason in ("timeout", "crashed")
        else:
            value = qa_score(text_answer, [strip_latex_text(gold)])
            how = "em" if value == 1.0 else "f1"
            if kind == "auto" and value < 1.0:
                equal, reason = math_equal_check(answer, gold, timeout_s)
                if equal:
                    value, how = 1.0, "math_fallback"
                gave_up = gave_up or (value == 0.0 and reason in ("timeout", "crashed"))
        if value > best:
            best, method = value, how
        if best == 1.0:
            break
    if best == 0.0 and gave_up:
        method = "math_timeout"
    return min(max(best, 0.0), 1.0), method


def _fallback_answer(response: str, box_found: bool) -> str | None:
    if box_found:
        return None  # a box was attempted but malformed: do not guess
    tagged = _last_answer_tag(drop_thinking(response))  # like a box, a tag drafted while thinking is no answer
    if tagged:
        return tagged
    if "<think>" in response or "</think>" in response:
        return None  # a bare answer has no thinking, and what follows thinking is not bare
    bare = response.strip()
    if bare and "\n" not in bare and len(bare) <= MAX_BARE_ANSWER_CHARS:
        return bare
    return None


def _last_answer_tag(text: str) -> str | None:
    """Stripped content of the last closed ``<answer>`` tag; linear (a lazy regex over many unclosed
    tags is quadratic: minutes for a degenerate 1 MB response)."""
    last_close = text.rfind(_ANSWER_CLOSE)
    start = text.rfind(_ANSWER_OPEN, 0, max(last_close, 0))
    if last_close < 0 or start < 0:
        return None
    start += len(_ANSWER_OPEN)
    return text[start : text.find(_ANSWER_CLOSE, start)].strip() or None


def _as_ground_truths(ground_truths: str | Sequence[str]) -> list[str]:
    if isinstance(ground_truths, (str, int, float)):
        ground_truths = [ground_truths]
    if not isinstance(ground_truths, Sequence) and not hasattr(ground_truths, "__iter__"):
        raise TypeError(f"ground_truths must be a string or a list of strings, got {type(ground_truths).__name__}")
    golds = []
    for i, gold in enumerate(ground_truths):
        if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
            raise TypeError(f"ground_truths[{i}] must be a string (or number), got {type(gold).__name__}: {gold!r}")
        if str(gold).strip():
            golds.append(str(gold).strip())
    if not golds:
        raise ValueError(f"ground_truths has no non-empty answer: {ground_truths!r}")
    return golds
