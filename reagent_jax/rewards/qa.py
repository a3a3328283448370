"""Short-answer QA scoring: SQuAD-normalised exact match, token F1, and yes/no containment.

Normalisation is SQuAD's (lower-case, drop punctuation, drop the articles a/an/the, collapse
whitespace), extended so that non-English answers work: Unicode punctuation (and the U+2212 minus
sign, like the ASCII ``-``) is dropped as well as ASCII, and CJK characters are separate tokens
(whitespace tokenisation would make a Chinese answer one token and F1 all-or-nothing, e.g. for
xbench).

The rule reward of Reagent: exact match scores 1; otherwise the token F1 when F1 >= 0.3; else 0;
maximum over the acceptable answers. As in HotpotQA's official F1, a yes/no/noanswer prediction or
gold that is not an exact match scores 0.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence

F1_THRESHOLD = 0.3
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_CJK}]|[^\s{_CJK}]+")
_ASCII_PUNCT = frozenset(string.punctuation)
_YES_NO = {"yes": "no", "no": "yes", "true": "false", "false": "true"}


def normalize_answer(text: str) -> str:
    """SQuAD normalisation (see module docstring)."""
    text = text.lower()
    text = "".join(c for c in text if not _is_punct(c))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def answer_tokens(text: str) -> list[str]:
    """Tokens of the normalised answer; each CJK character is one token."""
    return _TOKEN.findall(normalize_answer(text))


def exact_match(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def token_f1(prediction: str, ground_truth: str) -> float:
    """Bag-of-tokens F1 between normalised answers."""
    pred, gold = normalize_answer(prediction), normalize_answer(ground_truth)
    if pred != gold and (pred in ("yes", "no", "noanswer") or gold in ("yes", "no", "noanswer")):
        return 0.0
    pred_tokens, gold_tokens = _TOKEN.findall(pred), _TOKEN.findall(gold)
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def em_f1_score(prediction: str, ground_truth: str, threshold: float = F1_THRESHOLD) -> float:
    """1 on exact match, else F1 if F1 >= threshold, else 0."""
    if exact_match(prediction, ground_truth):
        return 1.0
    f1 = token_f1(prediction, ground_truth)
    return f1 if f1 >= threshold else 0.0


def qa_score(prediction: str, ground_truths: Sequence[str], threshold: float = F1_THRESHOLD) -> float:
    """Best ``em_f1_score`` over the acceptable answers."""
    return max((em_f1_score(prediction, gt, threshold) for gt in ground_truths), default=0.0)


def is_yes_no(ground_truth: str) -> bool:
    return normalize_answer(ground_truth) in _YES_NO


def yes_no_score(prediction: str, ground_truth: str) -> float:
    """1 if the prediction's words contain the yes/no (true/false) answer and not its opposite.

    Reagent checks plain substring containment; whole-word matching avoids crediting "no" inside
    "not known" or "cannot", and a hedge that says both gets 0.
    """
    gold = normalize_answer(ground_truth)
    if gold not in _YES_NO:
        raise ValueError(f"yes_no_score needs a yes/no/true/false ground truth, got {ground_truth!r}")
    words = set(answer_tokens(prediction))
    return float(gold in words and _YES_NO[gold] not in words)


def _is_punct(char: str) -> bool:
    # U+2212 MINUS SIGN is a math symbol (Sm) but stands for the ASCII hyphen-minus, which is dropped
    return char in _ASCII_PUNCT or char == "\u2212" or unicodedata.category(char).startswith("P")
