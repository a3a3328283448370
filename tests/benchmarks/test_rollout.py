"""The decode benchmarks: the engine on slots of mixed lengths and the decode call alone, each
against its HBM roofline; the decode call in both KV cache axis orders and attention forms."""
from reagent_jax.benchmarks.rollout import decode_kernel, mixed_decode
from reagent_jax.kernels import kv_layout, xla_attention


def test_mixed_decode_reports_the_live_and_window_bounds():
    out = mixed_decode("tiny", slots=4, min_prompt=8, max_prompt=40, new_tokens=8, decode_steps=4, iters=1)
    assert out["decode_tokens_per_s"] > 0 and out["shape"]["decode_window"] >= 40 + 8 - 1
    assert out["step_gb/live_kv"] < out["step_gb/window_kv"]  # mixed lengths: the window over-reads
    assert out["bound_ms/live"] < out["bound_ms/window"]
    assert 0 < out["fraction_of_roofline/live"] < out["fraction_of_roofline/window"]


def test_decode_kernel_times_each_cache_order_and_form_and_restores_the_tables():
    before = dict(kv_layout.ORDERS), dict(xla_attention.DECODE_FORMS)
    out = decode_kernel("tiny", slots=4, min_len=8, max_len=40, steps=4, iters=1, orders=("lnksd", "lnskd"),
                       forms=("reduce",))
    assert (kv_layout.ORDERS, xla_attention.DECODE_FORMS) == before
    for key in ("lnksd/reduce", "lnskd/reduce"):
        assert out[f"step_ms/{key}"] > 0 and 0 < out[f"fraction_of_roofline/live/{key}"] < 1.5
