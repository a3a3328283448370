"""SFT demonstrations of the Reagent-C conversation: attempt, critique, corrected attempt.

Why: at inference Reagent-C appends the judge's critique as a user turn after the policy's final
answer and lets it try again. A policy fine-tuned only on single attempts has never seen a
conversation go on after its answer, and a small one degenerates there (EXPERIMENTS.md, session
48: attempt 2 = 0.000 on every seed of the quickstart). These demonstrations put that turn in the
policy's distribution without teaching the flaw: the first attempt's assistant turns carry
`"weight": 0` (rendered, but out of every loss: `chat.render`), the critique is the rule
annotator's (exactly what the rule judge writes at inference, never the answer), and only the
expert's second attempt is trained.

A first attempt is a flawed trajectory or, as often as any one flaw, the expert's own (the judge
then calls it sound and the retry confirms it), because selective or not, Reagent-C also retries
attempts that were right.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional

from reagent_jax.rrm.prompt import build_refinement_message
from reagent_jax.worlds import gsm8k_annotator, rrm_annotator
from reagent_jax.worlds.annotated import SOLVER_SYSTEM_PROMPT, annotated_trajectory
from reagent_jax.worlds.expert import WorldTools, applicable_flaws, expert_trajectory, flawed_trajectory
from reagent_jax.worlds.synthetic import Question, SyntheticWorld

Messages = list[dict[str, Any]]


def critique_conversation(first_attempt: Sequence[Mapping[str, Any]], critique: str,
                          retry: Sequence[Mapping[str, Any]], question: str | None = None) -> Messages:
    """`first_attempt` with its assistant turns at weight 0, the critique as the Reagent-C user
    turn (`build_refinement_message`, restating `question` when given), then `retry`'s turns
    after its prompt (system and user)."""
    if not first_attempt or first_attempt[-1].get("role") != "assistant":
        raise ValueError("the first attempt must end with the agent's final assistant turn")
    start = next((i for i, m in enumerate(retry) if m.get("role") not in ("system", "user")), None)
    if start is None or start == 0:
        raise ValueError("the retry must start with its prompt (system/user) and contain the agent's turns")
    if [dict(m) for m in retry[:start]] != [dict(m) for m in first_attempt[:start]]:
        raise ValueError("the retry must answer the same prompt as the first attempt")
    hidden = [{**m, "weight": 0} if m.get("role") == "assistant" else dict(m) for m in first_attempt]
    return hidden + [build_refinement_message(critique, question)] + [dict(m) for m in retry[start:]]


def _first_flaw(rng: random.Random, flaws: Sequence[str]) -> Optional[str]:
    """A flaw, or None (the expert's attempt) with the same chance as each flaw."""
    return rng.choice([*flaws, None])


def synthetic_critique_demonstration(world: SyntheticWorld, question: Question, rng: random.Random, *,
                                     tools: WorldTools | None = None, system_prompt: str | None = None,
                                     restate_question: bool = False) -> Messages:
    """A synthetic-world question: a flawed (or expert) attempt, the rule judge's critique, the expert."""
    expert = expert_trajectory(world, question, tools=tools, system_prompt=system_prompt)
    flaw = _first_flaw(rng, applicable_flaws(question))
    first = expert if flaw is None else flawed_trajectory(world, question, flaw, seed=rng.randrange(2**31),
                                                          tools=tools, system_prompt=system_prompt)
    return critique_conversation(first, rrm_annotator.annotate(question, first).critique, expert,
                                 question.question if restate_question else None)


def gsm8k_critique_demonstration(record: Mapping[str, Any], python: Callable[[str], str], rng: random.Random,
                                 *, system_prompt: Optional[str] = SOLVER_SYSTEM_PROMPT,
                                 restate_question: bool = False) -> Optional[Messages]:
    """A GSM8K row with a worked solution: a flawed (or expert) attempt, the GSM8K annotator's
    critique, the expert; None when the row has no solution."""
    expert = annotated_trajectory(dict(record), python, system_prompt=system_prompt)
    if expert is None:
        return None
    flaw = _first_flaw(rng, gsm8k_annotator.FLAWS)
    first = (gsm8k_annotator.flawed_trajectory(record, flaw, python, rng, system_prompt) if flaw else None) or expert
    return critique_conversation(first, gsm8k_annotator.annotate(record, first).critique, expert,
                                 record["question"] if restate_question else None)
