r"""The synthetic pairwise task of the CPU quickstart, and a scripted judge that writes its chains.

Triples come from the synthetic world's questions. Two kinds of responses:

  answer       (default) the instruction lists the facts the question needs and asks for a
               \boxed{} answer; the chosen response states the facts, the arithmetic and the
               boxed result; the rejected one has one flaw (category = the flaw):
                 misread_value     one value copied wrong (the result follows from it)
                 skipped_lookup    one value guessed instead of taken from the facts
                 wrong_arithmetic  right values, wrong result (questions with arithmetic only)
                 no_boxed          right result, not in \boxed{}
               A judge can decide every pair by reading, with no memorised knowledge.
  trajectory   the instruction is the bare question; responses are whole agent trajectories
               (expert vs one of `worlds.expert.FLAWS`), rendered as text like the Agent-RRM sees them.

`SyntheticTeacher` is a rule-based judge for `answer` triples with a chain-source interface
(`plans`, `executions`, like `judge.EngineJudge`): its plan lists the facts, the arithmetic and a
reference answer; its execution checks each response against the plan. With probability
`error_rate` an execution mixes the two responses up (it reports A's findings as B's and the
reverse), so its verdict is wrong. It writes the quickstart's seed-judge SFT data (a mediocre
seed judge, as the paper's seed model is) and is a deterministic chain source for tests.
"""
from __future__ import annotations

import random
import re
from typing import Sequence

from reagent_jax.evalplanner import prompts as P
from reagent_jax.evalplanner.judge import FORMATS, Chain, PairItem, parse_output, plan_block, request_seed
from reagent_jax.evalplanner.pairs import Triple
from reagent_jax.rrm.prompt import render_trajectory
from reagent_jax.worlds.expert import FLAWS, applicable_flaws, expert_trajectory, flawed_trajectory, plausible_wrong_value
from reagent_jax.worlds.synthetic import Question, SyntheticWorld, apply_ops, expression


ANSWER_FLAWS = ("misread_value", "skipped_lookup", "wrong_arithmetic", "no_boxed")
RESPONSE_KINDS = ("answer", "trajectory")


def _facts(q: Question, values: Sequence[int] | None = None) -> list[str]:
    values = [t.value for t in q.terms] if values is None else values
    return [f"The {t.attribute} of {t.entity} is {v}." for t, v in zip(q.terms, values)]


def instruction_text(q: Question) -> str:
    return f"Facts: {' '.join(_facts(q))}\nQuestion: {q.question}\nGive the final answer as \\boxed{{...}}."


def _answer(q: Question, sentences: list[str], values: Sequence[int], result: int, boxed: bool = True) -> str:
    parts = list(sentences)
    if q.level > 1:
        parts.append(f"{expression(values, q.ops, words=True)} is {result}.")
    shown = "\\boxed{" + str(result) + "}" if boxed else str(result)
    parts.append(f"The answer is {shown}.")
    return " ".join(parts)


def answer_flaws(q: Question) -> tuple[str, ...]:
    return tuple(f for f in ANSWER_FLAWS if not (f == "wrong_arithmetic" and q.level < 2))


def flawed_answer(q: Question, flaw: str, rng: random.Random) -> str:
    values = [t.value for t in q.terms]
    if flaw not in answer_flaws(q):
        raise ValueError(f"flaw {flaw!r} does not apply to {q.id} (level {q.level}); use one of {answer_flaws(q)}")
    if flaw == "no_boxed":
        return _answer(q, _facts(q), values, int(q.answer), boxed=False)
    if flaw == "wrong_arithmetic":
        return _answer(q, _facts(q), values, int(q.answer) + rng.choice((-1, 1)) * rng.randint(1, 20))
    j = rng.randrange(len(values))
    used = list(values)
    used[j] = plausible_wrong_value(rng, values[j])
    sentences = _facts(q, used)
    if flaw == "skipped_lookup":
        t = q.terms[j]
        sentences[j] = f"I guess the {t.attribute} of {t.entity} is about {used[j]}."
    return _answer(q, sentences, used, apply_ops(used, q.ops))


def synthetic_triples(world: SyntheticWorld, questions: Sequence[Question], *, seed: int = 0,
                      response_kind: str = "answer", flaws: Sequence[str] | None = None) -> list[Triple]:
    """One triple per question; the rejected response's flaw is drawn (seeded) from `flaws`."""
    if response_kind not in RESPONSE_KINDS:
        raise ValueError(f"response_kind={response_kind!r}; expected one of {RESPONSE_KINDS}")
    known = ANSWER_FLAWS if response_kind == "answer" else FLAWS
    bad = [f for f in (flaws or ()) if f not in known]
    if bad:
        raise ValueError(f"unknown flaws {bad} for response_kind={response_kind!r}; known: {known}")
    out = []
    for q in questions:
        rng = random.Random(f"{seed}/{q.id}")
        if response_kind == "answer":
            options = [f for f in answer_flaws(q) if not flaws or f in flaws]
            if not options:
                continue
            flaw = rng.choice(options)
            chosen = _answer(q, _facts(q), [t.value for t in q.terms], int(q.answer))
            rejected, instruction = flawed_answer(q, flaw, rng), instruction_text(q)
        else:
            options = [f for f in applicable_flaws(q) if not flaws or f in flaws]
            if not options:
                continue
            flaw = rng.choice(options)
            chosen = render_trajectory(expert_trajectory(world, q), question=q.question)
            rejected = render_trajectory(flawed_trajectory(world, q, flaw, seed=seed), question=q.question)
            instruction = q.question
        out.append(Triple(q.id, instruction, chosen, rejected, flaw,
                          {"question_id": q.id, "answer": q.answer, "level": q.level}))
    return out


# ---- the scripted teacher ----------------------------------------------------------------------
_FACT = re.compile(r"(?:The|I guess the) (.+?) of ([A-Z][a-z]+) is (?:about )?(-?\d+)\.")
_BOXED = re.compile(r"\\boxed\{(-?\d+)\}")
_RESULT = re.compile(r"The answer is (-?\d+)\.")


def teacher_plan(q: Question) -> str:
    """Three checks and a worked reference answer (short: a tiny model must be able to write it)."""
    values = [t.value for t in q.terms]
    arithmetic = (f"The arithmetic must be right: {expression(values, q.ops, words=True)} is {q.answer}."
                  if q.level > 1 else "No arithmetic is needed.")
    return (f"1. Each value must match the facts.\n2. {arithmetic}\n3. The answer must be in \\boxed{{}}.\n"
            f"Reference answer: {q.answer}.")


def _check(q: Question, response: str) -> tuple[list[str], int]:
    """Findings (one per plan step, fixed phrases) about one answer-kind response, and a problem count."""
    truth = {(t.attribute, t.entity): t.value for t in q.terms}
    wrong_values = sum(truth.get((a, e), int(v)) != int(v) for a, e, v in _FACT.findall(response))
    boxed = _BOXED.findall(response)
    plain = _RESULT.findall(response)
    answer = boxed[-1] if boxed else (plain[-1] if plain else None)
    notes = ["a value differs from the facts." if wrong_values else "the values match the facts.",
             "The answer matches the reference." if answer == q.answer else "The answer differs from the reference.",
             "It is boxed." if boxed else "It is not boxed."]
    return notes, wrong_values + 2 * (answer != q.answer) + (not boxed)


def teacher_execution(q: Question, item: PairItem, mixed_up: bool = False) -> tuple[str, str]:
    """(execution text, verdict); mixed_up swaps which response each finding is reported for."""
    (na, pa), (nb, pb) = _check(q, item.response_a), _check(q, item.response_b)
    if mixed_up:
        (na, pa), (nb, pb) = (nb, pb), (na, pa)
    verdict = "A" if pa <= pb else "B"
    return f"Response A: {' '.join(na)}\nResponse B: {' '.join(nb)}\nResponse {verdict} is better.", verdict


class SyntheticTeacher:
    """Scripted chain source for `answer` triples (see the module docstring)."""

    def __init__(self, world: SyntheticWorld, triples: Sequence[Triple], *, fmt: str = "plan_execute",
                 error_rate: float = 0.0):
        if fmt not in FORMATS:
            raise ValueError(f"fmt={fmt!r}; expected one of {FORMATS}")
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {error_rate}")
        self.fmt, self.error_rate = fmt, error_rate
        self._questions = {}
        for t in triples:
            qid = t.meta.get("question_id")
            if qid is None or not t.instruction.startswith("Facts:"):
                raise ValueError(f"SyntheticTeacher needs synthetic answer-kind triples; {t.id!r} is not one")
            self._questions[t.instruction] = world.question(qid)

    def _question(self, item: PairItem) -> Question:
        try:
            return self._questions[item.instruction]
        except KeyError:
            raise ValueError(f"SyntheticTeacher got an instruction it was not built with: {item.instruction!r:.120}")

    def plans(self, items: Sequence[PairItem], n: int, seed: int = 0, greedy: bool = False) -> list[list[str]]:
        if self.fmt == "verdict_only":
            return [[""] * n for _ in items]
        return [[teacher_plan(self._question(it))] * n for it in items]

    def chain(self, item: PairItem, plan: str, mixed_up: bool) -> Chain:
        execution, verdict = teacher_execution(self._question(item), item, mixed_up)
        if self.fmt == "verdict_only":
            output = f"{P.FINAL_VERDICT} [[{verdict}]]"
        else:
            output = P.format_execution_output(execution, verdict)
            if self.fmt == "single_pass":
                output = plan_block(plan) + output
        return parse_output(self.fmt, output, plan)

    def executions(self, requests: Sequence[tuple[PairItem, str]], n: int, seed: int = 0,
                   greedy: bool = False) -> list[list[Chain]]:
        out = []
        for i, (item, plan) in enumerate(requests):
            row = []
            for k in range(n):
                u = request_seed(seed, 1, i, k) / 2 ** 32
                row.append(self.chain(item, plan, mixed_up=(not greedy and u < self.error_rate)))
            out.append(row)
        return out

    def judge(self, items: Sequence[PairItem], seed: int = 0, greedy: bool = True) -> list[Chain]:
        plans = [p[0] for p in self.plans(items, 1, seed)]
        return [c[0] for c in self.executions(list(zip(items, plans)), 1, seed, greedy)]
