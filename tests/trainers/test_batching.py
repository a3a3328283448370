"""Length buckets, row buckets and padding for the trainers' fixed-shape batches."""
import numpy as np
import pytest

from reagent_jax.trainers.batching import bucket_length, default_buckets, pad_rows
from reagent_jax.trainers.grpo import row_bucket


@pytest.mark.parametrize("max_len", [100, 768, 1536, 8192, 32768])
def test_default_buckets_bound_padding_and_shape_count(max_len):
    b = default_buckets(max_len)
    assert b[-1] == max_len and list(b) == sorted(set(b))
    assert all(x % 64 == 0 for x in b[:-1])
    # any length needs at most ~25% padding beyond the smallest bucket (the point of the growth factor)
    for n in range(65, max_len + 1, 7):
        assert bucket_length(n, b) <= max(1.3 * n, n + 64)
    assert len(b) <= 30


def test_row_bucket_is_a_power_of_two_multiple_of_micro_batches():
    assert [row_bucket(n, 2, 64) for n in (1, 2, 3, 5, 9, 17, 33, 64)] == [2, 2, 4, 8, 16, 32, 64, 64]
    assert row_bucket(70, 2, 64) == 64  # never above the step's cap
    assert all(row_bucket(n, 4, 48) % 4 == 0 for n in range(1, 49))


def test_pad_rows_pads_to_bucket_and_batch_size():
    rows = [{"tokens": [5, 6, 7], "loss_mask": [0, 1, 1], "old_logprobs": [0.0, -1.0, -2.0], "advantages": 0.5},
            {"tokens": list(range(1, 71)), "loss_mask": [1] * 70, "old_logprobs": [-0.5] * 70, "advantages": -1.0}]
    b = pad_rows(rows, buckets=default_buckets(768), batch_size=4)
    assert b["tokens"].shape == (4, 128) and b["old_logprobs"].dtype == np.float32
    np.testing.assert_array_equal(b["row_mask"], [1, 1, 0, 0])
    np.testing.assert_array_equal(b["attention_mask"].sum(1), [3, 70, 0, 0])
    np.testing.assert_array_equal(b["advantages"], [0.5, -1.0, 0.0, 0.0])
    assert b["loss_mask"][0].tolist()[:4] == [0, 1, 1, 0]
    with pytest.raises(ValueError, match="do not fit"):
        pad_rows(rows * 3, buckets=(64,), batch_size=4)


def test_sft_rows_carry_the_context_mask_of_weight_zero_turns_into_the_batch():
    """render_examples -> pad_rows keeps `context_mask` (int32), so a weight-0 assistant turn stays
    out of the SFT objective's context loss as well as its loss mask."""
    from reagent_jax import chat
    from reagent_jax.trainers.sft import render_examples
    tok = chat.load_tokenizer(None)
    conv = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "5", "weight": 0},
            {"role": "user", "content": "Wrong, again."}, {"role": "assistant", "content": "4"}]
    rows = render_examples(tok, [conv])
    b = pad_rows(rows, buckets=(64,), batch_size=2)
    assert b["context_mask"].dtype == np.int32 and b["context_mask"].shape == b["tokens"].shape
    n = len(rows[0]["tokens"])
    hidden = (b["attention_mask"][0, :n] == 1) & (b["loss_mask"][0, :n] == 0) & (b["context_mask"][0, :n] == 0)
    assert tok.decode(b["tokens"][0, :n][hidden]).strip() == "<|im_start|>assistant\n<think>\n\n</think>\n\n5<|im_end|>"
    assert tok.decode(b["tokens"][0, :n][b["loss_mask"][0, :n] == 1]).endswith("4<|im_end|>")
    assert not b["context_mask"][1].any()  # the padding row
    assert "context_mask" not in render_examples(tok, [conv[2:]])[0]  # no weight-0 turn: the usual SFT inputs
