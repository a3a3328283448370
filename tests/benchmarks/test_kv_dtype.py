"""The KV-cache dtype benchmark (`launch/bench.py --mode=kv_dtype`) on the tiny model."""
import json


from reagent_jax.benchmarks import kv_dtype
from tests.rollout.test_engine import prompts_of


def test_an_fp32_cache_matches_itself_and_bf16_is_measured(peaked_tiny_model):
    cfg, params = peaked_tiny_model
    out = kv_dtype.compare(cfg, params, prompts_of((5, 17, 30), seed=2), ["float32", "bfloat16", "float8_e4m3fn"],
                           new_tokens=24)
    same = out["dtypes"]["float32"]
    assert same["identical_rows"] == 3 and same["median_first_difference"] == 24
    assert same["logprob_abs_error_max"] == 0.0 and same["cache_bytes_vs_fp32"] == 1.0
    for dt, size in (("bfloat16", 0.5), ("float8_e4m3fn", 0.25)):
        got = out["dtypes"][dt]
        assert got["cache_bytes_vs_fp32"] == size and 0 <= got["identical_rows"] <= 3
        assert 0 < got["logprob_abs_error_mean"] <= got["logprob_abs_error_max"] < 5
    # fp8 keeps fewer mantissa bits than bf16: its logprobs are further from fp32's
    assert out["dtypes"]["float8_e4m3fn"]["logprob_abs_error_mean"] > out["dtypes"]["bfloat16"]["logprob_abs_error_mean"]
    json.dumps(out)


def test_prompts_are_the_models_chat_template(tmp_path):
    class Tok:
        def apply_chat_template(self, messages, add_generation_prompt, return_dict):
            assert add_generation_prompt and not return_dict
            return [len(messages[0]["content"]), 7]
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": ["1"]}) + "\n" for q in ("ab", "abcd", "x")))
    assert kv_dtype.gsm8k_prompts(Tok(), str(path), 2) == [[2, 7], [4, 7]]
