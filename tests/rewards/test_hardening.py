"""Regressions for reward bugs found in an audit: hangs on pathological answers, thinking leaks,
scientific notation and Unicode minus signs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from reagent_jax.rewards import compute_reward, drop_thinking, math_equal, math_verify_check, score_answer
from reagent_jax.rewards import math_equiv


def test_scientific_notation_and_unicode_minus():
    for pred, gold in [("1e3", "1000"), ("1.5e-3", "0.0015"), ("3.0E2", "300"), ("\u22123", "-3"),
                       ("\u2212\\frac{1}{2}", "-0.5")]:
        assert math_equal(pred, gold), (pred, gold)
        assert score_answer(f"\\boxed{{{pred}}}", [gold], "gsm8k") == 1.0, (pred, gold)
    assert not math_equal("1e3", "100") and not math_equal("1e-3", "1000")
    assert not math_equal("1e99999999", "1")  # huge exponents are not materialised as integers
    assert score_answer("\\boxed{\u22125}", ["-5"], "hotpotqa") == 1.0  # SQuAD drops the minus either way


def test_thinking_never_supplies_the_answer():
    assert compute_reward("<think>maybe \\boxed{3}", ["3"], "math").answer is None  # cut off while thinking
    gave_up = compute_reward("draft \\boxed{3}</think>I give up.", ["3"], "math")  # <think> was in the prompt
    assert not gave_up.has_boxed and gave_up.correctness == 0.0
    assert compute_reward("draft \\boxed{3}</think>So \\boxed{4}", ["4"], "math").correctness == 1.0
    assert compute_reward("<think><answer>3</answer></think>\nno idea", ["3"], "hotpotqa").answer is None
    assert drop_thinking("a<think>b</think>c<think>d</think>e") == "ace"
    degenerate = "<think>" * 200_000 + "\\boxed{1}"  # quadratic for a lazy regex: minutes
    assert compute_reward(degenerate, ["1"], "math").answer is None
    assert compute_reward("<answer>" * 200_000, ["1"], "hotpotqa").answer is None  # same for <answer>
    assert compute_reward("<answer>a</answer> then <answer> b </answer>", ["b"], "hotpotqa").answer == "b"


def test_pathological_math_is_bounded_on_a_worker_thread():
    """9^{9^{9}} made sympy hold the GIL for minutes on a pool thread (no signal timeouts there)."""
    script = textwrap.dedent("""
        import json
        from concurrent.futures import ThreadPoolExecutor
        from reagent_jax.rewards import compute_reward
        answers = ["9^{9^{9}}", "100000000!", "\\\\int_0^1 e^{-x^{2}}\\\\sin(x^{x}) dx"]
        with ThreadPoolExecutor(2) as pool:
            out = list(pool.map(lambda a: compute_reward("\\\\boxed{%s}" % a, ["4"], "math",
                                                         math_timeout_s=1), answers))
        print(json.dumps([[r.correctness, r.method] for r in out]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(score == 0.0 for score, _ in results)
    assert {method for _, method in results} <= {"math_timeout", "none"}
    assert results[0][1] == "math_timeout"


def test_stuck_or_dead_workers_are_replaced(monkeypatch):
    assert math_verify_check("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}") == (True, "equal")
    worker = math_equiv._idle[-1]
    os.kill(worker.proc.pid, signal.SIGSTOP)  # stuck where no alarm helps (e.g. a long C call)
    monkeypatch.setattr(math_equiv, "_hard_deadline_s", lambda timeout_s: 0.5)
    assert math_verify_check("x^2", "x \\cdot x", timeout_s=1) == (False, "timeout")
    assert worker.proc.poll() is not None and worker not in math_equiv._idle  # killed, not reused
    monkeypatch.undo()
    assert math_verify_check("x^2", "x \\cdot x") == (True, "equal")
    dead = math_equiv._idle[-1]
    os.kill(dead.proc.pid, signal.SIGKILL)
    dead.proc.wait()
    assert math_verify_check("x^2", "x \\cdot x") == (True, "equal")  # a dead idle worker is skipped
    assert math_verify_check("1", "1" * 5000) == (False, "too_long")
