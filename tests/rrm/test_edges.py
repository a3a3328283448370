"""Agent-RRM parser and Reagent strategies on adversarial judge output: verdicts hidden in thinking,
number forms, replies of 10^5-10^6 characters, and strategies fed failed or odd judgements."""
import random
import re
import types

import numpy as np
import pytest

from reagent_jax import rrm
from reagent_jax.rrm import JudgementStatus as S
from reagent_jax.rrm import parser as rrm_parser
from reagent_jax.rrm import strategies
from reagent_jax.rrm.base import as_request

TAIL = "<critique>c</critique><score>0.4</score>"

# A verdict inside a closed think block is a draft: it never counts. (reply, status, score, critique)
THINK_TABLE = [
    ("<think>maybe <score>0.9</score></think><critique>c</critique>", S.MISSING_SCORE, 0.0, "c"),
    ("<think>maybe <critique>fake</critique><score>0.9</score></think>", S.MISSING_SCORE, 0.0, ""),
    ("drafting <critique>fake</critique><score>0.9</score> hmm</think>", S.MISSING_SCORE, 0.0, ""),  # Qwen3
    ("<think>x <critique>fake</critique></think><score>0.3</score>", S.MISSING_CRITIQUE, 0.3, ""),
    ("<think>x <score>0.9</score></think>" + TAIL, S.OK, 0.4, "c"),
    # a verdict outside thinking still counts when thinking comes after it
    (TAIL + "<think>afterthought <score>0.9</score></think>", S.OK, 0.4, "c"),
    ("<think>a</think>" + TAIL + "\n</think>", S.OK, 0.4, "c"),  # stray closing tag at the end
    ("<think>a</think><think>b <score>1</score></think>" + TAIL, S.OK, 0.4, "c"),
]


@pytest.mark.parametrize("text,status,score,critique", THINK_TABLE)
def test_verdict_inside_thinking_never_counts(text, status, score, critique):
    j = rrm.parse_judgement(text)
    assert (j.status, j.score, j.critique) == (status, score, critique), j


@pytest.mark.parametrize("raw,value", [
    ("5e-1", 0.5), ("1e-3", 0.001), ("2E-1", 0.2), ("\u22120.5", -0.5), ("\u22122/10", -0.2),
    ("1e400", None), ("0.5e", 0.5), ("8 out of 10", 0.8), ("0.8/1.0", 0.8), ("+0.3", 0.3),
    ("0,8", 0.8), ("8,5/10", 0.85), ("85,5%", 0.855), ("0, 8", 0.0), ("0,", 0.0),
])
def test_parse_number_exponent_and_unicode_minus(raw, value):
    got = rrm.parse_number(raw)
    assert got == (pytest.approx(value) if value is not None else None)


@pytest.mark.parametrize("raw,status,score", [
    ("1e-3", S.OK, 0.001),            # was read as 1 (the mantissa): the opposite verdict
    ("\u22120.5", S.CLAMPED, 0.0),    # was read as +0.5
    ("eight", S.BAD_SCORE, 0.0),
    ("nan", S.BAD_SCORE, 0.0),
    ("9" * 400, S.BAD_SCORE, 0.0),    # overflows to inf
    ("80%", S.OK, 0.8),
    ("\r\n 0.7 \r\n", S.OK, 0.7),
    ("0,8", S.OK, 0.8),               # a decimal comma: was read as 0, the opposite verdict
    ("7,5 out of 10", S.OK, 0.75),
])
def test_score_forms(raw, status, score):
    j = rrm.parse_judgement(f"<think>a</think><critique>c</critique><score>{raw}</score>")
    assert (j.status, j.score) == (status, pytest.approx(score))


def _findall_blocks(text, name):
    """Reference: the regex the one-pass scanner replaces."""
    tag = lambda close: r"<\s*" + (r"/\s*" if close else "") + name + r"\s*>"  # noqa: E731
    return re.findall(tag(False) + r"(.*?)" + tag(True), text, flags=re.IGNORECASE | re.DOTALL)


def _regex_sub_scores(block):
    """Reference: the regex the linear sub-score scanner replaces."""
    out = {}
    for key, raw in re.findall(r"([A-Za-z_][\w ]*?)\s*[=:]\s*([^;,\n]+)", block):
        value = rrm.parse_number(raw)
        if value is not None:
            out[key.strip().lower().replace(" ", "_")] = min(1.0, max(0.0, value))
    return out


def test_scanner_matches_the_regex_reference_on_random_replies():
    rng = random.Random(0)
    pieces = ["<think>", "</think>", "<score>", "</score>", "<Score >", "< /score>", "<critique>", "</critique>",
              "<scores>", "</scores>", "<confidence>", "0.5", "x", " ", "\n", "<", ">", "/"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        blocks = rrm_parser._scan(text)
        for name in rrm_parser._TAG_NAMES:
            got = [text[s:e] for _, s, e, _ in blocks[name].complete]
            assert got == _findall_blocks(text, name), (text, name)
    alphabet = list("ab _=:;,\n0.5%/12xZ-()\t")
    for _ in range(5000):
        block = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        assert rrm_parser._parse_sub_scores(block) == _regex_sub_scores(block), block


GOOD = "<think>a</think><critique>c</critique><score>0.5</score>"
N = 200_000  # the old regexes took minutes on these (quadratic); each now parses in well under a second


@pytest.mark.parametrize("text,status,score", [
    ("<score>" * (N // 7), S.BAD_SCORE, 0.0),
    ("<think>" * (N // 7), S.MISSING_SCORE, 0.0),
    ("<think>a</think>" + "<critique>" * (N // 10), S.MISSING_SCORE, 0.0),
    (GOOD + "<scores>" + "ab " * (N // 3) + "</scores>", S.OK, 0.5),
    (GOOD + "<scores>" + "=" * N, S.OK, 0.5),
    ("<" + " " * N + GOOD, S.OK, 0.5),
    ("<think>" + "x" * N + "</think><critique>" + "y" * N + "</critique><score>0.25</score>", S.OK, 0.25),
    ("<think>a</think><critique>c</critique><score>" + "1 " * (N // 2) + "</score>", S.OK, 1.0),
])
def test_very_long_replies(text, status, score):
    j = rrm.parse_judgement(text)
    assert (j.status, j.score) == (status, score)


# ---- strategies ---------------------------------------------------------------------------------
class ScriptJudge:
    """judge_many -> parse of a scripted reply per question (the text after 'Q:' names it)."""

    def __init__(self, replies):
        self.replies, self.calls = replies, []

    def judge_many(self, items):
        requests = [as_request(it) for it in items]
        self.calls.append([(r.question, r.trajectory) for r in requests])
        return [rrm.parse_judgement(self.replies[r.question]) for r in requests]


class FakeLoop:
    """Episodes without tool calls; a refined episode answers `second[question]`."""

    def __init__(self, first, second=None):
        self.first, self.second = first, second or {}
        self.engine = types.SimpleNamespace(num_slots=0)
        self.refine_turns = []

    def _traj(self, rec, text, attempt=1):
        msgs = [{"role": "user", "content": rec["question"]}, {"role": "assistant", "content": text}]
        return types.SimpleNamespace(question=rec, messages=msgs, final_text=text, finish_reason="answer",
                                     attempt=attempt)

    def run(self, records, n=1, seed=0, keep_sessions=False, greedy=False):
        return [self._traj(r, self.first[r["question"]]) for r in records for _ in range(n)]

    def release(self, trajs):
        pass

    def keeps_sessions(self, episodes):
        return False

    def continue_many(self, jobs, greedy=False):
        self.refine_turns += [turns for _, turns in jobs]
        return [self._traj(t.question, self.second[t.question["question"]], 2) for t, _ in jobs]


RECORDS = [{"question": "q1", "answer": "7", "data_source": "em"},
           {"question": "q2", "answer": "3", "data_source": "em"}]
REPLIES = {
    "q1": "<think>x <score>0.9</score></think><critique>check the sum</critique>",  # fake score: none real
    "q2": "<think>ok</think><critique>fine</critique><score>0.6</score>",
}


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_reagent_r_reward_is_rule_plus_lam_times_parsed_score(lam):
    loop = FakeLoop({"q1": r"\boxed{7}", "q2": r"\boxed{4}"})
    trajs, rewards, groups, m = strategies.ReagentR(ScriptJudge(REPLIES), strategies.RRMConfig(lam=lam)).collect(
        loop, RECORDS, n=2, seed=0)
    # q1: rule 1, no real score -> fallback 0 (status missing_score); q2: rule 0, score 0.6
    np.testing.assert_allclose(rewards, [1.0, 1.0, lam * 0.6, lam * 0.6], rtol=1e-6)
    np.testing.assert_array_equal(groups, [0, 0, 1, 1])
    assert m["rrm/parse_ok_frac"] == 0.5 and m["rrm/score/mean"] == pytest.approx(0.3)


def test_reagent_r_all_equal_rewards_and_failed_judge():
    loop = FakeLoop({"q1": "no answer", "q2": "no answer"})
    judge = ScriptJudge({"q1": "", "q2": "garbage"})
    _, rewards, _, m = strategies.ReagentR(judge, strategies.RRMConfig(lam=0.3)).collect(loop, RECORDS, n=3, seed=0)
    np.testing.assert_array_equal(rewards, np.zeros(6, np.float32))
    assert m["rrm/parse_ok_frac"] == 0.0 and np.isfinite(list(m.values())).all()


def test_reagent_u_refines_with_default_critique_when_judge_wrote_none():
    loop = FakeLoop({"q1": "no answer", "q2": r"\boxed{3}"}, {"q1": r"\boxed{7}", "q2": r"\boxed{3}"})
    judge = ScriptJudge({"q1": "<think>x</think><score>0.1</score>", "q2": REPLIES["q2"]})
    cfg = strategies.RRMConfig(lam=0.5, refine_below=0.5)
    trajs, rewards, groups, m = strategies.ReagentU(judge, cfg).collect(loop, RECORDS, n=1, seed=0)
    assert len(trajs) == 3 and m["reagent/refined_frac"] == 0.5  # only q1 (0.1 < 0.5)
    np.testing.assert_array_equal(groups, [0, 1, 0])
    assert "no specific critique" in loop.refine_turns[0][0]["content"]
    # refined q1 is judged again (judge_refined): rule 1 + 0.5 * 0.1
    np.testing.assert_allclose(rewards, [0.5 * 0.1, 1.0 + 0.5 * 0.6, 1.0 + 0.5 * 0.1], rtol=1e-6)


def test_sub_score_metrics_average_over_the_judgements_that_rated_them():
    js = [rrm.parse_judgement(GOOD + "<scores>reasoning=0.2; tool_use=0.4</scores>"),
          rrm.parse_judgement(GOOD + "<scores>reasoning=0.6</scores>"),
          rrm.parse_judgement(GOOD + "<scores>information_use=1.0</scores>"),
          rrm.parse_judgement(GOOD)]
    m = strategies._judge_metrics(js)
    assert m["rrm/reasoning/mean"] == pytest.approx(0.4)  # was NaN: one rated judgement lacked it
    assert m["rrm/tool_use/mean"] == pytest.approx(0.4)
    assert m["rrm/information_use/mean"] == pytest.approx(1.0)  # was missing: not in the first one


@pytest.mark.parametrize("kwargs,field", [
    ({"lam": float("nan")}, "lam"), ({"lam": -0.1}, "lam"), ({"lam": float("inf")}, "lam"),
    ({"lam": "0.3"}, "lam"), ({"lam_start": float("nan"), "lam_warmup": 10}, "lam_start"),
    ({"lam_warmup": -1}, "lam_warmup"), ({"lam_warmup": 2.5}, "lam_warmup"),
    ({"refine_below": float("nan")}, "refine_below"),
])
def test_rrm_config_rejects_weights_that_would_poison_rewards(kwargs, field):
    with pytest.raises(ValueError, match=f"RRMConfig.{field}"):
        strategies.RRMConfig(**kwargs)


@pytest.mark.parametrize("kwargs,step,lam", [
    ({"lam": 0.0}, 5, 0.0), ({"lam": 1.0}, 0, 1.0), ({"lam": np.float32(0.3)}, 0, 0.3),
    ({"lam": 0.4, "lam_start": 0.0, "lam_warmup": 4}, 2, 0.2),
    ({"lam": 0.4, "lam_start": 0.0, "lam_warmup": 4}, 9, 0.4),
    ({"lam": 0.4, "lam_start": 0.0, "lam_warmup": 0}, 0, 0.4),
])
def test_lambda_schedule_extremes(kwargs, step, lam):
    assert strategies._lam(strategies.RRMConfig(**kwargs), step) == pytest.approx(lam)


@pytest.mark.parametrize("cls", [strategies.ReagentR, strategies.ReagentU])
def test_lambda_follows_the_training_step_so_a_resumed_run_keeps_its_schedule(cls):
    """A strategy rebuilt on resume (a fresh object) at step 3 uses the lambda of step 3."""
    cfg = strategies.RRMConfig(lam=0.4, lam_start=0.0, lam_warmup=4)
    lams = []
    for step in (0, 3, 3):  # step 3 twice: once in the first run, once by a fresh (resumed) strategy
        loop = FakeLoop({"q1": r"\boxed{7}", "q2": r"\boxed{4}"}, {"q1": r"\boxed{7}", "q2": r"\boxed{3}"})
        lams.append(cls(ScriptJudge(REPLIES), cfg).collect(loop, RECORDS, n=1, seed=0, step=step)[3]["rrm/lambda"])
    assert lams == pytest.approx([0.0, 0.3, 0.3])


# ---- local and rule judges: items they cannot judge get an explicit status, never a parse of ""


class _ReplyEngine:
    """Answers each prompt with a fixed reply; answers only the first `answer` prompts."""

    def __init__(self, tok, reply: str, max_len: int, answer: int | None = None):
        self.tok, self.reply, self.max_len, self.answer = tok, reply, max_len, answer
        self.prompt_lens: list[int] = []

    def generate(self, prompts, sampling):
        from reagent_jax.rollout.session import Result
        self.prompt_lens += [len(p) for p in prompts]
        ids = self.tok.encode(self.reply)
        return [Result(i, list(ids), [0.0] * len(ids), "stop") for i, _ in enumerate(prompts[:self.answer])]


def test_local_judge_marks_too_long_prompts_and_unanswered_items():
    from reagent_jax import chat
    from reagent_jax.rrm.judges import LocalJudge
    reply = "<think>checked</think><critique>fine</critique><score>0.8</score>"
    tok = chat.build_compact_tokenizer(["checked fine score critique think question answer tool " * 3, reply],
                                       vocab_size=300)
    short = ("Q?", [{"role": "assistant", "content": "A"}])
    long = ("Q?", [{"role": "assistant", "content": "answer " * 400}])
    probe = LocalJudge(_ReplyEngine(tok, reply, 10_000), tok)
    n_short = len(probe.prompt_ids(*short))
    engine = _ReplyEngine(tok, reply, max_len=n_short + 50, answer=1)
    judge = LocalJudge(engine, tok, fallback_score=0.25)
    out = judge.judge_many([short, long, short])
    assert engine.prompt_lens == [n_short, n_short]  # the long prompt never reached the engine
    assert out[0].status == S.OK and out[0].score == pytest.approx(0.8)
    assert str(out[1].status) == "prompt_too_long" and out[1].score == 0.25
    assert str(out[2].status) == "no_reply" and out[2].score == 0.25  # the engine answered one of two
    assert judge.stats.total == 3 and judge.stats.counts["prompt_too_long"] == 1


def test_rule_judge_refuses_mismatched_records():
    from reagent_jax.worlds.rrm_annotator import RuleJudge
    with pytest.raises(ValueError, match="2 items but 1 records"):
        RuleJudge().judge_many([("Q?", []), ("Q2?", [])], records=[{"question": "Q?", "answer": ["a"]}])
