"""Runs an EvalPlanner judge on the rollout engine: plans, executions and full judgements, batched.

Three formats (`JudgeConfig.format`), one per way the judge can be asked:

  plan_execute   two calls. The plan comes from `plan_messages(instruction)` (the responses are
                 not shown); the execution from `execution_messages(instruction, a, b, plan)`.
                 Chain.output = the execution call's text (execution section + verdict).
  single_pass    one prompt, `judge_messages(instruction, a, b)`; the judge writes plan,
                 execution and verdict. To sample |E| executions of one plan, the plan is drawn
                 as the start of the answer (stopped at "[End of Evaluation Plan]") and each
                 execution continues after it. Chain.output = the whole answer, plan included.
  verdict_only   the ablation without planning or written reasoning: `verdict_only_messages`;
                 Chain.plan is "" and Chain.output the bare verdict.

`EngineJudge` and the scripted teacher in `worlds.pairwise` share the chain-source shape
used by the pair builder (`evalplanner.pairs.sample_chains`):

    plans(items, n, seed) -> [[plan] * n per item]
    executions([(item, plan), ...], n, seed) -> [[Chain] * n per request]

and `judge(items, seed, greedy)` gives one full Chain per item (evaluation, reward model). Every
request gets its own sampling seed derived from (seed, request, sample), so a call is
reproducible. A request that cannot run (too long for the engine) gives a Chain with status
"error" and no verdict instead of raising.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Sequence

import numpy as np

from reagent_jax import chat
from reagent_jax.evalplanner import prompts as P
from reagent_jax.evalplanner.parser import parse_evaluation, parse_plan
from reagent_jax.rollout import SamplingParams

log = logging.getLogger(__name__)

FORMATS = ("plan_execute", "single_pass", "verdict_only")
ERROR_STATUS = "error"


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    format: str = "plan_execute"
    temperature: float = 0.8  # the paper's sampling settings for synthetic chains
    top_p: float = 0.95
    max_plan_tokens: int = 512
    max_execution_tokens: int = 1024
    enable_thinking: bool = False  # the plan and execution are the judge's reasoning

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"JudgeConfig.format={self.format!r}; expected one of {FORMATS}")
        for name in ("max_plan_tokens", "max_execution_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"JudgeConfig.{name} must be an int >= 1, got {getattr(self, name)!r}")


@dataclasses.dataclass(frozen=True)
class PairItem:
    """One judging request: response A is shown first."""
    instruction: str
    response_a: str
    response_b: str


@dataclasses.dataclass(frozen=True)
class Chain:
    plan: str
    output: str  # the text of the judge's final call (see the module docstring)
    verdict: str | None  # "A", "B" or None
    status: str  # a parser VerdictStatus value, or "error"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def final_messages(fmt: str, item: PairItem, plan: str) -> list[dict[str, str]]:
    """Prompt of the call whose answer is `Chain.output` (the SFT / DPO prompt of a chain)."""
    if fmt == "plan_execute":
        return P.execution_messages(item.instruction, item.response_a, item.response_b, plan)
    if fmt == "single_pass":
        return P.judge_messages(item.instruction, item.response_a, item.response_b)
    if fmt == "verdict_only":
        return P.verdict_only_messages(item.instruction, item.response_a, item.response_b)
    raise ValueError(f"unknown judge format {fmt!r}; expected one of {FORMATS}")


def plan_block(plan: str) -> str:
    """The single-pass answer's opening up to the execution: plan section and blank line."""
    return f"{P.PLAN_START}\n{plan.strip()}\n{P.PLAN_END}\n\n"


def parse_output(fmt: str, output: str, plan: str) -> Chain:
    """Chain from the final call's text; plan_execute and verdict_only outputs carry no plan section."""
    e = parse_evaluation(output, expect_plan=(fmt == "single_pass"), expect_execution=(fmt != "verdict_only"))
    return Chain(plan=e.plan if fmt == "single_pass" else plan, output=output, verdict=e.verdict,
                 status=e.status.value)


def request_seed(seed: int, kind: int, index: int, sample: int) -> int:
    """A uint32 sampling seed that depends only on (seed, call kind, request, sample)."""
    return int(np.random.SeedSequence([int(seed) % 2 ** 32, kind, index, sample]).generate_state(1)[0])


class EngineJudge:
    """The judge model behind a started (or self-driven) `rollout.Engine`; see the module docstring."""

    def __init__(self, engine, tokenizer, config: JudgeConfig = JudgeConfig()):
        self.engine, self.tok, self.config = engine, tokenizer, config
        self.stop_ids = chat.stop_token_ids(tokenizer)

    # ---- prompts and sampling ----------------------------------------------------------------
    def _prompt(self, messages, prefix: str = "") -> list[int]:
        ids = chat.render(self.tok, messages, add_generation_prompt=True,
                          enable_thinking=self.config.enable_thinking).ids
        return list(ids) + (self.tok.encode(prefix, add_special_tokens=False) if prefix else [])

    def _sampling(self, max_new_tokens: int, seed: int, greedy: bool, stop_strings=()) -> SamplingParams:
        c = self.config
        return SamplingParams(temperature=0.0 if greedy else c.temperature, top_p=1.0 if greedy else c.top_p,
                              max_new_tokens=max_new_tokens, seed=seed, stop_token_ids=self.stop_ids,
                              stop_strings=tuple(stop_strings))

    def _generate(self, prompts: list[list[int]], samplings: list[SamplingParams]) -> list[tuple[str | None, Any]]:
        """(text or None on error, result) per prompt; the stop token is not part of the text."""
        if not prompts:
            return []
        out, errors = [], []
        for r in self.engine.generate(prompts, samplings):
            if r.finish_reason == "error":
                out.append((None, r))
                errors.append(r.error)
                continue
            toks = list(r.tokens)
            if toks and toks[-1] in self.stop_ids:
                toks = toks[:-1]
            out.append((self.tok.decode(toks, skip_special_tokens=False), r))
        if errors:
            log.warning("judge: %d of %d requests failed (judged as no verdict), e.g. %s", len(errors), len(prompts),
                        errors[0])
        return out

    # ---- chain-source interface --------------------------------------------------------------
    def plans(self, items: Sequence[PairItem], n: int, seed: int = 0, greedy: bool = False) -> list[list[str]]:
        c = self.config
        if c.format == "verdict_only":
            return [[""] * n for _ in items]
        prompts, samplings = [], []
        for i, item in enumerate(items):
            if c.format == "plan_execute":
                ids, stops = self._prompt(P.plan_messages(item.instruction)), ()
            else:
                ids = self._prompt(P.judge_messages(item.instruction, item.response_a, item.response_b),
                                   prefix=P.PLAN_START + "\n")
                stops = (P.PLAN_END,)
            for k in range(n):
                prompts.append(ids)
                samplings.append(self._sampling(c.max_plan_tokens, request_seed(seed, 0, i, k), greedy, stops))
        texts = [t or "" for t, _ in self._generate(prompts, samplings)]
        if c.format == "single_pass":
            texts = [t.split(P.PLAN_END)[0].strip() for t in texts]
        else:
            texts = [parse_plan(t) for t in texts]
        return [texts[i * n:(i + 1) * n] for i in range(len(items))]

    def executions(self, requests: Sequence[tuple[PairItem, str]], n: int, seed: int = 0,
                   greedy: bool = False) -> list[list[Chain]]:
        c = self.config
        prompts, samplings, prefixes = [], [], []
        for i, (item, plan) in enumerate(requests):
            prefix = plan_block(plan) if c.format == "single_pass" else ""
            ids = self._prompt(final_messages(c.format, item, plan), prefix=prefix)
            for k in range(n):
                prompts.append(ids)
                prefixes.append(prefix)
                samplings.append(self._sampling(c.max_execution_tokens, request_seed(seed, 1, i, k), greedy))
        chains = []
        for (text, r), prefix, j in zip(self._generate(prompts, samplings), prefixes, range(len(prompts))):
            plan = requests[j // n][1]
            if text is None:
                chains.append(Chain(plan, "", None, ERROR_STATUS))
            else:
                chains.append(parse_output(c.format, prefix + text, plan))
        return [chains[i * n:(i + 1) * n] for i in range(len(requests))]

    def judge(self, items: Sequence[PairItem], seed: int = 0, greedy: bool = True) -> list[Chain]:
        """One full judgement per item. plan_execute: one plan per distinct instruction (shared by
        both orders of a pair, as in the pair builder), then one execution per item."""
        c = self.config
        if c.format == "single_pass":
            prompts = [self._prompt(final_messages(c.format, it, "")) for it in items]
            budget = c.max_plan_tokens + c.max_execution_tokens
            samplings = [self._sampling(budget, request_seed(seed, 2, i, 0), greedy) for i in range(len(items))]
            return [Chain("", "", None, ERROR_STATUS) if t is None else parse_output(c.format, t, "")
                    for t, _ in self._generate(prompts, samplings)]
        firsts: dict[str, int] = {}
        for i, it in enumerate(items):
            firsts.setdefault(it.instruction, i)
        unique = [items[i] for i in firsts.values()]
        plans = dict(zip(firsts, (p[0] for p in self.plans(unique, 1, seed, greedy))))
        return [ch[0] for ch in self.executions([(it, plans[it.instruction]) for it in items], 1, seed, greedy)]
