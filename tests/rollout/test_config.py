"""config.rollout as a RolloutConfig: one reading of the engine settings for every pipeline."""
import pytest

from reagent_jax.rollout import RolloutConfig
from reagent_jax.typed_config import ConfigError


def test_bucket_lists_as_text_or_tuples_become_engine_ints():
    r = RolloutConfig.from_config(dict(num_slots=4, max_len=2048, length_buckets="256, 1024,",
                                       window_buckets=[512, 2048]), "rollout")
    assert r.engine_kwargs() == dict(num_slots=4, max_len=2048, prefill_chunk=512, decode_steps=8,
                                     length_buckets=(256, 1024), window_buckets=(512, 2048))
    assert "row_buckets" not in r.engine_kwargs()  # "" = the engine's defaults


@pytest.mark.parametrize("block,want", [
    (dict(length_buckets="a,b"), "config.rollout.length_buckets='a,b': expected comma-separated positive integers"),
    (dict(row_buckets=(0, 4)), "config.rollout.row_buckets=(0, 4): expected positive integers"),
    (dict(max_len=1), "config.rollout.max_len=1: must be >= 2"),
    (dict(num_slot=4), "config.rollout.num_slot=4: unknown field"),
])
def test_bad_rollout_fields_are_named(block, want):
    with pytest.raises(ConfigError, match=want.replace("(", r"\(").replace(")", r"\)")):
        RolloutConfig.from_config(block, "rollout")
