"""The GRPO-shaped paged-vs-contiguous rollout benchmark (`launch/bench.py --mode=grpo_rollout`)."""
from reagent_jax.benchmarks import paged


def test_samples_of_a_prompt_share_its_pages_and_draw_the_same_tokens():
    out = paged.grpo_rollout("tiny", questions=2, n=3, prompt_len=40, new_tokens=8, page_size=16, iters=1)
    assert out["same_tokens"]
    assert out["contiguous"]["prefill_tokens"] == 6 * 40 and out["contiguous"]["prefix_shared_tokens"] == 0
    # each prompt's first 2 full pages (32 of its 40 tokens) computed once, mapped by its 2 other samples
    assert out["paged"]["prefix_shared_tokens"] == 2 * 2 * 32
    assert out["paged"]["prefill_tokens"] == 6 * 40 - 2 * 2 * 32
    assert out["paged_vs_contiguous_wall"] > 0
