"""Expert and deliberately flawed trajectories for the synthetic world (SFT, RRM and judge data).

Why: the quickstart needs supervised examples of good tool use (agent SFT) and labelled bad ones
(Agent-RRM SFT, EvalPlanner pairs) without any model or network. Trajectories are OpenAI-style
chat messages in the project's shared format: assistant turns carry `tool_calls` for
`search {"query", "topk"}` and `python {"code"}`, tool turns carry what the tools return for the
world's corpus, and the last assistant turn gives `\\boxed{answer}`.

How tool responses are produced is pluggable (`WorldTools.search_formatter`,
`WorldTools.python_runner`) so the text can be aligned with the real search / python tools.

Flaws (`FLAWS`, each trajectory has at most one):
  skipped_lookup       one needed value is never searched; a made-up number is used instead
  misread_value        the value is searched but a different number is copied from the result
  wrong_arithmetic     values are right but the result is not (by hand, or a wrong operator in code)
  no_boxed             everything is right but the final answer is not in \\boxed{}
  malformed_tool_call  one tool call is broken JSON (the tool answers with an error), then retried
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import random
import threading
from typing import Any, Callable, Sequence

from reagent_jax.worlds.synthetic import SMALL_ATTRIBUTE_MAX, Question, SyntheticWorld, apply_ops, expression

SearchFormatter = Callable[[str, Sequence[dict]], str]
PythonRunner = Callable[[str], str]

FLAWS = ("skipped_lookup", "misread_value", "wrong_arithmetic", "no_boxed", "malformed_tool_call")
MALFORMED_CALL_ERROR = "Error: the tool call is not valid JSON. Write one JSON object with name and arguments."


def format_search_results(query: str, docs: Sequence[dict]) -> str:
    """Default search response: one "Doc i (Title: t) contents" line per document."""
    if not docs:
        return f'No results for "{query}".'
    return "\n".join(f"Doc {i} (Title: {d['title']}) {d['contents']}" for i, d in enumerate(docs, 1))


def run_python(code: str) -> str:
    """Runs the expert's own arithmetic code and returns its stdout (trusted code only, no sandbox)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<expert>", "exec"), {"__builtins__": {"print": print}})  # noqa: S102
    return out.getvalue().strip()


@dataclasses.dataclass(frozen=True)
class WorldTools:
    """The responses the real tools would give for this world's corpus."""

    world: SyntheticWorld
    search_formatter: SearchFormatter = format_search_results
    python_runner: PythonRunner = run_python

    def search(self, query: str, topk: int | None = None) -> str:
        return self.search_formatter(query, self.world.search(query, topk))

    def python(self, code: str) -> str:
        return self.python_runner(code)


@dataclasses.dataclass(frozen=True)
class LabelledTrajectory:
    question: Question
    messages: list[dict[str, Any]]
    flaw: str | None  # None for an expert trajectory, else one of FLAWS


def tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def boxed(answer: Any) -> str:
    return "\\boxed{" + str(answer) + "}"


def applicable_flaws(question: Question) -> tuple[str, ...]:
    """Flaws that make sense for `question` (single lookups involve no arithmetic)."""
    return tuple(f for f in FLAWS if not (f == "wrong_arithmetic" and question.level < 2))


def expert_trajectory(
    world: SyntheticWorld, question: Question, *, tools: WorldTools | None = None, system_prompt: str | None = None,
    by_hand: bool = False,
) -> list[dict[str, Any]]:
    """Search each needed value, compute with python (levels 2-3), answer in \\boxed{}.

    by_hand: do the (correct) arithmetic in the text instead of calling python, as a teacher that can
    compute in its head would. A small student imitating that guesses the number; the quickstart mixes
    such demonstrations in so that GRPO has a tool-use habit to learn (see configs/quickstart.py).
    """
    return _trajectory(world, question, None, random.Random(0), tools, system_prompt, by_hand)


def flawed_trajectory(
    world: SyntheticWorld,
    question: Question,
    flaw: str,
    *,
    seed: int = 0,
    tools: WorldTools | None = None,
    system_prompt: str | None = None,
) -> list[dict[str, Any]]:
    """The expert trajectory with exactly one injected `flaw` (see module docstring)."""
    if flaw not in FLAWS:
        raise ValueError(f"unknown flaw {flaw!r}; expected one of {FLAWS}")
    if flaw not in applicable_flaws(question):
        raise ValueError(f"flaw {flaw!r} needs a question with arithmetic (level >= 2); {question.id} has level {question.level}")
    rng = random.Random(f"{seed}/{question.id}/{flaw}")
    return _trajectory(world, question, flaw, rng, tools, system_prompt)


def labelled_trajectories(
    world: SyntheticWorld, split: str = "train", *, flaw_fraction: float = 0.5, seed: int = 0,
    tools: WorldTools | None = None, system_prompt: str | None = None,
) -> list[LabelledTrajectory]:
    """Each question's expert trajectory, plus (with probability flaw_fraction) one flawed one."""
    if not 0.0 <= flaw_fraction <= 1.0:
        raise ValueError(f"flaw_fraction must be in [0, 1], got {flaw_fraction}")
    rng = random.Random(seed)
    questions = {"train": world.train, "heldout": world.heldout, "all": world.questions}.get(split)
    if questions is None:
        raise ValueError(f"split must be 'train', 'heldout' or 'all', got {split!r}")
    out = []
    for q in questions:
        out.append(LabelledTrajectory(q, expert_trajectory(world, q, tools=tools, system_prompt=system_prompt), None))
        if rng.random() < flaw_fraction:
            flaw = rng.choice(applicable_flaws(q))
            out.append(LabelledTrajectory(q, flawed_trajectory(world, q, flaw, seed=seed, tools=tools,
                                                               system_prompt=system_prompt), flaw))
    return out


def message_texts(messages: Sequence[dict[str, Any]]) -> list[str]:
    """Strings of a trajectory as the model sees them (tool calls in their Hermes JSON form)."""
    texts = []
    for m in messages:
        for key in ("content", "reasoning_content"):
            if isinstance(m.get(key), str) and m[key]:
                texts.append(m[key])
        for call in m.get("tool_calls") or ():
            fn = call.get("function", call)
            texts.append(json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")}, ensure_ascii=False))
    return texts


def plausible_wrong_value(rng: random.Random, true: int) -> int:
    """A plausible wrong value: off by 1-9 (tens for four-digit values half of the time)."""
    scale = 10 if true >= 1000 and rng.random() < 0.5 else 1
    while True:
        value = true + rng.choice((-1, 1)) * rng.randint(1, 9) * scale
        if value > 0 and value != true:
            return value


def _wrong_ops(rng: random.Random, values: Sequence[int], ops: Sequence[str]) -> tuple[str, ...] | None:
    """Ops with one operator swapped so the result changes (None when no swap changes it)."""
    truth = apply_ops(values, ops)
    candidates = []
    for i, op in enumerate(ops):
        # `times` only for one small-number operation: keeps left-to-right == Python, and few digits
        small = len(ops) == 1 and max(values) <= SMALL_ATTRIBUTE_MAX
        allowed = ("plus", "minus", "times") if small else ("plus", "minus")
        for other in allowed:
            new = tuple(ops[:i]) + (other,) + tuple(ops[i + 1 :])
            if other != op and apply_ops(values, new) != truth:
                candidates.append(new)
    return rng.choice(candidates) if candidates else None


def _trajectory(
    world: SyntheticWorld,
    q: Question,
    flaw: str | None,
    rng: random.Random,
    tools: WorldTools | None,
    system_prompt: str | None,
    by_hand: bool = False,
) -> list[dict[str, Any]]:
    tools = tools or WorldTools(world)
    topk = world.config.search_topk
    messages: list[dict[str, Any]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": q.question})

    bad_term = rng.randrange(len(q.terms)) if flaw in ("skipped_lookup", "misread_value", "malformed_tool_call") else None
    if flaw == "malformed_tool_call":
        term = q.terms[bad_term]
        args = {"query": term.query, "topk": topk}
        broken = json.dumps({"name": "search", "arguments": args}, ensure_ascii=False)[:-1]
        messages.append({"role": "assistant", "content": f"I need {term.phrase}.\n<tool_call>\n{broken}\n</tool_call>"})
        messages.append({"role": "tool", "content": MALFORMED_CALL_ERROR})
    # All lookups in one turn, as parallel calls in the question's order: the model copies the
    # question's terms left to right, and the trajectory needs one turn instead of one per term.
    looked_up = [j for j in range(len(q.terms)) if not (flaw == "skipped_lookup" and j == bad_term)]
    if looked_up:
        calls = [tool_call("search", {"query": q.terms[j].query, "topk": topk}) for j in looked_up]
        phrases = " and ".join(q.terms[j].phrase for j in looked_up)
        messages.append({"role": "assistant", "content": f"I need {phrases}.", "tool_calls": calls})
        for j in looked_up:
            messages.append({"role": "tool", "name": "search", "content": tools.search(q.terms[j].query, topk)})
    used: list[int] = []
    for j, term in enumerate(q.terms):
        if j not in looked_up or (flaw == "misread_value" and j == bad_term):
            used.append(plausible_wrong_value(rng, term.value))
        else:
            used.append(term.value)

    facts = " ".join(f"The {t.attribute} of {t.entity} is {v}." for t, v in zip(q.terms, used))
    if q.level == 1:
        result: int = used[0]
        final_prefix = facts + " "
    else:
        code_ops = tuple(q.ops)
        if flaw == "wrong_arithmetic":
            swapped = _wrong_ops(rng, used, q.ops) if rng.random() < 0.5 else None
            by_hand = swapped is None
            code_ops = swapped or code_ops
        spoken = expression(used, q.ops, words=True)
        if by_hand:
            result = apply_ops(used, q.ops)
            if flaw == "wrong_arithmetic":
                result += rng.choice((-1, 1)) * rng.randint(1, 20)
            final_prefix = f"{facts} {spoken} is {result}. "
        else:
            code = f"print({expression(used, code_ops)})"
            messages.append(
                {"role": "assistant", "content": f"{facts} I will compute {spoken}.", "tool_calls": [tool_call("python", {"code": code})]}
            )
            messages.append({"role": "tool", "name": "python", "content": tools.python(code)})
            result = apply_ops(used, code_ops)
            final_prefix = ""
    answer = str(result) if flaw == "no_boxed" else boxed(result)
    messages.append({"role": "assistant", "content": f"{final_prefix}The answer is {answer}."})
    return messages


class RegistryTools:
    """Expert trajectories with the responses of the real tools (what the agent loop will see).

    The expert's python code is our own trusted arithmetic (`print(a + b)`), and the sandbox costs
    ~0.1 s per call, which would dominate building thousands of SFT examples. So the first
    `verify_python` calls go through the real tool and must equal `run_python`'s text (a mismatch
    raises); later calls use `run_python` directly. `verify_python=None` always uses the tool.
    """

    def __init__(self, registry: Any, verify_python: int | None = 8):
        self.registry = registry
        self.verify_python = verify_python
        self._verified = 0
        self._lock = threading.Lock()

    def search(self, query: str, topk: int | None = None) -> str:
        args: dict[str, Any] = {"query": query}
        if topk:
            args["topk"] = topk
        return self.registry.call("search", args).text

    def python(self, code: str) -> str:
        with self._lock:
            fast = self.verify_python is not None and self._verified >= self.verify_python
        if fast:
            return run_python(code)
        text = self.registry.call("python", {"code": code}).text
        if self.verify_python is not None:
            expected = run_python(code)
            if text != expected:
                raise RuntimeError(f"the python tool answered {text!r} where the expert's runner gives {expected!r} "
                                   f"for {code!r}; use RegistryTools(verify_python=None) with this tool")
            with self._lock:
                self._verified += 1
        return text


def world_texts(world: SyntheticWorld) -> list[str]:
    """Corpus, questions, answers and every expert / flawed trajectory string of the world: the
    training text of the quickstart's compact tokenizer."""
    texts = [d["contents"] for d in world.corpus()]
    for q in world.questions:
        texts += [q.question, q.answer]
        trajectories = [expert_trajectory(world, q)] + [flawed_trajectory(world, q, f) for f in applicable_flaws(q)]
        for messages in trajectories:
            texts += message_texts(messages)
    return texts
