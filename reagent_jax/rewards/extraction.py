"""Find the final answer in a response: the content of the last ``\\boxed{...}`` or ``\\fbox{...}``.

Braces nest (``\\boxed{\\frac{1}{2}}``) and escaped braces ``\\{ \\}`` do not count. The
brace-less form ``\\boxed 5`` (seen in MATH solutions) is read up to the next ``$`` or line end.
Thinking is ignored, so a box drafted while thinking never counts as the answer: complete
``<think>...</think>`` blocks, everything before a ``</think>`` whose ``<think>`` was in the prompt,
and everything after a ``<think>`` that never closes (a response cut off while thinking).
Scanning is linear in the response length (degenerate, repetitive outputs included).
"""

from __future__ import annotations

import re
from typing import NamedTuple

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_TEXT_COMMANDS = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")


class BoxedAnswer(NamedTuple):
    text: str | None  # stripped content of the last box; None if absent, empty or malformed
    found: bool  # a box command occurs in the response
    malformed: bool  # the last box is unterminated or empty


def find_last_boxed(response: str) -> BoxedAnswer:
    """Content of the last box in ``response`` (see module docstring)."""
    if not isinstance(response, str):
        raise TypeError(f"response must be str, got {type(response).__name__}")
    text = drop_thinking(response)
    start, command = -1, ""
    for cmd in _BOX_COMMANDS:
        pos = _rfind_command(text, cmd)
        if pos > start:
            start, command = pos, cmd
    if start < 0:
        return BoxedAnswer(None, False, False)
    i = start + len(command)
    if i < len(text) and text[i] == " " and "{" not in text[i : i + 2]:
        content = re.split(r"[$\n]", text[i + 1 :], maxsplit=1)[0].strip()
        return BoxedAnswer(content or None, True, not content)
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text) or text[i] != "{":
        return BoxedAnswer(None, True, True)
    content = _braced(text, i)
    if content is None or not content.strip():
        return BoxedAnswer(None, True, True)
    return BoxedAnswer(content.strip(), True, False)


def drop_thinking(response: str) -> str:
    """``response`` without its thinking (see module docstring), in one left-to-right pass."""
    kept, pos = [], 0
    close = response.find(_THINK_CLOSE)
    opened = response.find(_THINK_OPEN)
    if close >= 0 and (opened < 0 or close < opened):
        pos = close + len(_THINK_CLOSE)  # thinking opened by the prompt
    while True:
        start = response.find(_THINK_OPEN, pos)
        if start < 0:
            kept.append(response[pos:])
            break
        kept.append(response[pos:start])
        end = response.find(_THINK_CLOSE, start + len(_THINK_OPEN))
        if end < 0:
            break  # never closed: the rest is unfinished thinking
        pos = end + len(_THINK_CLOSE)
    return "".join(kept)


def extract_boxed_answer(response: str) -> str | None:
    """The last boxed answer of ``response``, or None."""
    return find_last_boxed(response).text


def strip_latex_text(answer: str) -> str:
    """Unwrap ``\\text{..}``-like commands and drop ``$`` so text answers compare as words."""
    previous = None
    while previous != answer:
        previous, answer = answer, _TEXT_COMMANDS.sub(r"\1", answer)
    return answer.replace("$", "").replace("\\,", " ").replace("\\ ", " ").replace("\\%", "%").strip()


def _rfind_command(text: str, command: str) -> int:
    """Last index of ``command`` not followed by a letter (so ``\\boxed`` != ``\\boxedsomething``)."""
    end = len(text)
    while True:
        pos = text.rfind(command, 0, end)
        if pos < 0:
            return -1
        after = pos + len(command)
        if after >= len(text) or not text[after].isalpha():
            return pos
        end = pos


def _braced(text: str, open_index: int) -> str | None:
    """Text inside the brace group opening at ``open_index``; None if it never closes."""
    depth = 0
    i = open_index
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # escaped character, e.g. \{ or \}
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : i]
        i += 1
    return None
