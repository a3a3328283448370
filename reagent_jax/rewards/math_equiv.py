r"""Mathematical answer equivalence: normalised strings first, math-verify for the rest.

The string check (always tried first, and cheap) compares numbers numerically (so ``025 == 25``,
``2,125 == 2125``, ``0.5 == 1/2``, ``1e3 == 1000``, a U+2212 minus sign as ``-``) and otherwise LaTeX-normalised
strings. It drops ``%`` and ``^\circ``, so ``50\% == 50``.

math-verify (sympy) is run in helper processes (``_verify_worker.py``), one per concurrent caller,
never in the caller: sympy can hold the GIL for minutes or exhaust memory on a few characters
(``9^{9^{9}}``), and its ``signal.alarm`` timeouts only work on a main thread. The worker applies
math-verify's own timeouts (``timeout_s`` for each of the two parses and the comparison); the host
kills it at a hard deadline after that, so a comparison never takes much more than
``3 * timeout_s`` s, on any thread. Answers longer than ``MAX_VERIFY_CHARS`` are not sent. Any
error, crash or timeout counts as "not shown equal"; ``math_verify_check`` says which.
math-verify itself is lenient in ways a strict grader may not be: ``50\%`` equals ``0.5``,
``x = 3`` equals ``3``, ``0.3333333`` equals ``1/3`` (it rounds to 6 decimals), ``2, 3`` equals ``3, 2``.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import selectors
import subprocess
import sys
import threading
import time
from fractions import Fraction

MAX_VERIFY_CHARS = 1000
STARTUP_TIMEOUT_S = 60.0
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_verify_worker.py")
_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\ufe63": "-", "\uff0d": "-"})  # minus signs as ASCII
_log = logging.getLogger(__name__)

_STRIP = (
    "\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "\\$", "$", "^\\circ", "^{\\circ}", "\\%", "%",
)
_FRAC = re.compile(r"\\[dt]frac")
_SIMPLE_FRAC = re.compile(r"^\\frac\{(-?\d+)\}\{(\d+)\}$")


def normalize_math(answer: str) -> str:
    """LaTeX-light normalisation for string comparison."""
    s = answer.strip().translate(_MINUS_SIGNS)
    for token in _STRIP:
        s = s.replace(token, "")
    s = _FRAC.sub("\\\\frac", s)
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    s = s.replace(" ", "").rstrip(".")
    return s.lower()


def as_number(answer: str) -> Fraction | None:
    """Exact rational value of a plain number (``2,125``, ``025``, ``-0.5``, ``3/4``, ``\\frac{3}{4}``, ``1.5e-3``;
    exponents of at most 4 digits, so ``1e99999999`` is not materialised)."""
    s = normalize_math(answer)
    match = _SIMPLE_FRAC.match(s)
    if match:
        s = f"{match.group(1)}/{match.group(2)}"
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if not re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)((/\d+)|(e[-+]?\d{1,4}))?", s):
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


def _hard_deadline_s(timeout_s: int) -> float:
    """When the host gives up on a worker: its own timeouts (two parses, one comparison) and a margin."""
    return 3 * timeout_s + 2.0


class _Worker:
    """One math-verify helper process; used by one thread at a time."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, close_fds=True)
        self.buffer = b""
        if self.read(time.monotonic() + STARTUP_TIMEOUT_S) != b'{"ready": true}':
            self.close()
            raise RuntimeError("the math-verify worker did not start")

    def read(self, deadline: float) -> bytes | None:
        """The next reply line, or None at the deadline or when the worker died."""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    return None
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    return None
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def ask(self, prediction: str, ground_truth: str, timeout_s: int) -> tuple[bool, str]:
        request = {"pred": prediction, "gold": ground_truth, "timeout": timeout_s}
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            self.close()
            return False, "crashed"
        reply = self.read(time.monotonic() + _hard_deadline_s(timeout_s))
        if reply is None:
            timed_out = self.proc.poll() is None
            self.close()
            return False, "timeout" if timed_out else "crashed"
        try:
            verdict = json.loads(reply)
            return bool(verdict["equal"]), str(verdict["reason"])
        except (ValueError, KeyError, TypeError):
            self.close()  # something else wrote to its stdout: the stream cannot be trusted any more
            return False, "error: bad reply from the math-verify worker"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


_idle: list[_Worker] = []
_idle_lock = threading.Lock()
_RETRY_START_S = 60.0  # after a worker failed to start, strings only for this long (no spawn per call)
_start_failed_at = -_RETRY_START_S


def _forget_workers_after_fork() -> None:
    """A forked child must not share its parent's workers (their pipes would interleave)."""
    global _idle_lock
    _idle_lock = threading.Lock()
    _idle.clear()


os.register_at_fork(after_in_child=_forget_workers_after_fork)


@atexit.register
def _close_workers() -> None:
    with _idle_lock:
        while _idle:
            _idle.pop().close()


def math_verify_check(prediction: str, ground_truth: str, timeout_s: int = 5) -> tuple[bool, str]:
    """math-verify's verdict and why: "equal", "not_equal", "unparsed", "timeout", "too_long",
    "crashed" or "error: ..."; bounded in time on any thread (see module docstring)."""
    if max(len(prediction), len(ground_truth)) > MAX_VERIFY_CHARS:
        return False, "too_long"
    worker = None
    with _idle_lock:
        while _idle and worker is None:
            worker = _idle.pop()
            if not worker.alive():  # died while idle (e.g. the OOM killer): never hand it a request
                worker.close()
                worker = None
    if worker is None:
        global _start_failed_at
        if time.monotonic() - _start_failed_at < _RETRY_START_S:
            return False, "error: math-verify unavailable"
        try:
            worker = _Worker()
        except Exception as exc:  # noqa: BLE001 - no interpreter, no math-verify, no process: strings only
            _start_failed_at = time.monotonic()
            _log.warning("math-verify unavailable (%s); math answers fall back to string comparison for %g s",
                         exc, _RETRY_START_S)
            return False, f"error: {exc}"
    verdict = worker.ask(prediction, ground_truth, max(1, int(timeout_s)))
    if worker.alive():
        with _idle_lock:
            _idle.append(worker)
    else:
        _log.debug("math-verify worker stopped (%s) on %r vs %r", verdict[1], prediction[:80], ground_truth[:80])
    return verdict


def math_verify_equal(prediction: str, ground_truth: str, timeout_s: int = 5) -> bool:
    """math-verify's verdict (False on any error/timeout); thread-safe, see module docstring."""
    return math_verify_check(prediction, ground_truth, timeout_s)[0]


def math_equal(prediction: str, ground_truth: str, timeout_s: int = 5) -> bool:
    """True if ``prediction`` is mathematically equal to ``ground_truth``."""
    return math_equal_check(prediction, ground_truth, timeout_s)[0]


def math_equal_check(prediction: str, ground_truth: str, timeout_s: int = 5) -> tuple[bool, str]:
    """``math_equal`` with the reason of ``math_verify_check`` ("equal" when the strings agree)."""
    if strings_equivalent(prediction, ground_truth):
        return True, "equal"
    return math_verify_check(prediction, ground_truth, timeout_s)
