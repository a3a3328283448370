"""The programs of a run, built from its config without weights: the right programs per stage and
strategy, the shapes the pipeline would use, and what stays resident; compiled here on 8
simulated CPU devices (the `local` topology of the compile check)."""
import os

import pytest

from tests.multidevice import run_with_devices

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_programs_follow_the_config_and_compile_on_local_devices():
    res = run_with_devices("""
        import json
        from ml_collections import ConfigDict
        from reagent_jax import parallel
        from reagent_jax.aot import programs
        from reagent_jax.aot.check import check_config
        from tests.test_configs import _load
        c = _load("quickstart")
        c.model.update(dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16))
        c.tokenizer.vocab_size = 256
        c.sft.update(dict(batch_size=8, max_len=64))
        c.grpo.update(dict(questions_per_step=2, n=4, micro_batches=2, beta=0.04, old_logprobs="recompute"))
        c.rollout.update(dict(num_slots=8, max_len=64, prefill_chunk=32))
        mesh = parallel.make_mesh(1, -1, 1)
        cfg, progs = programs.run_programs(c, mesh)
        names = [p.name for p in progs]
        grpo = next(p for p in progs if p.name == "grpo/train_step")
        rows, length = grpo.args[1]["tokens"].shape
        c.strategy, c.rrm.judge = "reagent_u", "local"
        c.stages = "rrm_sft,rrm_grpo,sft,grpo"
        u_names = [p.name for p in programs.run_programs(c, mesh)[1]]
        u_rows = next(p for p in programs.run_programs(c, mesh)[1] if p.name == "grpo/train_step").args[1]["tokens"].shape[0]
        c.strategy, c.rrm.judge, c.stages = "grpo", "rule", "sft,grpo"
        refused = check_config(c, "local", mesh_preset="auto", only=["grpo/train_step"])["programs"][0]
        c.grpo.micro_batches = 1
        report = check_config(c, "local", mesh_preset="auto", only=["grpo/train_step", "rollout/decode"])
        print(json.dumps({"vocab": cfg.vocab_size, "names": names, "rows": rows, "length": length,
                          "resident": sorted(grpo.resident), "u_names": u_names, "u_rows": u_rows,
                          "fits": report["all_fit"], "compiled": [p["name"] for p in report["programs"] if p["compiled"]],
                          "mesh": report["mesh"], "flops": [p["model_flops"] > 0 for p in report["programs"]],
                          "refused": [refused["compiled"], refused["error"]]}))
    """)
    assert res["vocab"] == 256
    assert res["names"] == ["sft/train_step", "grpo/train_step", "grpo/ref_logprobs", "grpo/old_logprobs",
                            "rollout/prefill", "rollout/decode"]
    assert (res["rows"], res["length"]) == (8, 64)  # 2 questions x n=4, padded to the rollout's max_len
    assert res["resident"] == ["engine KV cache", "reference params"]
    assert res["u_names"][:2] == ["rrm_sft/train_step", "rrm_grpo/train_step"]
    assert res["u_names"][-2:] == ["judge/prefill", "judge/decode"]  # a local Agent-RRM is a second engine
    assert res["u_rows"] == 16  # Reagent-U: initial + refined rows of each episode
    assert res["fits"] and res["compiled"] == ["grpo/train_step", "rollout/decode"]
    assert res["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1} and all(res["flops"])
    assert res["refused"][0] is False and "4 rows per micro-batch" in res["refused"][1]
    assert "use micro_batches=1" in res["refused"][1]


def test_per_chip_bytes_and_the_model_of_an_hf_checkpoint(tmp_path):
    import json
    import jax
    import jax.numpy as jnp
    from ml_collections import ConfigDict
    from reagent_jax.aot import programs
    assert programs.per_chip_bytes(jax.ShapeDtypeStruct((4, 6), jnp.bfloat16)) == 48
    hf = {"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 96,
          "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "max_position_embeddings": 512}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    c = ConfigDict(dict(model=dict(init_from=str(tmp_path), param_dtype="float32", compute_dtype="bfloat16",
                                   remat_policy="full"), tokenizer=dict(kind="qwen3", vocab_size=0)))
    cfg = programs.model_config(c)
    assert (cfg.vocab_size, cfg.num_layers, cfg.compute_dtype, cfg.remat_policy) == (1000, 3, "bfloat16", "full")


def test_mixed_length_decode_bytes_follow_the_attention_kernel():
    """Qwen3-8B, 64 slots of 1k-16k tokens on 8 chips (data 2 x tensor 4): XLA attention reads
    every slot's whole window (over 1.5x the live minimum); the ragged kernel reads each slot's own
    blocks (within 1.3x)."""
    import types
    from reagent_jax import models
    from reagent_jax.aot.programs import mixed_length_step_bytes
    cfg = models.preset("qwen3-8b", compute_dtype="bfloat16")
    emesh = types.SimpleNamespace(shape={"data": 2, "fsdp": 1, "tensor": 4})
    weights = cfg.num_params() * 2 / 4
    xla = mixed_length_step_bytes(cfg, emesh, 64, 16384, weights, "xla")
    ragged = mixed_length_step_bytes(cfg, emesh, 64, 16384, weights, "ragged")
    assert xla["lengths"] == ragged["lengths"] == "1024-16383" and xla["min_bytes"] == ragged["min_bytes"]
    per_position = 2 * cfg.num_layers * (cfg.num_kv_heads // 4) * cfg.head_dim * 2  # k and v, bf16, per chip
    assert xla["read_bytes"] == pytest.approx(weights + 32 * 16384 * per_position)  # 32 slots per data shard
    assert xla["vs_min"] > 1.5 and ragged["vs_min"] <= 1.3
