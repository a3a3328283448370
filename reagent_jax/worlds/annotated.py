"""Expert python-tool trajectories from worked solutions with calculator annotations (GSM8K).

GSM8K's reference solutions mark every computation as `<<48/2=24>>`. Each one is a natural
python call, so a real question becomes an SFT demonstration of the agent loop:

    user:       the question
    assistant:  one python call printing every annotated expression, in order
    tool:       what the python tool printed
    assistant:  the solution's text (annotations removed) and `\\boxed{answer}`

Only plain arithmetic becomes code (numbers, + - * / // % **, parentheses); a solution whose
annotations are not all arithmetic gets the python step for the ones that are, and one with
none is answered directly. Rows without `meta.solution` are skipped and counted by the caller.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Callable, Optional

ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>]*)>>")
_ARITHMETIC = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div,
               ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd)
SOLVER_SYSTEM_PROMPT = ("You are a careful math assistant. Compute with the python tool, then give the "
                        "final answer as \\boxed{...}.")


def arithmetic(expr: str) -> Optional[str]:
    """`expr` as python if it is plain arithmetic on numbers, else None."""
    code = expr.strip().replace("^", "**")
    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError:
        return None
    ok = all(isinstance(node, _ARITHMETIC) for node in ast.walk(tree)) and all(
        isinstance(n.value, (int, float)) for n in ast.walk(tree) if isinstance(n, ast.Constant))
    big_power = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow)
                    and not (isinstance(n.right, ast.Constant) and abs(n.right.value) <= 64)
                    for n in ast.walk(tree))
    return code if ok and not big_power else None


def calculations(solution: str) -> list[str]:
    """The arithmetic annotations of a solution, in order."""
    return [code for code in (arithmetic(m.group(1)) for m in ANNOTATION.finditer(solution)) if code]


def annotated_trajectory(record: dict, python: Callable[[str], str],
                         system_prompt: Optional[str] = SOLVER_SYSTEM_PROMPT) -> Optional[list[dict[str, Any]]]:
    """The expert conversation of a question record with `meta.solution` (None without one).

    python: runs code and returns the tool's text (e.g. `RegistryTools(registry).python`).
    """
    solution = (record.get("meta") or {}).get("solution")
    answers = record.get("answer") or []
    if not isinstance(solution, str) or not solution.strip() or not answers:
        return None
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": record["question"]})
    codes = calculations(solution)
    if codes:
        code = "\n".join(f"print({c})" for c in codes)
        messages += [
            {"role": "assistant", "content": "Let me compute each step with Python.",
             "tool_calls": [{"type": "function", "function": {"name": "python", "arguments": {"code": code}}}]},
            {"role": "tool", "content": python(code)},
        ]
    text = ANNOTATION.sub("", solution).strip()
    messages.append({"role": "assistant", "content": f"{text}\nThe answer is \\boxed{{{answers[0]}}}."})
    return messages
