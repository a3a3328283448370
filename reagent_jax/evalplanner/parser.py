"""Reads EvalPlanner judge outputs and scores them (pairwise and position-consistent accuracy).

Why: chains are sampled, so they may lose a marker, repeat a verdict or end early. Every output
still yields an `Evaluation` (plan, execution, verdict, status) and never raises, so the DPO pair
builder can pick chosen / rejected chains and evaluation can count ties the RewardBench way.

Rules:
  * Markers match case-insensitively with free spacing: "[Start of Evaluation Plan]",
    "[ start of  the evaluation plan ]", "[End of Plan Execution]", "[Final Verdict]".
  * A Qwen3 `<think>...</think>` preamble (or text before a lone `</think>`) is dropped first, and
    so is an unclosed `<think>` with all after it: a draft verdict in thinking never counts.
  * Verdict: taken from the text after the last "[Final Verdict]". If there is no such marker,
    from the whole text. Either way only after the plan section: a verdict in the plan never
    counts. `[[A]]` / `[[ b ]]` count; inside the verdict section a bare `[A]` or a lone capital
    A / B also counts (status malformed).
  * Both A and B found -> verdict None, status both_verdicts. None found -> status no_verdict.
  * A verdict is found but a section is missing or unclosed -> status malformed (verdict kept).

Scoring (RewardBench style): `verdict_score` gives 1 for the correct verdict, 0 for the wrong
one, 0.5 when there is no single verdict. Records for the accuracy helpers are plain dicts:
    {"id": pair id, "swapped": bool (responses in reversed order), "verdict": "A"|"B"|None,
     "correct": "A"|"B"}
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Any, Iterable, Mapping

from reagent_jax.evalplanner.prompts import VERDICTS


class VerdictStatus(str, enum.Enum):
    OK = "ok"
    NO_VERDICT = "no_verdict"
    BOTH_VERDICTS = "both_verdicts"
    MALFORMED = "malformed"  # a single verdict, but a section is missing, unclosed or irregular


@dataclasses.dataclass(frozen=True)
class Evaluation:
    plan: str
    execution: str
    verdict: str | None  # "A", "B" or None
    status: VerdictStatus


def _marker(kind: str, what: str) -> str:
    """"[Start of (the) Evaluation Plan]" etc., with free spacing (matched case-insensitively)."""
    return rf"\[\s*{kind}\s+of\s+(?:the\s+)?" + r"\s+".join(what.split()) + r"\s*\]"


_PLAN_START, _PLAN_END = _marker("start", "evaluation plan"), _marker("end", "evaluation plan")
_EXEC_START, _EXEC_END = _marker("start", "plan execution"), _marker("end", "plan execution")
_FINAL = r"\[\s*final\s+verdict\s*\]"
_DOUBLE = r"\[\[\s*([AaBb])\s*\]\]"
_FLAGS = re.IGNORECASE | re.DOTALL


def strip_thinking(text: str) -> str:
    """Drops Qwen3 thinking: a `<think>...</think>` preamble (or everything before a lone `</think>`),
    and a `<think>` that never closes (a reply cut off while thinking) with all after it."""
    closes = list(re.finditer(r"</think>", text, flags=re.IGNORECASE))
    text = text[closes[-1].end() :] if closes else text
    unclosed = re.search(r"<think>", text, flags=re.IGNORECASE)
    return text[: unclosed.start()] if unclosed else text


def _section(text: str, start: str, ends: list[str]) -> tuple[str, bool, bool, int]:
    """(content, found start marker, found its own end marker, where the section ends in `text`).
    Unclosed: runs to the next marker (or the end)."""
    m = re.search(start, text, flags=_FLAGS)
    if not m:
        return "", False, False, 0
    rest = text[m.end() :]
    own = re.search(ends[0], rest, flags=_FLAGS)
    if own:
        return rest[: own.start()].strip(), True, True, m.end() + own.end()
    stops = [s.start() for s in (re.search(e, rest, flags=_FLAGS) for e in ends[1:]) if s]
    end = min(stops) if stops else len(rest)
    return rest[:end].strip(), True, False, m.end() + end


def _letters(text: str) -> tuple[set[str], bool]:
    """Verdict letters in `text` and whether only a lenient form (not [[X]]) was used."""
    found = {x.upper() for x in re.findall(_DOUBLE, text)}
    if found:
        return found, False
    lenient = {x.upper() for x in re.findall(r"\[\s*([AaBb])\s*\]", text)} or set(re.findall(r"\b([AB])\b", text))
    return lenient, bool(lenient)


def parse_evaluation(text: str, *, expect_plan: bool = True, expect_execution: bool = True) -> Evaluation:
    """Parse a judge output. expect_plan=False for execution-stage outputs (no plan section);
    expect_execution=False as well for verdict-only outputs (the ablation without reasoning)."""
    text = strip_thinking(text if isinstance(text, str) else "")
    plan, has_plan, plan_closed, plan_end = _section(text, _PLAN_START, [_PLAN_END, _EXEC_START, _FINAL])
    execution, has_exec, exec_closed, _ = _section(text, _EXEC_START, [_EXEC_END, _FINAL])
    tail = text[plan_end:]  # a verdict written inside the plan section never counts
    finals = list(re.finditer(_FINAL, tail, flags=_FLAGS))
    if finals:
        letters, lenient = _letters(tail[finals[-1].end() :])
    else:
        letters, lenient = {x.upper() for x in re.findall(_DOUBLE, tail)}, True
    if not letters:
        return Evaluation(plan, execution, None, VerdictStatus.NO_VERDICT)
    if len(letters) > 1:
        return Evaluation(plan, execution, None, VerdictStatus.BOTH_VERDICTS)
    verdict = letters.pop()
    complete = ((not expect_execution or (has_exec and exec_closed))
                and (not expect_plan or (has_plan and plan_closed)))
    status = VerdictStatus.OK if complete and not lenient else VerdictStatus.MALFORMED
    return Evaluation(plan, execution, verdict, status)


def parse_plan(text: str) -> str:
    """Plan-stage output -> plan text (markers, if the model wrote them, are removed)."""
    text = strip_thinking(text if isinstance(text, str) else "")
    plan, found, _, _ = _section(text, _PLAN_START, [_PLAN_END, _EXEC_START, _FINAL])
    return plan if found else text.strip()


def _verdict_of(parsed: Evaluation | Mapping[str, Any] | str | None) -> str | None:
    if isinstance(parsed, Evaluation):
        return parsed.verdict
    if isinstance(parsed, Mapping):
        return parsed.get("verdict")
    return parsed


def verdict_score(parsed: Evaluation | Mapping[str, Any] | str | None, correct: str) -> float:
    """1.0 right, 0.0 wrong, 0.5 for no single verdict (none, or both)."""
    if correct not in VERDICTS:
        raise ValueError(f"correct must be 'A' or 'B', got {correct!r}")
    verdict = _verdict_of(parsed)
    if verdict not in VERDICTS:
        return 0.5
    return 1.0 if verdict == correct else 0.0


def _records(results: Iterable[Mapping[str, Any]], keys: tuple[str, ...]) -> list[Mapping[str, Any]]:
    rows = list(results)
    for i, r in enumerate(rows):
        missing = [k for k in keys if k not in r]
        if missing:
            raise ValueError(f"result record {i} lacks {missing}: {dict(r)!r:.200}")
    return rows


def pairwise_accuracy(results: Iterable[Mapping[str, Any]]) -> float:
    """Mean `verdict_score` over records {"verdict", "correct"} (ties count 0.5)."""
    rows = _records(results, ("verdict", "correct"))
    if not rows:
        raise ValueError("pairwise_accuracy needs at least one result record")
    return sum(verdict_score(r, r["correct"]) for r in rows) / len(rows)


def position_consistent_accuracy(results: Iterable[Mapping[str, Any]]) -> float:
    """Fraction of pairs judged right in BOTH orders (ties and missing verdicts count as wrong).

    Needs exactly one record with swapped=False and one with swapped=True per "id".
    """
    rows = _records(results, ("id", "swapped", "verdict", "correct"))
    pairs: dict[Any, dict[bool, Mapping[str, Any]]] = {}
    for r in rows:
        orders = pairs.setdefault(r["id"], {})
        if bool(r["swapped"]) in orders:
            raise ValueError(f"pair {r['id']!r} has two records with swapped={bool(r['swapped'])}")
        orders[bool(r["swapped"])] = r
    if not pairs:
        raise ValueError("position_consistent_accuracy needs at least one pair of records")
    incomplete = [pid for pid, o in pairs.items() if len(o) != 2]
    if incomplete:
        raise ValueError(f"pairs without both orders (need swapped=False and swapped=True): {incomplete[:5]}")
    right = sum(all(verdict_score(r, r["correct"]) == 1.0 for r in o.values()) for o in pairs.values())
    return right / len(pairs)
