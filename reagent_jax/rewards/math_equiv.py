"""Mathematical answer equivalence: math-verify when it can run, normalised strings otherwise.

math-verify (``parse`` + ``verify``) guards its sympy work with ``signal.alarm`` timeouts, which
only work on the main thread: elsewhere it raises ValueError. Rewards are often computed from a
thread pool, so:
  * on the main thread we call it with timeouts (``timeout_s``);
  * on any other thread we call it with timeouts disabled, and only for answers of at most
    ``MAX_VERIFY_CHARS`` characters (short inputs keep sympy's worst cases small);
  * any exception or timeout counts as "not shown equal" and we fall back to the string check.
The string check (always tried first, and cheap) compares numbers numerically (so ``025 == 25``,
``2,125 == 2125``, ``0.5 == 1/2``) and otherwise LaTeX-normalised strings.
"""

from __future__ import annotations

import logging
import re
import threading
from fractions import Fraction

MAX_VERIFY_CHARS = 300
_log = logging.getLogger(__name__)

_STRIP = (
    "\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "\\$", "$", "^\\circ", "^{\\circ}", "\\%", "%",
)
_FRAC = re.compile(r"\\[dt]frac")
_SIMPLE_FRAC = re.compile(r"^\\frac\{(-?\d+)\}\{(\d+)\}$")


def normalize_math(answer: str) -> str:
    """LaTeX-light normalisation for string comparison."""
    s = answer.strip()
    for token in _STRIP:
        s = s.replace(token, "")
    s = _FRAC.sub("\\\\frac", s)
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    s = s.replace(" ", "").rstrip(".")
    return s.lower()


def as_number(answer: str) -> Fraction | None:
    """Exact rational value of a plain number (``2,125``, ``025``, ``-0.5``, ``3/4``, ``\\frac{3}{4}``)."""
    s = normalize_math(answer)
    match = _SIMPLE_FRAC.match(s)
    if match:
        s = f"{match.group(1)}/{match.group(2)}"
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if not re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)(/\d+)?", s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def strings_equivalent(prediction: str, ground_truth: str) -> bool:
    """Numeric equality for plain numbers, else equality of normalised strings."""
    a, b = as_number(prediction), as_number(ground_truth)
    if a is not None and b is not None:
        return a == b
    return normalize_math(prediction) == normalize_math(ground_truth)


def math_verify_equal(prediction: str, ground_truth: str, timeout_s: int = 5) -> bool:
    """math-verify's verdict (False on any error/timeout); thread-safe, see module docstring."""
    on_main = threading.current_thread() is threading.main_thread()
    if not on_main and max(len(prediction), len(ground_truth)) > MAX_VERIFY_CHARS:
        return False
    timeout = timeout_s if on_main else None
    try:
        from math_verify import parse, verify
        from math_verify.errors import TimeoutException
    except ImportError:  # pragma: no cover - math-verify is a pinned dependency
        _log.warning("math-verify is not installed; math answers fall back to string comparison")
        return False
    try:
        gold = parse("\\boxed{" + ground_truth + "}", parsing_timeout=timeout)
        pred = parse("\\boxed{" + prediction + "}", parsing_timeout=timeout)
        if not gold or not pred:
            return False
        return bool(verify(gold, pred, timeout_seconds=timeout))
    except (Exception, TimeoutException) as exc:  # TimeoutException is a BaseException
        _log.debug("math-verify failed on %r vs %r: %s", prediction, ground_truth, exc)
        return False


def math_equal(prediction: str, ground_truth: str, timeout_s: int = 5) -> bool:
    """True if ``prediction`` is mathematically equal to ``ground_truth``."""
    if strings_equivalent(prediction, ground_truth):
        return True
    return math_verify_equal(prediction, ground_truth, timeout_s)
