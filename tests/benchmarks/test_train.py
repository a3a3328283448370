"""The GRPO-step benchmark reports the update next to its rematerialised-head baseline, with
executed and model FLOPs read from the compiled programs; the train-step benchmark times each
attention kernel asked for on the same state."""
import pytest

from reagent_jax import models
from reagent_jax.benchmarks.train import run_grpo_step


def test_grpo_step_bench_reports_the_baseline_and_flops():
    out = run_grpo_step(models.preset("tiny"), prompts=2, n=2, prompt_len=8, new_tokens=8, iters=1)
    for key in ("gen", "ref", "reward", "update", "update_unfused"):
        assert out[f"timing_s/{key}"] > 0, key
    assert out["step_s"] < sum(out[f"timing_s/{k}"] for k in ("gen", "ref", "reward", "update", "update_unfused"))
    for path in ("update", "update_unfused"):
        # every matmul of the model is executed at least once; nothing runs 4 projections per token here
        assert 0.9 <= out[f"flops/executed_over_model/{path}"] <= 1.5, out
        assert 0 < out[f"mfu/{path}"] <= out[f"hfu/{path}"] * 1.2
        assert out[f"memory/temp_gb/{path}"] > 0


def test_train_step_bench_times_each_attention_kernel_on_the_same_state(monkeypatch):
    from reagent_jax.benchmarks.train import run_train_step
    from reagent_jax.metrics import perf
    monkeypatch.setattr(perf, "matmul_peak_flops", lambda **kw: 1e11)  # the figure's plumbing, not the machine
    out = run_train_step(models.preset("tiny"), batch=2, seq_len=32, iters=1, param_dtype="bfloat16",
                         attentions=("auto", "xla"))
    assert out["attention"] == "xla" and out["attention/xla"] == "xla"  # a CPU: auto is XLA
    assert out["step_s"] > 0 and out["speedup_over/xla"] == out["step_s/xla"] / out["step_s"]
    assert out["mfu"] == pytest.approx(out["model_tflops_per_s"] * 10) and "mfu_vs_datasheet" not in out  # a CPU
