"""Reads an Agent-RRM reply back into (think, critique, score) without ever raising.

Why: a judge's text is sampled, so it can be cut off, repeat blocks, or write "8/10". Training must
keep going and still know what happened, so every reply yields a `Judgement` with a usable score
and a `status` saying what (if anything) was wrong. `JudgementStats` counts statuses for metrics.

Rules (documented here because they decide rewards):
  * Tags match case-insensitively with inner spaces: `<Score>`, `< score >`, `</ SCORE >`.
  * think: the text of `<think>...</think>` blocks (non-empty ones joined); with only `</think>`
    (Qwen3 thinking output, the opening tag was in the prompt), everything before it.
  * critique and score are looked for after the last `</think>` first, then in the text outside
    the think blocks: a verdict written inside a closed `<think>` never counts. (An unclosed
    `<think>` ends at the next tag, so a cut-off reply's blocks after it are read, status
    unclosed_tag.)
  * critique: the last complete `<critique>` block (else an unclosed one); empty -> missing_critique.
  * Several complete `<score>` blocks: the LAST one with a number wins (status multiple_scores);
    an unclosed trailing `<score>` counts as the last one.
  * Score forms: "0.8", ".8", "8/10", "8 out of 10", "80%"; the first number form in the block
    counts. A comma between digits is a decimal comma ("0,8" = 0.8, "8,5/10" = 0.85; read as
    "0" it would flip the verdict), so a thousands separator reads as a decimal ("1,000" = 1.0,
    the same score after clamping). Out of [0, 1] -> clamped (status clamped). No number, or
    nan/inf -> `fallback_score` (status bad_score). No score block at all -> `fallback_score`
    (status missing_score). Numbers may carry an exponent ("5e-1") or a unicode minus.
  * An unclosed block (`<score>0.7` at the end of a cut-off reply) is read up to the next tag or
    the end (status unclosed_tag).
  * Parsing is linear in the reply's length (tags are paired in one pass, no backtracking regex).
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


_TAG_NAMES = ("think", "critique", "score", "scores", "confidence")
# One optional "/" between two runs of spaces would backtrack quadratically on "<" + many spaces.
_TAG_RE = re.compile(r"<\s*(?:(/)\s*)?(think|critique|scores|score|confidence)\s*>", re.IGNORECASE)


@dataclasses.dataclass
class _Blocks:
    """Where one tag's blocks are: complete (open_start, content_start, content_end, close_end)
    spans, the trailing unclosed block's (content_start, content_end), and every closing tag."""

    complete: list[tuple[int, int, int, int]]
    unclosed: tuple[int, int] | None
    closes: list[tuple[int, int]]


def _scan(text: str) -> dict[str, _Blocks]:
    """Blocks of every known tag in one pass over the tags, so parsing stays linear in the text.

    Complete blocks are what `re.findall("<x>(.*?)</x>")` gives (an opening tag pairs with the
    first closing tag after it); the unclosed block is the text after the last opening tag with no
    closing tag after it, up to the next known tag (or the end)."""
    tags = [(m.start(), m.end(), m.group(2).lower(), bool(m.group(1))) for m in _TAG_RE.finditer(text)]
    out = {}
    for name in _TAG_NAMES:
        opens = [k for k, t in enumerate(tags) if t[2] == name and not t[3]]
        closes = [(t[0], t[1]) for t in tags if t[2] == name and t[3]]
        complete, j, pos = [], 0, 0
        for k in opens:
            start, end = tags[k][0], tags[k][1]
            if start < pos:
                continue
            while j < len(closes) and closes[j][0] < end:
                j += 1
            if j == len(closes):
                break
            complete.append((start, end, closes[j][0], closes[j][1]))
            pos = closes[j][1]
            j += 1
        unclosed = None
        if opens and not (closes and closes[-1][0] >= tags[opens[-1]][1]):
            k = opens[-1]
            unclosed = (tags[k][1], tags[k + 1][0] if k + 1 < len(tags) else len(text))
        out[name] = _Blocks(complete, unclosed, closes)
    return out


_NUM = r"[-+\u2212]?(?:\d+(?:\.\d*|,\d+)?|\.\d+)(?:[eE][-+\u2212]?\d+)?"


def _float(raw: str) -> float:
    return float(raw.replace("\u2212", "-").replace(",", "."))


def parse_number(text: str) -> float | None:
    """First "a/b", "a out of b", "a%" or plain number in `text` as a float (None if there is none).

    Plain numbers may use an exponent ("5e-1"), a unicode minus ("\u22120.5") and a decimal comma
    ("0,8")."""
    m = re.search(rf"({_NUM})\s*(?:(/|out\s+of)\s*({_NUM})|(%))?", text, flags=re.IGNORECASE)
    if not m:
        return None
    value = _float(m.group(1))
    if m.group(2):
        denom = _float(m.group(3))
        if denom == 0:
            return None
        value /= denom
    elif m.group(4):
        value /= 100.0
    return value if math.isfinite(value) else None


def _unit(value: float) -> tuple[float, bool]:
    clamped = min(1.0, max(0.0, value))
    return clamped, clamped != value


_ITEM_END = re.compile(r"[;,\n]")


def _is_name_char(ch: str) -> bool:
    return ch.isalnum() or ch in "_ "


def _parse_sub_scores(block: str) -> dict[str, float]:
    r""""name = value" items (value up to ";", "," or a newline) in one linear scan, exactly as the
    regex `([A-Za-z_][\w ]*?)\s*[=:]\s*([^;,\n]+)` finds them; the regex itself backtracks
    quadratically over a long run of words without a separator."""
    out, pos = {}, 0
    for sep in re.finditer(r"[=:]", block):
        if sep.start() < pos:  # inside the previous item's value
            continue
        end = sep.start()
        while end > pos and block[end - 1].isspace():
            end -= 1
        start = end
        while start > pos and _is_name_char(block[start - 1]):
            start -= 1
        first = re.search(r"[A-Za-z_]", block[start:end])
        if first is None:
            continue
        k = sep.end()
        while k < len(block) and block[k].isspace():
            k += 1
        stop = _ITEM_END.search(block, k)
        value_end = stop.start() if stop else len(block)
        if k == value_end:
            continue
        pos = value_end
        value = parse_number(block[k:value_end])
        if value is not None:
            out[block[start + first.start() : end].strip().lower().replace(" ", "_")] = _unit(value)[0]
    return out


def _outside_think(text: str, think: _Blocks) -> str:
    """The text with every think block (or, Qwen3-style, all before a lone `</think>`) removed."""
    if not think.complete:
        return text[think.closes[0][1] :] if think.closes else text
    pieces, pos = [], 0
    for start, _, _, end in think.complete:
        pieces.append(text[pos:start])
        pos = end
    return "\n".join(pieces + [text[pos:]])


def parse_judgement(text: str, *, fallback_score: float = DEFAULT_FALLBACK_SCORE) -> Judgement:
    """Parse one RRM reply; never raises (non-string input gives status missing_score)."""
    if not 0.0 <= fallback_score <= 1.0:
        raise ValueError(f"fallback_score must be in [0, 1], got {fallback_score}")
    text = text if isinstance(text, str) else ""
    issues: set[JudgementStatus] = set()

    # think
    think_blocks = _scan(text)["think"]
    think = "\n\n".join(t for t in (text[s:e].strip() for _, s, e, _ in think_blocks.complete) if t)
    close_think = think_blocks.closes
    if not think_blocks.complete and close_think:  # Qwen3: "<think>" was part of the prompt
        think = text[: close_think[0][0]].strip()
    if not think_blocks.complete and not close_think and think_blocks.unclosed is not None:
        think = text[slice(*think_blocks.unclosed)].strip()
        issues.add(JudgementStatus.UNCLOSED_TAG)
    if not think:
        issues.add(JudgementStatus.MISSING_THINK)
    # The verdict comes after the last </think>, else from outside the think blocks; never from inside.
    region_texts = [text[close_think[-1][1] :], _outside_think(text, think_blocks)] if close_think else [text]
    regions = [(t, _scan(t)) for t in region_texts]

    def blocks(name: str) -> tuple[list[str], str | None]:
        for region_text, region in regions:
            b = region[name]
            if b.complete or b.unclosed is not None:
                unclosed = region_text[slice(*b.unclosed)] if b.unclosed is not None else None
                return [region_text[s:e] for _, s, e, _ in b.complete], unclosed
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
