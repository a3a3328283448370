"""EvalPlanner prompts: plan first (from the instruction alone), then execute the plan on two
responses, then give a verdict `[[A]]` or `[[B]]`.

Why: separating *what to check* (the plan, written before seeing any response, possibly with a
worked reference answer) from *checking it* (the execution) is what EvalPlanner trains. The same
wording is used for sampling chains, for SFT / DPO targets and for evaluation, so it lives here.

Functions (each returns OpenAI-style [system, user] messages):
    plan_messages(instruction)
        ask for an evaluation plan; for verifiable tasks the plan may contain a step-by-step
        reference answer. The reply is the plan text only.
    execution_messages(instruction, response_a, response_b, plan)
        ask the judge to follow the plan step by step on both responses, free of position,
        length and name bias, and to end with "[Final Verdict] [[A]]" or "[Final Verdict] [[B]]".
    judge_messages(instruction, response_a, response_b)
        single pass: the judge writes plan, execution and verdict in the format below.
    verdict_only_messages(instruction, response_a, response_b)
        ablation without planning or written reasoning: the reply is just [[A]] or [[B]].

    format_judge_output(plan, execution, verdict) -> str   the single-pass target text:

        [Start of Evaluation Plan]
        ...
        [End of Evaluation Plan]

        [Start of Plan Execution]
        ...
        [End of Plan Execution]

        [Final Verdict] [[A]]
"""

from __future__ import annotations

PLAN_START, PLAN_END = "[Start of Evaluation Plan]", "[End of Evaluation Plan]"
EXEC_START, EXEC_END = "[Start of Plan Execution]", "[End of Plan Execution]"
FINAL_VERDICT = "[Final Verdict]"
VERDICTS = ("A", "B")

_FAIRNESS = (
    "Judge only the content. The order in which the responses appear, their length, and any names "
    "or labels they carry must not sway you: a longer answer is not better for being longer, and "
    "Response A is not favoured for coming first."
)

PLAN_SYSTEM = (
    "You design evaluation plans. Given a user's instruction, you write a plan that a careful judge "
    "can follow to decide which of two responses answers it better. You do not see the responses."
)

PLAN_USER = """\
Instruction:
{instruction}

Write an evaluation plan for responses to this instruction. The plan should:
1. List the criteria that matter most for this instruction (for example correctness, following \
every constraint, completeness, clarity) and how much each one weighs.
2. Say how to check each criterion on a response.
3. When the instruction has a verifiable answer (math, code, facts), solve it yourself step by \
step and include the reference answer so the judge can compare against it.

Reply with the plan only. Do not judge any response."""

EXECUTION_SYSTEM = (
    "You are an impartial judge comparing two responses to a user's instruction. You follow a given "
    "evaluation plan step by step. " + _FAIRNESS
)

EXECUTION_USER = """\
Instruction:
{instruction}

[Start of Response A]
{response_a}
[End of Response A]

[Start of Response B]
{response_b}
[End of Response B]

Evaluation plan:
{plan}

Carry out the plan step by step, applying every step to both responses and noting what you find. \
Then decide which response is better. Write your work as

{exec_start}
...
{exec_end}

and finish with "{final} [[A]]" if Response A is better or "{final} [[B]]" if Response B is better. \
Give exactly one verdict."""

JUDGE_SYSTEM = (
    "You are an impartial judge comparing two responses to a user's instruction. First you plan how "
    "to evaluate, from the instruction alone; then you carry out the plan on both responses; then "
    "you give a verdict. " + _FAIRNESS
)

JUDGE_USER = """\
Instruction:
{instruction}

[Start of Response A]
{response_a}
[End of Response A]

[Start of Response B]
{response_b}
[End of Response B]

Answer in exactly this format:

{plan_start}
The criteria that matter for this instruction, how to check each, and, when the instruction has a \
verifiable answer, a step-by-step reference answer. Base the plan on the instruction only.
{plan_end}

{exec_start}
The plan carried out step by step on both responses.
{exec_end}

{final} [[A]] or [[B]]

Use [[A]] if Response A is better and [[B]] if Response B is better. Give exactly one verdict."""

VERDICT_ONLY_SYSTEM = "You are an impartial judge comparing two responses to a user's instruction. " + _FAIRNESS

VERDICT_ONLY_USER = """\
Instruction:
{instruction}

[Start of Response A]
{response_a}
[End of Response A]

[Start of Response B]
{response_b}
[End of Response B]

Which response is better? Reply with "{final} [[A]]" or "{final} [[B]]" and nothing else."""


def _check(**fields: str) -> None:
    for name, value in fields.items():
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string, got {type(value).__name__}")
        if name == "instruction" and not value.strip():
            raise ValueError("instruction must be a non-empty string")


def _messages(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _markers() -> dict[str, str]:
    return {"plan_start": PLAN_START, "plan_end": PLAN_END, "exec_start": EXEC_START, "exec_end": EXEC_END, "final": FINAL_VERDICT}


def plan_messages(instruction: str) -> list[dict[str, str]]:
    _check(instruction=instruction)
    return _messages(PLAN_SYSTEM, PLAN_USER.format(instruction=instruction.strip()))


def execution_messages(instruction: str, response_a: str, response_b: str, plan: str) -> list[dict[str, str]]:
    _check(instruction=instruction, response_a=response_a, response_b=response_b, plan=plan)
    user = EXECUTION_USER.format(
        instruction=instruction.strip(), response_a=response_a, response_b=response_b, plan=plan.strip(), **_markers()
    )
    return _messages(EXECUTION_SYSTEM, user)


def judge_messages(instruction: str, response_a: str, response_b: str) -> list[dict[str, str]]:
    _check(instruction=instruction, response_a=response_a, response_b=response_b)
    user = JUDGE_USER.format(instruction=instruction.strip(), response_a=response_a, response_b=response_b, **_markers())
    return _messages(JUDGE_SYSTEM, user)


def verdict_only_messages(instruction: str, response_a: str, response_b: str) -> list[dict[str, str]]:
    _check(instruction=instruction, response_a=response_a, response_b=response_b)
    user = VERDICT_ONLY_USER.format(instruction=instruction.strip(), response_a=response_a, response_b=response_b, final=FINAL_VERDICT)
    return _messages(VERDICT_ONLY_SYSTEM, user)


def format_execution_output(execution: str, verdict: str) -> str:
    """Target text for the execution stage (after `execution_messages`)."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be 'A' or 'B', got {verdict!r}")
    return f"{EXEC_START}\n{execution.strip()}\n{EXEC_END}\n\n{FINAL_VERDICT} [[{verdict}]]"


def format_judge_output(plan: str, execution: str, verdict: str) -> str:
    """Single-pass target text: plan, execution and verdict in the bracketed format."""
    return f"{PLAN_START}\n{plan.strip()}\n{PLAN_END}\n\n" + format_execution_output(execution, verdict)
