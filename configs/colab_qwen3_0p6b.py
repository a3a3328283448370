r"""Colab / one 16 GiB chip (a TPU v5e-1 or a 16 GB GPU): GRPO of Qwen3-0.6B with the rule reward.

  python launch/train.py --config=configs/colab_qwen3_0p6b.py --workdir=/content/runs/qwen3_0p6b \
      --config.model.init_from=/content/qwen3-0.6b --config.data.train_path=/content/gsm8k_train.jsonl \
      --config.data.eval_path=/content/gsm8k_test.jsonl

Every device program of the run fits one v5e chip, compiled ahead of time on a CPU host with
`python launch/compile_check.py --config=configs/colab_qwen3_0p6b.py --topology=v5e:2x2 --mesh=single`
(docs/launching.md has the figures). The trainer keeps fp32 params, AdamW moments and the
gradient accumulator (16 bytes a parameter: ~9.5 GB for 0.6B), so the rest is tight: one row per
micro-batch, and the engine's bf16 KV cache holds 4 trajectories of up to 2048 tokens (0.9 GB),
so the 8 episodes of a step run 4 at a time.
"""
import importlib.util
import os

import ml_collections


def _paper():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "qwen3_8b_reagent_u.py")
    spec = importlib.util.spec_from_file_location("reagent_paper_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def get_config() -> ml_collections.ConfigDict:
    c = _paper()
    c.strategy = "grpo"
    c.mesh = "single"
    c.model.update(dict(preset="qwen3-0.6b", hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
                        num_kv_heads=8, head_dim=128))
    c.agent.max_turns = 6
    c.agent.max_tokens_per_turn = 320
    c.agent.tools = "python"
    c.rollout = ml_collections.ConfigDict(dict(num_slots=4, max_len=2048, prefill_chunk=512, decode_steps=16, kv_page_size=0, kv_pages=0, kv_dtype=""))
    c.grpo.steps = 100
    c.grpo.questions_per_step = 2
    c.grpo.n = 4
    c.grpo.micro_batches = 8
    c.grpo.learning_rate = 1e-6
    c.rrm.judge = "rule"
    c.eval = ml_collections.ConfigDict(dict(num_questions=50, max_turns=6, greedy=True, refinement=False))
    c.checkpoint = ml_collections.ConfigDict(dict(every=20, keep=2))
    return c
