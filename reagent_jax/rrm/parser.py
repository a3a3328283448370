"""Reads an Agent-RRM reply back into (think, critique, score) without ever raising.

Why: a judge's text is sampled, so it can be cut off, repeat blocks, or write "8/10". Training must
keep going and still know what happened, so every reply yields a `Judgement` with a usable score
and a `status` saying what (if anything) was wrong. `JudgementStats` counts statuses for metrics.

Rules (documented here because they decide rewards):
  * Tags match case-insensitively with inner spaces: `<Score>`, `< score >`, `</ SCORE >`.
  * think: the text of `<think>...</think>` blocks (non-empty ones joined); with only `</think>`
    (Qwen3 thinking output, the opening tag was in the prompt), everything before it.
  * critique and score are looked for after the last `</think>` first, then in the whole text.
  * critique: the last complete `<critique>` block (else an unclosed one); empty -> missing_critique.
  * Several complete `<score>` blocks: the LAST one with a number wins (status multiple_scores);
    an unclosed trailing `<score>` counts as the last one.
  * Score forms: "0.8", ".8", "8/10", "8 out of 10", "80%"; the first number form in the block
    counts. Out of [0, 1] -> clamped (status clamped). No number, or nan/inf -> `fallback_score`
    (status bad_score). No score block at all -> `fallback_score` (status missing_score).
  * An unclosed block (`<score>0.7` at the end of a cut-off reply) is read up to the next tag or
    the end (status unclosed_tag).
  * `status` is the most severe issue, in `JudgementStatus` order; `issues` lists all of them.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import math
import re
from typing import Iterable

DEFAULT_FALLBACK_SCORE = 0.0


class JudgementStatus(str, enum.Enum):
    """Most severe first; `Judgement.status` is the first of these that applies."""

    MISSING_SCORE = "missing_score"  # no <score> block: score = fallback
    BAD_SCORE = "bad_score"  # <score> without a finite number: score = fallback
    CLAMPED = "clamped"  # number outside [0, 1]: clamped into it
    UNCLOSED_TAG = "unclosed_tag"  # a block was opened but never closed (cut-off reply)
    MULTIPLE_SCORES = "multiple_scores"  # several complete <score> blocks: the last number wins
    MISSING_CRITIQUE = "missing_critique"  # no (or an empty) <critique> block
    MISSING_THINK = "missing_think"  # no analysis before the verdict
    OK = "ok"


_SEVERITY = {s: i for i, s in enumerate(JudgementStatus)}


@dataclasses.dataclass(frozen=True)
class Judgement:
    think: str
    critique: str
    score: float  # always in [0, 1]
    status: JudgementStatus
    sub_scores: dict[str, float] = dataclasses.field(default_factory=dict)
    confidence: float | None = None
    issues: tuple[JudgementStatus, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status is JudgementStatus.OK


def _tag(name: str, closing: bool = False) -> str:
    return r"<\s*" + (r"/\s*" if closing else "") + name + r"\s*>"


def _complete_blocks(text: str, name: str) -> list[str]:
    return re.findall(_tag(name) + r"(.*?)" + _tag(name, True), text, flags=re.IGNORECASE | re.DOTALL)


_ANY_TAG = r"<\s*/?\s*(?:think|critique|score|scores|confidence)\s*>"


def _unclosed_block(text: str, name: str) -> str | None:
    """Text after the last opening tag that has no closing tag, up to the next known tag."""
    opens = list(re.finditer(_tag(name), text, flags=re.IGNORECASE))
    if not opens:
        return None
    rest = text[opens[-1].end() :]
    if re.search(_tag(name, True), rest, flags=re.IGNORECASE):
        return None
    nxt = re.search(_ANY_TAG, rest, flags=re.IGNORECASE)
    return rest[: nxt.start()] if nxt else rest


_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"


def parse_number(text: str) -> float | None:
    """First "a/b", "a out of b", "a%" or plain number in `text` as a float (None if there is none)."""
    m = re.search(rf"({_NUM})\s*(?:(/|out\s+of)\s*({_NUM})|(%))?", text, flags=re.IGNORECASE)
    if not m:
        return None
    value = float(m.group(1))
    if m.group(2):
        denom = float(m.group(3))
        if denom == 0:
            return None
        value /= denom
    elif m.group(4):
        value /= 100.0
    return value if math.isfinite(value) else None


def _unit(value: float) -> tuple[float, bool]:
    clamped = min(1.0, max(0.0, value))
    return clamped, clamped != value


def _parse_sub_scores(block: str) -> dict[str, float]:
    out = {}
    for key, raw in re.findall(r"([A-Za-z_][\w ]*?)\s*[=:]\s*([^;,\n]+)", block):
        value = parse_number(raw)
        if value is not None:
            out[key.strip().lower().replace(" ", "_")] = _unit(value)[0]
    return out


def parse_judgement(text: str, *, fallback_score: float = DEFAULT_FALLBACK_SCORE) -> Judgement:
    """Parse one RRM reply; never raises (non-string input gives status missing_score)."""
    if not 0.0 <= fallback_score <= 1.0:
        raise ValueError(f"fallback_score must be in [0, 1], got {fallback_score}")
    text = text if isinstance(text, str) else ""
    issues: set[JudgementStatus] = set()

    # think
    thinks = [t.strip() for t in _complete_blocks(text, "think")]
    think = "\n\n".join(t for t in thinks if t)
    close_think = list(re.finditer(_tag("think", True), text, flags=re.IGNORECASE))
    if not thinks and close_think:  # Qwen3: "<think>" was part of the prompt
        think = text[: close_think[0].start()].strip()
    if not thinks and not close_think:
        unclosed = _unclosed_block(text, "think")
        if unclosed is not None:
            think = unclosed.strip()
            issues.add(JudgementStatus.UNCLOSED_TAG)
    if not think:
        issues.add(JudgementStatus.MISSING_THINK)
    after_think = text[close_think[-1].end() :] if close_think else text

    def blocks(name: str) -> tuple[list[str], str | None]:
        for region in (after_think, text):
            found, unclosed = _complete_blocks(region, name), _unclosed_block(region, name)
            if found or unclosed is not None:
                return found, unclosed
        return [], None

    # critique
    critiques, unclosed_critique = blocks("critique")
    critique = critiques[-1].strip() if critiques else (unclosed_critique or "").strip()
    if unclosed_critique is not None:
        issues.add(JudgementStatus.UNCLOSED_TAG)
    if not critique:
        issues.add(JudgementStatus.MISSING_CRITIQUE)

    # score
    scores, unclosed_score = blocks("score")
    score = fallback_score
    if len(scores) > 1:
        issues.add(JudgementStatus.MULTIPLE_SCORES)
    candidates = scores + ([unclosed_score] if unclosed_score is not None else [])
    if unclosed_score is not None:
        issues.add(JudgementStatus.UNCLOSED_TAG)
    if not candidates:
        issues.add(JudgementStatus.MISSING_SCORE)
    else:
        values = [v for v in (parse_number(c) for c in candidates) if v is not None]
        if not values:
            issues.add(JudgementStatus.BAD_SCORE)
        else:
            score, clamped = _unit(values[-1])
            if clamped:
                issues.add(JudgementStatus.CLAMPED)

    # optional extras
    sub_blocks, sub_unclosed = blocks("scores")
    sub_scores = _parse_sub_scores(sub_blocks[-1] if sub_blocks else (sub_unclosed or ""))
    conf_blocks, conf_unclosed = blocks("confidence")
    conf_raw = conf_blocks[-1] if conf_blocks else conf_unclosed
    confidence = parse_number(conf_raw) if conf_raw is not None else None
    confidence = _unit(confidence)[0] if confidence is not None else None

    status = min(issues, key=_SEVERITY.__getitem__) if issues else JudgementStatus.OK
    ordered = tuple(sorted(issues, key=_SEVERITY.__getitem__))
    return Judgement(think, critique, float(score), status, sub_scores, confidence, ordered)


class JudgementStats:
    """Counts of parse statuses (and the mean score) over many judgements, for metrics."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.total = 0
        self.score_sum = 0.0

    def update(self, judgements: Judgement | Iterable[Judgement]) -> "JudgementStats":
        for j in [judgements] if isinstance(judgements, Judgement) else judgements:
            self.counts[j.status.value] += 1
            self.total += 1
            self.score_sum += j.score
        return self

    def fraction(self, status: JudgementStatus | str) -> float:
        key = status.value if isinstance(status, JudgementStatus) else str(status)
        return self.counts[key] / self.total if self.total else 0.0

    def as_dict(self, prefix: str = "rrm/") -> dict[str, float]:
        """{prefix+"count/<status>", prefix+"frac/<status>" for every status, "n", "mean_score"}."""
        out: dict[str, float] = {f"{prefix}n": float(self.total)}
        out[f"{prefix}mean_score"] = self.score_sum / self.total if self.total else 0.0
        for s in JudgementStatus:
            out[f"{prefix}count/{s.value}"] = float(self.counts[s.value])
            out[f"{prefix}frac/{s.value}"] = self.fraction(s)
        return out

    def merge(self, other: "JudgementStats") -> "JudgementStats":
        """Adds another counter's totals (e.g. from another host or worker) into this one."""
        self.counts.update(other.counts)
        self.total += other.total
        self.score_sum += other.score_sum
        return self
